import json

import pytest

from turnout.core.claims import POOL_LABEL, ClaimPhase, PodView, parse_claim_spec
from turnout.core.reconcile import (
    REJECTED,
    Activate,
    Annotate,
    ClaimState,
    Deactivate,
    EngineInfo,
    PodState,
    ReleaseFinalizer,
    SetStatus,
    announces,
    download_detail,
    event_type,
    plan,
    rejected,
    route_annotation,
)

SPEC = parse_claim_spec("qwen", {"podSelector": {"matchLabels": {"pool": "a"}}, "artifactURL": "hf://q"})
KEY = "modelclaim.aibrix.ai/qwen"


def pod(name: str = "p1", **kw: object) -> PodView:
    base: dict[str, object] = {
        "labels": {"pool": "a", POOL_LABEL: "true"},
        "running": True,
        "address": "10.0.0.1",
        "gpus": 1,
    }
    base.update(kw)
    return PodView(name=name, **base)  # type: ignore[arg-type]


def statuses(actions: list[object]) -> list[tuple[ClaimPhase, str]]:
    return [(a.phase, a.reason) for a in actions if isinstance(a, SetStatus)]


def test_unbound_claim_is_placed_on_the_best_pod() -> None:
    actions = plan([ClaimState("qwen", SPEC)], [PodState(pod("p1", models=2)), PodState(pod("p2"))])
    assert Activate("qwen", "p2", SPEC) in actions
    assert statuses(actions) == [(ClaimPhase.SCHEDULING, "Scheduled")]
    assert Annotate("p2", KEY, '{"model":"qwen","port":0,"state":"activating"}') in actions


def test_no_candidate_remains_scheduling_with_the_reason() -> None:
    """A claim with zero candidate pods remains Scheduling (the design), unbound, with the reason; nothing is
    activated or annotated, and it is placed on the first tick a pod can take it."""
    actions = plan([ClaimState("qwen", SPEC)], [PodState(pod(running=False))])
    [status] = actions
    assert isinstance(status, SetStatus)
    assert (status.phase, status.reason, status.pod) == (ClaimPhase.SCHEDULING, "NoCandidatePod", None)
    assert "running" in status.message
    placed = plan([ClaimState("qwen", SPEC)], [PodState(pod())])
    assert statuses(placed) == [(ClaimPhase.SCHEDULING, "Scheduled")] and Activate("qwen", "p1", SPEC) in placed


@pytest.mark.parametrize(
    ("before", "before_reason", "status", "event"),
    [
        (None, None, SetStatus("q", ClaimPhase.SCHEDULING, "NoCandidatePod", "none"), True),
        (ClaimPhase.SCHEDULING, "NoCandidatePod", SetStatus("q", ClaimPhase.SCHEDULING, "NoCandidatePod", "x"), False),
        # placed at last: the phase stays Scheduling, yet that is news
        (ClaimPhase.SCHEDULING, "NoCandidatePod", SetStatus("q", ClaimPhase.SCHEDULING, "Scheduled", "", "p1"), True),
        (ClaimPhase.PENDING, "NoCandidatePod", SetStatus("q", ClaimPhase.SCHEDULING, "NoCandidatePod", "x"), True),
        (ClaimPhase.LOADING, "Activating", SetStatus("q", ClaimPhase.LOADING, "Loading", "", "p1"), False),
        (ClaimPhase.LOADING, "Loading", SetStatus("q", ClaimPhase.ACTIVE, "Ready", "", "p1"), True),
    ],
)
def test_which_status_writes_are_events(
    before: ClaimPhase | None, before_reason: str | None, status: SetStatus, event: bool
) -> None:
    assert announces(before, before_reason, status) is event


def test_invalid_spec_fails() -> None:
    [status] = plan([ClaimState("qwen", None, invalid="replicas must be 1")], [PodState(pod())])
    assert isinstance(status, SetStatus) and status.phase is ClaimPhase.FAILED and status.reason == "InvalidSpec"


@pytest.mark.parametrize(
    ("engine", "phase", "port", "state"),
    [
        (EngineInfo("booting", False, 30001), ClaimPhase.LOADING, 0, "activating"),
        (EngineInfo("active", True, 30001), ClaimPhase.ACTIVE, 30001, "active"),
        (EngineInfo("active", False, 30001), ClaimPhase.LOADING, 0, "activating"),
        (EngineInfo("sleeping", False, 30001), ClaimPhase.SLEEPING, 0, "sleeping"),
        (EngineInfo("restarting", False, 30001, "exit 1"), ClaimPhase.ACTIVATING, 0, "activating"),
        (EngineInfo("failed", False, 30001, "exit 1"), ClaimPhase.FAILED, 0, "failed"),
    ],
)
def test_bound_claim_follows_its_engine(engine: EngineInfo, phase: ClaimPhase, port: int, state: str) -> None:
    actions = plan([ClaimState("qwen", SPEC, bound_pod="p1")], [PodState(pod(), {"qwen": engine})])
    [status] = [a for a in actions if isinstance(a, SetStatus)]
    assert status.phase is phase
    assert (status.port, status.engine_port) == (port, 30001)  # routable only when Active; the engine's always
    [note] = [a for a in actions if isinstance(a, Annotate)]
    assert json.loads(note.value or "") == {"model": "qwen", "port": port, "state": state}
    assert not any(isinstance(a, Activate) for a in actions)


def test_missing_engine_is_activated_again() -> None:
    actions = plan([ClaimState("qwen", SPEC, bound_pod="p1")], [PodState(pod())])
    assert Activate("qwen", "p1", SPEC) in actions


def test_pod_gone_reschedules() -> None:
    actions = plan([ClaimState("qwen", SPEC, bound_pod="gone")], [PodState(pod("p2"))])
    assert Activate("qwen", "p2", SPEC) in actions


def test_unreachable_agent_keeps_the_binding() -> None:
    actions = plan([ClaimState("qwen", SPEC, bound_pod="p1")], [PodState(pod(), reachable=False)])
    assert statuses(actions) == [(ClaimPhase.ACTIVATING, "AgentUnreachable")]
    [status] = [a for a in actions if isinstance(a, SetStatus)]
    assert status.engine_port is None  # not known this tick: the status keeps the last known


def test_deletion_deroutes_then_stops_then_releases() -> None:
    running = {"qwen": EngineInfo("active", True, 30001)}
    first = plan([ClaimState("qwen", SPEC, bound_pod="p1", deleting=True)], [PodState(pod(), running)])
    assert first == [Annotate("p1", KEY, None), Deactivate("qwen", "p1", "qwen")]
    second = plan([ClaimState("qwen", SPEC, bound_pod="p1", deleting=True)], [PodState(pod())])
    assert second == [Annotate("p1", KEY, None), ReleaseFinalizer("qwen")]
    assert plan([ClaimState("qwen", SPEC, deleting=True)], []) == [ReleaseFinalizer("qwen")]


@pytest.mark.parametrize(
    ("engine", "note"),
    [
        (EngineInfo("active", True, 9), '{"model":"m","port":9,"state":"active"}'),
        (EngineInfo("active", False, 9), '{"model":"m","port":0,"state":"activating"}'),
        (None, '{"model":"m","port":0,"state":"activating"}'),
        (EngineInfo("booting", False, 9), '{"model":"m","port":0,"state":"activating"}'),
        (EngineInfo("restarting", False, 9), '{"model":"m","port":0,"state":"activating"}'),
        (EngineInfo("stopping", False, 9), '{"model":"m","port":0,"state":"activating"}'),
        (EngineInfo("sleeping", False, 9), '{"model":"m","port":0,"state":"sleeping"}'),
        (EngineInfo("failed", False, 9), '{"model":"m","port":0,"state":"failed"}'),
    ],
)
def test_route_annotation_uses_aibrix_states(engine: EngineInfo | None, note: str) -> None:
    assert route_annotation("m", engine) == note


def launched(spec: object = SPEC) -> object:
    from turnout.core.reconcile import launch_key

    return launch_key(spec)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("engine", "restarts"),
    [
        (EngineInfo("active", True, 30001, launched=launched()), False),  # same spec: keep serving
        (EngineInfo("active", True, 30001), False),  # launch not reported: no drift check
        (EngineInfo("active", True, 30001, launched=("vllm", "hf://q", (("--max-model-len", "4096"),))), True),
        (EngineInfo("active", True, 30001, launched=("sglang", "hf://q", ())), True),
        (EngineInfo("active", True, 30001, launched=("vllm", "hf://other", ())), True),
    ],
)
def test_changed_spec_restarts_the_engine(engine: EngineInfo, restarts: bool) -> None:
    actions = plan([ClaimState("qwen", SPEC, bound_pod="p1")], [PodState(pod(), {"qwen": engine})])
    if restarts:
        # de-routed first, then stopped; the next pass finds no engine and activates the new spec
        assert actions[:2] == [Annotate("p1", KEY, route_annotation("qwen", None)), Deactivate("qwen", "p1", "qwen")]
        assert statuses(actions) == [(ClaimPhase.LOADING, "SpecChanged")]
    else:
        assert not any(isinstance(a, Deactivate) for a in actions)
        assert statuses(actions) == [(ClaimPhase.ACTIVE, "Ready")]


def test_renamed_model_stops_the_old_engine_only() -> None:
    engines = {
        "old-name": EngineInfo("active", True, 30001, claim="qwen"),
        "neighbour": EngineInfo("active", True, 30002, claim="other-claim"),
    }
    actions = plan([ClaimState("qwen", SPEC, bound_pod="p1")], [PodState(pod(), engines)])
    assert [a for a in actions if isinstance(a, Deactivate)] == [Deactivate("qwen", "p1", "old-name")]
    assert Activate("qwen", "p1", SPEC) in actions


def test_pods_whose_agent_is_silent_are_not_candidates() -> None:
    pods = [PodState(pod("p1"), reachable=False), PodState(pod("p2", models=5))]
    actions = plan([ClaimState("qwen", SPEC)], pods)
    assert Activate("qwen", "p2", SPEC) in actions  # the worse-ranked pod that answers
    [status] = [a for a in plan([ClaimState("qwen", SPEC)], pods[:1]) if isinstance(a, SetStatus)]
    assert status.phase is ClaimPhase.SCHEDULING and "p1 does not answer" in status.message


@pytest.mark.parametrize("bound", [None, "p1"])
def test_activate_is_each_claims_last_action(bound: str | None) -> None:
    """A rejected activation is followed by nothing else of that claim within the tick."""
    actions = plan([ClaimState("qwen", SPEC, bound_pod=bound), ClaimState("other", None)], [PodState(pod())])
    mine = [a for a in actions if getattr(a, "claim", None) == "qwen" or isinstance(a, Annotate)]
    assert isinstance(mine[-1], Activate)


def test_rejected_activation_unbinds_and_fails() -> None:
    actions = rejected("qwen", "p1", "qwen", "artifact_url must start with one of hf://")
    assert actions[0] == Annotate("p1", KEY, None)
    [status] = [a for a in actions if isinstance(a, SetStatus)]
    assert (status.phase, status.reason, status.pod) == (ClaimPhase.FAILED, REJECTED, None)
    assert "p1" in status.message and "artifact_url must start" in status.message


@pytest.mark.parametrize("bound", [None, "p1"])
def test_a_rejected_spec_stays_failed_without_a_retry(bound: str | None) -> None:
    claim = ClaimState("qwen", SPEC, bound_pod=bound, rejected="the runtime agent on p1 refused it")
    actions = plan([claim], [PodState(pod())])
    assert actions == [SetStatus("qwen", ClaimPhase.FAILED, REJECTED, "the runtime agent on p1 refused it")]


def test_deleting_a_rejected_claim_lets_it_go() -> None:
    claim = ClaimState("qwen", SPEC, deleting=True, rejected="refused")
    assert plan([claim], [PodState(pod())]) == [ReleaseFinalizer("qwen")]


@pytest.mark.parametrize(
    ("phase", "reason", "kind"),
    [
        (ClaimPhase.FAILED, "EngineFailed", "Warning"),
        (ClaimPhase.FAILED, "InvalidSpec", "Warning"),
        (ClaimPhase.FAILED, REJECTED, "Warning"),
        (ClaimPhase.SCHEDULING, "NoCandidatePod", "Warning"),  # a claim no pod can take
        (ClaimPhase.PENDING, "NoCandidatePod", "Warning"),  # as earlier Turnout wrote it
        (ClaimPhase.ACTIVATING, "Restarting", "Warning"),  # a crash
        (ClaimPhase.ACTIVATING, "AgentUnreachable", "Warning"),
        (ClaimPhase.ACTIVE, "Ready", "Normal"),
        (ClaimPhase.SLEEPING, "Sleeping", "Normal"),
        (ClaimPhase.LOADING, "Loading", "Normal"),
        (ClaimPhase.SCHEDULING, "Scheduled", "Normal"),
    ],
)
def test_event_types(phase: ClaimPhase, reason: str, kind: str) -> None:
    assert event_type(SetStatus("qwen", phase, reason)) == kind


_DOWNLOAD = {"url": "s3://w/m", "bytes_done": 0, "bytes_total": None, "files_done": 0, "files_total": None}


@pytest.mark.parametrize(
    ("download", "detail"),
    [
        (None, None),
        ("downloading", None),
        ({**_DOWNLOAD, "url": 3}, None),
        ({**_DOWNLOAD, "bytes_done": -1}, None),
        ({**_DOWNLOAD, "bytes_done": True}, None),
        (_DOWNLOAD, "downloading s3://w/m: 0 B (listing its objects)"),
        ({**_DOWNLOAD, "bytes_done": 512, "bytes_total": 2048}, "downloading s3://w/m: 512 B of 2.0 KiB (25 %)"),
        (
            {**_DOWNLOAD, "bytes_done": 3 << 29, "bytes_total": 4 << 30, "files_done": 3, "files_total": 9},
            "downloading s3://w/m: 1.5 GiB of 4.0 GiB (37 %), 3 of 9 files",
        ),
        (
            {**_DOWNLOAD, "bytes_done": 5, "bytes_total": 5, "files_done": 1, "files_total": 1},
            "downloading s3://w/m: 5 B of 5 B (100 %)",
        ),
    ],
)
def test_download_detail(download: object, detail: str | None) -> None:
    assert download_detail(download) == detail


def test_a_claim_whose_artifact_downloads_is_loading_with_the_download_as_its_message() -> None:
    detail = "downloading s3://w/m: 1.5 GiB of 4.0 GiB (37 %)"
    engine = EngineInfo("booting", False, 20001, detail=detail)
    state = ClaimState("qwen", SPEC, bound_pod="p1")
    actions = plan([state], [PodState(pod(), {"qwen": engine})])
    status = next(a for a in actions if isinstance(a, SetStatus))
    assert (status.phase, status.reason, status.message, status.port) == (ClaimPhase.LOADING, "Downloading", detail, 0)
    assert not announces(ClaimPhase.LOADING, "Loading", status)  # progress is no event
