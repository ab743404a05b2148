"""Prometheus metrics, one registry per app (no module-level collectors)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from turnout.core.admission import Priority
from turnout.core.latency import LEGACY_BOUNDS_MS
from turnout.core.priority import CLASSES
from turnout.fleet.state import Fleet
from turnout.phase_stats import PhaseCollector, PhaseStats, count_coarse, exposed

__all__ = ["ClassCounts", "Metrics"]

# 1 ms .. 300 s (phase_stats.count_coarse counts in these too)
_LATENCY_BUCKETS = tuple(bound / 1000 for bound in LEGACY_BOUNDS_MS)


class _FleetCollector(Collector):
    """Reads worker health and load at scrape time instead of mirroring it into gauges."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self):  # type: ignore[no-untyped-def]
        healthy = GaugeMetricFamily(
            "turnout_worker_healthy", "1 when the worker's last poll succeeded", labels=["worker"]
        )
        in_flight = GaugeMetricFamily("turnout_worker_in_flight", "requests in flight on the worker", labels=["worker"])
        models = GaugeMetricFamily(
            "turnout_worker_models", "models in the worker's inventory (-1: unknown)", labels=["worker"]
        )
        parallel = GaugeMetricFamily(
            "turnout_worker_parallelism",
            "requests the worker's engine runs at once for the model (-1: a batching engine of unknown capacity; model "
            '"*": none answered yet), and how that was found: declared, engine, learned or assumed',
            labels=["worker", "model", "source"],
        )
        now = time.monotonic()
        for state in self.fleet.workers.values():
            healthy.add_metric([state.name], 1.0 if state.healthy else 0.0)
            in_flight.add_metric([state.name], float(state.in_flight))
            models.add_metric([state.name], float(-1 if state.inventory is None else len(state.inventory)))
            for model, figure in state.parallelisms(now).items():
                slots = -1.0 if figure.slots is None else float(figure.slots)
                parallel.add_metric([state.name, model, figure.source.value], slots)
        yield healthy
        yield in_flight
        yield models
        yield parallel


class _InFlightCollector(Collector):
    """Client requests being served, and of those the ones held: plain counts the request path keeps
    (``Metrics.requests_in_flight``, ``Metrics.requests_held``), read at scrape time; a Gauge takes a lock twice
    per request."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        yield GaugeMetricFamily(
            "turnout_in_flight_requests", "client requests being served", value=self.metrics.requests_in_flight
        )
        yield GaugeMetricFamily(
            "turnout_held_requests",
            "requests held now for a model that is waking, activating or starting, or whose workers are expected "
            "back (routing.hold_s)",
            value=self.metrics.requests_held,
        )


class _SpansCollector(Collector):
    """Spans the trace exporter lost (``Metrics.spans_dropped``: reason -> count, kept by the tracing's own
    thread and the request path, read at scrape time)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        family = CounterMetricFamily(
            "turnout_trace_spans_dropped",
            "spans never delivered to the OTLP collector (telemetry.otlp_endpoint): queue_full (the collector slow "
            "or away and the export queue full: dropped rather than waited for), export_failed (the collector "
            "refused them or could not be reached)",
            labels=["reason"],
        )
        for reason, count in sorted(self.metrics.spans_dropped.items()):
            family.add_metric([reason], float(count))
        yield family


class ClassCounts:
    """One priority class's requests in this process: waiting for a slot (in the dispatcher: routed, in its queue,
    or held until their model's engine is ready) and running (holding a worker's slot). Plain counts the proxy
    keeps, read at scrape time."""

    __slots__ = ("running", "waiting")

    def __init__(self) -> None:
        self.waiting = 0
        self.running = 0


class _ClassesCollector(Collector):
    """Requests waiting and running by priority class (``Metrics.classes``), read at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        waiting = GaugeMetricFamily(
            "turnout_priority_waiting_requests",
            "requests of this gateway process waiting for a slot (being routed, in the queue or held), by priority "
            "class",
            labels=["priority"],
        )
        running = GaugeMetricFamily(
            "turnout_priority_running_requests",
            "requests of this gateway process holding a worker's slot, by priority class",
            labels=["priority"],
        )
        for priority, counts in self.metrics.classes.items():
            waiting.add_metric([priority.value], float(counts.waiting))
            running.add_metric([priority.value], float(counts.running))
        yield waiting
        yield running


class _ReasonsCollector(Collector):
    """Why routed requests went where they did: counts the dispatcher keeps (``Metrics.route_reasons``), read at
    scrape time (a Counter takes a lock on every request)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        family = CounterMetricFamily(
            "turnout_route_reasons",
            "why routed requests went to the worker they went to: prefix (it held the largest part of the prompt), "
            "session (it held the client's session), history (none held any of it; it was sent it recently), "
            "free slot (work-conserving: it had one, the one that held more of the prompt had a queue), load guard, "
            "least expected time, only candidate",
            labels=["reason"],
        )
        for reason, count in sorted(self.metrics.route_reasons.items()):
            family.add_metric([reason], float(count))
        yield family


_FOLD_DURATIONS = 4096  # durations of one (api, endpoint) kept before they are counted (a bound on memory)


class _Latency:
    """The durations of one (api, endpoint): counts per bucket (:data:`_LATENCY_BUCKETS`, and one above them), their
    sum, and those not counted yet."""

    __slots__ = ("counts", "pending", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(_LATENCY_BUCKETS) + 1)
        self.sum = 0.0
        self.pending: list[float] = []

    def fold(self) -> None:
        pending, self.pending = self.pending, []
        self.sum += count_coarse(self.counts, pending)


class _Done:
    """One (api, endpoint, status): its requests, and its (api, endpoint)'s durations (shared by its statuses)."""

    __slots__ = ("count", "latency")

    def __init__(self, latency: _Latency) -> None:
        self.count = 0
        self.latency = latency


class _RequestsCollector(Collector):
    """Client requests and their durations (``Metrics.request_done``): plain counts the request path keeps, read at
    scrape time; a Counter and a Histogram take a lock each, and search the buckets, on every request."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        requests = CounterMetricFamily("turnout_requests", "client requests", labels=["api", "endpoint", "status"])
        latency = HistogramMetricFamily(
            "turnout_request_duration_seconds",
            "time from request to the last byte of the response",
            labels=["api", "endpoint"],
        )
        seen: set[int] = set()
        for (api, endpoint, status), done in sorted(self.metrics._done.items()):
            requests.add_metric([api, endpoint, str(status)], float(done.count))
            if id(done.latency) not in seen:
                seen.add(id(done.latency))
                done.latency.fold()
                latency.add_metric([api, endpoint], *exposed(done.latency.counts, done.latency.sum))
        yield requests
        yield latency


class Metrics:
    def __init__(self, fleet: Fleet) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # turnout_requests_total, turnout_request_duration_seconds: plain counts, read at scrape time
        self._done: dict[tuple[str, str, int], _Done] = {}
        self.registry.register(_RequestsCollector(self))
        self.requests_in_flight = 0  # exported as turnout_in_flight_requests
        self.requests_held = 0  # exported as turnout_held_requests (turnout.gateway.timing.Holding keeps it)
        self.registry.register(_InFlightCollector(self))
        self.phases = PhaseStats()  # turnout_request_phase_seconds, and the Overview's last minutes
        self.registry.register(PhaseCollector(self.phases))
        self.spans_dropped = {"queue_full": 0, "export_failed": 0}  # turnout_trace_spans_dropped_total
        self.registry.register(_SpansCollector(self))
        self.routing = Counter("turnout_routing_decisions", "routing outcomes", ["outcome"], registry=self.registry)
        self.route_reasons: dict[str, int] = {}  # reason -> routed requests: plain counts, read at scrape time
        self.registry.register(_ReasonsCollector(self))
        self.classes: dict[Priority, ClassCounts] = {p: ClassCounts() for p in CLASSES}
        self.registry.register(_ClassesCollector(self))
        self.routed_prompt_tokens = Counter(
            "turnout_prefix_prompt_tokens",
            "prompt tokens (estimated, 4 bytes each) of requests routed with a choice of workers, by the worker chosen",
            ["worker"],
            registry=self.registry,
        )
        self.matched_prompt_tokens = Counter(
            "turnout_prefix_matched_tokens",
            "of those, the tokens the chosen worker was expected to hold in its KV cache (prefix index or session); "
            "matched / prompt is the matched share",
            ["worker"],
            registry=self.registry,
        )
        self.engine_cached_tokens = Counter(
            "turnout_engine_cached_prompt_tokens",
            "prompt tokens the worker's engine said it served from its cache (usage.prompt_tokens_details, llama.cpp "
            "timings.cache_n), where it says so",
            ["worker"],
            registry=self.registry,
        )
        self.engine_prompt_tokens = Counter(
            "turnout_engine_prompt_tokens",
            "prompt tokens of the answers whose engine said how many it served from its cache",
            ["worker"],
            registry=self.registry,
        )
        self._prefix_children: dict[str, tuple[Counter, Counter]] = {}
        self._engine_children: dict[str, tuple[Counter, Counter]] = {}
        self.queue_wait = Histogram(
            "turnout_queue_wait_seconds",
            "time a request waited for a free slot",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queued = Gauge("turnout_queued_requests", "requests waiting for a free slot", registry=self.registry)
        self.preempted = Counter(
            "turnout_preempted_requests",
            "batch requests stopped in flight for a waiting interactive or standard request (each sent again; a "
            "Batch API line at most three times)",
            registry=self.registry,
        )
        self._shared_up: Gauge | None = None  # registered with storage.redis_url only (shared_state)
        self.upstream_errors = Counter(
            "turnout_upstream_errors", "failed upstream attempts", ["worker", "kind"], registry=self.registry
        )
        self.fallbacks = Counter(
            "turnout_endpoint_fallbacks",
            "requests sent to an endpoint's fallback model",
            ["endpoint", "reason"],
            registry=self.registry,
        )
        self.usage_rows_dropped = Counter(
            "turnout_usage_rows_dropped",
            "usage roll-ups the database refused even one by one (each is logged; every other row is written)",
            registry=self.registry,
        )
        self.registry.register(_FleetCollector(fleet))

    def shared_state(self, up: bool) -> None:
        """The shared routing state (Redis) answers, or stopped answering."""
        if self._shared_up is None:
            self._shared_up = Gauge(
                "turnout_shared_state_up",
                "1 while the replicas' shared routing state (storage.redis_url) answers, 0 while this replica "
                "serves on its own",
                registry=self.registry,
            )
        self._shared_up.set(1.0 if up else 0.0)

    def request_done(self, api: str, endpoint: str, status: int, seconds: float) -> None:
        """Count one finished request (this runs on every request: a count and an append; its duration is put in
        its bucket with the others' when they are read, or when 4096 wait)."""
        done = self._done.get((api, endpoint, status))
        if done is None:
            latency = next((d.latency for (a, e, _), d in self._done.items() if (a, e) == (api, endpoint)), None)
            done = self._done[(api, endpoint, status)] = _Done(latency or _Latency())
        done.count += 1
        pending = done.latency.pending
        pending.append(seconds)
        if len(pending) >= _FOLD_DURATIONS:
            done.latency.fold()

    def prefix_tokens(self, worker: str, prompt: float, matched: float) -> None:
        """A request routed with a choice of workers: its prompt's tokens and those its worker was expected to hold."""
        children = self._prefix_children.get(worker)
        if children is None:
            children = (self.routed_prompt_tokens.labels(worker), self.matched_prompt_tokens.labels(worker))
            self._prefix_children[worker] = children
        children[0].inc(prompt)
        children[1].inc(matched)

    def engine_tokens(self, worker: str, prompt: int, cached: int) -> None:
        """An engine's own count of a prompt and of what it served from its cache."""
        children = self._engine_children.get(worker)
        if children is None:
            children = (self.engine_prompt_tokens.labels(worker), self.engine_cached_tokens.labels(worker))
            self._engine_children[worker] = children
        children[0].inc(prompt)
        children[1].inc(cached)

    def render(self) -> bytes:
        return generate_latest(self.registry)
