"""A second API key accepted during a key rotation (`--previous-api-key`, read from `--config`).

SGLang 0.5.23 takes one `--api-key`. Behind the fleet gateway (smg, which passes each client's
`Authorization` header on to the worker) a rotation with no failed request needs every server to
take the old key and the new one while clients move over: the deployment renders the new key as
`api-key` and the old one as `previous-api-key` in the server's config file, rolls the fleet, and
removes `previous-api-key` with a second roll once no client sends the old key.

Three hooks, all in the launcher process, where the HTTP server runs:
- `add_cli_args` AFTER: the `--previous-api-key` flag (one value, so `--config` files may carry it);
- `from_cli_args` AFTER: the value kept in this module (never in the environment, never on
  ServerArgs, so never in SGLang's start-up log line); refused without `--api-key` or equal to it;
- `sglang.srt.utils.auth.decide_request_auth` AROUND: a request SGLang refuses is decided again with
  the previous key in place of `api_key`. Admin keys are untouched: an endpoint that needs the admin
  key still needs it.
"""

from __future__ import annotations

import argparse

DECIDE = "sglang.srt.utils.auth.decide_request_auth"
_previous_api_key: str | None = None


class KeyRotationError(ValueError):
    """A previous key that cannot work; the message names the flag and the fix."""


def add_cli_args(result, *args, **kwargs):
    """AFTER hook on ServerArgs.add_cli_args(parser)."""
    parser = next(a for a in list(args) + list(kwargs.values()) if isinstance(a, argparse.ArgumentParser))
    group = parser.add_argument_group("API key rotation (k26-ddtree plugin)")
    group.add_argument("--previous-api-key", default=None,
                       help="a second key accepted beside --api-key while clients move to a new key; keep it in "
                            "the --config file, like the key")
    return result


def capture(result, *args, **kwargs):
    """AFTER hook on ServerArgs.from_cli_args(args): keep the previous key in this process."""
    global _previous_api_key
    ns = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, argparse.Namespace)), None)
    previous = getattr(ns, "previous_api_key", None) if ns is not None else None
    if previous and not getattr(ns, "api_key", None):
        raise KeyRotationError("--previous-api-key is set without --api-key: a rotation keeps the new key as api-key "
                               "and the old one as previous-api-key")
    if previous and previous == ns.api_key:
        raise KeyRotationError("--previous-api-key equals --api-key: set it to the key being retired, or remove it")
    _previous_api_key = previous or None
    return result


def accept_previous(original, *args, **kwargs):
    """AROUND hook on decide_request_auth(*, method, path, authorization_header, api_key,
    admin_api_key, auth_level): refused with the current key, decided again with the previous one."""
    decision = original(*args, **kwargs)
    if decision.allowed or not _previous_api_key or not kwargs.get("api_key"):
        return decision
    return original(*args, **{**kwargs, "api_key": _previous_api_key})
