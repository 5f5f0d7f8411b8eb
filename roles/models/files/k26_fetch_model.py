#!/usr/bin/python3
"""Fetch one model file to its folder, resuming inside the file, and check it against its pinned digest.

    k26_fetch_model.py --url URL --dest PATH --sha256 HEX [--group k26] [--mode 0640]

Run by the models role (playbooks/stage_models.yml) with the host's python3; standard library only.
- A file already at DEST with the digest is left as it is (nothing is requested).
- Otherwise the bytes go to DEST.part: a part left by a run that stopped is continued with an HTTP Range request
  from its size (a source that answers 200 instead of 206 is fetched again from the start); the whole part is then
  checked against the digest and only then renamed to DEST (group GROUP, MODE; owned by
  the user running it: root under the play), so DEST is never a partial or
  unchecked file. A part whose digest is wrong is removed, and the run fails naming the file and both digests.
- A token for a gated or private model hub is read from the environment (K26_HUB_TOKEN) and sent as a bearer token
  to the source's own host only: a redirect to another host (a hub's download CDN) goes without it.
Prints one JSON line: {"changed": bool, "resumed_from": bytes or null, "fetched": bytes}. Errors go to stderr and
exit 1; they never hold the token.
"""

from __future__ import annotations

import argparse
import grp
import hashlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CHUNK = 8 << 20                  # bytes read and hashed at a time
TIMEOUT_S = 60                   # per socket operation, not per file


class FetchError(Exception):
    """A failure the operator can act on; the message names the file and the fix."""


@dataclass(frozen=True)
class Job:
    url: str
    dest: Path
    sha256: str
    group: str
    mode: int
    token: str

    @property
    def part(self) -> Path:
        return self.dest.with_name(self.dest.name + ".part")


@dataclass(frozen=True)
class Outcome:
    changed: bool
    resumed_from: int | None
    fetched: int


def digest_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follows redirects, dropping the Authorization header when the redirect leaves the first URL's host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def open_source(job: Job, offset: int):
    """The HTTP response for the file from OFFSET (a Range request when OFFSET > 0)."""
    headers = {"User-Agent": "k26-fetch-model/1"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    if job.token:
        headers["Authorization"] = f"Bearer {job.token}"
    opener = urllib.request.build_opener(_SameHostAuth)
    try:
        return opener.open(urllib.request.Request(job.url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:           # the part is already whole: check it as it is
            return None
        hint = (" (a gated or private model: set k26_models_token in the vault)" if err.code in (401, 403) else
                " (check the entry's source and the revision in it)" if err.code == 404 else "")
        raise FetchError(f"{job.url}: the source answered HTTP {err.code} {err.reason}{hint}") from None
    except (urllib.error.URLError, OSError) as err:
        raise FetchError(f"{job.url}: cannot reach the source ({getattr(err, 'reason', err)}); "
                         f"run the play again to continue from the bytes already fetched") from None


def stopped(job: Job, fetched: int, why: str):
    raise FetchError(f"{job.url}: the transfer stopped after {fetched} bytes ({why}); run the play again to continue "
                     f"from the {job.part.stat().st_size} bytes in {job.part}") from None


def download(job: Job) -> tuple[int | None, int]:
    """DEST.part completed from where it stopped; returns (the offset resumed from or None, bytes fetched now)."""
    offset = job.part.stat().st_size if job.part.exists() else 0
    response = open_source(job, offset)
    if response is None:
        return offset, 0
    with response:
        resumed = offset if offset and response.status == 206 else None
        mode = "ab" if resumed else "wb"      # a source that ignored the Range sends the whole file
        fetched = 0
        with job.part.open(mode) as out:
            try:
                while block := response.read(CHUNK):
                    out.write(block)
                    fetched += len(block)
            except OSError as err:
                stopped(job, fetched, str(err))
            out.flush()
            os.fsync(out.fileno())
        length = response.headers.get("Content-Length")
        if length is not None and fetched < int(length):     # http.client returns a short body without raising
            stopped(job, fetched, f"{length} bytes announced")
    return resumed, fetched


def check_and_place(job: Job) -> None:
    """The part checked against the digest, then owned, moded and renamed to DEST (the folder synced)."""
    got = digest_of(job.part)
    if got != job.sha256:
        job.part.unlink()
        raise FetchError(f"{job.dest}: sha256 {got} where the digest list pins {job.sha256}; the fetched bytes were "
                         f"removed. The source serves other bytes than those pinned: check the entry's source (the "
                         f"revision in its URL) and the digest list (tools/pin_model.py writes it from the hub)")
    os.chown(job.part, -1, grp.getgrnam(job.group).gr_gid)      # the owner: the user running it (root on a host)
    os.chmod(job.part, job.mode)
    os.replace(job.part, job.dest)
    fd = os.open(job.dest.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fetch(job: Job) -> Outcome:
    if job.dest.is_file() and digest_of(job.dest) == job.sha256:
        return Outcome(False, None, 0)
    resumed, fetched = download(job)
    check_and_place(job)
    return Outcome(True, resumed, fetched)


def parse(argv: list[str]) -> Job:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--dest", required=True, type=Path)
    p.add_argument("--sha256", required=True)
    p.add_argument("--group", default="k26")
    p.add_argument("--mode", default="0640")
    a = p.parse_args(argv)
    if len(a.sha256) != 64 or any(c not in "0123456789abcdef" for c in a.sha256):
        p.error(f"--sha256 {a.sha256!r}: expected 64 lowercase hex digits")
    if not a.dest.is_absolute():
        p.error(f"--dest {a.dest}: expected an absolute path")
    return Job(a.url, a.dest, a.sha256, a.group, int(a.mode, 8), os.environ.get("K26_HUB_TOKEN", ""))


def main(argv: list[str] | None = None) -> int:
    job = parse(sys.argv[1:] if argv is None else argv)
    try:
        outcome = fetch(job)
    except FetchError as err:
        print(f"k26_fetch_model: {err}", file=sys.stderr)
        return 1
    print(json.dumps({"changed": outcome.changed, "resumed_from": outcome.resumed_from, "fetched": outcome.fetched}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
