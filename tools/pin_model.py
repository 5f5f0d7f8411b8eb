"""Pin a model on a Hugging Face-style hub for playbooks/stage_models.yml: its revision resolved to a commit, a
sha256sum-format digest list of its files at that commit, and the source URL with the commit in it.

    python tools/pin_model.py --repo moonshotai/Kimi-K2.6 --revision main \\
        --out inventory/site/models/target.sha256 [--exclude 'figures/*'] [--endpoint URL]

Runs on the controller with huggingface_hub (requirements/test.txt); a token for a gated or private model comes
from huggingface_hub's own HF_TOKEN (never printed). The digests come from the hub at the resolved commit:
- a large (LFS) file's sha256 is the hub's own record of it (its LFS object id), not downloaded;
- a small file is downloaded at the commit and its git blob id checked against the hub's tree before its sha256
  is taken, so every line belongs to that commit.
Prints the k26_models entry to put in the inventory (source: ENDPOINT/REPO/resolve/COMMIT). A branch or tag moves;
the commit printed does not, and the staging play fetches only from it.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.file_download import hf_hub_url
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers, get_session

COMMIT = re.compile(r"^[0-9a-f]{40}$")


class PinError(Exception):
    """A failure the operator can act on; the message names the repository, the revision or the file."""


@dataclass(frozen=True)
class Pin:
    repo: str
    commit: str
    endpoint: str

    @property
    def source(self) -> str:
        return f"{self.endpoint}/{self.repo}/resolve/{self.commit}"


@dataclass(frozen=True)
class Digest:
    path: str
    sha256: str
    size: int
    lfs: bool               # True: the hub's LFS record; False: downloaded and hashed here


def resolve(api: HfApi, repo: str, revision: str) -> Pin:
    """The revision (branch, tag or commit) as the commit the hub has for it now."""
    try:
        info = api.model_info(repo, revision=revision)
    except HfHubHTTPError as err:
        raise PinError(f"{repo} at revision {revision!r}: the hub answered {err.response.status_code} "
                       f"({type(err).__name__}); check the repository and revision names, and HF_TOKEN for a "
                       f"gated or private model") from None
    if not info.sha or not COMMIT.match(info.sha):
        raise PinError(f"{repo} at revision {revision!r}: the hub gave no commit id (got {info.sha!r})")
    if COMMIT.match(revision) and info.sha != revision:
        raise PinError(f"{repo}: asked for commit {revision} and the hub resolved {info.sha}")
    return Pin(repo, info.sha, api.endpoint.rstrip("/"))


def files_at(api: HfApi, pin: Pin, exclude: list[str]) -> list[RepoFile]:
    """Every file of the repository at the commit (recursive), less those an exclude pattern matches."""
    entries = api.list_repo_tree(pin.repo, revision=pin.commit, recursive=True)
    files = [e for e in entries if isinstance(e, RepoFile)]
    kept = [f for f in files if not any(fnmatch.fnmatch(f.path, pat) for pat in exclude)]
    if not kept:
        raise PinError(f"{pin.repo} at {pin.commit}: no file left (of {len(files)}) after --exclude {exclude}")
    return sorted(kept, key=lambda f: f.path)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def small_file_digest(api: HfApi, pin: Pin, f: RepoFile) -> Digest:
    url = hf_hub_url(pin.repo, f.path, revision=pin.commit, endpoint=pin.endpoint)
    # httpx drops the Authorization header on a redirect to another host (a hub's CDN)
    r = get_session().get(url, headers=build_hf_headers(token=api.token), follow_redirects=True)
    if r.status_code != 200:
        raise PinError(f"{pin.repo}/{f.path} at {pin.commit}: the hub answered {r.status_code}")
    data = r.content
    if git_blob_id(data) != f.blob_id:
        raise PinError(f"{pin.repo}/{f.path}: the bytes downloaded have git blob id {git_blob_id(data)}, the hub's "
                       f"tree at {pin.commit} says {f.blob_id}: not the pinned file; try again, or check the endpoint")
    return Digest(f.path, hashlib.sha256(data).hexdigest(), len(data), lfs=False)


def digest_of(api: HfApi, pin: Pin, f: RepoFile) -> Digest:
    if f.lfs is not None:
        return Digest(f.path, f.lfs.sha256, f.lfs.size, lfs=True)
    return small_file_digest(api, pin, f)


def digest_list(digests: list[Digest]) -> str:
    return "".join(f"{d.sha256}  {d.path}\n" for d in digests)


def inventory_of(out: Path) -> Path | None:
    """The inventory folder the digest list is written into: the nearest folder above it with a hosts file."""
    for folder in out.resolve().parents:
        if any((folder / name).is_file() for name in ("hosts.yml", "hosts.yaml", "hosts", "hosts.ini")):
            return folder
    return None


def digests_path(out: Path) -> str:
    """How the k26_models entry names the list: under {{ inventory_dir }} with every folder between (issue 71: the
    file name alone lost its models/ folder), else the absolute path."""
    inventory = inventory_of(out)
    if inventory is None:
        return str(out.resolve())
    return "{{ inventory_dir }}/" + out.resolve().relative_to(inventory).as_posix()


def entry(name: str, pin: Pin, out: Path) -> str:
    return (f"  - name: {name}\n    source: {pin.source}\n    dest: \"{{{{ k26_{'draft_' if name == 'draft' else ''}"
            f"model_path }}}}\"\n    digests: \"{digests_path(out)}\"\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", required=True, help="owner/name on the hub")
    p.add_argument("--revision", default="main", help="branch, tag or 40-hex commit (default main)")
    p.add_argument("--out", required=True, type=Path, help="the digest list to write (sha256sum format)")
    p.add_argument("--name", default="target", help="the k26_models entry's name: target or draft")
    p.add_argument("--exclude", action="append", default=[".gitattributes"],
                   help="glob of repository paths to leave out (repeatable; .gitattributes always)")
    p.add_argument("--endpoint", default=None, help="the hub's base URL (default: huggingface_hub's, HF_ENDPOINT)")
    a = p.parse_args(argv)
    api = HfApi(endpoint=a.endpoint)
    try:
        pin = resolve(api, a.repo, a.revision)
        digests = [digest_of(api, pin, f) for f in files_at(api, pin, a.exclude)]
    except PinError as err:
        print(f"pin_model: {err}", file=sys.stderr)
        return 1
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(digest_list(digests))
    total = sum(d.size for d in digests)
    print(f"{a.repo} {a.revision} -> commit {pin.commit}: {len(digests)} files, {total / 1e9:.2f} GB "
          f"({sum(d.lfs for d in digests)} from the hub's LFS records); digests in {a.out}")
    print("k26_models entry:\n" + entry(a.name, pin, a.out), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
