"""deploy/gateway-replicas.yaml and deploy/nginx/turnout.conf: three replicas as docs/scaling.md describes them.

The manifests' generic checks (selectors, ports, probes, images, CLI arguments) are tests/deploy/test_manifests.py's;
these check what several replicas need: shared stores in the config, one secret key and admin token for all of
them from one Secret, nothing kept on a volume only one pod can write, rolling upgrades that never drop below the
replica count, and an nginx example that nginx itself accepts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.manifests import DEPLOY, ROOT, container, named, objects, selects
from tests.support.replicas import NGINX_EXAMPLE, Balancer, balancer_site
from turnout.config import Settings, load_settings

WORKLOAD = "turnout-gateways"


def _secret_command() -> tuple[str, set[str]]:
    """The Secret the header's kubectl command creates: its name and its keys."""
    header = "\n".join(
        line[2:] for line in (DEPLOY / "gateway-replicas.yaml").read_text().splitlines() if line[:2] == "# "
    )
    found = re.search(r"create secret generic (\S+)", header)
    assert found, "the header says how to create the Secret"
    return found.group(1), set(re.findall(r"--from-literal=([A-Z_]+)=", header))


def _settings(tmp_path: Path, env: dict[str, str]) -> Settings:
    data = named("ConfigMap", "turnout-gateways-config")["data"]["config.json"]
    path = tmp_path / "config.json"
    path.write_text(data)
    return load_settings(path, env=env)


def test_the_config_shares_postgresql_and_redis_and_keeps_nothing_on_a_pod_volume(tmp_path: Path) -> None:
    settings = _settings(tmp_path, {})
    assert (settings.storage.database_url or "").startswith("postgresql://")
    assert (settings.storage.redis_url or "").startswith("redis://")
    assert urlsplit(settings.storage.database_url or "").password is None  # the password comes from the Secret
    c = container(WORKLOAD)
    mounts = c.mounts()
    assert str(settings.data_dir) in mounts
    assert "emptyDir" in mounts[str(settings.data_dir)], "a volume one pod owns would pin a replica to it"
    assert settings.pools is not None and settings.pools.kubernetes is not None  # claims from the cluster


def test_every_replica_gets_the_same_secret_key_and_admin_token(tmp_path: Path) -> None:
    name, keys = _secret_command()
    c = container(WORKLOAD)
    assert [e["secretRef"]["name"] for e in c.spec["envFrom"]] == [name]
    assert keys == {"PGPASSWORD", "TURNOUT_SECRET_KEY", "TURNOUT_ADMIN_TOKEN"}
    settings = _settings(tmp_path, {"TURNOUT_SECRET_KEY": "k" * 43 + "=", "TURNOUT_ADMIN_TOKEN": "t"})
    assert settings.endpoint_env.secret_key == "k" * 43 + "=" and settings.admin_token == "t"  # read from there
    account = c.pod["serviceAccountName"]
    assert named("ServiceAccount", account)["metadata"]["namespace"] == c.namespace  # gateway-rbac.yaml


def test_three_replicas_that_a_rolling_upgrade_never_drops_below() -> None:
    deployment = named("Deployment", WORKLOAD)
    replicas = deployment["spec"]["replicas"]
    assert replicas >= 3
    rolling = deployment["spec"]["strategy"]
    assert rolling["type"] == "RollingUpdate" and rolling["rollingUpdate"]["maxUnavailable"] == 0
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (budget,) = [b for b in objects("PodDisruptionBudget") if selects(b["spec"]["selector"], labels)]
    assert 0 < budget["spec"]["minAvailable"] < replicas
    service = named("Service", WORKLOAD)
    assert selects({"matchLabels": service["spec"]["selector"]}, labels)


def test_the_nginx_example_is_what_nginx_accepts(tmp_path: Path) -> None:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.fail("nginx is not installed (scripts/test installs it)")
    text = NGINX_EXAMPLE.read_text()
    for directive in (
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "proxy_buffering off;",
        "proxy_next_upstream error timeout;",
        "keepalive ",
    ):
        assert directive in text, directive
    balancer = Balancer(tmp_path, 8080)
    conf = balancer.write_config([18001, 18002, 18003])
    check = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-e", str(tmp_path / "e.log"), "-c", str(conf)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    site = balancer_site([18001, 18002, 18003], 8080)
    assert site.count("server 127.0.0.1:") == 3 and "10.0.0." not in site and "listen 127.0.0.1:8080;" in site


def test_the_docs_show_the_shipped_nginx_example() -> None:
    scaling = (ROOT / "docs" / "scaling.md").read_text()
    blocks = re.findall(r"```nginx\n(.*?)```", scaling, re.S)
    assert NGINX_EXAMPLE.read_text() in blocks, "docs/scaling.md shows deploy/nginx/turnout.conf as it is"
    assert json.loads(named("ConfigMap", "turnout-gateways-config")["data"]["config.json"])  # and a JSON config
