"""The phase histograms (:mod:`turnout.phase_stats`): what Prometheus reads against the samples themselves, and the
last minutes' percentiles against the samples of exactly those minutes, time given; the request counts and
durations, counted the same way."""

from __future__ import annotations

import math
import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from turnout.config import Settings
from turnout.core.latency import LEGACY_BOUNDS_MS
from turnout.fleet.state import Fleet
from turnout.metrics import Metrics
from turnout.phase_stats import KEEP_MINUTES, PhaseCollector, PhaseStats, summarize
from turnout.state.placement_store import PlacementStore

T0 = 6000.0  # a minute's start (100 * 60)


def _record(stats: PhaseStats, total_s: float, now: float, stream: bool = False, **phases: float | None) -> None:
    stats.record(
        phases.get("model", "m"),  # type: ignore[arg-type]
        "w",
        stream,
        phases.get("queue", 0.0),
        phases.get("hold") or 0.0,
        phases.get("upstream", 0.0),
        phases.get("ttft"),
        total_s,
        now,
    )


def _exposed(stats: PhaseStats) -> dict[tuple[str, ...], float]:
    registry = CollectorRegistry()
    registry.register(PhaseCollector(stats))
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = tuple(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[(sample.name, *labels)] = sample.value
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.floats(min_value=0, max_value=400, allow_nan=False)
        | st.sampled_from([b / 1000 for b in LEGACY_BOUNDS_MS]),  # on a bound exactly
        min_size=1,
        max_size=40,
    )
)
def test_prometheus_buckets_count_the_samples_at_or_below_each_bound(totals: list[float]) -> None:
    stats = PhaseStats()
    for seconds in totals:
        _record(stats, seconds, T0)
    exposed = _exposed(stats)
    key = ("phase=total", "stream=false", "model=m", "worker=w")

    def sample(name: str, *extra: str) -> float:
        labels = tuple(sorted((*key, *extra)))
        return exposed[(name, *labels)]

    for bound in LEGACY_BOUNDS_MS:
        le = f"le={bound / 1000:g}"
        # a sample exactly on a bound counts in it (le: less than or equal, in seconds)
        assert sample("turnout_request_phase_seconds_bucket", le) == sum(1 for t in totals if t <= bound / 1000)
    assert sample("turnout_request_phase_seconds_bucket", "le=+Inf") == len(totals)
    assert sample("turnout_request_phase_seconds_count") == len(totals)
    assert math.isclose(sample("turnout_request_phase_seconds_sum"), sum(totals), rel_tol=1e-9, abs_tol=1e-9)


def test_phases_a_request_did_not_go_through_are_not_counted() -> None:
    stats = PhaseStats()
    _record(stats, 0.5, T0, queue=0.001, hold=None, upstream=None, ttft=None)  # a queue timeout, say
    counted = [k for k in _exposed(stats) if k[0] == "turnout_request_phase_seconds_count"]
    phases = {label for k in counted for label in k if label.startswith("phase=")}
    assert phases == {"phase=queue", "phase=total"}


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_the_last_minutes_are_those_minutes_samples() -> None:
    stats = PhaseStats()
    old = [0.010 * (i + 1) for i in range(50)]  # 10..500 ms, 20 minutes ago
    for t in old:
        _record(stats, t, T0 - 20 * 60, ttft=t / 2)
    recent = [1.0 + 0.05 * i for i in range(40)]  # 1.0..2.95 s: half 14 minutes ago, half this minute
    for t in recent[1::2]:
        _record(stats, t, T0 - 14 * 60, ttft=t / 2)
    for t in recent[::2]:
        _record(stats, t, T0 + 30, ttft=t / 2)
    streams = [0.2, 0.4]
    for t in streams:
        _record(stats, 3.0, T0 + 31, stream=True, ttft=t)

    last15 = stats.recent(15, T0 + 45)
    assert last15["total_whole"]["count"] == len(recent)  # the 20-minute-old ones are out
    for q, key in ((0.5, "p50"), (0.9, "p90")):
        exact = _nearest_rank(recent, q) * 1000
        got = last15["total_whole"][key]
        assert got is not None and abs(got - exact) <= max(0.1, exact / 10)  # the histograms' resolution
    assert last15["ttft_stream"]["count"] == 2 and last15["total_stream"]["count"] == 2
    assert last15["hold"] == {"count": 0, "p50": None, "p90": None}
    # the last 5 minutes: this minute's alone (the others were 14 minutes ago)
    last5 = stats.recent(5, T0 + 45)
    assert last5["total_whole"]["count"] == len(recent) // 2
    assert last5["queue"]["count"] == len(recent) // 2 + len(streams)
    # later, with nothing new: the window moves on
    assert stats.recent(15, T0 + 14 * 60)["total_whole"]["count"] == len(recent) // 2
    assert stats.recent(15, T0 + 15 * 60)["total_whole"]["count"] == 0
    # Prometheus keeps counting everything since the start
    exposed = _exposed(stats)
    assert sum(
        v for k, v in exposed.items() if k[0] == "turnout_request_phase_seconds_count" and "phase=total" in k
    ) == (len(old) + len(recent) + len(streams))


def test_minutes_are_kept_no_longer_than_the_longest_window() -> None:
    stats = PhaseStats()
    for minute in range(100):
        _record(stats, 0.1, minute * 60.0)
    assert len(stats._marks) <= KEEP_MINUTES
    assert stats.recent(KEEP_MINUTES, 99 * 60.0)["total_whole"]["count"] == KEEP_MINUTES


def test_request_counts_and_durations_are_exposed_as_before() -> None:
    """``turnout_requests_total`` and ``turnout_request_duration_seconds``, now plain counts read at scrape time:
    the same names, labels and buckets, and every request counted, past the point its durations are folded."""
    metrics = Metrics(Fleet(Settings(), PlacementStore(Path("/nonexistent/model-placement.json"))))
    durations = [0.0005 * (i % 700) for i in range(5000)]  # more than one fold's worth
    for i, seconds in enumerate(durations):
        metrics.request_done("openai", "/v1/chat/completions", 200 if i % 10 else 503, seconds)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    chat = (("api", "openai"), ("endpoint", "/v1/chat/completions"))
    assert samples[("turnout_requests_total", (*chat, ("status", "200")))] == 4500
    assert samples[("turnout_requests_total", (*chat, ("status", "503")))] == 500
    assert samples[("turnout_request_duration_seconds_count", chat)] == len(durations)
    assert math.isclose(samples[("turnout_request_duration_seconds_sum", chat)], sum(durations), rel_tol=1e-9)
    for bound in LEGACY_BOUNDS_MS:
        le = bound / 1000
        key = ("turnout_request_duration_seconds_bucket", tuple(sorted((*chat, ("le", f"{le:g}")))))
        assert samples[key] == sum(1 for d in durations if d <= le)


def test_many_requests_are_counted_exactly_and_their_percentiles_estimated_from_a_sample() -> None:
    """Past a few hundred requests a batch, the Overview's percentiles come from an even sample of them (a bucket
    search over 721 fine bounds for every request cost more than the rest of its timing); the counts, Prometheus's
    and the Overview's, stay exact."""
    stats = PhaseStats()
    totals = [0.001 * (1 + i % 1000) for i in range(10_000)]  # 1..1000 ms, evenly
    random.Random(7).shuffle(totals)
    for t in totals:
        _record(stats, t, T0 + 1)
    last5 = stats.recent(5, T0 + 2)
    assert last5["total_whole"]["count"] == len(totals)
    for q, key in ((0.5, "p50"), (0.9, "p90")):
        exact = _nearest_rank(totals, q) * 1000
        got = last5["total_whole"][key]
        assert got is not None and abs(got - exact) <= exact * 0.15, (key, got, exact)
    exposed = _exposed(stats)
    count = [v for k, v in exposed.items() if k[0] == "turnout_request_phase_seconds_count" and "phase=total" in k]
    assert count == [len(totals)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0.001, 50.0), st.integers(0, 6)), min_size=1, max_size=60))
def test_several_processes_summed_are_one_process_holding_all_their_requests(
    requests: list[tuple[int, float, int]],
) -> None:
    """`serve --workers N`: the Overview adds up each process's counts (summarize); the figures are those of one
    process that had served every request."""
    processes = [PhaseStats() for _ in range(3)]
    alone = PhaseStats()
    for process, total_s, minutes_ago in sorted(requests, key=lambda r: -r[2]):  # (time runs forward)
        for stats in (processes[process], alone):
            _record(stats, total_s, T0 + 30 - minutes_ago * 60, ttft=total_s / 3)
    for minutes in (1, 5, 15):
        now = T0 + 45
        together = summarize(stats.recent_counts(minutes, now) for stats in processes)
        assert together == alone.recent(minutes, now)
        assert together["total_whole"]["count"] == sum(1 for _, _, ago in requests if ago < minutes)
