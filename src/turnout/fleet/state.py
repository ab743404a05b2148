"""Per-worker live state and the fleet that owns it.

Mutable, owned by one event loop: the poller writes probe results, inventory and residency; the gateway
writes in-flight counts, speed observations and what its proxied requests saw (``record_progress``,
``record_success``, ``record_failure``). Health rules live in :mod:`turnout.core.health`; health (is it
serving?) and inventory (what does it hold?) are kept apart, so a failed listing never takes a serving
worker out of routing. ``views()`` freezes what the pure router needs for one request.

Each worker keeps what it was recently sent (its :class:`~turnout.core.prefix.PrefixIndex`) and, per model, its
learned prefill and decode rates (:func:`turnout.core.signals.speeds`), each with the time it was learned: a
figure older than ``routing.speed_ttl_s`` is forgotten, so a worker that was slow once counts as average again
and is tried again (none starves on an old figure).

Every change of a worker's health is logged once, with its reason (``worker "w1" is down: connection refused``,
``worker "w1" is up again``), never once per poll; so is an endpoint or worker rejecting its credential, and a
model taken out on one worker while the worker keeps serving its others (``worker "w1": model "m" is out
(requests failing: HTTP 500) ...``, ``worker "w1": model "m" is back``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from turnout.config import Settings, Worker, WorkerType
from turnout.core.endpoint_health import EndpointState
from turnout.core.health import Event, Health, ModelHealth, after, model_after, model_checked
from turnout.core.names import lookup
from turnout.core.parallelism import Evidence, Parallelism, Span, depth, effective, waited
from turnout.core.placement import PlacementRules
from turnout.core.prefix import BYTES_PER_TOKEN, NO_MATCH, Match, PrefixIndex, Prompt
from turnout.core.routing import NO_BACKLOG, Backlog, WorkerView
from turnout.core.sharing import Company, fitted, level
from turnout.core.signals import Sample, pool, smooth, speeds
from turnout.dialects.base import WorkerAPI
from turnout.state.placement_store import PlacementStore
from turnout.upstream.http1 import DialGuard

__all__ = ["MAX_SESSIONS", "External", "Fleet", "Learned", "WorkerState"]

log = logging.getLogger("turnout.fleet")

MAX_SESSIONS = 4096  # client sessions each worker's prefix index remembers at most
RECENT_SPANS = 64  # answers per (worker, model) kept to find the ones that ran at the same time
MAX_COMPANY_ANSWERS = 20  # a level of company weighs as many answers at most (a busy level never drowns the others)


@dataclass(slots=True)
class External:
    """What makes a worker an external endpoint: namespaced models, SSRF-guarded dials, health states."""

    prefix: str  # "<endpoint>/": clients ask for "<endpoint>/<model>"
    guard: DialGuard
    fallback_model: str | None = None
    latency_budget_ms: int | None = None
    state: EndpointState = EndpointState.UNKNOWN
    last_check: float | None = None
    latency_ms: float | None = None
    hint: str | None = None

    def upstream_name(self, model: str) -> str:
        return model.removeprefix(self.prefix)


@dataclass(slots=True)
class Learned:
    """One model's learned figures on one worker, each with the monotonic time it was last learned."""

    prefill: float | None = None  # uncached prompt tokens/s
    prefill_at: float = 0.0
    prefill_n: int = 0  # answers folded into ``prefill`` since it was last forgotten
    decode: float | None = None  # completion tokens/s after the first
    decode_at: float = 0.0
    decode_n: int = 0
    service: float | None = None  # seconds a request held the worker
    service_at: float = 0.0
    # how much what its engine runs at once slows each (turnout.core.sharing): by the company its answers had (the
    # nearest whole number of others in flight beside them), their mean company, decode rate, how many answers
    # (at most MAX_COMPANY_ANSWERS: the weight of a level) and when last taught
    company: dict[int, tuple[float, float, int, float]] = field(default_factory=dict)
    # the last fit of it, and the times between which it holds (no answer since, no level gone stale: every view of
    # this worker on every routed request reads it, and a fit is a few microseconds)
    fit: float | None = None
    fit_from: float = math.inf
    fit_until: float = -math.inf
    # what it has shown of its parallelism, and its last answers' spans (those that ran together show it)
    parallel: Evidence = field(default_factory=Evidence)
    spans: deque[Span] = field(default_factory=lambda: deque(maxlen=RECENT_SPANS))
    # the other gateway replicas' figures for it (pooled: prefill, its answers, decode, its answers, service), and
    # when they were read (monotonic; see turnout.gateway.redis_fleet)
    peers: tuple[float | None, int, float | None, int, float | None] | None = None
    peers_at: float = 0.0

    def learn(self, sample: Sample, now: float, ttl_s: float, beside: float | None = None) -> None:
        """Fold one answer in: each rate it teaches smoothed into the fresh figure, or replacing a stale one.
        ``beside``: how many other requests were in flight there on average while it was (None: not known)."""
        limit = now - ttl_s
        prefill = self.prefill if self.prefill_at >= limit else None
        decode = self.decode if self.decode_at >= limit else None
        learned = speeds(sample, prefill, decode)
        if beside is not None and learned.decode is not None:
            self._shared(learned.decode, beside, now, limit)
        if learned.prefill is not None:
            self.prefill_n = 1 if prefill is None else self.prefill_n + 1
            self.prefill, self.prefill_at = smooth(prefill, learned.prefill), now
        if learned.decode is not None:
            self.decode_n = 1 if decode is None else self.decode_n + 1
            self.decode, self.decode_at = smooth(decode, learned.decode), now
        if learned.service_s is not None:
            service = self.service if self.service_at >= limit else None
            self.service, self.service_at = smooth(service, learned.service_s), now

    def _shared(self, rate: float, beside: float, now: float, limit: float) -> None:
        """One answer's decode ``rate``, generated with ``beside`` others in flight on average: folded into its
        level of company (a stale level starts again)."""
        at = level(beside)
        known = self.company.get(at)
        if known is None or known[3] < limit:
            self.company[at] = (beside, rate, 1, now)
        else:
            answers = min(known[2] + 1, MAX_COMPANY_ANSWERS)
            self.company[at] = (smooth(known[0], beside), smooth(known[1], rate), answers, now)
        self.fit_from = math.inf  # fitted again at the next reading

    def fresh_sharing(self, now: float, ttl_s: float) -> float | None:
        """The sharing the levels of company learned within ``ttl_s`` of ``now`` say
        (:func:`turnout.core.sharing.fitted`), or None. Fitted once, and again only after an answer was folded in or
        one of the levels fitted went stale."""
        if self.fit_from <= now <= self.fit_until:
            return self.fit
        limit = now - ttl_s
        fresh = [(b, r, n, when) for b, r, n, when in self.company.values() if when >= limit]
        self.fit = fitted(Company(b, r, n) for b, r, n, _ in fresh)
        self.fit_from = now
        self.fit_until = min((when for *_, when in fresh), default=math.inf) + ttl_s
        return self.fit

    def pooled(self, now: float, ttl_s: float) -> tuple[float | None, int, float | None, int, float | None]:
        """(prefill, its answers, decode, its answers, service): this process's fresh figures pooled with the other
        replicas' (:func:`turnout.core.signals.pool`) while theirs are fresh."""
        prefill, decode, service = self.fresh(now, ttl_s)
        own = (prefill, self.prefill_n if prefill is not None else 0, decode, self.decode_n if decode else 0, service)
        peers = self.peers
        if peers is None or now - self.peers_at > ttl_s:
            return own
        prefill, prefill_n = pool([(own[0], own[1]), (peers[0], peers[1])])
        decode, decode_n = pool([(own[2], own[3]), (peers[2], peers[3])])
        return prefill, prefill_n, decode, decode_n, service if service is not None else peers[4]

    def fresh(self, now: float, ttl_s: float) -> tuple[float | None, float | None, float | None]:
        """(prefill, decode, service) learned within ``ttl_s`` of ``now``; None where older or never learned."""
        limit = now - ttl_s
        return (
            self.prefill if self.prefill_at >= limit else None,
            self.decode if self.decode_at >= limit else None,
            self.service if self.service_at >= limit else None,
        )


@dataclass(slots=True)
class WorkerState:
    config: Worker
    healthy: bool = False
    checked: bool = False  # at least one poll (or proxied answer) finished
    last_error: str | None = None
    down_reason: str | None = None  # the last counted failure in a few words (``connection refused``)
    credential_rejected: int | None = None  # the HTTP status of its credential's last rejection (until a success)
    healthy_at: float | None = None  # monotonic time it was last seen healthy (a probe or an answer)
    failures: int = 0  # consecutive probe failures that counted
    request_failures: int = 0  # consecutive proxied requests that broke before any answer
    failures_to_down: int = 1  # health.failures_to_down (set by the fleet)
    request_failures_to_down: int = 5  # health.request_failures_to_down (set by the fleet)
    model_retry_s: float = 30.0  # health.model_retry_s (set by the fleet)
    # model (as sent upstream) -> what its requests here found; only models with something against them
    models: dict[str, ModelHealth] = field(default_factory=dict)
    last_progress: float | None = None  # monotonic time bytes last arrived for a proxied request
    inventory: frozenset[str] | None = None  # None until fetched once; then the last known, maybe stale
    inventory_stale: bool = False  # the last inventory poll failed; ``inventory`` is from an earlier one
    inventory_error: str | None = None
    inventory_at: float | None = None  # monotonic time of the last good inventory poll
    tags: dict[str, dict[str, Any]] = field(default_factory=dict)  # raw inventory entries by name
    loaded: frozenset[str] = frozenset()
    ps: list[dict[str, Any]] = field(default_factory=list)  # raw /api/ps entries
    in_flight: int = 0
    completed: int = 0  # requests finished here (success or not), for idle detection
    # requests in flight here integrated over (monotonic) time, up to ``flight_at``: an answer's mean company
    flight_area: float = 0.0
    flight_at: float = 0.0
    # what the engine says of itself: its family by its model listing (``llamacpp``, ``vllm``, ``sglang``), its
    # llama.cpp ``GET /props`` as the poller last read it (None: not read, or not a llama.cpp server: its slots,
    # modalities and chat template capabilities), and the parallelism read from either
    engine_family: str | None = None
    engine_props: dict[str, Any] | None = None
    engine_parallelism: Parallelism | None = None
    engine_seen_running: int = 0  # the most requests a batching engine's gauge showed running
    learned: dict[str, Learned] = field(default_factory=dict)  # model (as requested) -> its learned figures
    prefix: PrefixIndex = field(default_factory=lambda: PrefixIndex(16384))  # what it was recently sent
    # prompt tokens of the requests routed here with a choice of workers, and how many of them it was expected
    # to hold (the prefix index, or the session); and where the engine said so itself, its own two counts
    routed_tokens: float = 0.0
    expected_cached_tokens: float = 0.0
    engine_prompt_tokens: int = 0
    engine_cached_tokens: int = 0
    gpu_util: float | None = None
    gpu_memory: float | None = None
    offload: float | None = None
    external: External | None = None
    claim: str | None = None  # set for a ModelClaim binding (an engine on a GPU pool pod)
    # Derived once from the config: read on every request, so never recomputed there.
    base_url: str = field(init=False)
    baseline: PlacementRules = field(init=False)
    headers: dict[str, str] = field(init=False)
    speaks: WorkerAPI = field(init=False)  # its own API (the config's type)
    native_apis: frozenset[str] = field(init=False)  # client APIs it serves itself (passed through unchanged)

    def __post_init__(self) -> None:
        self.base_url = self.config.base_url
        self.baseline = self.config.model_placement.rules()
        self.speaks = WorkerAPI(self.config.type.value)
        self.native_apis = frozenset(self.config.native_apis)
        self.headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            self.headers["Authorization"] = f"Bearer {self.config.api_key}"

    @property
    def name(self) -> str:
        return self.config.name

    def upstream_name(self, model: str) -> str:
        """The name this worker knows ``model`` by (an endpoint's, without its namespace)."""
        return model if self.external is None else self.external.upstream_name(model)

    @property
    def vram_pressure(self) -> float | None:
        offload, memory = self.offload, self.gpu_memory  # read on every request: no list built
        if offload is None:
            return memory
        return offload if memory is None else max(offload, memory)

    def observe(self, model: str, sample: Sample, now: float, ttl_s: float, beside: float | None = None) -> None:
        """What one answer for ``model`` (as requested) taught about this worker's speed (``beside``: the others in
        flight here on average meanwhile, where its engine runs several at once; None: not known, or one at a
        time)."""
        self.figures(model).learn(sample, now, ttl_s, beside)

    def figures(self, model: str) -> Learned:
        learned = self.learned.get(model)
        if learned is None:
            learned = self.learned[model] = Learned()
        return learned

    def parallelism(self, model: str, now: float) -> Parallelism:
        """What its engine runs at once for ``model`` (as requested), and how that was found
        (:func:`turnout.core.parallelism.effective`)."""
        learned = self.learned.get(model)
        return effective(self.config.slots, self.engine_parallelism, None if learned is None else learned.parallel, now)

    def parallelisms(self, now: float) -> dict[str, Parallelism]:
        """By model: each model it has answered (learned), else the worker's own figure under ``*``."""
        out = {m: self.parallelism(m, now) for m in sorted(self.learned)}
        return out or {"*": effective(self.config.slots, self.engine_parallelism, None, now)}

    def ran(self, model: str, span: Span, now: float) -> None:
        """One answer for ``model`` (as requested) ended here: when it was sent and when the engine was seen working
        on it. Those that ran at the same time as it, or its wait for the ones before, teach the parallelism."""
        learned = self.figures(model)
        recent = learned.spans
        if recent:
            level = depth(span, recent)
            if level > 1:
                learned.parallel.observe(level, now)
            elif waited(span, recent):
                learned.parallel.observe_wait()
        recent.append(span)

    def flown(self, now: float) -> float:
        """Requests in flight here integrated over time up to ``now`` (call it before ``in_flight`` changes): the
        difference between two readings over the time between them is the mean number in flight meanwhile."""
        if now > self.flight_at:
            self.flight_area += self.in_flight * (now - self.flight_at)
            self.flight_at = now
        return self.flight_area

    def restarted(self) -> None:
        """It went down and came back: its engine may have been restarted with other settings, so what was read
        from it or learned of its parallelism is found again."""
        self.engine_parallelism = None
        self.engine_props = None
        self.engine_seen_running = 0
        for learned in self.learned.values():
            learned.parallel.forget()
            learned.spans.clear()

    def decode_rates(self, now: float, ttl_s: float) -> dict[str, float]:
        """Fresh decode rates by model (the admin API and UI show them)."""
        return {m: r for m, f in self.learned.items() if (r := f.fresh(now, ttl_s)[1]) is not None}

    def sharings(self, now: float, ttl_s: float) -> dict[str, float]:
        """Fresh learned sharing by model (the admin API shows it)."""
        return {m: v for m, f in self.learned.items() if (v := f.fresh_sharing(now, ttl_s)) is not None}

    def prefill_rates(self, now: float, ttl_s: float) -> dict[str, float]:
        return {m: r for m, f in self.learned.items() if (r := f.fresh(now, ttl_s)[0]) is not None}

    def routed(self, prompt_tokens: float, cached_tokens: float) -> None:
        """A request with a choice of workers came here: its prompt, and what it was expected to hold of it."""
        self.routed_tokens += prompt_tokens
        self.expected_cached_tokens += cached_tokens

    def engine_counted(self, prompt_tokens: int, cached_tokens: int) -> None:
        """The engine's own count of a prompt and of what it served from its cache."""
        self.engine_prompt_tokens += prompt_tokens
        self.engine_cached_tokens += cached_tokens

    @property
    def hit_rate(self) -> float | None:
        """The share of prompt tokens served from the engine's cache: its own counts where it reports them, else
        what the prefix index expected it to hold; None before any request with a choice came here."""
        if self.engine_prompt_tokens:
            return self.engine_cached_tokens / self.engine_prompt_tokens
        if self.routed_tokens:
            return self.expected_cached_tokens / self.routed_tokens
        return None

    @property
    def kind(self) -> str:
        """``endpoint`` or ``worker``, for log lines and messages."""
        return "worker" if self.external is None else "endpoint"

    @property
    def label(self) -> str:
        """``worker "w1"`` or ``endpoint "mac"``: how log lines name it."""
        return f'{self.kind} "{self.name}"'

    def mark_down(self, error: str, reason: str) -> None:
        """A proxied request could not reach it (refused, DNS, TLS, SSRF guard): down at once, and an
        endpoint unreachable until a check sees it online."""
        was, known, before = self.healthy, self.checked, self.down_reason
        self.healthy = False
        self.checked = True
        self.last_error = error
        self.down_reason = reason
        if self.external is not None and self.external.state.routable:
            self.external.state = EndpointState.UNREACHABLE
        self._log_change(was, known, before, error)

    # -- what proxied requests saw (called by the gateway; ``now``: loop.time(), i.e. time.monotonic())
    def record_progress(self, now: float) -> None:
        """Bytes arrived from the worker for a proxied request: it is working (probe timeouts won't count)."""
        self.last_progress = now

    def record_success(self, now: float, model: str | None = None) -> None:
        """A proxied request got a complete answer: alive, failure counts reset, healthy; ``model`` (as sent
        upstream) is back in if it was out."""
        self.last_progress = now
        self.record(Event.SERVED)
        cleared = self.models.pop(model, None) if model is not None and self.models else None
        if cleared is not None and cleared.out_until is not None:
            log.info('%s: model "%s" is back (a request succeeded)', self.label, model)
        if self.credential_rejected is not None:
            self.credential_rejected = None
            log.info("%s accepts its credential again", self.label)

    def record_failure(self, error: str, now: float, reason: str | None = None) -> None:
        """A proxied request broke before any answer (the connection reset or closed after the request was
        sent): the worker's failure; ``request_failures_to_down`` in a row take it down. Connections that
        could not be made call :meth:`mark_down`; answers that were bad are the model's
        (:meth:`record_model_failure`). ``reason``: the failure in a few words; ``error`` when not given."""
        del now  # the count is what decides; the time is part of every event's signature
        self.record(Event.REQUEST_FAILED, error, f"requests failing: {reason or error}")

    def record_model_failure(self, model: str, error: str, now: float, reason: str | None = None) -> None:
        """The worker answered a request for ``model`` (as sent upstream) badly: an HTTP 5xx, an invalid
        answer, a stream broken after it started. The model's failure, not the worker's (which answered, so
        it is alive): ``request_failures_to_down`` in a row take that model out on this worker, and only it
        (:func:`turnout.core.health.model_after`). ``now``: monotonic seconds."""
        self.last_progress = now
        self.last_error = error
        before = self.models.get(model, ModelHealth())
        health = model_after(
            before,
            True,
            now,
            failures_to_out=self.request_failures_to_down,
            retry_s=self.model_retry_s,
            reason=f"requests failing: {reason or error}",
        )
        self.models[model] = health
        if health.out_until != before.out_until:
            log.warning(
                '%s: model "%s" is out (%s) after %d failed requests in a row; the %s keeps serving its other '
                "models, and requests try this one again in %.0fs",
                self.label,
                model,
                health.reason,
                health.failures,
                self.kind,
                (health.out_until or now) - now,
            )

    def models_back(self, now: float, why: str) -> None:
        """A health check found it serving: every model taken out here is tried again from the next request
        (:func:`turnout.core.health.model_checked`); each one that was out is logged back once, with ``why``."""
        for model, health in self.models.items():
            if health.out_until is not None:
                self.models[model] = model_checked(health)
                if health.out(now):
                    log.info('%s: model "%s" is back (%s)', self.label, model, why)

    def model_out(self, model: str, now: float) -> str | None:
        """Why ``model`` (either spelling, ``m`` or ``m:latest``) is out on this worker now; None: it is in."""
        if not self.models:
            return None
        name = lookup(model, self.models)
        health = None if name is None else self.models[name]
        return health.reason if health is not None and health.out(now) else None

    def models_out(self, now: float) -> dict[str, str]:
        """Every model out on this worker now, with why (the worker's card shows them)."""
        return {m: h.reason or "requests failing" for m, h in sorted(self.models.items()) if h.out(now)}

    def reject_credential(self, status: int, detail: str, now: float) -> None:
        """It answered 401/403 to the gateway's credential for it: alive, and the operator's problem (logged
        once, until a request succeeds)."""
        self.last_progress = now
        self.record(Event.SERVED)
        if self.credential_rejected is None:
            where = (
                f"set the right one: turnout endpoint set {self.name} --credential-from-env VAR"
                if self.external is not None
                else f'fix "api_key" of worker "{self.name}" in the config'
            )
            log.warning("%s rejected its credential (HTTP %d: %s); %s", self.label, status, detail, where)
        self.credential_rejected = status

    def record(self, event: Event, error: str | None = None, reason: str | None = None) -> None:
        """Apply one health event (probe or request) through :func:`turnout.core.health.after`. ``reason``:
        a failure in a few words (``connection refused``), kept as :attr:`down_reason` while it is down."""
        was, known, before = self.healthy, self.checked, self.down_reason
        health = after(
            Health(self.healthy, self.failures, self.request_failures),
            event,
            self.failures_to_down,
            self.request_failures_to_down,
        )
        self.healthy, self.failures, self.request_failures = (
            health.healthy,
            health.probe_failures,
            health.request_failures,
        )
        self.checked = True
        if error is not None:
            self.last_error = error
        elif not (health.probe_failures or health.request_failures):
            self.last_error = None
        if reason is not None:
            self.down_reason = reason
        elif self.healthy:
            self.down_reason = None
        if self.healthy:
            self.healthy_at = time.monotonic()
        if known and not was and self.healthy:
            self.restarted()
        self._log_change(was, known, before, error)

    def _log_change(self, was: bool, known: bool, before: str | None, error: str | None) -> None:
        """One line per change of health (and of the reason while down), never one per poll."""
        if self.healthy:
            if not known:
                log.info("%s is up", self.label)
            elif not was:
                log.info("%s is up again (was down: %s)", self.label, before or "unknown")
            return
        detail = f" [{error}]" if error and error != self.down_reason else ""
        if was or not known:
            log.warning("%s is down: %s%s", self.label, self.down_reason or "unknown", detail)
        elif self.down_reason != before:
            log.warning("%s is still down, now: %s%s", self.label, self.down_reason, detail)

    # -- what inventory polls saw (called by the poller) -------------------------------------------
    def inventory_fetched(self, now: float) -> None:
        self.inventory_stale = False
        self.inventory_error = None
        self.inventory_at = now

    def inventory_failed(self, error: str) -> None:
        """The listing failed: keep the last known inventory (or None: unknown), marked stale."""
        self.inventory_stale = self.inventory is not None
        self.inventory_error = error


# Fleet.views fills WorkerView's first 11 fields for every worker; Fleet._ranked appends these by position.
if WorkerView._fields[11:] != (
    "slots",
    "busy_s",
    "prefill_rate",
    "decode_rate",
    "prefill_samples",
    "decode_samples",
    "service_s",
    "backlog_s",
    "ranked",
    "cached",
    "by_session",
    "evicts",
    "evicts_age_s",
    "history",
    "sharing",
):  # pragma: no cover - a reordered WorkerView must fail at import, never route on swapped figures
    raise ImportError("WorkerView's fields moved: update Fleet._ranked")


class Fleet:
    def __init__(self, settings: Settings, placement: PlacementStore) -> None:
        self.settings = settings
        self.placement = placement
        self.workers: dict[str, WorkerState] = {w.name: self.state_for(w) for w in settings.workers}
        self.endpoints = 0  # how many external endpoints are in ``workers`` (kept by the endpoint manager)
        self.bindings: dict[str, WorkerState] = {}  # model name -> its claim's engine (kept by the claim bindings)
        # model name -> epoch it was first listed to a client: the stable ``modified_at`` of an OpenAI-style
        # worker's model (kept by the gateway's catalog; ``keep_listing`` records a new one where every process
        # and restart sees it, the store, and answers the time recorded first)
        self.first_listed: dict[str, float] = {}
        self.keep_listing: Callable[[str, float], float] | None = None
        # model name -> its /v1/models entry, for claimed models listed whether or not routable now (asleep)
        self.claim_listing: dict[str, dict[str, Any]] = {}
        # model (as requested) -> its answers' mean length in completion tokens (smoothed): routing's estimate
        # of the decode a request will take
        self.completion: dict[str, float] = {}

    def answered(self, model: str, completion_tokens: int) -> None:
        """An answer for ``model`` had this many completion tokens."""
        self.completion[model] = smooth(self.completion.get(model), float(completion_tokens))

    def state_for(self, config: Worker, **extra: Any) -> WorkerState:
        """A new worker's state, with the ``health`` settings every worker takes: the config's workers, the
        endpoints and the claims' engines alike (``extra``: ``external=...``, ``claim=...``)."""
        health = self.settings.health
        routing = self.settings.routing
        blocks = routing.prefix_max_blocks
        if config.cache_tokens is not None:  # the engine's cache, when smaller, is the bound
            blocks = max(1, min(blocks, config.cache_tokens * BYTES_PER_TOKEN // routing.prefix_block_bytes))
        return WorkerState(
            config,
            failures_to_down=health.failures_to_down,
            request_failures_to_down=health.request_failures_to_down,
            model_retry_s=health.model_retry_s,
            prefix=PrefixIndex(blocks, min(blocks, MAX_SESSIONS)),
            **extra,
        )

    def rules(self, name: str) -> tuple[PlacementRules, str]:
        """Effective rules for a worker and their source: ``override`` or ``config``."""
        return self.rules_of(self.workers[name])

    def rules_of(self, state: WorkerState) -> tuple[PlacementRules, str]:
        """:meth:`rules` of a worker's state, which a request may hold after the fleet let it go (a claim's engine
        unbound while the request waited on the occupancy: it is then refused at its engine, never a KeyError)."""
        override = self.placement.get(state.name)
        if override is not None:
            return override, "override"
        return state.baseline, "config"

    def candidates(self, model: str) -> list[WorkerState]:
        """The workers that may serve ``model``: its endpoint alone for "<endpoint>/<model>", otherwise the fleet's
        own workers (endpoints never serve un-namespaced names)."""
        endpoint = self.endpoint_for(model) or self.bindings.get(model)
        if endpoint is not None:
            return [endpoint]
        if self.endpoints or self.bindings:
            return [s for s in self.workers.values() if s.external is None and s.claim is None]
        return list(self.workers.values())

    def views(
        self,
        model: str,
        prompt: Prompt | None = None,
        candidates: list[WorkerState] | None = None,
        in_flight: Mapping[str, int] | None = None,
        matches: Mapping[str, Match] | None = None,
        backlogs: Mapping[str, Backlog] | None = None,
    ) -> list[WorkerView]:
        """What the router needs of each candidate (:meth:`candidates` unless given) for one request for ``model``;
        with ``prompt``, what each is expected to hold of it (``matches``: as the occupancy's keeper found it; else
        its own prefix index and the client's session). ``in_flight``: every gateway's requests in flight per worker
        (else this process's); ``backlogs``: what every gateway's requests in flight per worker are expected to take
        (the occupancy's keeper's; none: nothing ranked). Learned figures are read only when there is more than one
        candidate (there is nothing to compare otherwise)."""
        if candidates is None:
            candidates = self.candidates(model)
        choice = len(candidates) > 1
        now = time.monotonic() if choice or any(state.models for state in candidates) else 0.0
        # (routing compares parallelism, speeds and held prefixes only where there is a choice of workers)
        ttls = (self.settings.routing.speed_ttl_s, self.settings.routing.prefix_ttl_s)
        out = []
        for state in candidates:
            rules, _ = self.rules_of(state)
            view = WorkerView(
                state.name,
                state.healthy,
                rules,
                state.inventory,
                state.loaded,
                state.in_flight if in_flight is None else in_flight.get(state.name, state.in_flight),
                state.config.max_concurrent,
                state.gpu_util,
                state.vram_pressure,
                None if state.healthy else state.down_reason,
                state.model_out(model, now) if state.models else None,
                state.config.slots,
            )
            if choice:  # one tuple built, not a copy made per figure (this runs per worker on every request)
                view = self._ranked(view, state, model, now, ttls, prompt, matches, backlogs)
            out.append(view)
        return out

    @staticmethod
    def _ranked(
        view: WorkerView,
        state: WorkerState,
        model: str,
        now: float,
        ttls: tuple[float, float],
        prompt: Prompt | None,
        matches: Mapping[str, Match] | None,
        backlogs: Mapping[str, Backlog] | None,
    ) -> WorkerView:
        """``view`` with what ranking it against the others needs: what its engine runs at once, its learned
        rates, what it is expected to hold of ``prompt`` and the backlog of its requests in flight."""
        slots = state.parallelism(model, now).slots
        learned = state.learned.get(model)
        prefill, prefill_n, decode, decode_n, service = (
            (None, 0, None, 0, None) if learned is None else learned.pooled(now, ttls[0])
        )
        # a batching engine (no slots) keeps a shared cache; the others one prompt per slot
        match = None
        if prompt is not None:
            match = matches.get(state.name) if matches is not None else None
            if match is None and matches is None:
                match = state.prefix.match(prompt, now, ttls[1], slots)
        # what its requests in flight are expected to take, as the occupancy's keeper counts them (none given: a
        # view for placement or metadata, which prices each in flight at the learned service time)
        backlog = NO_BACKLOG if backlogs is None else backlogs.get(state.name, NO_BACKLOG)
        if match is None:
            match = NO_MATCH
        return WorkerView(  # (positional, the fastest build: the order is checked below the class)
            *view[:11],
            slots,
            backlog.busy_s,
            prefill,
            decode,
            prefill_n,
            decode_n,
            service,
            backlog.work_s,
            backlog.ranked,
            match.cached,
            match.by_session,
            match.evicts,
            match.evicts_age_s,
            match.history,
            None if learned is None else learned.fresh_sharing(now, ttls[0]),
        )

    def endpoint_for(self, model: str) -> WorkerState | None:
        """The external endpoint a namespaced model name ("<endpoint>/<model>") belongs to."""
        if not self.endpoints:
            return None
        name = model.split("/", 1)[0]
        state = self.workers.get(name)
        if state is not None and state.external is not None and model.startswith(state.external.prefix):
            return state
        return None

    def is_openai(self, name: str) -> bool:
        return self.workers[name].config.type is WorkerType.OPENAI
