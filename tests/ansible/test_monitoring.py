"""The monitoring role without a host: the files it renders from the sandbox's and the production
inventory (scrape targets, collector settings, thresholds from a sweep), checked by Debian 12's own
promtool and amtool (`make promtool`), the package pins against the Makefile's, and the service
settings the textfile collector reads back from the repository's rendered units."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml

from .conftest import BIN, ROOT, load_filters, run
from .test_static import render

_spec = importlib.util.spec_from_file_location("k26_textfile_metrics", ROOT / "roles/monitoring/files/k26_textfile_metrics.py")
collector = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("k26_textfile_metrics", collector)
_spec.loader.exec_module(collector)

PRODUCTION_FLEET = """
k26_gateway:
  hosts:
    k26-gw-01: {ansible_host: 192.0.2.20, ansible_user: deploy}
k26_monitor:
  hosts:
    k26-gw-01:
"""


def render_monitoring(tmp: Path, vault_pass: Path, *inventories: str, extra: tuple = ()) -> dict[str, str]:
    out = tmp / "render-monitoring"
    out.mkdir(parents=True, exist_ok=True)
    args = [str(BIN / "ansible-playbook")]
    for inv in inventories:
        args += ["-i", inv]
    r = run(args + ["tests/ansible/render_monitoring.yml", "--vault-password-file", str(vault_pass),
                    "-e", f"k26_render_dir={out}", *extra], tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {p.name: p.read_text() for p in out.iterdir()}


def tool(name: str) -> str:
    path = os.environ.get(f"K26_{name.upper()}")
    if not path:
        pytest.skip(f"K26_{name.upper()} is not set: `make promtool` unpacks Debian's, make test sets it")
    return path


def targets(prometheus: dict) -> dict[str, list[tuple[str, str]]]:
    return {job["job_name"]: [(c["labels"]["host"], c["targets"][0]) for c in job["static_configs"]]
            for job in prometheus["scrape_configs"]}


def test_the_sandbox_scrapes_every_host_from_the_inventory(tmp_path, vault_pass):
    files = render_monitoring(tmp_path, vault_pass, "inventory/sandbox")
    assert sorted(files) == ["gateway.alertmanager.yml", "gateway.grafana-dashboards-k26.yaml",
                             "gateway.grafana-datasources-k26.yaml", "gateway.metrics.json", "gateway.prometheus.yml",
                             "sandbox.metrics.json", "sandbox2.metrics.json"]
    prom = yaml.safe_load(files["gateway.prometheus.yml"])
    assert targets(prom) == {
        "k26-server": [("sandbox", "127.0.0.1:30000"), ("sandbox2", "127.0.0.1:30001")],
        "k26-gateway": [("gateway", "127.0.0.1:29000")],
        "k26-node": [("sandbox", "127.0.0.1:9101"), ("sandbox2", "127.0.0.1:9102"), ("gateway", "127.0.0.1:9103")],
        "k26-monitor": [("gateway", "127.0.0.1:9090"), ("gateway", "127.0.0.1:9093")]}
    assert [j["honor_labels"] for j in prom["scrape_configs"]] == [False, False, True, False]
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    # no key anywhere in the monitoring files: /metrics is open on every server and on smg
    assert not any("sandbox-demo-key" in text for text in files.values())
    gateway = json.loads(files["gateway.metrics.json"])
    assert gateway["expected_workers"] == {"http://127.0.0.1:30000": "sandbox", "http://127.0.0.1:30001": "sandbox2"}
    assert gateway["locks"] == {"fleet": "/run/k26-fleet"} and gateway["service_unit"] == ""
    server = json.loads(files["sandbox2.metrics.json"])
    assert server["locks"] == {"host": "/run/k26-deploy"} and server["expected_workers"] == {}
    assert server["service_unit"] == "/etc/systemd/system/k26-ddtree.service"
    assert server["thresholds"]["accept_length_floor"] == 0.9          # the sandbox's random pair (its group_vars)
    assert server["disks"]["extra-1"] == "/var/lib/k26-disk-standin"     # the disk stand-in the sandbox test fills
    receivers = yaml.safe_load(files["gateway.alertmanager.yml"])["receivers"]
    assert [(r["name"], r["webhook_configs"][0]["url"]) for r in receivers] == [
        ("k26-page", "http://127.0.0.1:39093/alerts"), ("k26-ticket", "http://127.0.0.1:39093/alerts"),   # no ticket hook
        ("k26-heartbeat", "http://127.0.0.1:39093/heartbeat")]


def test_the_rendered_configurations_pass_promtool_and_amtool(tmp_path, vault_pass):
    promtool, amtool = tool("promtool"), tool("amtool")
    shutil.copy(ROOT / "roles/monitoring/files/k26-alerts.rules.yml", tmp_path / "k26-alerts.rules.yml")
    inventory = tmp_path / "fleet.yml"
    inventory.write_text(PRODUCTION_FLEET)
    for name, invs, extra in (("sandbox", ["inventory/sandbox"], ()),
                              ("production", ["inventory/production", str(inventory)], ()),
                              ("no-webhook", ["inventory/sandbox"], ("-e", '{"k26_alert_webhooks": []}'))):
        files = render_monitoring(tmp_path / name, vault_pass, *invs,
                                  extra=("-e", f"k26_monitoring_config_dir={tmp_path}", *extra))
        monitor = "gateway" if name != "production" else "k26-gw-01"
        for kind, cmd in (("prometheus.yml", [promtool, "check", "config"]), ("alertmanager.yml", [amtool, "check-config"])):
            path = tmp_path / f"{name}.{kind}"
            path.write_text(files[f"{monitor}.{kind}"])
            r = subprocess.run(cmd + [str(path)], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, (name, kind, r.stdout + r.stderr)
        if name == "no-webhook":
            assert yaml.safe_load(files["gateway.alertmanager.yml"])["receivers"][:2] == [{"name": "k26-page"},
                                                                                        {"name": "k26-ticket"}]


def rules() -> list[dict]:
    text = (ROOT / "roles/monitoring/files/k26-alerts.rules.yml").read_text()
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r]


def test_pages_and_tickets_reach_their_own_receivers_and_a_down_host_pages_once(tmp_path, vault_pass):
    """Issue 71, item 2, on the rendered Alertmanager configuration with amtool's own router: every alert of the rules
    by its severity (pages to the on-call, tickets to theirs, the heartbeat alone), failed notifications to both; the
    inhibition of a down host's node exporter covers every server and GPU alert of that host and nothing else."""
    amtool = tool("amtool")
    files = render_monitoring(tmp_path, vault_pass, "inventory/sandbox", extra=(
        "-e", '{"k26_alert_ticket_webhooks": ["http://127.0.0.1:39093/tickets"]}'))
    config = tmp_path / "alertmanager.yml"
    config.write_text(files["gateway.alertmanager.yml"])
    want = {"page": "k26-page", "ticket": "k26-ticket"}
    for rule in rules():
        labels = [f"alertname={rule['alert']}", f"severity={rule['labels']['severity']}", "host=gpu1"]
        r = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}", *labels],
                           capture_output=True, text=True, timeout=60)
        got = r.stdout.strip()
        expected = {"K26DeadMansSwitch": "k26-heartbeat",
                    "K26NotificationsFailing": "k26-ticket,k26-page"}.get(rule["alert"]) or want[rule["labels"]["severity"]]
        assert got == expected, (rule["alert"], got, r.stderr)
    receivers = {r["name"]: r["webhook_configs"][0]["url"] for r in yaml.safe_load(config.read_text())["receivers"]}
    assert receivers["k26-ticket"] == "http://127.0.0.1:39093/tickets"
    inhibit = yaml.safe_load(config.read_text())["inhibit_rules"]
    assert len(inhibit) == 1 and inhibit[0]["equal"] == ["host"]
    assert inhibit[0]["source_matchers"] == ['alertname="K26TargetDown"', 'job="k26-node"']
    pattern = re.fullmatch(r'alertname=~"(.*)"', inhibit[0]["target_matchers"][0]).group(1)
    silenced = {r["alert"] for r in rules() if re.fullmatch(pattern, r["alert"])}
    host_alerts = {r["alert"] for r in rules() if r["alert"].startswith(("K26Server", "K26Gpu"))}
    assert host_alerts <= silenced and "K26TargetDown" not in silenced and "K26DeadMansSwitch" not in silenced
    assert "K26GatewayWorkerNotReady" not in silenced          # the gateway's view of a worker still pages


def test_production_targets_come_from_the_worker_urls_and_the_host_addresses(tmp_path, vault_pass):
    inventory = tmp_path / "fleet.yml"
    inventory.write_text(PRODUCTION_FLEET)
    files = render_monitoring(tmp_path, vault_pass, "inventory/production", str(inventory))
    prom = yaml.safe_load(files["k26-gw-01.prometheus.yml"])
    assert targets(prom) == {
        "k26-server": [("k26-gpu-01", "192.0.2.10:30000")], "k26-gateway": [("k26-gw-01", "192.0.2.20:29000")],
        "k26-node": [("k26-gpu-01", "192.0.2.10:9100"), ("k26-gw-01", "192.0.2.20:9100")],
        "k26-monitor": [("k26-gw-01", "127.0.0.1:9090"), ("k26-gw-01", "127.0.0.1:9093")]}
    assert prom["global"]["scrape_interval"] == "15s"
    server = json.loads(files["k26-gpu-01.metrics.json"])
    # every threshold the rules read, on every host (no sweep yet: the tokens/s floor is 0, which the rules report
    # as K26AlertThresholdMissing); the collector's age bound from its interval
    assert server["thresholds"] == {
        "accept_length_floor": 1.5, "accept_length_drop_share": 0.7, "tokens_per_s_per_request_floor": 0.0, "queue_depth_max": 32,
        "queue_wait_seconds_max": 30.0, "ttft_p95_seconds_max": 10.0, "itl_p95_seconds_max": 0.25,
        "error_ratio_budget": 0.005, "abort_ratio_max": 0.05, "kv_usage_max": 0.95, "hang_seconds_max": 300.0, "load_seconds_max": 3600.0, "gpu_temperature_max": 85.0,
        "disk_used_ratio_max": 0.9, "collector_max_age_seconds": 120, "clock_skew_seconds_max": 0.5}
    assert json.loads(files["k26-gw-01.metrics.json"])["thresholds"] == server["thresholds"]
    # the root, log and model disks (a gateway host has no model)
    model = server["disks"].pop("model")
    assert server["disks"] == {"root": "/", "logs": "/var/log"} and model.startswith("/")
    assert json.loads(files["k26-gw-01.metrics.json"])["disks"] == {"root": "/", "logs": "/var/log"}
    # the dead man's switch to its own receiver only, on its own interval
    alertmanager = yaml.safe_load(files["k26-gw-01.alertmanager.yml"])
    heartbeat = alertmanager["route"]["routes"][0]
    assert heartbeat["matchers"] == ['alertname="K26DeadMansSwitch"'] and heartbeat["receiver"] == "k26-heartbeat"
    assert heartbeat["repeat_interval"] == "5m" and heartbeat["continue"] is False


def test_a_sweeps_thresholds_become_the_floors_unless_the_inventory_sets_them(tmp_path, vault_pass):
    sweep = tmp_path / "sweep-results" / "20261202T050000Z"
    sweep.mkdir(parents=True)
    (sweep / "thresholds.json").write_text(json.dumps({"accept_length_floor": 4.4, "tokens_per_s_per_request_floor": 31.5,
                                                       "ttft_p95_seconds_max": 1.8, "itl_p95_seconds_max": 0.045}))
    files = render_monitoring(tmp_path / "a", vault_pass, "inventory/production",
                              extra=("-e", f"k26_alert_sweep_results={sweep}"))
    floors = json.loads(files["k26-gpu-01.metrics.json"])["thresholds"]
    assert (floors["accept_length_floor"], floors["tokens_per_s_per_request_floor"]) == (4.4, 31.5)
    assert (floors["ttft_p95_seconds_max"], floors["itl_p95_seconds_max"]) == (1.8, 0.045)    # issue 49
    # the sandbox's group_vars set both floors themselves: the sweep gives only the latency bounds there
    files = render_monitoring(tmp_path / "b", vault_pass, "inventory/sandbox", extra=("-e", f"k26_alert_sweep_results={sweep}"))
    floors = json.loads(files["sandbox.metrics.json"])["thresholds"]
    assert floors["accept_length_floor"] == 0.9 and floors["tokens_per_s_per_request_floor"] == 0.5
    assert floors["ttft_p95_seconds_max"] == 1.8


def test_a_grafana_host_gets_the_dashboard_folder_and_the_data_source_it_names(tmp_path, vault_pass):
    """Issue 49: the provisioning files of a k26_grafana host: the dashboard folder the role fills, and a Prometheus
    data source under the name and uid the dashboard's data-source variable defaults to."""
    files = render_monitoring(tmp_path, vault_pass, "inventory/sandbox",
                              extra=("-e", "k26_grafana_prometheus_url=http://10.0.0.5:9090"))
    [provider] = yaml.safe_load(files["gateway.grafana-dashboards-k26.yaml"])["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/k26-monitoring/grafana"
    assert provider["allowUiUpdates"] is False
    [source] = yaml.safe_load(files["gateway.grafana-datasources-k26.yaml"])["datasources"]
    assert (source["type"], source["url"], source["uid"]) == ("prometheus", "http://10.0.0.5:9090", "k26-prometheus")
    dashboard = json.loads((ROOT / "roles/monitoring/files/k26-dashboard.json").read_text())
    [variable] = [v for v in dashboard["templating"]["list"] if v["name"] == "datasource"]
    assert variable["current"]["value"] == source["name"] == source["uid"]
    # no k26_grafana host (the production example): no Grafana files
    inventory = tmp_path / "fleet.yml"
    inventory.write_text(PRODUCTION_FLEET)
    assert not [n for n in render_monitoring(tmp_path / "p", vault_pass, "inventory/production", str(inventory))
                if "grafana" in n]


def test_the_package_pins_are_the_makefiles():
    defaults = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
    make = (ROOT / "Makefile").read_text()
    prometheus = re.search(r"^PROMETHEUS_DEB := (\S+)", make, re.MULTILINE)[1]
    alertmanager = re.search(r"^ALERTMANAGER_DEB := (\S+)", make, re.MULTILINE)[1]
    assert defaults["k26_monitoring_packages"] == [f"prometheus={prometheus}", f"prometheus-alertmanager={alertmanager}"]
    assert all("=" in p for p in defaults["k26_node_exporter_packages"])


def test_the_monitoring_units_are_hardened(tmp_path):
    units = {p.name: p.read_text() for p in (ROOT / "templates/etc/systemd/system").glob("k26-*.j2")
             if p.name.split(".")[0] in ("k26-prometheus", "k26-alertmanager", "k26-node-exporter")}
    assert len(units) == 3
    for name, text in units.items():
        for line in ("User=prometheus", "NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=",
                     "PrivateDevices=yes", "RestrictNamespaces=yes", "SystemCallFilter=@system-service"):
            assert f"\n{line}\n" in text, (name, line)
    # the node exporter reads the clock's state (adjtimex, no change asked: @clock is otherwise refused, and ProtectClock
    # refuses it too); it still cannot set the clock: no capability at all (issue 49, measured: timex failed before)
    exporter = units["k26-node-exporter.service.j2"]
    assert "\nSystemCallFilter=adjtimex\n" in exporter and "\nProtectClock=no\n" in exporter
    assert "\nCapabilityBoundingSet=\n" in exporter and "\nAmbientCapabilities=\n" in exporter



def test_the_service_info_comes_from_the_rendered_units(tmp_path, vault_pass):
    """The production unit and the sandbox's (ddtree-serve, budget from its inventory), rendered by the
    repository's templates, read back as the configuration they run; a NONE unit and graphs off too."""
    production = render("production", tmp_path, vault_pass)["k26-gpu-01.service"]
    assert collector.service_lines(production, "20261202T0500Z-abc") == [
        'k26_service_info{release="20261202T0500Z-abc",algorithm="DDTREE",budget="8",topk_cap="8",cuda_graph="true"} 1']
    other = tmp_path / "other"
    other.mkdir()
    none = render("production", other, vault_pass, "-e", "k26_speculative_algorithm=NONE", "-e", "k26_cuda_graph=false",
                  "-e", "k26_draft_model_path=")["k26-gpu-01.service"]
    assert collector.service_lines(none, "r1") == [
        'k26_service_info{release="r1",algorithm="NONE",budget="",topk_cap="",cuda_graph="false"} 1']
    assert collector.service_lines(None, "r1") == [] and collector.service_lines("[Unit]\n", "r1") == []


LISTENS = [("k26-node-exporter.service.j2", "k26_node_exporter_listen", "k26_node_exporter_port"),
           ("k26-prometheus.service.j2", "k26_prometheus_listen", "k26_prometheus_port"),
           ("k26-alertmanager.service.j2", "k26_alertmanager_listen", "k26_alertmanager_port")]


@pytest.mark.parametrize(("listen", "address", "local"), [("::", "[::]:9100", "[::1]:9100"),
                                                            ("fd00::5", "[fd00::5]:9100", "[fd00::5]:9100"),
                                                            ("10.0.0.11", "10.0.0.11:9100", "10.0.0.11:9100"),
                                                            ("0.0.0.0", "0.0.0.0:9100", "127.0.0.1:9100")])
@pytest.mark.parametrize(("template", "variable", "port"), LISTENS)
def test_every_listen_address_brackets_an_ipv6_one(template, variable, port, listen, address, local):
    """Issue 72: `k26_node_exporter_listen: '::'` rendered `--web.listen-address=:::9100`; Prometheus's and
    Alertmanager's flags the same; the clients on the host (Prometheus's Alertmanager target, the exporter's check)
    reach the any-address through loopback."""
    env = jinja2.Environment()
    env.filters.update(k26_host_port=load_filters("k26_relations").k26_host_port, to_json=json.dumps)
    line = next(ln for ln in (ROOT / "templates/etc/systemd/system" / template).read_text().splitlines()
                if "--web.listen-address=" in ln)
    rendered = env.from_string(line).render({variable: listen, port: 9100})
    assert f"--web.listen-address={address} " in rendered + " "
    target = next(ln for ln in (ROOT / "templates/etc/k26-monitoring/prometheus.yml.j2").read_text().splitlines()
                  if "k26_alertmanager_listen" in ln)
    assert f'["{local}"]' in env.from_string(target).render(k26_alertmanager_listen=listen, k26_alertmanager_port=9100)
