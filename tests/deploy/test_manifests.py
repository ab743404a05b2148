"""What a cluster would do with deploy/: selectors that select, ports that exist, args the CLI accepts, images that
some Dockerfile here builds, a runtime image with tini as PID 1, and RBAC that covers every API call the code
makes. tests/deploy/test_kubelet.py runs the containers themselves."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import typer

from tests.support.manifests import (
    DEPLOY,
    IMAGES,
    ROOT,
    container,
    containers,
    dockerfile_exec,
    named,
    objects,
    selects,
)
from turnout.cli import app as cli_app
from turnout.controller.kube import GROUP, PLURAL

POD_IP = "10.244.0.5"


def test_every_workload_selects_its_own_pods() -> None:
    for kind in ("Deployment", "StatefulSet", "DaemonSet"):
        for obj in objects(kind):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert selects(obj["spec"]["selector"], labels), obj["metadata"]["name"]


@pytest.mark.parametrize("service", [s["metadata"]["name"] for s in objects("Service")])
def test_services_select_pods_and_target_their_ports(service: str) -> None:
    svc = named("Service", service)
    ns = svc["metadata"].get("namespace", "default")
    backing = [
        c for c in containers() if c.namespace == ns and selects({"matchLabels": svc["spec"]["selector"]}, c.labels)
    ]
    assert backing, f"Service {service} selects no pod in deploy/"
    for port in svc["spec"]["ports"]:
        for c in backing:
            c.port(port.get("targetPort", port["port"]))  # raises when the pod has no such port


def test_service_monitors_select_services_and_ports() -> None:
    services = objects("Service")
    for monitor in objects("ServiceMonitor"):
        ns = monitor["metadata"]["namespace"]
        any_ns = (monitor["spec"].get("namespaceSelector") or {}).get("any", False)
        chosen = [
            s
            for s in services
            if (any_ns or s["metadata"].get("namespace", "default") == ns)
            and selects(monitor["spec"]["selector"], s["metadata"].get("labels") or {})
        ]
        assert chosen, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for endpoint in monitor["spec"]["endpoints"]:
            for s in chosen:
                assert endpoint["port"] in {p.get("name") for p in s["spec"]["ports"]}, (monitor, s)


def test_network_policy_admits_the_agent_and_every_engine_port() -> None:
    policy = named("NetworkPolicy", "warm-runtime-pool")
    pool = container("warm-runtime-pool")
    assert selects(policy["spec"]["podSelector"], pool.labels)
    args = pool.spec["args"]
    low, high = (int(x) for x in args[args.index("--engine-ports") + 1].split("-"))
    ranges = [(p["port"], p.get("endPort", p["port"])) for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert any(lo <= pool.port("runtime") <= hi for lo, hi in ranges)
    assert any(lo <= low and high <= hi for lo, hi in ranges), "some engine ports would be unreachable"


@pytest.mark.parametrize("c", containers(), ids=lambda c: c.workload)
def test_images_are_built_here_and_probes_name_real_ports(c: Any) -> None:
    assert c.image in IMAGES, f"{c.workload}: image {c.spec['image']} is not built by any Dockerfile in deploy/"
    for probe in c.probes().values():
        assert "httpGet" in probe, "probes are HTTP GETs on routes the tests call"
        c.port(probe["httpGet"]["port"])


def _parse(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse a turnout command line with the real CLI (its callbacks validate values) without running it."""
    group: Any = typer.main.get_command(cli_app)  # typer may bring its own copy of click's Group
    name, *rest = argv
    ctx = group.make_context("turnout", [name])
    cmd = group.get_command(ctx, name)
    assert cmd is not None, f"turnout has no command {name!r}"
    sub = cmd.make_context(name, rest, parent=ctx)  # unknown options and bad values raise here
    return str(name), dict(sub.params)


@pytest.mark.parametrize("c", containers(), ids=lambda c: c.workload)
def test_container_args_are_accepted_by_the_cli(c: Any) -> None:
    argv = c.argv(POD_IP)
    turnout_at = next(i for i, a in enumerate(argv) if Path(a).name in ("turnout", "turnout-runtime"))
    rest = argv[turnout_at + 1 :]
    if Path(argv[turnout_at]).name == "turnout-runtime":
        rest = ["agent", *rest]  # deploy/runtime-entrypoint.sh runs `turnout agent "$@"`
    name, params = _parse(rest)
    assert name in ("serve", "agent", "operator", "controller")
    if name == "agent":
        assert params["host"] not in ("127.0.0.1", "localhost", "::1"), "a pod's agent must be reachable"


def test_runtime_image_runs_tini_as_pid_1_and_the_restart_loop() -> None:
    dockerfile = IMAGES["turnout-runtime"]
    text = dockerfile.read_text()
    assert re.search(r"^ARG ENGINE_BASE=\S+", text, re.M) and re.search(r"^FROM \$\{ENGINE_BASE\}", text, re.M)
    entry = dockerfile_exec(dockerfile, "ENTRYPOINT")
    assert Path(entry[0]).name == "tini" and "--" in entry
    script = entry[entry.index("--") + 1]
    copied = re.search(rf"^COPY (\S+) {re.escape(script)}$", text, re.M)
    assert copied, f"{script} is not copied into the image"
    assert (ROOT / copied.group(1)).is_file()
    assert "tini" in text.split("ENTRYPOINT")[0], "tini must be installed"


def test_runtime_image_builds_on_the_kvcached_base_by_default() -> None:
    """The pools design shares a GPU between engines through kvcached, with a dedicated kvcached runtime image:
    the default base is kvcached's vLLM image (ovg-project/kvcached, docker/README.md: ghcr.io/ovg-project/
    kvcached-vllm), not a plain engine image; the docs name the same base."""
    text = IMAGES["turnout-runtime"].read_text()
    default = re.search(r"^ARG ENGINE_BASE=(\S+)$", text, re.M)
    assert default is not None and default.group(1) == "ghcr.io/ovg-project/kvcached-vllm:latest", default
    pools = (ROOT / "docs" / "runtime-pools.md").read_text()
    assert "ghcr.io/ovg-project/kvcached-vllm:latest" in pools


# --- RBAC: every API call in the code, by the client method's name -------------------------------------------

_KUBE = ROOT / "src" / "turnout" / "controller" / "kube.py"
_VERBS = {"list": "list", "read": "get", "get": "get", "patch": "patch", "create": "create", "replace": "update"}
_VERBS |= {"delete": "delete", "delete_collection": "deletecollection"}
_GROUPS = {"core": "", "apps": "apps"}
_METHOD = re.compile(
    r"^(?P<verb>delete_collection|list|read|get|patch|create|replace|delete)_(?:namespaced_|cluster_)?"
    r"(?P<resource>[a-z_]+?)(?:_for_all_namespaces)?(?P<status>_status)?$"
)
# What kopf itself does for the operator (kopf's docs, "Deployment" -> RBAC): it watches the resource it serves,
# patches it (finalizers, progress annotations, status through the subresource), posts events, and scans CRDs
# and namespaces.
_KOPF = {("model.aibrix.ai", "modelclaims", v) for v in ("list", "watch", "patch")} | {
    ("model.aibrix.ai", "modelclaims/status", "patch"),
    ("", "events", "create"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
}


def _client_calls(cls: str) -> dict[str, set[tuple[str, str]]]:
    """Method name -> {(api object, client method)} that the method of ``cls`` references (self.core.X etc.)."""
    tree = ast.parse(_KUBE.read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    out: dict[str, set[tuple[str, str]]] = {}
    for fn in node.body:
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            found = out.setdefault(fn.name, set())
            for sub in ast.walk(fn):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Attribute)
                    and isinstance(sub.value.value, ast.Name)
                    and sub.value.value.id == "self"
                ):
                    found.add((sub.value.attr, sub.attr))
    return out


def _needed(users: tuple[str, ...]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) for every client call reachable from the Kube methods the given classes use."""
    kube = _client_calls("Kube")
    needed: set[tuple[str, str, str]] = set()
    for user in users:
        methods = {m for calls in _client_calls(user).values() for obj, m in calls if obj == "kube"}
        for method in methods:
            for api, call in kube.get(method, set()):
                if api not in ("core", "apps", "custom"):
                    continue
                m = _METHOD.match(call)
                assert m, f"Kube.{method} calls {api}.{call}: teach this test its verb and resource"
                if api == "custom":
                    group, resource = GROUP, PLURAL
                else:
                    group, resource = _GROUPS[api], m.group("resource") + "s"
                needed.add((group, resource + ("/status" if m.group("status") else ""), _VERBS[m.group("verb")]))
    return needed


def _granted(role: str) -> set[tuple[str, str, str]]:
    found = named("ClusterRole", role)
    return {
        (g, r, v)
        for rule in found["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_operator_role_covers_every_call_of_the_operator_and_kopf() -> None:
    needed = _needed(("Operator",)) | _KOPF
    assert ("", "pods", "patch") in needed and ("", "events", "create") in needed  # the scan sees the calls
    missing = needed - _granted("turnout-operator")
    assert not missing, f"deploy/rbac.yaml lacks {sorted(missing)}"


def test_gateway_role_covers_its_reads_and_nothing_more() -> None:
    needed = _needed(("KubeRoutes",))
    assert needed, "the scan found no call of the gateway's cluster reader"
    granted = _granted("turnout-gateway")
    assert not needed - granted, f"deploy/gateway-rbac.yaml lacks {sorted(needed - granted)}"
    assert {v for _, _, v in granted} <= {"get", "list", "watch"}, "the gateway's role is read-only"


def test_manifests_name_every_image_and_dockerfile_that_exists() -> None:
    for dockerfile in IMAGES.values():
        assert dockerfile.is_file() and dockerfile.parent == DEPLOY


def test_workloads_can_write_their_volumes_as_their_image_user() -> None:
    """A non-root image (USER in its Dockerfile) needs the pod's fsGroup to write a persistent volume."""
    for c in containers():
        users = re.findall(r"^USER (\d+)(?::(\d+))?$", IMAGES[c.image].read_text(), re.M)
        writable = [p for p, v in c.mounts().items() if "persistentVolumeClaim" in v]
        if users and writable:
            uid, gid = users[-1]
            assert (c.pod.get("securityContext") or {}).get("fsGroup") == int(gid or uid), c.workload
