"""The Prometheus scrape config and Grafana provisioning in compose/: the override file validates
with the compose file, the scrape targets are the compose services on their ports, and the
dashboard reads the Prometheus datasource that is provisioned. (That every metric the dashboard
queries is exported is checked against live services in test_ui.py.)"""

from __future__ import annotations

import json
import subprocess

import yaml

from tests.support.servers import ROOT
from tests.deploy.test_deploy import compose_binary

COMPOSE = ROOT / "compose"


def _config(tmp_path) -> dict:
    out = subprocess.run([compose_binary(), "-f", str(COMPOSE / "docker-compose.yml"), "-f",
                          str(COMPOSE / "monitoring.yml"), "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_monitoring_override_validates_and_scrapes_the_compose_services(tmp_path):
    services = _config(tmp_path)["services"]
    assert {"prometheus", "grafana", "api", "gateway"} <= set(services)
    ports = {name: {str(p.get("target")) for p in svc.get("ports") or []} for name, svc in services.items()}
    prom = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    assert set(jobs) == {"polar_mq_api", "polar_mq_gateway"}
    for job in jobs.values():
        assert job["metrics_path"] == "/metrics"
        assert job["authorization"]["credentials_file"] == "/etc/prometheus/polar-token"
        for target in job["static_configs"][0]["targets"]:
            host, port = target.split(":")
            assert host in services and port in ports[host], (target, ports.get(host))
    mounts = {v["target"] for v in services["prometheus"]["volumes"]}
    assert {"/etc/prometheus/prometheus.yml", "/etc/prometheus/polar-token"} <= mounts


def test_dashboard_uses_the_provisioned_datasource():
    ds = yaml.safe_load((COMPOSE / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = ds["datasources"][0]["uid"]
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    dash = json.loads((COMPOSE / "grafana" / "dashboards" / "polar_mq.json").read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 12
    for panel in panels:
        assert panel["datasource"]["uid"] == uid
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
