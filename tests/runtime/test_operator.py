"""The Kubernetes operator against a real kube-apiserver (v1.20, RBAC on) with the manifests in deploy/,
a real runtime agent and real llama.cpp engines. Nothing runs pods here: the test creates the pool pod
object and sets its status (Running, podIP 127.0.0.1) itself."""

from __future__ import annotations

import asyncio
import gc
import json
import ssl
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import utils as k8s_utils

from tests.conftest import GatewayFactory, eventually
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_gateway_claims import through_the_transition, until_status
from tests.support.kube import KubeServer
from turnout.controller.kube import (
    FINALIZER,
    GROUP,
    LEGACY_FINALIZERS,
    Kube,
    OperatorConfig,
    build_registry,
    kube_configuration,
)
from turnout.controller.metrics import ControllerMetrics
from turnout.runtime.agent import SUPERVISOR

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NS = "pools"
VERSION, PLURAL = "v1alpha1", "modelclaims"


def api_client(kubeconfig: Path) -> k8s.ApiClient:
    conf = k8s.Configuration()
    k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
    return k8s.ApiClient(conf)


@pytest.fixture(scope="module")
def cluster(kube: KubeServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[k8s.ApiClient, Path]]:
    """CRD and RBAC from deploy/ installed; yields an admin client and a kubeconfig for the operator's
    service account (a TokenRequest token: the operator runs with exactly the ClusterRole in deploy/)."""
    admin = api_client(kube.kubeconfig)
    k8s_utils.create_from_yaml(admin, str(DEPLOY / "crd.yaml"))
    ext = k8s.ApiextensionsV1Api(admin)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = ext.read_custom_resource_definition("modelclaims.model.aibrix.ai")
        if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("CRD never became Established")
    k8s_utils.create_from_yaml(admin, str(DEPLOY / "rbac.yaml"))
    k8s_utils.create_from_yaml(admin, str(DEPLOY / "gateway-rbac.yaml"))
    core = k8s.CoreV1Api(admin)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
    yield admin, service_account_kubeconfig(kube, core, "turnout-operator", tmp_path_factory)
    admin.close()


def service_account_kubeconfig(
    kube: KubeServer, core: k8s.CoreV1Api, account: str, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconfig holding a TokenRequest token of a service account in turnout-system."""
    token = core.create_namespaced_service_account_token(
        account,
        "turnout-system",
        k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)),
    ).status.token
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"][0]["user"] = {"token": token}
    path = tmp_path_factory.mktemp(account) / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


class RunningOperator:
    def __init__(self, kubeconfig: Path) -> None:
        self.metrics = ControllerMetrics()
        registry = build_registry(OperatorConfig(interval_s=0.5, namespaces=(NS,), kubeconfig=kubeconfig), self.metrics)
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.errors: list[BaseException] = []

        async def run() -> None:
            try:
                await kopf.operator(
                    registry=registry,
                    standalone=True,
                    namespaces=[NS],
                    stop_flag=self.stop,
                    ready_flag=self.ready,
                )
            finally:
                # kopf closes its cached API sessions at the end (its vault.close()), but one opened by a task
                # still running at that moment is left to the garbage collector, which then fails some later
                # test with "Unclosed client session" (1 run in 27 here). Close what is left on this loop.
                loop = asyncio.get_running_loop()
                for obj in gc.get_objects():
                    if isinstance(obj, aiohttp.ClientSession) and not obj.closed and obj._loop is loop:
                        await obj.close()

        def main() -> None:
            try:
                asyncio.run(run())
            except BaseException as exc:  # reported by the test, not lost in the thread
                self.errors.append(exc)

        self.thread = threading.Thread(target=main, name="kopf-operator", daemon=True)
        self.thread.start()
        assert self.ready.wait(30), "the operator did not start"

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the operator did not stop"
        assert not self.errors, self.errors


def claim(name: str, artifact: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelClaim",
        "metadata": {"name": name},
        "spec": {
            "podSelector": {"matchLabels": {"pool": "cpu"}},
            "artifactURL": artifact,
            "engine": "llamacpp",
            "engineConfig": {"args": {"--ctx-size": "256"}},
        },
    }


def request(kube: KubeServer, method: str, path: str, body: Any = None, accept: str = "application/json") -> Any:
    """A plain REST call, as kubectl makes it (the Python client turns "" map values into null)."""
    cluster = yaml.safe_load(kube.kubeconfig.read_text())["clusters"][0]["cluster"]
    ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
    ctx.check_hostname = False
    headers = {"Authorization": f"Bearer {kube.token}", "Accept": accept, "Content-Type": "application/json"}
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(kube.url + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return json.loads(r.read())


def table(kube: KubeServer, path: str) -> dict[str, Any]:
    """The server-side table (what kubectl get prints), using the CRD's printer columns."""
    result: dict[str, Any] = request(kube, "GET", path, accept="application/json;as=Table;v=v1;g=meta.k8s.io")
    return result


def test_manifests_apply_and_the_schema_refuses_bad_claims(
    cluster: tuple[k8s.ApiClient, Path], kube: KubeServer
) -> None:
    admin, _ = cluster
    # The operator Deployment and the warm pool sample are accepted by the API server as written.
    for manifest in ("operator.yaml", "gateway.yaml", "warm-pool.yaml", "networkpolicy.yaml"):
        k8s_utils.create_from_yaml(admin, str(DEPLOY / manifest))
    custom = k8s.CustomObjectsApi(admin)
    for doc in yaml.safe_load_all((DEPLOY / "modelclaims.yaml").read_text()):
        request(kube, "POST", f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}", doc)
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "qwen25-0-5b")
    assert stored["spec"]["engine"] == "vllm" and stored["spec"]["replicas"] == 1  # schema defaults
    # a status as AIBrix's controller writes it (api/model/v1alpha1/modelclaim_types.go) is accepted as is
    aibrix_status = {
        "phase": "Unknown",
        "candidates": 2,
        "desiredReplicas": 1,
        "readyReplicas": 0,
        "instances": [{"pod": "warm-0", "port": 20000, "phase": "Activating"}],
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "qwen25-0-5b", {"status": aibrix_status}
    )
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "qwen25-0-5b")
    assert {k: stored["status"][k] for k in aibrix_status} == aibrix_status
    flags = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "qwen3-0-6b")["spec"]
    assert flags["engineConfig"]["args"]["--enforce-eager"] == ""
    policy = k8s.AppsV1Api(admin).read_namespaced_deployment("warm-runtime-pool", "default").metadata.annotations
    json.loads(policy["pool.aibrix.ai/policy"])  # the sample's policy is valid JSON as folded by YAML
    bad = [
        {"artifactURL": "hf://x"},  # no podSelector
        {"podSelector": {"matchLabels": {"a": "b"}}, "artifactURL": "ftp://x"},  # unknown scheme
        {"podSelector": {"matchLabels": {"a": "b"}}, "artifactURL": "gcs://bucket/m"},  # no engine or agent reads it
        {"podSelector": {"matchLabels": {"a": "b"}}, "artifactURL": "hf://x", "replicas": 2},
        {"podSelector": {"matchLabels": {"a": "b"}}, "artifactURL": "hf://x", "engine": "tgi"},
        {
            "podSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
            "artifactURL": "hf://x",
        },
    ]
    for i, spec in enumerate(bad):
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelClaim", "metadata": {"name": f"bad{i}"}, "spec": spec}
        with pytest.raises(k8s.ApiException) as caught:
            custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
        assert caught.value.status == 422, spec


def claim_gone(custom: k8s.CustomObjectsApi, name: str) -> Callable[[], Awaitable[bool]]:
    """For eventually(): the claim ``name`` no longer exists."""

    async def gone() -> bool:
        try:
            custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        except k8s.ApiException as exc:
            return exc.status == 404
        return False

    return gone


async def test_operator_reconciles_claims_on_a_real_api_server(
    cluster: tuple[k8s.ApiClient, Path],
    kube: KubeServer,
    start_agent: AgentStarter,
    gateway: GatewayFactory,
    tiny_model: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    admin, operator_kubeconfig = cluster
    core, custom, apps = k8s.CoreV1Api(admin), k8s.CustomObjectsApi(admin), k8s.AppsV1Api(admin)
    url, agent = await start_agent()
    agent_port = int(url.rsplit(":", 1)[1])
    labels = {"pool": "cpu", "pool.aibrix.ai/enabled": "true", "app": "pool"}
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="pool-0", labels=labels),
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(
                    name="runtime",
                    image="turnout",
                    ports=[k8s.V1ContainerPort(name="runtime", container_port=agent_port)],
                )
            ]
        ),
    )
    core.create_namespaced_pod(NS, pod)
    core.patch_namespaced_pod_status("pool-0", NS, {"status": {"phase": "Running", "podIP": "127.0.0.1"}})
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "pool", "annotations": {"pool.aibrix.ai/policy": '{"lifecycle":{"sleepAfter":1}}'}},
        "spec": {
            "selector": {"matchLabels": {"app": "pool"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "runtime", "image": "turnout"}]},
            },
        },
    }
    apps.create_namespaced_deployment(NS, deployment)
    operator = RunningOperator(operator_kubeconfig)
    try:
        tiny_claim = claim("tiny", f"file://{tiny_model}")
        # a full LabelSelector, as AIBrix's ModelClaimSpec has it; and the finalizer an earlier Turnout set
        tiny_claim["spec"]["podSelector"]["matchExpressions"] = [
            {"key": "app", "operator": "In", "values": ["pool", "other"]},
            {"key": "spot", "operator": "DoesNotExist"},
        ]
        tiny_claim["metadata"]["finalizers"] = list(LEGACY_FINALIZERS)
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, tiny_claim)
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, claim("broken", f"file://{tmp_path / 'missing.gguf'}")
        )

        def get(name: str) -> dict[str, Any]:
            obj: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
            return obj

        async def active() -> dict[str, Any] | None:
            obj = get("tiny")
            return obj if (obj.get("status") or {}).get("phase") == "Active" else None

        tiny = await eventually(active, "claim tiny Active")
        status = tiny["status"]
        assert status["pod"] == "pool-0" and status["port"] > 0 and status["readyReplicas"] == 1
        assert {c["type"]: c["status"] for c in status["conditions"]} == {"Scheduled": "True", "Ready": "True"}
        assert FINALIZER == "model.aibrix.ai/modelclaim-finalizer" and FINALIZER in tiny["metadata"]["finalizers"]
        # AIBrix's ModelClaimStatus fields
        assert status["candidates"] == 1 and status["desiredReplicas"] == 1
        assert status["instances"] == [{"pod": "pool-0", "port": status["port"], "phase": "Active"}]

        async def routed() -> bool:
            notes = core.read_namespaced_pod("pool-0", NS).metadata.annotations or {}
            return json.loads(notes.get("modelclaim.aibrix.ai/tiny", "{}")).get("state") == "active"

        await eventually(routed, "routing annotation")
        notes = core.read_namespaced_pod("pool-0", NS).metadata.annotations
        assert json.loads(notes["modelclaim.aibrix.ai/tiny"]) == {
            "model": "tiny",
            "port": status["port"],
            "state": "active",
        }
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"http://127.0.0.1:{status['port']}/v1/chat/completions", json=body) as r,
        ):
            assert r.status == 200  # the engine the annotation points at serves the claim's model

        rows = table(kube, f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/tiny")
        columns = [c["name"] for c in rows["columnDefinitions"]]
        assert columns[:6] == ["Name", "Phase", "Model", "Pod", "Ready", "Engine"]
        assert rows["rows"][0]["cells"][1:5] == ["Active", "tiny", "pool-0", 1]

        greedy = claim("greedy", "hf://org/m")
        greedy["spec"]["engineConfig"]["args"]["--gpu-memory-utilization"] = "0.9"
        nowhere = claim("nowhere", "hf://org/m")
        nowhere["spec"]["podSelector"]["matchExpressions"] = [{"key": "app", "operator": "NotIn", "values": ["pool"]}]
        for extra in (greedy, nowhere):
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, extra)

        async def phases() -> bool:
            got = {n: (get(n).get("status") or {}).get("phase") for n in ("greedy", "nowhere")}
            return got == {"greedy": "Failed", "nowhere": "Scheduling"}

        await eventually(phases, "greedy Failed and nowhere Scheduling")
        assert get("greedy")["status"]["reason"] == "InvalidSpec"
        assert "gpu-memory-utilization" in get("greedy")["status"]["message"]
        assert get("nowhere")["status"]["reason"] == "NoCandidatePod" and get("nowhere")["status"]["candidates"] == 0
        assert get("nowhere")["status"].get("pod") is None and get("nowhere")["status"]["instances"] == []
        assert "podSelector" in get("nowhere")["status"]["message"]

        # A gateway in the cluster (read-only service account) routes to the claim the operator placed, and a
        # request for a sleeping claim is answered 503 Retry-After: 10 while it wakes it.
        gw_config = service_account_kubeconfig(kube, core, "turnout-gateway", tmp_path_factory)
        gw = await gateway(
            [], pools={"kubernetes": {"namespaces": [NS], "kubeconfig": str(gw_config)}, "interval_s": 0.2}
        )
        await until_status(gw, "tiny", 200)
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{url}/v1/runtime/models/sleep", json={"model_name": "tiny", "level": 1, "operation_id": "test-sleep"}
            ) as r,
        ):
            assert r.status == 200
        # every answer from the de-route to the re-route is the claim's own 503 (no race with the status)
        seen = await through_the_transition(gw, "tiny")
        assert "model_waking" in {c for _, c in seen}

        # The gateway woke the claim through its agent; the operator writes the claim's status on its next pass,
        # so the status may still say Sleeping (port 0) when the first 200 comes back.
        async def active() -> dict[str, Any] | None:
            st = get("tiny").get("status") or {}
            return st if st.get("phase") == "Active" and st.get("port") else None

        status = await eventually(active, "tiny Active again after the wake")

        # A restarted operator picks up where the last one stopped: same engine, same port, no relaunch.
        pid = agent.app[SUPERVISOR].engines["tiny"].pid
        operator.close()
        first = operator  # its counters: what it saw before it stopped
        operator = RunningOperator(operator_kubeconfig)
        await asyncio.sleep(1.5)
        assert get("tiny")["status"]["phase"] == "Active" and get("tiny")["status"]["port"] == status["port"]
        assert agent.app[SUPERVISOR].engines["tiny"].pid == pid

        async def failed() -> dict[str, Any] | None:
            obj = get("broken")
            return obj if (obj.get("status") or {}).get("phase") == "Failed" else None

        broken = await eventually(failed, "claim broken Failed")
        assert broken["status"]["reason"] == "EngineFailed" and "exited" in broken["status"]["message"]
        # AIBrix's instances[] carries the engine's port in every phase, not only the routable one
        broken_port = agent.app[SUPERVISOR].engines[broken["status"]["model"]].port
        assert broken["status"]["port"] == 0 and broken_port > 0
        assert broken["status"]["instances"] == [{"pod": "pool-0", "port": broken_port, "phase": "Failed"}]

        def events(name: str) -> list[Any]:
            return core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items

        async def engine_failed_event() -> bool:
            return any(e.reason == "EngineFailed" and e.type == "Warning" for e in events("broken"))

        await eventually(engine_failed_event, "EngineFailed event")
        assert any(e.reason == "Ready" for e in events("tiny"))
        await asyncio.sleep(2)  # several pool-policy passes: still one event for one bad policy
        # the claim no pod takes stays Scheduling: one Warning when that starts, not one per pass (as locally)
        unplaced = [(e.type, e.reason, e.count or 1) for e in events("nowhere")]
        assert unplaced == [("Warning", "NoCandidatePod", 1)], unplaced
        invalid = [e for e in events("pool") if e.reason == "InvalidPoolPolicy"]
        assert len(invalid) == 1 and (invalid[0].count or 1) == 1, invalid
        assert invalid[0].involved_object.kind == "Deployment" and "sleepAfter" in invalid[0].message
        sample = operator.metrics.registry.get_sample_value
        assert sample("aibrix_modelclaim_pool_policy_valid", {"namespace": NS, "deployment": "pool"}) == 0
        assert sample("aibrix_modelclaim_ready_replicas", {"namespace": NS, "model": "tiny"}) == 1
        # one failure, counted once, by whichever operator saw the claim become Failed (the broken engine's
        # restarts may end before the restart above or after it; the second one never counts it again)
        failure = {"namespace": NS, "model": "broken", "result": "failure"}
        counted = [
            op.metrics.registry.get_sample_value("aibrix_modelclaim_activation_total", failure) or 0
            for op in (first, operator)
        ]
        assert sum(counted) == 1, counted

        # Deleting: the finalizer de-routes, stops the engine, and only then lets the object go (the earlier
        # Turnout finalizer with it).
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "tiny")

        await eventually(claim_gone(custom, "tiny"), "claim tiny deleted")
        assert "tiny" not in agent.app[SUPERVISOR].engines
        assert "modelclaim.aibrix.ai/tiny" not in (core.read_namespaced_pod("pool-0", NS).metadata.annotations or {})
    finally:
        operator.close()


async def test_operator_fails_a_refused_activation_once_and_aggregates_events(
    cluster: tuple[k8s.ApiClient, Path], start_agent: AgentStarter
) -> None:
    """The agent refuses a model name over 253 characters (HTTP 400): the claim goes Failed with the agent's
    reason and one Warning event, is not activated again, and a repeated event is counted on that one Event."""
    admin, operator_kubeconfig = cluster
    core, custom = k8s.CoreV1Api(admin), k8s.CustomObjectsApi(admin)
    url, _ = await start_agent()
    labels = {"pool": "refusing", "pool.aibrix.ai/enabled": "true"}
    ports = [k8s.V1ContainerPort(name="runtime", container_port=int(url.rsplit(":", 1)[1]))]
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="refusing-0", labels=labels),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="runtime", image="turnout", ports=ports)]),
    )
    core.create_namespaced_pod(NS, pod)
    core.patch_namespaced_pod_status("refusing-0", NS, {"status": {"phase": "Running", "podIP": "127.0.0.1"}})
    long = claim("long-name", "hf://org/m")
    long["spec"]["modelName"] = "m" * 300
    long["spec"]["podSelector"] = {"matchLabels": {"pool": "refusing"}}
    operator = RunningOperator(operator_kubeconfig)
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, long)

        async def failed() -> dict[str, Any] | None:
            obj: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "long-name")
            return obj if (obj.get("status") or {}).get("phase") == "Failed" else None

        status = (await eventually(failed, "claim long-name Failed"))["status"]
        assert status["reason"] == "ActivationRejected" and "model_name" in status["message"]
        assert status.get("pod") is None and status["rejectedSpec"]  # a null in a merge patch removes the key
        await asyncio.sleep(2.5)  # five reconcile intervals: no retry, no new event
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode())
        assert 'aibrix:modelclaim_lifecycle_operations_total{operation="activate",result="invalid"} 1.0' in text
        events = core.list_namespaced_event(NS, field_selector="involvedObject.name=long-name").items
        warnings = [(e.reason, e.count) for e in events if e.type == "Warning"]
        assert warnings == [("ActivationRejected", 1)], warnings
        notes = core.read_namespaced_pod("refusing-0", NS).metadata.annotations or {}
        assert "modelclaim.aibrix.ai/long-name" not in notes  # de-routed: nothing runs there

        # the operator's event writer: a repeat raises the count of the first Event, as client-go's correlator does
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "long-name")
        kube_api = Kube(kube_configuration(operator_kubeconfig))
        for message in ("first", "second", "first", "first"):
            await kube_api.event(obj, "Warning", "Repeated", message)
        repeated = [
            e
            for e in core.list_namespaced_event(NS, field_selector="involvedObject.name=long-name").items
            if e.reason == "Repeated"
        ]
        assert sorted((e.message, e.count) for e in repeated) == [("first", 3), ("second", 1)]
        first = next(e for e in repeated if e.message == "first")
        assert first.last_timestamp >= first.first_timestamp and first.source.component == "turnout-operator"
        custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "long-name")

        await eventually(
            claim_gone(custom, "long-name"), "claim long-name deleted (nothing ran: the finalizer lets it go at once)"
        )
    finally:
        operator.close()


async def test_a_claim_deleted_under_the_earlier_finalizer_alone_is_still_released(
    cluster: tuple[k8s.ApiClient, Path], start_agent: AgentStarter, tiny_model: Path
) -> None:
    """A claim an earlier Turnout operator placed carries only its finalizer (modelclaim.aibrix.ai/finalizer). Deleted
    before this operator first added its own, it is not one kopf finishes (kopf handles only objects carrying its
    finalizer), yet it is released all the same: de-routed, its engine stopped, then let go."""
    admin, operator_kubeconfig = cluster
    core, custom = k8s.CoreV1Api(admin), k8s.CustomObjectsApi(admin)
    url, agent = await start_agent()
    ports = [k8s.V1ContainerPort(name="runtime", container_port=int(url.rsplit(":", 1)[1]))]
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="legacy-0", labels={"pool": "legacy", "pool.aibrix.ai/enabled": "true"}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="runtime", image="turnout", ports=ports)]),
    )
    core.create_namespaced_pod(NS, pod)
    core.patch_namespaced_pod_status("legacy-0", NS, {"status": {"phase": "Running", "podIP": "127.0.0.1"}})
    old = claim("old", f"file://{tiny_model}")
    old["spec"]["podSelector"] = {"matchLabels": {"pool": "legacy"}}
    old["metadata"]["finalizers"] = list(LEGACY_FINALIZERS)
    uid = custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, old)["metadata"]["uid"]
    # what the earlier operator left behind: the claim bound to the pod, its engine running there, its route
    ref = {"namespace": NS, "name": "old", "uid": uid}
    body = {"model_name": "old", "artifact_url": f"file://{tiny_model}", "engine": "llamacpp", "claim_ref": ref}
    body["engine_config"] = {"args": {"--ctx-size": "256"}}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/runtime/models/activate", json=body) as r:
        assert r.status == 200
        port = (await r.json())["port"]
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, PLURAL, "old", {"status": {"phase": "Active", "model": "old", "pod": "legacy-0"}}
    )
    route = json.dumps({"model": "old", "port": port, "state": "active"})
    core.patch_namespaced_pod("legacy-0", NS, {"metadata": {"annotations": {"modelclaim.aibrix.ai/old": route}}})
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "old")  # while no operator runs
    stuck = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "old")
    assert stuck["metadata"]["deletionTimestamp"] and stuck["metadata"]["finalizers"] == list(LEGACY_FINALIZERS)

    operator = RunningOperator(operator_kubeconfig)
    try:
        await eventually(claim_gone(custom, "old"), "claim old released", 30)
        assert "old" not in agent.app[SUPERVISOR].engines  # its engine stopped first
        assert "modelclaim.aibrix.ai/old" not in (core.read_namespaced_pod("legacy-0", NS).metadata.annotations or {})
    finally:
        operator.close()
        core.delete_namespaced_pod("legacy-0", NS, grace_period_seconds=0)
