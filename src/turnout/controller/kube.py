"""The Kubernetes ModelClaim driver (`turnout operator`): kopf handlers around the same pure plan.

- ``ModelClaim`` (``modelclaims.model.aibrix.ai/v1alpha1``): a kopf timer reconciles each claim every
  ``interval_s`` (and at once when it appears): status through the status subresource, events on phase
  changes, routing annotations on pool pods, agent calls. Deletion goes through AIBrix's finalizer
  (``model.aibrix.ai/modelclaim-finalizer``): de-route, stop the engine, then let the object go; the one earlier
  Turnout operators set (``modelclaim.aibrix.ai/finalizer``) is removed at the same time. A claim deleted while it
  carried only that earlier finalizer (kopf does not handle it) is finished by a periodic pass the same way.
- Pool Deployments carrying ``pool.aibrix.ai/policy``: a loop lists them every ``interval_s`` and applies the
  policy to each Deployment's pods (idle sleep, KV limits); an invalid policy is disabled with one
  ``InvalidPoolPolicy`` warning per text. (Listed, not watched through kopf: kopf would patch its own
  bookkeeping onto the user's Deployments.)

Kubernetes API calls use the official client (in threads; kopf itself watches and patches claims).
Pods: the agent is at ``http://<podIP>:<containerPort named "runtime", else 8080>``; GPUs are the pod's
``nvidia.com/gpu`` limits (a pod without any counts as one device: a CPU pool for llama.cpp).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf
import orjson
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from turnout.controller.agents import (
    Activity,
    AgentClient,
    AgentReport,
    Refusal,
    engine_info,
    pod_view,
    spec_digest,
)
from turnout.controller.claim_sources import ClaimView, WakeTarget, effective_phase, sleeping_engine
from turnout.controller.metrics import ControllerMetrics
from turnout.controller.policy import PolicyRunner, PoolTarget
from turnout.controller.status import bound_pod, now_iso, phase_of, rejection, render_status
from turnout.core.claims import (
    POOL_LABEL,
    ClaimPhase,
    ClaimSpec,
    InvalidClaim,
    candidates,
    claim_engine,
    parse_claim_spec,
    schedules_by_priority,
)
from turnout.core.poolpolicy import PolicyError, parse_pool_policy
from turnout.core.reconcile import (
    ANNOTATION_PREFIX,
    Activate,
    Annotate,
    ClaimState,
    Deactivate,
    PodState,
    ReleaseFinalizer,
    SetStatus,
    announces,
    event_type,
    parse_route,
    plan,
    rejected,
)
from turnout.core.selectors import InvalidSelector, LabelSelector, parse_label_selector
from turnout.upstream.client import UpstreamClient

__all__ = [
    "FINALIZER",
    "GROUP",
    "LEGACY_FINALIZERS",
    "KubeRoutes",
    "OperatorConfig",
    "build_registry",
    "kube_configuration",
]

log = logging.getLogger("turnout.operator")

GROUP, VERSION, PLURAL = "model.aibrix.ai", "v1alpha1", "modelclaims"
FINALIZER = "model.aibrix.ai/modelclaim-finalizer"  # AIBrix's (pkg/controller/modelclaim, ModelClaimFinalizer)
LEGACY_FINALIZERS = ("modelclaim.aibrix.ai/finalizer",)  # what earlier Turnout operators set
POLICY_ANNOTATION = "pool.aibrix.ai/policy"
RUNTIME_PORT_NAME = "runtime"
DEFAULT_RUNTIME_PORT = 8080
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
EVENT_SOURCE = "turnout-operator"


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    interval_s: float = 5.0
    namespaces: tuple[str, ...] = ()  # () = every namespace
    kubeconfig: Path | None = None  # None: in-cluster service account, else the default kubeconfig
    agent_timeout_s: float = 120.0


def kube_configuration(kubeconfig: Path | None) -> k8s.Configuration:
    conf = k8s.Configuration()
    if kubeconfig is not None:
        k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
        return conf
    try:
        k8s_config.load_incluster_config(client_configuration=conf)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=conf)
    return conf


class Kube:
    """The few API calls the operator makes itself (kopf patches the claims)."""

    def __init__(self, conf: k8s.Configuration) -> None:
        api = k8s.ApiClient(conf)
        self.core = k8s.CoreV1Api(api)
        self.apps = k8s.AppsV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self._event_lock = asyncio.Lock()  # a repeat is counted on the first event, never posted beside it

    @staticmethod
    async def _get(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One API call in a thread, its JSON decoded here (orjson) rather than into client model objects."""
        response = await asyncio.to_thread(call, *args, _preload_content=False, **kwargs)
        return orjson.loads(response.data)

    async def _items(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self._get(call, *args, **kwargs))["items"]
        return items

    async def pods(self, namespace: str, selector: LabelSelector) -> list[dict[str, Any]]:
        return await self._items(self.core.list_namespaced_pod, namespace, label_selector=selector.query())

    async def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            pod: dict[str, Any] = await self._get(self.core.read_namespaced_pod, name, namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return pod

    async def annotate_pod(self, namespace: str, name: str, key: str, value: str | None) -> None:
        body = {"metadata": {"annotations": {key: value}}}
        try:
            await asyncio.to_thread(self.core.patch_namespaced_pod, name, namespace, body)
        except k8s.ApiException as exc:
            if exc.status != 404:  # a pod that is gone has no route to fix
                raise

    async def policy_deployments(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        """Deployments that carry a pool policy annotation, in the given namespaces (or all)."""
        if namespaces:
            items = [d for ns in namespaces for d in await self._items(self.apps.list_namespaced_deployment, ns)]
        else:
            items = await self._items(self.apps.list_deployment_for_all_namespaces)
        return [
            {"apiVersion": "apps/v1", "kind": "Deployment", **item}
            for item in items
            if POLICY_ANNOTATION in (item["metadata"].get("annotations") or {})
        ]

    async def event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Record a Kubernetes event on an object (best effort: a lost event never stops reconciliation). A
        repeat (same object, type, reason, message and source) raises the existing Event's ``count`` and
        ``lastTimestamp`` instead of adding another, as client-go's event correlator does."""
        meta = obj.get("metadata") or {}
        namespace, uid, text = str(meta.get("namespace")), meta.get("uid"), message[:1024]
        now = datetime.now(UTC)
        try:
            async with self._event_lock:
                same = await self._same_event(namespace, uid, kind, reason, text) if uid else None
                if same is not None:
                    patch = {"count": int(same.get("count") or 1) + 1, "lastTimestamp": now_iso(now.timestamp())}
                    await asyncio.to_thread(
                        self.core.patch_namespaced_event, same["metadata"]["name"], namespace, patch
                    )
                    return
                event = k8s.CoreV1Event(
                    metadata=k8s.V1ObjectMeta(generate_name=f"{meta.get('name')}.", namespace=meta.get("namespace")),
                    involved_object=k8s.V1ObjectReference(
                        api_version=obj.get("apiVersion"),
                        kind=obj.get("kind"),
                        name=meta.get("name"),
                        namespace=meta.get("namespace"),
                        uid=uid,
                    ),
                    reason=reason,
                    message=text,
                    type=kind,
                    count=1,
                    first_timestamp=now,
                    last_timestamp=now,
                    source=k8s.V1EventSource(component=EVENT_SOURCE),
                    reporting_component=EVENT_SOURCE,
                )
                await asyncio.to_thread(self.core.create_namespaced_event, namespace, event)
        except k8s.ApiException as exc:
            log.warning("event %s on %s not recorded: %s", reason, meta.get("name"), exc.reason)

    async def _same_event(
        self, namespace: str, uid: str, kind: str, reason: str, message: str
    ) -> dict[str, Any] | None:
        selector = f"involvedObject.uid={uid},reason={reason}"
        events = await self._items(self.core.list_namespaced_event, namespace, field_selector=selector)
        same = [
            e
            for e in events
            if e.get("type") == kind
            and e.get("message") == message
            and (e.get("source") or {}).get("component") == EVENT_SOURCE
        ]
        return max(same, key=lambda e: int(e.get("count") or 1), default=None)

    async def has_event(self, namespace: str, uid: str, reason: str, message: str) -> bool:
        selector = f"involvedObject.uid={uid},reason={reason}"
        events = await self._items(self.core.list_namespaced_event, namespace, field_selector=selector)
        return any(e.get("message") == message[:1024] for e in events)

    async def all_claims(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        if namespaces:
            return [c for ns in namespaces for c in await self.claims(ns)]
        return await self._items(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)

    async def pool_pods(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        if namespaces:
            return [p for ns in namespaces for p in await self.pods(ns, LabelSelector({POOL_LABEL: "true"}))]
        return await self._items(self.core.list_pod_for_all_namespaces, label_selector=f"{POOL_LABEL}=true")

    async def claims(self, namespace: str) -> list[dict[str, Any]]:
        return await self._items(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL)

    async def set_claim_finalizers(self, namespace: str, name: str, finalizers: list[str], version: str) -> bool:
        """Replace a claim's finalizers if it is still at ``version`` (a merge patch carrying the resourceVersion
        is refused with 409 when the object changed meanwhile); False when it changed or is gone."""
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": version}}
        try:
            await asyncio.to_thread(
                self.custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        except k8s.ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True


def agent_url(pod: Mapping[str, Any]) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    port = DEFAULT_RUNTIME_PORT
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == RUNTIME_PORT_NAME:
                port = int(p["containerPort"])
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def pod_gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        total += sum(int(limits.get(r, 0)) for r in GPU_RESOURCES)
    return max(total, 1)


class Operator:
    def __init__(self, cfg: OperatorConfig, metrics: ControllerMetrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.kube = Kube(kube_configuration(cfg.kubeconfig))
        self.client = UpstreamClient(connect_timeout_s=3, total_timeout_s=cfg.agent_timeout_s)
        self.agents = AgentClient(self.client)
        self.policy = PolicyRunner(self.agents, metrics)
        self.reported_invalid: dict[str, str] = {}  # deployment uid -> policy text already reported
        # claim uid -> (spec digest, status message) of an activation refused as invalid, for the next pass's body
        # may predate the status patch that records it
        self.refused: dict[str, tuple[str, str]] = {}
        self.pools_seen: set[tuple[str, str]] = set()

    async def pod_state(self, pod: dict[str, Any]) -> tuple[PodState, AgentReport | None]:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        namespace = str(meta.get("namespace", ""))
        url = agent_url(pod)
        running = status.get("phase") == "Running" and meta.get("deletionTimestamp") is None
        report = await self.agents.report(url, meta["name"]) if running and url else None
        engines = {str(e["model_name"]): engine_info(e, namespace) for e in (report.engines if report else [])}
        view = pod_view(meta["name"], meta.get("labels") or {}, running, status.get("podIP"), pod_gpus(pod), report)
        reachable = report is not None or not running
        return PodState(view, engines, reachable=reachable), report

    async def reconcile(self, body: Mapping[str, Any], patch: kopf.Patch, *, deleting: bool = False) -> bool:
        """One pass for one claim; True when a deleting claim may go."""
        meta, status = body["metadata"], dict(body.get("status") or {})
        name, namespace = meta["name"], meta["namespace"]
        try:
            spec, invalid = parse_claim_spec(name, dict(body.get("spec") or {})), None
        except InvalidClaim as exc:
            spec, invalid = None, str(exc)
        model = spec.model_name if spec is not None else name
        pods = await self.kube.pods(namespace, spec.pod_selector) if spec is not None else []
        bound = bound_pod(status)
        if bound and all(p["metadata"]["name"] != bound for p in pods):
            extra = await self.kube.pod(namespace, bound)  # the claim stays where it is if labels change
            pods += [extra] if extra is not None else []
        states = await asyncio.gather(*(self.pod_state(p) for p in pods))
        by_name = {p["metadata"]["name"]: p for p in pods}
        refused = rejection(status, spec)
        remembered = self.refused.get(str(meta.get("uid", "")))
        if refused is None and spec is not None and remembered is not None and remembered[0] == spec_digest(spec):
            refused = remembered[1]
        claim = ClaimState(name, spec, invalid, bound if bound in by_name else None, deleting, refused)
        count = candidates(spec, [s.pod for s, _ in states]) if spec is not None else 0
        done = False
        last: SetStatus | None = None  # the status the plan gave before an Activate (its port comes after)
        for action in plan([claim], [s for s, _ in states]):
            last = action if isinstance(action, SetStatus) else last
            done |= await self._apply(action, body, patch, status, by_name, model, spec, count, last)
        if deleting and done:
            self.metrics.forget(namespace, model)
            self.refused.pop(str(meta.get("uid", "")), None)
        return done

    async def _apply(
        self,
        action: object,
        body: Mapping[str, Any],
        patch: kopf.Patch,
        status: dict[str, Any],
        by_name: Mapping[str, dict[str, Any]],
        model: str,
        spec: ClaimSpec | None,
        count: int,
        last: SetStatus | None = None,
    ) -> bool:
        """Carry out one action of the plan; True for the finalizer's release. ``count``: the claim's
        candidate pods (its status's ``candidates``); ``last``: the status this pass set so far."""
        meta = body["metadata"]
        namespace = meta["namespace"]
        if isinstance(action, SetStatus):
            await self._status(body, patch, status, action, model, spec, count)
        elif isinstance(action, Activate):
            ref = {"namespace": namespace, "name": meta["name"], "uid": str(meta.get("uid", ""))}
            url = agent_url(by_name[action.pod]) or ""
            result = await self.agents.activate(url, action.pod, action.spec, ref)
            if isinstance(result, Refusal) and result.invalid:  # terminal: Failed, no retry (see core.reconcile)
                for step in rejected(action.claim, action.pod, action.spec.model_name, result.detail):
                    if isinstance(step, SetStatus):
                        self.refused[ref["uid"]] = (spec_digest(action.spec), step.message)
                    await self._apply(step, body, patch, status, by_name, model, spec, count)
            elif isinstance(result, Refusal):
                await self.kube.event(body, "Warning", "ActivateFailed", result.message)
            elif result and last is not None and last.pod == action.pod:  # the engine's port, known from now on
                await self._status(body, patch, status, replace(last, engine_port=result), model, spec, count)
        elif isinstance(action, Deactivate):
            url = agent_url(by_name[action.pod]) or ""
            await self.agents.post(url, action.pod, "/v1/runtime/models/deactivate", {"model_name": action.model})
        elif isinstance(action, Annotate):
            pod_meta = by_name[action.pod]["metadata"]
            notes = dict(pod_meta.get("annotations") or {})
            if notes.get(action.key) != action.value:
                await self.kube.annotate_pod(namespace, action.pod, action.key, action.value)
                if action.value is None:
                    notes.pop(action.key, None)
                else:
                    notes[action.key] = action.value
                pod_meta["annotations"] = notes  # what a later action of this pass compares with
        elif isinstance(action, ReleaseFinalizer):
            return True
        return False

    async def _status(
        self,
        body: Mapping[str, Any],
        patch: kopf.Patch,
        status: dict[str, Any],
        action: SetStatus,
        model: str,
        spec: ClaimSpec | None,
        count: int,
    ) -> None:
        before, before_reason = phase_of(status), status.get("reason")
        new = render_status(action, status, now_iso(time.time()), model, spec, candidates=count)
        if any(status.get(k) != v for k, v in new.items()):
            patch.status.update(new)
        status.update(new)  # a later action of this pass compares with what it will be
        if announces(before, before_reason, action):
            await self.kube.event(body, event_type(action), action.reason, action.message or action.phase.value)
        self.metrics.claim(body["metadata"]["namespace"], model, before, action.phase)

    async def pool(self, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", meta["name"])
        text = (meta.get("annotations") or {}).get(POLICY_ANNOTATION)
        if text is None:
            self.metrics.pool(namespace, name, None)
            return
        try:
            parse_pool_policy(text)
        except PolicyError as exc:
            self.metrics.pool(namespace, name, False)
            if self.reported_invalid.get(uid) != text:
                self.reported_invalid[uid] = text
                message = f"pool policy disabled: {exc}"
                log.warning("deployment %s/%s: %s", namespace, name, message)
                # One event per policy text, also across operator restarts: look before posting.
                if not await self.kube.has_event(namespace, uid, "InvalidPoolPolicy", message):
                    await self.kube.event(body, "Warning", "InvalidPoolPolicy", message)
            return
        self.reported_invalid.pop(uid, None)
        try:  # the Deployment's own selector, read by the same rule as a claim's podSelector
            selector = parse_label_selector((body.get("spec") or {}).get("selector"), "spec.selector")
        except InvalidSelector:
            return
        if not selector.match_labels and not selector.match_expressions:
            return
        pods = await self.kube.pods(namespace, selector)
        claims = {c["metadata"]["name"]: c for c in await self.kube.claims(namespace)}
        for pod in pods:
            state, report = await self.pod_state(pod)
            url = agent_url(pod)
            if report is None or url is None:
                continue
            pod_name = state.pod.name
            bound = {
                str((c.get("status") or {}).get("model") or c["metadata"]["name"]): n
                for n, c in claims.items()
                if bound_pod(c.get("status")) == pod_name and not c["metadata"].get("deletionTimestamp")
            }
            target = PoolTarget(
                pod_name, url, state.pod.gpus, text, report.engines, bound, namespace, name, report.accelerators
            )

            async def set_route(claim: str, value: str, pod_name: str = pod_name) -> None:
                await self.kube.annotate_pod(namespace, pod_name, ANNOTATION_PREFIX + claim, value)

            async def event(claim: str | None, kind: str, reason: str, message: str) -> None:
                await self.kube.event(claims.get(claim or "", body), kind, reason, message)

            await self.policy.step(target, time.time(), set_route=set_route, event=event)

    async def pools(self) -> None:
        """One pass over every pool Deployment (listed here rather than watched through kopf, which would
        patch its own bookkeeping onto the user's Deployments)."""
        deployments = await self.kube.policy_deployments(self.cfg.namespaces)
        seen = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in deployments}
        for namespace, name in self.pools_seen - seen:
            self.metrics.pool(namespace, name, None)
        self.pools_seen = seen
        for deployment in deployments:
            try:
                await self.pool(deployment)
            except k8s.ApiException as exc:
                log.warning("pool %s: %s", deployment["metadata"]["name"], exc.reason)

    async def legacy_deletions(self) -> None:
        """Finish claims deleted while they carried only the finalizer an earlier Turnout operator set.

        kopf finishes only objects that carry its own finalizer (:data:`FINALIZER`): to it, an object being deleted
        without it is free to go (kopf's ``Reason.FREE``: no handler runs). A claim deleted before this operator
        first added its finalizer would so keep its engine, its route and the old finalizer forever. Each pass
        does for these what the delete handler does (de-route, stop the engine), then drops the old finalizer."""
        for claim in await self.kube.all_claims(self.cfg.namespaces):
            meta = claim["metadata"]
            held = list(meta.get("finalizers") or [])
            if not meta.get("deletionTimestamp") or FINALIZER in held or not set(held) & set(LEGACY_FINALIZERS):
                continue
            if not await self.reconcile(claim, kopf.Patch(), deleting=True):
                continue  # the engine is being stopped: the next pass looks again
            kept = [f for f in held if f not in LEGACY_FINALIZERS]
            if await self.kube.set_claim_finalizers(meta["namespace"], meta["name"], kept, meta["resourceVersion"]):
                log.info("claim %s/%s: deleted under an earlier finalizer; released", meta["namespace"], meta["name"])

    async def pool_loop(self) -> None:
        """Pool policies and claims deleted under an earlier operator's finalizer, every ``interval_s``."""
        while True:
            for name, step in (("pool policy", self.pools), ("legacy deletion", self.legacy_deletions)):
                try:
                    await step()
                except Exception:  # one failed pass must not end the next ones
                    log.exception("%s pass failed", name)
            await asyncio.sleep(self.cfg.interval_s)

    async def close(self) -> None:
        await self.client.close()


class KubeRoutes:
    """The gateway's view of the claims an operator reconciles: statuses for the phase, the routing annotation
    on the bound pod for the port, the pod's agent for wakes. Read-only (deploy/gateway-rbac.yaml)."""

    def __init__(self, namespaces: tuple[str, ...], kubeconfig: Path | None, client: UpstreamClient) -> None:
        self.kube = Kube(kube_configuration(kubeconfig))
        self.namespaces = namespaces
        self.agents = AgentClient(client)
        self.on_route_change: Callable[[], None] | None = None
        self.activity: Callable[[str], Activity | None] = lambda claim: None  # the operator reads engines' own
        self._views: list[ClaimView] = []
        self._bound: dict[str, tuple[dict[str, Any], str]] = {}  # key -> (pod, model)

    async def refresh(self) -> None:
        claims = await self.kube.all_claims(self.namespaces)
        pods = {
            (p["metadata"]["namespace"], p["metadata"]["name"]): p for p in await self.kube.pool_pods(self.namespaces)
        }
        views, bound = [], {}
        for claim in sorted(claims, key=lambda c: (c["metadata"]["namespace"], c["metadata"]["name"])):
            meta, status = claim["metadata"], claim.get("status") or {}
            if meta.get("deletionTimestamp"):
                continue
            key = f"{meta['namespace']}/{meta['name']}"
            model = str(status.get("model") or (claim.get("spec") or {}).get("modelName") or meta["name"])
            phase = phase_of(status) or ClaimPhase.PENDING
            pod = pods.get((meta["namespace"], bound_pod(status) or ""))
            route = None
            if pod is not None:
                bound[key] = (pod, model)
                note = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_PREFIX + meta["name"])
                port, state = parse_route(note)
                ip = (pod.get("status") or {}).get("podIP")
                route = (ip, port) if port and ip else None
                phase = effective_phase(phase, state, route is not None)
            ranked = schedules_by_priority(meta["name"], claim.get("spec"))
            engine = claim_engine(meta["name"], claim.get("spec"))
            views.append(ClaimView(key, model, phase, route, bound_pod(status) is not None, ranked, engine))
        self._views, self._bound = views, bound

    def views(self) -> list[ClaimView]:
        return list(self._views)

    async def wake_target(self, key: str) -> WakeTarget | None:
        found = self._bound.get(key)
        if found is None:
            return None
        pod, model = found
        url = agent_url(pod)
        if url is None:
            return None
        report = await self.agents.report(url, pod["metadata"]["name"])
        sleep_id = sleeping_engine(report.engines if report else [], model)
        return None if sleep_id is None else WakeTarget(url, pod["metadata"]["name"], model, sleep_id)


def _drop_legacy_finalizers(body: Any) -> None:
    meta = body.get("metadata") or {}
    if "finalizers" in meta:
        meta["finalizers"] = [f for f in meta["finalizers"] if f not in LEGACY_FINALIZERS]


def build_registry(cfg: OperatorConfig, metrics: ControllerMetrics) -> kopf.OperatorRegistry:
    """The operator's handlers in their own registry (several can run in one process, as the tests do)."""
    registry = kopf.OperatorRegistry()
    holder: dict[str, Operator] = {}
    tasks: list[asyncio.Task[None]] = []

    def operator() -> Operator:
        if "op" not in holder:
            holder["op"] = Operator(cfg, metrics)
        return holder["op"]

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.posting.level = logging.WARNING  # kopf's own events only for handler errors
        settings.watching.server_timeout = 60
        tasks.append(asyncio.create_task(operator().pool_loop(), name="turnout-pool-policies"))

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        conf = kube_configuration(cfg.kubeconfig)
        keys = conf.api_key or {}
        token = keys.get("BearerToken") or keys.get("authorization") or ""  # the key's name varies by client version
        scheme, _sep, value = token.partition(" ")
        return kopf.ConnectionInfo(
            server=conf.host,
            ca_path=conf.ssl_ca_cert,
            insecure=not conf.verify_ssl,
            scheme=scheme or None,
            token=value or None,
            certificate_path=conf.cert_file,
            private_key_path=conf.key_file,
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if "op" in holder:
            await holder.pop("op").close()

    @kopf.timer(GROUP, VERSION, PLURAL, interval=cfg.interval_s, registry=registry)
    async def claim_timer(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        await operator().reconcile(body, patch)

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    async def claim_deleted(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        if not await operator().reconcile(body, patch, deleting=True):
            raise kopf.TemporaryError("de-routing and stopping the engine", delay=1)
        if set(body.get("metadata", {}).get("finalizers") or []) & set(LEGACY_FINALIZERS):
            patch.fns.append(_drop_legacy_finalizers)  # applied as kopf drops its own: a JSON patch, version-checked

    return registry
