"""TLS in front of the gateway on the sandbox fleet (issue 47): `deploy.yml` on the gateway host with
k26_gateway_tls_cert / k26_gateway_tls_key (a self-signed pair made here) serves the clients' port over TLS; a pair
that does not belong together is refused before it replaces the served one; without them the port is plain HTTP
again and the TLS files are gone. The sandbox shares this machine's network, so the checks are a client's on
127.0.0.1:30080."""

from __future__ import annotations

import ssl

import httpx
import pytest
import yaml

from tests.helpers import self_signed

from .conftest import deploy, guest

GATEWAY_PORT = 30080
API_KEY = "sandbox-demo-key"


def tls_vars(tmp, cert, key) -> str:
    path = tmp / "tls.yml"
    path.write_text(yaml.safe_dump({"k26_gateway_tls_cert": cert.read_text(), "k26_gateway_tls_key": key.read_text()}))
    return f"@{path}"


def gateway_deploy(tmp, *extra: str):
    return deploy("--limit", "gateway", *extra, tmp=tmp, fleet=True)


def complete(url: str, verify) -> int:
    r = httpx.post(url + "/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60, verify=verify,
                   json={"model": "k26-sandbox-tiny", "prompt": "tls", "max_tokens": 2})
    return r.status_code


def gateway_pid() -> str:
    return guest("systemctl show -p MainPID --value k26-gateway", host="k26-gateway").stdout.strip()


@pytest.fixture
def plain_again(fleet_deployed, tmp_path):
    """The gateway back on plain HTTP after the test, whatever it left (the fleet's other tests use it)."""
    yield
    if "tls_cert_file" in guest("cat /etc/k26-gateway/gateway.yaml", host="k26-gateway").stdout:
        play = gateway_deploy(tmp_path)
        assert play.rc == 0, play.out[-3000:]


@pytest.mark.extended     # make test's time: smg over TLS and the pair rules are tests/serve/test_gateway.py's (CPU)
def test_the_gateway_serves_tls_refuses_a_mismatched_pair_and_goes_back_to_plain_http(fleet_deployed, tmp_path,
                                                                                       plain_again):
    cert, key = self_signed(tmp_path / "a")
    other_cert, _ = self_signed(tmp_path / "b", "other.test")
    https, http = f"https://127.0.0.1:{GATEWAY_PORT}", f"http://127.0.0.1:{GATEWAY_PORT}"
    trusted = ssl.create_default_context(cafile=str(cert))

    play = gateway_deploy(tmp_path, "-e", tls_vars(tmp_path, cert, key))
    assert play.rc == 0, play.out[-3000:]
    assert "gateway healthy on port 30080: 2 workers ready" in play.out
    assert "PRIVATE KEY" not in play.out                                         # the key is never printed
    assert complete(https, trusted) == 200
    with pytest.raises(httpx.HTTPError):                                         # no plain HTTP on the port
        complete(http, True)
    files = guest("stat -c '%n %a %U %G' /etc/k26-gateway/tls/*.pem", host="k26-gateway").stdout.split("\n")
    modes = sorted(" ".join(line.split()[1:]) for line in files if line)
    assert modes == ["640 root k26gw", "644 root root"], files
    served_pid = gateway_pid()

    mismatched = gateway_deploy(tmp_path, "-e", tls_vars(tmp_path, other_cert, key))
    assert mismatched.rc != 0
    assert "are not a certificate and its key" in mismatched.out, mismatched.out[-3000:]
    assert gateway_pid() == served_pid and complete(https, trusted) == 200       # the served pair stays

    plain = gateway_deploy(tmp_path)
    assert plain.rc == 0, plain.out[-3000:]
    assert complete(http, True) == 200
    assert guest("ls /etc/k26-gateway/tls/ | grep -c pem || true", host="k26-gateway").stdout.strip() == "0"
