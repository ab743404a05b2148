import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.core.parallelism import (
    ASSUMED,
    CONFIRMATIONS,
    EVIDENCE_TTL_S,
    OVERLAP_MARGIN_S,
    WAITS_TO_LEARN_ONE,
    Evidence,
    Parallelism,
    Source,
    Span,
    depth,
    effective,
    engine_capacity,
    waited,
)


def span(first: float | None, last: float, sent: float = 0.0) -> Span:
    return Span(sent, first, last)


@pytest.mark.parametrize(
    ("this", "others", "expected"),
    [
        # one at a time: the next answer's first token after the last one's end
        (span(1.30, 2.0), [span(0.2, 1.25)], 1),
        # ... read in the other order within one turn of the gateway's loop (a millisecond): still one at a time
        (span(1.249, 2.0), [span(0.2, 1.25)], 1),
        # ... or overlapping by less than the margin
        (span(1.25 - OVERLAP_MARGIN_S / 2, 2.0), [span(0.2, 1.25)], 1),
        # running together: one went on for a second after the other's first token
        (span(1.0, 2.0), [span(0.2, 3.0)], 2),
        (span(0.2, 3.0), [span(1.0, 2.0)], 2),
        # three at one instant
        (span(1.0, 2.0), [span(0.5, 1.8), span(1.2, 3.0)], 3),
        # two others overlap this one, but not each other: two at most at any instant
        (span(1.0, 3.0), [span(0.5, 1.5), span(2.0, 3.5)], 2),
        # no known start (an answer in one piece, no timings), or too short to tell
        (span(None, 2.0), [span(0.5, 3.0)], 1),
        (span(1.0, 1.0 + OVERLAP_MARGIN_S / 2), [span(0.5, 3.0)], 1),
        # others without a start say nothing
        (span(1.0, 2.0), [span(None, 3.0)], 1),
        (span(1.0, 2.0), [], 1),
    ],
)
def test_depth(this: Span, others: list[Span], expected: int) -> None:
    assert depth(this, others) == expected


@pytest.mark.parametrize(
    ("this", "others", "expected"),
    [
        # sent while another ran, first token after it ended, most of the wait before that end: waited
        (Span(0.3, 1.40, 1.8), [span(0.2, 1.30)], True),
        # started at once (its first token while the other still ran)
        (Span(0.3, 0.60, 1.8), [span(0.2, 1.30)], False),
        # sent after the other ended
        (Span(1.35, 1.40, 1.8), [span(0.2, 1.30)], False),
        # the other ended at once and this one took long to start: its own prefill, not a wait
        (Span(0.3, 2.00, 2.5), [span(0.2, 0.35)], False),
        (Span(0.3, None, 2.5), [span(0.2, 1.30)], False),
    ],
)
def test_waited(this: Span, others: list[Span], expected: bool) -> None:
    assert waited(this, others) is expected


def test_a_level_counts_once_confirmed() -> None:
    evidence = Evidence()
    assert evidence.learned(0.0) is None
    evidence.observe(2, 1.0)
    assert CONFIRMATIONS == 2
    assert evidence.learned(1.0) is None  # one sighting may be an odd reading
    evidence.observe(2, 2.0)
    learned = evidence.learned(2.0)
    assert learned == Parallelism(2, Source.LEARNED, "seen running 2 at once")
    evidence.observe(4, 3.0)  # once at 4: 4 is not confirmed, but it counts for 2 and 3
    assert evidence.learned(3.0) is not None and evidence.learned(3.0).slots == 2  # type: ignore[union-attr]
    evidence.observe(3, 4.0)  # 3 and 4 seen once each: at least 3 at once twice
    assert evidence.learned(4.0).slots == 3  # type: ignore[union-attr]


def test_evidence_ages_out_and_is_forgotten() -> None:
    evidence = Evidence()
    evidence.observe(3, 0.0)
    evidence.observe(3, 10.0)
    assert evidence.learned(10.0 + EVIDENCE_TTL_S - 1).slots == 3  # type: ignore[union-attr]
    assert evidence.learned(10.0 + EVIDENCE_TTL_S + 1) is None  # both sightings too old
    evidence.observe(3, 20.0)
    evidence.forget()
    assert evidence.learned(21.0) is None


def test_one_at_a_time_is_learned_from_waits() -> None:
    evidence = Evidence()
    for _ in range(WAITS_TO_LEARN_ONE - 1):
        evidence.observe_wait()
    assert evidence.learned(0.0) is None
    evidence.observe_wait()
    learned = evidence.learned(0.0)
    assert learned is not None and learned.slots == 1 and learned.source is Source.LEARNED
    evidence.observe(2, 1.0)
    evidence.observe(2, 1.0)
    assert evidence.learned(1.0).slots == 2  # type: ignore[union-attr]  # running together outweighs the waits


def _evidence(*levels: int) -> Evidence:
    evidence = Evidence()
    for level in levels:
        evidence.observe(level, 0.0)
    return evidence


ENGINE_2 = Parallelism(2, Source.ENGINE, "vLLM: 2 running while 3 waited in its queue")
PROPS_1 = Parallelism(1, Source.ENGINE, "llama.cpp's /props: total_slots 1", exact=True)
BATCHING = engine_capacity("vLLM", None, None, 0)


@pytest.mark.parametrize(
    ("declared", "engine", "evidence", "slots", "source"),
    [
        (None, None, None, 1, Source.ASSUMED),
        (None, None, Evidence(), 1, Source.ASSUMED),
        (None, None, _evidence(3, 3), 3, Source.LEARNED),
        (None, ENGINE_2, _evidence(3, 3), 3, Source.LEARNED),  # it ran more than its gauges showed since
        (None, PROPS_1, _evidence(2, 2), 1, Source.ENGINE),  # the engine's own setting: overlaps were the reading's
        (None, ENGINE_2, None, 2, Source.ENGINE),
        (None, BATCHING, _evidence(3, 3), None, Source.ENGINE),  # a batching engine stays one
        (4, ENGINE_2, _evidence(3, 3), 4, Source.DECLARED),  # the operator's word first
        (1, None, _evidence(2, 2), 1, Source.DECLARED),
    ],
)
def test_effective_takes_the_strongest_source(
    declared: int | None, engine: Parallelism | None, evidence: Evidence | None, slots: int | None, source: Source
) -> None:
    figure = effective(declared, engine, evidence, 1.0)
    assert (figure.slots, figure.source) == (slots, source)
    assert figure.why


def test_the_assumption_says_why() -> None:
    assert ASSUMED.slots == 1
    assert "until" in ASSUMED.why
    assert ASSUMED.to_json() == {"slots": 1, "source": "assumed", "why": ASSUMED.why}


@pytest.mark.parametrize(
    ("running", "waiting", "seen", "slots", "fragment"),
    [
        (None, None, 0, None, "a batching engine"),
        (3, 0, 5, None, "seen running 5"),
        (8, 2, 8, 8, "8 running while 2 waited"),
        (0, 4, 0, None, "a batching engine"),  # nothing running: no capacity shown
    ],
)
def test_engine_capacity(running: int | None, waiting: int | None, seen: int, slots: int | None, fragment: str) -> None:
    figure = engine_capacity("vLLM", running, waiting, seen)
    assert figure.slots == slots
    assert figure.source is Source.ENGINE
    assert fragment in figure.why


# -- properties: a one-at-a-time engine is never learned as more; answers that ran together always are -----------
serial_gaps = st.lists(st.tuples(st.floats(0.03, 2.0), st.floats(0.0, 0.5)), min_size=2, max_size=12)


@given(serial_gaps, st.floats(0.0, OVERLAP_MARGIN_S / 2 - 1e-4))
@settings(max_examples=300, deadline=None)
def test_a_one_at_a_time_engine_never_shows_more(gaps: list[tuple[float, float]], jitter: float) -> None:
    """Answers one after another (each first token after the previous last one, read up to a loop turn early)."""
    spans, t = [], 0.0
    for length, pause in gaps:
        first = t + pause - jitter  # the next one's first token read a little before the last one's end
        spans.append(Span(first - 0.1, first, first + length))
        t = first + length
    assert all(depth(s, spans) == 1 for s in spans)


@given(
    st.integers(2, 6), st.floats(OVERLAP_MARGIN_S * 1.01, 5.0), st.lists(st.floats(0.0, 3.0), min_size=6, max_size=6)
)
@settings(max_examples=300, deadline=None)
def test_answers_that_ran_together_show_it(k: int, common: float, offsets: list[float]) -> None:
    """``k`` answers that were all being generated for ``common`` seconds at once (each started and ended anywhere
    around it)."""
    spans = [Span(10.0 - offsets[i], 10.0 - offsets[i] / 2, 10.0 + common + offsets[-1 - i]) for i in range(k)]
    assert max(depth(s, spans) for s in spans) == k
