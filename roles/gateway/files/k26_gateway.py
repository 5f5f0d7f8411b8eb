"""The k26 gateway: the SGLang Model Gateway (smg) started from a file, and its worker pool.

    k26_gateway.py serve --config /etc/k26/gateway.yaml
        smg's router in this process, with the settings and keys of the file; no key reaches the
        command line or the environment (smg's own CLI takes keys only as arguments).
    k26_gateway.py check --config FILE
        read and check the file (the deploy validates a new file with it before it replaces the old)
    k26_gateway.py pool --config FILE [--record DIR] status
        every worker as smg reports it, and (with --record) every worker taken out and not put back
        since, with who took it out and when (a run that ended before its put-back leaves one)
    k26_gateway.py pool --config FILE [--record DIR --reason TEXT] take-out URL [--timeout S]
        DELETE /workers/{id}: smg marks the worker "draining", lets its in-flight requests finish
        and then drops it; this waits until it is gone (so nothing is routed to it any more).
    k26_gateway.py pool --config FILE put-back URL [--timeout S]
        POST /workers, then wait until the worker is healthy and ready.
    k26_gateway.py check-tls --cert FILE --key FILE
        check that a PEM certificate and key load together (before a gateway file names them)
    k26_gateway.py health --config FILE [--timeout S]
        wait until the gateway's own /health answers 200 (over TLS when the file sets it, the served
        certificate pinned); exit 1 at the timeout
    k26_gateway.py probe --config FILE --model NAME [--requests N]
        N completions through the gateway with the clients' key from the file (never on the command
        line); prints how many answered and fails unless all did with text.

The file (YAML, 0640 root:<gateway group>):
    host: 127.0.0.1            port: 30080
    workers: [http://10.0.0.1:30000, ...]
    policy: round_robin         (one of smg's policies)
    client_keys: [K1, K2]       the keys smg accepts from clients (the first as smg's api_key, the
                                others as smg tenant keys); smg reads them only at its start
    api_key_file: /etc/k26-gateway/worker.key
                                the fleet's key (the workers' current k26_api_key; must be one of
                                client_keys), in a file of its own so that a key rotation rewrites it
                                without restarting smg (or `api_key: ...` inline); the tool registers
                                each worker with it (smg's own calls to the worker: model discovery)
                                and sends it in the probe and the pool's key check
    admin_key: ...              guards the worker API (smg control plane, role admin)
Keys, as smg 1.13.0 handles them (measured on loopback with two ddtree-serve workers): a client's
Authorization header is passed on to the worker unchanged; a client without one gets the worker's
registered key injected - so smg must check clients itself (client_keys), and the workers check
again. A request gets through when smg accepts its key AND the worker does: a rotation moves the
workers (k26_api_key, k26_api_key_previous) host by host and keeps client_keys as they are when
they already list the next key (docs/gateway.md: key rotation).
    health: {interval_secs: 10, failure_threshold: 3, success_threshold: 2, timeout_secs: 5,
             endpoint: /health}
    request_timeout_secs: 1800
    metrics_port: 29000         smg's Prometheus metrics, on the same address as `host`
    tls_cert_file: /etc/k26-gateway/tls/cert.pem   (both or neither) smg serves clients over TLS with
    tls_key_file: /etc/k26-gateway/tls/key.pem      this certificate (PEM, its chain after it) and key;
                                the tool's own calls to the gateway (pool, health, probe) go to the
                                loopback over TLS and accept exactly this certificate
Only the standard library and smg (serve) are imported: a gateway host has no torch.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "least_load", "consistent_hashing",
            "prefix_hash")
MIN_KEY = 16


class GatewayConfigError(ValueError):
    """A setting of the gateway file that cannot work; the message names it, its value and the fix."""


class GatewayHTTPError(RuntimeError):
    """The gateway's worker API refused a call (status and smg's error code kept)."""

    def __init__(self, method: str, path: str, status: int, body: str):
        super().__init__(f"gateway {method} {path} answered {status}: {body[:300]}")
        self.status, self.body = status, body


@dataclass(frozen=True)
class Health:
    interval_secs: int = 10
    failure_threshold: int = 3
    success_threshold: int = 2
    timeout_secs: int = 5
    endpoint: str = "/health"


@dataclass(frozen=True)
class GatewayConfig:
    host: str
    port: int
    workers: tuple[str, ...]
    api_key: str = field(repr=False)
    admin_key: str = field(repr=False)
    client_keys: tuple[str, ...] = field(default=(), repr=False)   # () -> (api_key,)
    policy: str = "round_robin"
    health: Health = Health()
    request_timeout_secs: int = 1800
    metrics_port: int = 29000
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @property
    def accepted(self) -> tuple[str, ...]:
        """The keys smg accepts from clients."""
        return self.client_keys or (self.api_key,)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"{'https' if self.tls_cert_file else 'http'}://{host}:{self.port}"

    def client_context(self) -> ssl.SSLContext | None:
        """The tool's TLS context for its own calls to this gateway: the served certificate is the trust anchor
        (a self-signed one, or a leaf of any CA: partial chains accepted) and the name is not checked - the call
        goes to this host's own address, which the certificate need not name. None without TLS."""
        if not self.tls_cert_file:
            return None
        context = ssl.create_default_context(cafile=self.tls_cert_file)
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        context.check_hostname = False
        return context


def _fail(name: str, value, why: str) -> GatewayConfigError:
    shown = "<hidden>" if name.endswith(("key", "keys")) else repr(value)
    return GatewayConfigError(f"{name}={shown} is invalid: {why}")


def _int(raw: dict, name: str, default: int, low: int, high: int) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(name, value, f"expected an integer in {low}..{high}")
    return value


def _key(raw: dict, name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or len(value) < MIN_KEY or any(c.isspace() or c == ":" for c in value):
        raise _fail(name, value, f"expected a secret of at least {MIN_KEY} characters without spaces or ':' "
                                 "(set it in the gateway's key file, e.g. k26_gateway_api_key in the vault)")
    return value


def _client_keys(raw: dict, api_key: str) -> tuple[str, ...]:
    """client_keys: 1..4 distinct keys holding the fleet's key (default: the fleet's key alone)."""
    keys = raw.get("client_keys", [api_key])
    if not isinstance(keys, list) or not 1 <= len(keys) <= 4:
        raise _fail("client_keys", keys, "expected a list of 1 to 4 keys")
    checked = tuple(_key({"client_keys": k}, "client_keys") for k in keys)
    if len(set(checked)) != len(checked):
        raise _fail("client_keys", keys, "a key is listed twice")
    if api_key not in checked:
        raise _fail("client_keys", keys, "must hold the fleet's key (api_key): clients could not use it through the "
                                         "gateway; add it (k26_gateway_api_keys) or, for a rotation, list the next key "
                                         "there one deploy ahead")
    return checked


def _worker(url) -> str:
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise _fail("workers", url, "expected a list of http(s)://host:port URLs of the k26 servers")
    return url.rstrip("/")


def parse_config(raw: dict) -> GatewayConfig:
    """The YAML mapping -> GatewayConfig; raises GatewayConfigError naming the first bad setting."""
    if not isinstance(raw, dict):
        raise _fail("config", type(raw).__name__, "expected a mapping of settings")
    unknown = sorted(set(raw) - {"host", "port", "workers", "api_key", "admin_key", "client_keys", "policy", "health",
                                 "request_timeout_secs", "metrics_port", "tls_cert_file", "tls_key_file"})
    if unknown:
        raise _fail(unknown[0], raw[unknown[0]], "not a gateway setting (a typo?)")
    workers = raw.get("workers")
    if not isinstance(workers, list) or not workers:
        raise _fail("workers", workers, "expected a non-empty list of worker URLs")
    urls = tuple(_worker(w) for w in workers)
    if len(set(urls)) != len(urls):
        raise _fail("workers", list(urls), "a worker is listed twice")
    policy = raw.get("policy", "round_robin")
    if policy not in POLICIES:
        raise _fail("policy", policy, f"expected one of {', '.join(POLICIES)}")
    host = raw.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise _fail("host", host, "expected an address to listen on")
    health_raw = raw.get("health") or {}
    if not isinstance(health_raw, dict):
        raise _fail("health", health_raw, "expected a mapping")
    endpoint = health_raw.get("endpoint", "/health")
    if not isinstance(endpoint, str) or not endpoint.startswith("/"):
        raise _fail("health.endpoint", endpoint, "expected a path such as /health")
    health = Health(interval_secs=_int(health_raw, "interval_secs", 10, 1, 3600),
                    failure_threshold=_int(health_raw, "failure_threshold", 3, 1, 100),
                    success_threshold=_int(health_raw, "success_threshold", 2, 1, 100),
                    timeout_secs=_int(health_raw, "timeout_secs", 5, 1, 600), endpoint=endpoint)
    api_key, admin_key = _key(raw, "api_key"), _key(raw, "admin_key")
    client_keys = _client_keys(raw, api_key)
    if admin_key in client_keys:
        raise _fail("admin_key", admin_key, "must differ from the clients' keys (clients must not drive the worker API)")
    cert, key = _tls_pair(raw)
    return GatewayConfig(host=host, port=_int(raw, "port", 30080, 1, 65535), workers=urls, api_key=api_key,
                         admin_key=admin_key, client_keys=client_keys, policy=policy, health=health,
                         request_timeout_secs=_int(raw, "request_timeout_secs", 1800, 1, 86400),
                         metrics_port=_int(raw, "metrics_port", 29000, 1, 65535), tls_cert_file=cert,
                         tls_key_file=key)


def _tls_pair(raw: dict) -> tuple[str | None, str | None]:
    """tls_cert_file and tls_key_file: both or neither, absolute paths of a PEM certificate and its key that load
    together (what smg would fail on at its start is named here, before the file replaces the old one)."""
    cert, key = raw.get("tls_cert_file"), raw.get("tls_key_file")
    if cert is None and key is None:
        return None, None
    for name, value in (("tls_cert_file", cert), ("tls_key_file", key)):
        if not isinstance(value, str) or not value.startswith("/"):
            raise _fail(name, value, "expected the absolute path of a PEM file (set both tls_cert_file and "
                                     "tls_key_file, or neither)")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except ssl.SSLError as err:                  # before OSError: SSLError is one
        raise _fail("tls_cert_file", cert, f"and tls_key_file={key!r} are not a certificate and its key in PEM "
                                           f"({err.reason or err}): give the certificate that matches the key") from None
    except OSError as err:
        raise _fail("tls_cert_file", cert, f"cannot be read with tls_key_file={key!r} ({err.strerror or err}): the "
                                           "gateway role writes both, the key 0640 root:<gateway group>") from None
    return cert, key


def load_config(path: str) -> GatewayConfig:
    import yaml

    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as err:
        raise GatewayConfigError(f"--config={path!r} cannot be read: {err.strerror}") from None
    return parse_config(with_key_file(raw))


def with_key_file(raw):
    """`api_key_file: PATH` -> `api_key: <the file's first line>` (exactly one of the two)."""
    if not isinstance(raw, dict) or "api_key_file" not in raw:
        return raw
    path = raw["api_key_file"]
    if "api_key" in raw:
        raise _fail("api_key_file", path, "set api_key or api_key_file, not both")
    if not isinstance(path, str) or not path.startswith("/"):
        raise _fail("api_key_file", path, "expected the absolute path of the file holding the fleet's key")
    try:
        with open(path) as f:
            key = f.readline().strip()
    except OSError as err:
        raise _fail("api_key_file", path, f"cannot be read ({err.strerror}): the gateway role writes it 0640 "
                                          "root:<gateway group>") from None
    return {**{k: v for k, v in raw.items() if k != "api_key_file"}, "api_key": key}


# --- serve ---------------------------------------------------------------------------------------

def router_args(cfg: GatewayConfig):
    """smg's RouterArgs for this configuration (keys passed in-process): the clients' keys as smg's
    api_key and tenant keys, the admin key for its worker API. No worker URLs: smg's own start-up
    registration would call each worker with its api_key, the first client key, which a finished
    rotation has retired on the workers; register_workers adds them with the fleet's key."""
    from smg.router_args import RouterArgs

    first, *others = cfg.accepted
    return RouterArgs(worker_urls=[], host=cfg.host, port=cfg.port, policy=cfg.policy, api_key=first,
                      tenant_api_keys=[(f"k26-key-{i}", key) for i, key in enumerate(others, start=2)],
                      control_plane_api_keys=[("k26-ops", "k26 operators", cfg.admin_key, "admin")],
                      health_check_interval_secs=cfg.health.interval_secs,
                      health_failure_threshold=cfg.health.failure_threshold,
                      health_success_threshold=cfg.health.success_threshold,
                      health_check_timeout_secs=cfg.health.timeout_secs,
                      health_check_endpoint=cfg.health.endpoint,
                      request_timeout_secs=cfg.request_timeout_secs,
                      # smg's own default is 0.0.0.0:29000: bound to the gateway's address instead
                      prometheus_host=cfg.host, prometheus_port=cfg.metrics_port,
                      server_cert_path=cfg.tls_cert_file, server_key_path=cfg.tls_key_file,
                      disable_tokenizer_autoload=True)


def serve(cfg: GatewayConfig) -> None:
    from smg.launch_router import launch_router

    threading.Thread(target=register_workers, args=(Pool(cfg),), name="k26-register", daemon=True).start()
    launch_router(router_args(cfg))


def register_workers(pool: Pool, retry_secs: float = 30, settle_secs: float = 2) -> None:
    """Add every worker of the file once, with the fleet's key, as smg's own start-up registration
    would: a worker that is down is asked again every `retry_secs` until it has joined once; after
    that take-out and put-back own it."""
    pool.wait_until_up()
    pending = list(pool.cfg.workers)
    while pending:
        for url in pending:
            try:
                pool.add(url)
            except (GatewayHTTPError, OSError) as err:   # smg refused it or is restarting: the next round
                print(f"k26_gateway: registering {url}: {err}", file=sys.stderr, flush=True)
        pool.sleep(settle_secs)
        pending = [url for url in pending if pool.find(url) is None]
        if pending:
            pool.sleep(retry_secs - settle_secs)


# --- the worker pool -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    status: str        # smg's: ready, draining, ...
    healthy: bool


class Pool:
    """The gateway's worker API (admin key); with `record`, a folder that remembers each worker taken
    out until it is put back (the reason a worker is out survives the run that took it out)."""

    def __init__(self, cfg: GatewayConfig, sleep=time.sleep, clock=time.monotonic, record: str | None = None):
        self.cfg, self.sleep, self.clock, self.record = cfg, sleep, clock, record

    def _record_path(self, url: str):
        import hashlib
        import pathlib

        return pathlib.Path(self.record) / (hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16] + ".json")

    def remember_out(self, url: str, reason: str) -> None:
        if not self.record:
            return
        path = self._record_path(url)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_text(json.dumps({"url": url.rstrip("/"), "reason": reason,
                                    "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")

    def forget_out(self, url: str) -> None:
        if self.record:
            self._record_path(url).unlink(missing_ok=True)

    def out_records(self) -> list[dict]:
        import pathlib

        folder = pathlib.Path(self.record) if self.record else None
        return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder and folder.is_dir() else []

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        req = urllib.request.Request(self.cfg.url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {self.cfg.admin_key}",
                                              "content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.cfg.client_context()) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as err:
            raise GatewayHTTPError(method, path, err.code, err.read().decode(errors="replace")) from None

    def workers(self) -> list[Worker]:
        return [Worker(id=w["id"], url=w["url"].rstrip("/"), status=w.get("status", ""),
                       healthy=bool(w.get("is_healthy"))) for w in self._call("GET", "/workers")["workers"]]

    def find(self, url: str) -> Worker | None:
        return next((w for w in self.workers() if w.url == url.rstrip("/")), None)

    def _wait(self, what: str, done, timeout: float) -> None:
        deadline = self.clock() + timeout
        while not done():
            if self.clock() > deadline:
                raise TimeoutError(f"{what} did not happen within {timeout:g} s")
            self.sleep(0.5)

    def wait_until_up(self, timeout: float = 300) -> None:
        """Until smg answers its worker API (it has bound its port)."""
        def up() -> bool:
            try:
                self.workers()
                return True
            except (GatewayHTTPError, OSError):
                return False
        self._wait("the gateway answering its worker API", up, timeout)

    def add(self, url: str) -> None:
        """POST /workers with the fleet's key (smg's own calls to the worker use it). smg adds the
        worker in the background; a 409 says it is still adding it, which is the same."""
        try:
            self._call("POST", "/workers", {"url": url.rstrip("/"), "api_key": self.cfg.api_key})
        except GatewayHTTPError as err:
            if err.status != 409 or "WORKER_CREATE_IN_PROGRESS" not in err.body:
                raise

    def take_out(self, url: str, timeout: float, reason: str = "taken out") -> str:
        """Drain and drop `url`: it gets no new request, its in-flight ones finish. Idempotent."""
        self.remember_out(url, reason)       # first: a run that dies during the drain leaves the reason
        worker = self.find(url)
        if worker is None:
            return f"{url} is not in the pool"
        self._call("DELETE", f"/workers/{worker.id}")
        self._wait(f"draining {url}", lambda: self.find(url) is None, timeout)
        return f"{url} taken out (drained)"

    def put_back(self, url: str, timeout: float) -> str:
        """Add `url` and wait until the gateway routes to it (healthy, ready). Idempotent."""
        if url.rstrip("/") not in self.cfg.workers:
            raise GatewayConfigError(f"worker {url!r} is not one of this gateway's workers {list(self.cfg.workers)}")
        worker = self.find(url)
        if worker is not None and worker.status == "draining":
            self._wait(f"the end of {url}'s draining", lambda: self.find(url) is None, timeout)
            worker = None
        if worker is None:
            self.add(url)

        def ready() -> bool:
            w = self.find(url)
            return w is not None and w.healthy and w.status == "ready" and authorized(url, self.cfg.api_key)

        try:
            self._wait(f"{url} becoming ready in the pool", ready, timeout)
        except TimeoutError:
            if not authorized(url, self.cfg.api_key):
                raise TimeoutError(f"{url} refuses the gateway's key (GET /v1/models answers {key_status(url, self.cfg.api_key)}): "
                                   "the host's k26_api_key differs from the api_key in the gateway's file; deploy the "
                                   "gateway with the host's key (playbooks: the key rotation in docs/gateway.md)") from None
            raise
        self.forget_out(url)
        return f"{url} in the pool"

    def status(self) -> list[dict]:
        """Every worker as smg reports it, plus whether it accepts the gateway's key ("authorized"):
        smg's health check (/health) needs no key, so a host whose key differs is healthy and ready
        to smg while every routed request gets 401."""
        present = [{**w.__dict__, "authorized": authorized(w.url, self.cfg.api_key)} for w in self.workers()]
        seen = {w["url"] for w in present}
        out = [{"url": r["url"], "status": "out", "healthy": False, "authorized": False,
                "reason": f"{r['reason']} at {r['since']}, not put back since"}
               for r in self.out_records() if r["url"] not in seen]
        return present + out


def key_status(url: str, api_key: str, timeout: float = 10) -> int | str:
    """The HTTP status of GET /v1/models on the worker with the gateway's key (or the error's name)."""
    req = urllib.request.Request(url.rstrip("/") + "/v1/models", headers={"Authorization": f"Bearer {api_key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError) as err:
        return type(err).__name__


def authorized(url: str, api_key: str) -> bool:
    """Whether the worker answers the gateway's key with 200 (not 401)."""
    return key_status(url, api_key) == 200


# --- a routed request --------------------------------------------------------------------------------

def probe(cfg: GatewayConfig, model: str, requests: int, timeout: float = 60) -> dict:
    """`requests` short completions through the gateway; {"sent", "answered", "errors"}."""
    body = json.dumps({"model": model, "prompt": "The gateway routes", "max_tokens": 4,
                       "temperature": 0}).encode()
    answered, errors = 0, []
    for _ in range(requests):
        req = urllib.request.Request(cfg.url + "/v1/completions", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {cfg.api_key}",
                                              "content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=cfg.client_context()) as r:
                text = json.loads(r.read())["choices"][0].get("text")
            answered += isinstance(text, str)
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as err:
            errors.append(f"{type(err).__name__}: {getattr(err, 'code', '')} {str(err)[:200]}")
    return {"sent": requests, "answered": answered, "errors": errors[:3]}


def wait_healthy(cfg: GatewayConfig, timeout: float, sleep=time.sleep, clock=time.monotonic) -> str:
    """Poll the gateway's own /health until it answers 200; the last error at the timeout."""
    deadline, last = clock() + timeout, "no answer yet"
    while True:
        try:
            with urllib.request.urlopen(cfg.url + "/health", timeout=5, context=cfg.client_context()) as r:
                if r.status == 200:
                    return f"{cfg.url}/health answers 200"
                last = f"status {r.status}"
        except urllib.error.HTTPError as err:
            last = f"status {err.code}"
        except (urllib.error.URLError, OSError) as err:
            last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        if clock() >= deadline:
            raise TimeoutError(f"{cfg.url}/health did not answer 200 within {timeout:g} s (last: {last}); the "
                               "gateway's journal says why: journalctl -u k26-gateway")
        sleep(1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="k26_gateway", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--config", required=True)
    c = sub.add_parser("check", help="check the file's settings and exit")
    c.add_argument("--config", required=True)
    p = sub.add_parser("pool", help="the gateway's worker pool")
    p.add_argument("--config", required=True)
    p.add_argument("action", choices=("status", "take-out", "put-back"))
    p.add_argument("url", nargs="?")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--record", help="folder remembering workers taken out until put back (the gateway role's)")
    p.add_argument("--reason", default="taken out", help="who takes the worker out, kept in --record")
    t = sub.add_parser("check-tls", help="check that a certificate and key load together and exit")
    t.add_argument("--cert", required=True)
    t.add_argument("--key", required=True)
    h = sub.add_parser("health", help="wait until the gateway's own /health answers 200")
    h.add_argument("--config", required=True)
    h.add_argument("--timeout", type=float, default=120)
    q = sub.add_parser("probe", help="completions through the gateway with the clients' key")
    q.add_argument("--config", required=True)
    q.add_argument("--model", required=True)
    q.add_argument("--requests", type=int, default=4)
    args = ap.parse_args(argv)
    try:
        if args.command == "check-tls":
            _tls_pair({"tls_cert_file": args.cert, "tls_key_file": args.key})
            print(f"{args.cert}: a certificate and its key ({args.key})")
            return 0
        cfg = load_config(args.config)
        if args.command == "serve":
            serve(cfg)
            return 0
        if args.command == "check":
            print(f"{args.config}: {len(cfg.workers)} workers, policy {cfg.policy}, port {cfg.port}, "
                  f"{'TLS' if cfg.tls_cert_file else 'plain HTTP'}")
            return 0
        if args.command == "health":
            print(wait_healthy(cfg, args.timeout))
            return 0
        if args.command == "probe":
            result = probe(cfg, args.model, args.requests)
            print(json.dumps(result))
            return 0 if result["answered"] == result["sent"] else 1
        pool = Pool(cfg, record=args.record)
        if args.action == "status":
            print(json.dumps(pool.status(), indent=1))
            return 0
        if not args.url:
            ap.error(f"pool {args.action} needs the worker URL")
        print(pool.take_out(args.url, args.timeout, args.reason) if args.action == "take-out"
              else pool.put_back(args.url, args.timeout))
        return 0
    except (GatewayConfigError, TimeoutError, RuntimeError) as err:
        print(f"k26_gateway: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
