"""deploy/: manifests agree with each other and with what the code exports (the operator test applies them to
a real API server; these checks need none)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client import generate_latest

from tests.runtime.conftest import AgentStarter
from turnout.controller.metrics import ControllerMetrics
from turnout.core.claims import POOL_LABEL, parse_claim_spec
from turnout.core.poolpolicy import parse_pool_policy

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def exported(text: str) -> set[str]:
    """Sample names an exposition offers, from its TYPE lines (present even before any sample exists)."""
    names = set()
    for kind, name in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(kind)
        if name == "counter":
            names.add(f"{kind}_total")
    return names


async def test_every_dashboard_metric_is_exported(start_agent: AgentStarter) -> None:
    url, _ = await start_agent()
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
        runtime = exported(await r.text())
    controller = exported(generate_latest(ControllerMetrics().registry).decode())
    dashboard = json.loads((DEPLOY / "grafana" / "turnout-modelclaims.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]]
    used = {m for e in exprs for m in re.findall(r"\b(aibrix[:_][A-Za-z0-9_:]+)", e)}
    assert len(used) >= 10, used
    missing = used - runtime - controller
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"
    assert {"aibrix_modelclaim_desired_replicas", "aibrix_modelclaim_activation_total"} <= controller
    assert {"aibrix:modelclaim_models_resident", "aibrix:modelclaim_kv_used_bytes"} <= runtime


def test_warm_pool_sample_is_a_valid_pool() -> None:
    deployment, service = docs("warm-pool.yaml")
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert labels[POOL_LABEL] == "true"
    # the pool's name and switch on the Deployment's own metadata as well as on its pods (the design)
    own = deployment["metadata"].get("labels") or {}
    assert own.get("pool.aibrix.ai/name") == deployment["metadata"]["name"] == labels["pool.aibrix.ai/name"]
    assert own.get(POOL_LABEL) == "true"
    assert all(labels.get(k) == v for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    parse_pool_policy(deployment["metadata"]["annotations"]["pool.aibrix.ai/policy"])  # strict parse passes
    container = template["spec"]["containers"][0]
    assert container["image"].startswith("turnout-runtime:")  # deploy/runtime.Dockerfile: tini -> `turnout agent`
    assert {"name": "runtime", "containerPort": 8080} in container["ports"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env == {"ENABLE_KVCACHED": "false", "KVCACHED_AUTOPATCH": "0"}  # the agent never loads kvcached
    assert service["metadata"]["labels"] == {"aibrix.ai/metrics": "modelclaim-runtime"}
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    for claim in docs("modelclaims.yaml"):  # the sample claims select this pool and pass the controller's rules
        spec = parse_claim_spec(claim["metadata"]["name"], claim["spec"])
        assert spec.pod_selector.matches(labels)


def test_service_monitors_find_the_services() -> None:
    operator_docs = {d["kind"]: d for d in docs("operator.yaml")}
    monitors = {d["metadata"]["name"]: d for d in docs("servicemonitor.yaml")}
    service = operator_docs["Service"]
    op_monitor = monitors["turnout-operator"]
    assert op_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert op_monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    runtime_monitor = monitors["turnout-modelclaim-runtime"]
    _, pool_service = docs("warm-pool.yaml")
    assert runtime_monitor["spec"]["selector"]["matchLabels"] == pool_service["metadata"]["labels"]
    assert runtime_monitor["spec"]["endpoints"][0]["port"] == "runtime"
    args = operator_docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--metrics-port") + 1] == str(service["spec"]["ports"][0]["port"])


def test_rbac_binds_the_operator_service_account() -> None:
    kinds = {d["kind"]: d for d in docs("rbac.yaml")}
    deployment = next(d for d in docs("operator.yaml") if d["kind"] == "Deployment")
    account = kinds["ServiceAccount"]["metadata"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]
    subject = kinds["ClusterRoleBinding"]["subjects"][0]
    assert (subject["name"], subject["namespace"]) == (account["name"], account["namespace"])


def test_gateway_manifest_config_is_valid_and_matches_its_rbac(tmp_path: Path) -> None:
    from turnout.config import load_settings

    config_map, _, deployment, service = docs("gateway.yaml")
    path = tmp_path / "config.json"
    path.write_text(config_map["data"]["config.json"])
    settings = load_settings(path, env={})
    assert settings.pools is not None and settings.pools.kubernetes is not None
    assert settings.listen.host == "0.0.0.0" and not settings.auth.open  # keys required off loopback
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == docs("gateway-rbac.yaml")[0]["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["data"] == settings.storage.data_dir and pod["containers"][0]["args"][-1].startswith(mounts["config"])
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
