"""Rules between a server host's settings that each pass alone (issue 72, item 4): every message names both
variables, what their values do together and the fix. `{{ facts | k26_relation_errors }}` -> a list of messages, where
`facts` maps the names below to the host's values (preflight's relations.yml builds it). Also the two questions the
rules share with other checks: which k26_firewall_allow entries are documentation networks (the example's
placeholder: `k26_documentation_networks`) and whether a folder is one the unit cannot see (`k26_unseen_by_unit`,
also the models role's check of each k26_models dest).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import yaml

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
ANY = {"0.0.0.0", "::", ""}
UNSEEN = ("/home/", "/root/", "/tmp/", "/run/user/", "/var/tmp/")   # ProtectHome=yes, PrivateTmp=yes in the unit
# RFC 5737's three IPv4 documentation networks and RFC 3849's IPv6 one: what examples use, never a real client
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in
                               ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))


def listed_networks(values: Iterable | None) -> Iterator[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network]]:
    """(entry as written, its network) for every entry of an address / network list that is one; the others are for
    the list's own type rule."""
    for value in values or []:
        text = str(value).strip()
        try:
            yield text, ipaddress.ip_network(text, strict=False)
        except ValueError:
            continue


def k26_documentation_networks(values) -> list[str]:
    """The entries of an address / network list inside a documentation network (an example's placeholder left in a
    site inventory)."""
    return [text for text, network in listed_networks(values)
            if any(network.version == doc.version and network.subnet_of(doc) for doc in DOCUMENTATION_NETWORKS)]


def k26_unseen_by_unit(path) -> bool:
    """A folder k26-ddtree.service cannot see: under /home, /root, /run/user or the temporary folders."""
    return (str(path) + "/").startswith(UNSEEN)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def verify_reaches_server(f: Mapping) -> str | None:
    host, verify = str(f["k26_host"]), str(f["k26_verify_host"])
    if host not in ANY and not is_loopback(host) and is_loopback(verify):
        return (f"k26_verify_host={verify} cannot reach a server bound to k26_host={host}: the deploy's health wait "
                f"would wait out k26_health_timeout and fail. Set k26_verify_host to {host} (k26_host)")
    return None


def gateway_reaches_server(f: Mapping) -> str | None:
    host, gateway = str(f["k26_host"]), str(f.get("k26_gateway_host") or "")
    # the sandbox's hosts share this machine's network: loopback reaches across them there, nowhere else
    if f.get("k26_gateway_pool") and not f.get("k26_sandbox") and gateway and gateway != f["inventory_hostname"] \
            and is_loopback(host):
        return (f"k26_host={host} binds the server to loopback, but the gateway on {gateway} (k26_gateway_host) routes "
                f"to it from another host: every routed request would fail. Bind k26_host to this host's address "
                f"({f.get('ansible_host') or f['inventory_hostname']})")
    return None


def worker_url_port(f: Mapping) -> str | None:
    url = str(f.get("k26_gateway_worker_url") or "")
    if not f.get("k26_gateway_pool") or not url:
        return None
    try:
        port = urlsplit(url).port
    except ValueError:
        return None                                      # the URL's own rule names it
    if port is not None and port != int(f["k26_port"]):
        return (f"k26_gateway_worker_url={url} names port {port} but k26_port={f['k26_port']}: the gateway would route "
                f"to a port nothing serves. Use http://HOST:{f['k26_port']}")
    return None


def tp_fits_gpus(f: Mapping) -> str | None:
    if f.get("k26_server_kind") != "sglang" or not f.get("k26_gpu_required"):
        return None
    tp, gpus = int(f["k26_tp_size"]), int(f["k26_gpu_count"])
    if tp > gpus:
        return (f"k26_tp_size={tp} needs {tp} GPUs on this host but k26_gpu_count={gpus}: the server would wait for "
                f"ranks that never start. Use k26_tp_size {gpus} or fewer")
    return None


def firewall_not_open(f: Mapping) -> str | None:
    if not f.get("k26_firewall"):
        return None
    wide = [text for text, network in listed_networks(f.get("k26_firewall_allow")) if network.prefixlen == 0]
    if wide:
        return (f"k26_firewall_allow holds {', '.join(wide)} (every address) while k26_firewall is true: the firewall "
                f"then lets every client in. Set k26_firewall: false to say so, or list the clients' networks")
    return None


def models_visible(f: Mapping) -> str | None:
    for name in ("k26_model_path", "k26_draft_model_path"):
        path = str(f.get(name) or "")
        if path and k26_unseen_by_unit(path):
            return (f"{name}={path} is in a folder the unit cannot see (ProtectHome=yes and PrivateTmp=yes in "
                    f"k26-ddtree.service hide /home, /root, /run/user and the temporary folders): the server would not "
                    f"find the weights. Stage them under /srv/models (k26_models, playbooks/stage_models.yml)")
    return None


def api_key_not_guessable(f: Mapping) -> str | None:
    key = str(f.get("k26_api_key") or "")
    if not key:
        return None
    distinct = len(set(key))
    repeated = re.fullmatch(r"(.{1,4})\1+", key) is not None
    if distinct < 8 or repeated:
        return (f"k26_api_key (not shown) has {distinct} distinct characters{' in a repeated pattern' if repeated else ''}"
                f": a guessable key for the API every client shares. Generate one with `openssl rand -hex 24` and put "
                f"it in the vault (vault_k26_api_key)")
    return None


RULES = (verify_reaches_server, gateway_reaches_server, worker_url_port, tp_fits_gpus, firewall_not_open,
         models_visible, api_key_not_guessable)


def k26_relation_errors(facts: Mapping) -> list[str]:
    return [why for rule in RULES if (why := rule(facts))]


# Folders by owner (issue 72, item 3). Root writes, or runs from, or restores from, each of ROOT_FOLDERS; a service
# user writes each of WRITABLE_FOLDERS. A root folder inside a writable one can be replaced by that service (a
# `k26_maintenance 1` line in the textfile folder mutes every page; a unit planted in the rollback folder is what root
# restores); a writable folder inside a root one puts the service's files among root's. Neither is allowed, whichever
# holds the other, equal included. k26_gpu_report_path is a file root rewrites whole at every deploy and never reads
# back (an operator's report; its default sits in the state folder): not in the rule.
ROOT_FOLDERS = ("k26_prefix", "k26_venv", "k26_config_dir", "k26_rollback_root", "k26_rollback_dir", "k26_lock_dir",
                "k26_fleet_lock_dir", "k26_monitoring_config_dir", "k26_textfile_dir", "k26_grafana_dashboards_dir",
                "k26_grafana_provisioning_dir", "k26_gateway_prefix", "k26_gateway_config_dir")
WRITABLE_FOLDERS = {"k26_state_dir": "the server's user (k26_user) writes",
                    "/var/lib/k26-prometheus": "Prometheus (user prometheus) writes",
                    "/var/lib/k26-alertmanager": "Alertmanager (user prometheus) writes"}
FOLDER_NAMES = (*ROOT_FOLDERS, "k26_state_dir")
MONITOR_ONLY = ("/var/lib/k26-prometheus", "/var/lib/k26-alertmanager")   # the monitor host's StateDirectory= folders


ROOT = Path(__file__).resolve().parents[3]


@functools.lru_cache(maxsize=1)
def _literal_folder_defaults() -> tuple[tuple[str, str], ...]:
    """The roles' own literal defaults (roles/*/defaults/main.yml, playbooks/vars/fleet.yml) of ROOT_FOLDERS and
    k26_state_dir, read once a process (the check play asks for every host)."""
    found: dict[str, str] = {}
    for path in [*sorted(ROOT.glob("roles/*/defaults/main.yml")), ROOT / "playbooks/vars/fleet.yml"]:
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            if name in FOLDER_NAMES and isinstance(value, str) and "{{" not in value:
                found[name] = value
    return tuple(found.items())


def k26_folder_values(values: Mapping) -> dict[str, str]:
    """VALUES (the host's, names it lacks or leaves empty absent) completed with the roles' own literal defaults for
    ROOT_FOLDERS and k26_state_dir: the check play loads no other role's defaults, and a default that nests with a
    value set is as wrong as two values set."""
    found = dict(_literal_folder_defaults())
    found.update({k: str(v) for k, v in values.items() if k in FOLDER_NAMES and v not in (None, "", "__k26_unset__")})
    return found


def _nests(a: str, b: str) -> bool:
    """A lies inside B or holds it (equal counts)."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def k26_folder_owner_errors(values: Mapping, monitor: bool = False, server: bool = True) -> list[str]:
    """One message per (root folder, writable folder) pair that nests, naming both variables (a fixed folder by its
    path). VALUES: the host's folder variables (ROOT_FOLDERS, k26_state_dir; those it lacks are left out); MONITOR:
    the host runs Prometheus and Alertmanager (their state folders count); SERVER: it runs the server (its
    k26_state_dir counts)."""
    writable = {name: (str(values[name]), who) for name, who in WRITABLE_FOLDERS.items()
                if name in values and (server or name != "k26_state_dir")}
    if monitor:
        writable.update({path: (path, WRITABLE_FOLDERS[path]) for path in MONITOR_ONLY})
    errors = []
    for root_name in ROOT_FOLDERS:
        root = str(values.get(root_name) or "")
        for name, (folder, who) in writable.items():
            if not root or not folder or not _nests(root, folder):
                continue
            shown = f"{name}={folder}" if name.startswith("k26_") else f"{folder} (fixed)"
            inside = root.rstrip("/") + "/" != folder.rstrip("/") + "/" and (root.rstrip("/") + "/").startswith(
                folder.rstrip("/") + "/")
            how = ("lies inside the folder " if inside else "holds or is the folder ") + f"{who}"
            errors.append(
                f"{root_name}={root} is invalid with {shown}: a folder root owns {how}, so that service could change "
                f"what root runs, restores or reads (e.g. a k26_maintenance line in the textfile folder mutes pages, "
                f"a unit in the rollback folder is what root restores); give {root_name} a folder apart from "
                f"{name if name.startswith('k26_') else folder} (the defaults keep them apart)")
    return errors


def k26_host_port(host, port, local: bool = False) -> str:
    """HOST:PORT as a listen flag or a URL takes it: an IPv6 address in brackets ([::]:9090); LOCAL (a client on the
    same host) turns the any-address into loopback (0.0.0.0 -> 127.0.0.1, :: -> [::1])."""
    text = str(host).strip("[]")
    if local and text in ("0.0.0.0", ""):
        text = "127.0.0.1"
    elif local and text == "::":
        text = "::1"
    return f"[{text}]:{port}" if ":" in text else f"{text}:{port}"


class FilterModule:
    def filters(self):
        return {"k26_relation_errors": k26_relation_errors, "k26_documentation_networks": k26_documentation_networks,
                "k26_unseen_by_unit": k26_unseen_by_unit, "k26_folder_owner_errors": k26_folder_owner_errors,
                "k26_folder_values": k26_folder_values, "k26_host_port": k26_host_port}
