import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.core.prefix import NO_MATCH, PrefixIndex, Prompt, prompt_of

B = 16  # block bytes in these tests: small, so that short texts have several blocks
TTL = 600.0


def p(text: str, session: str | None = None, model: str = "m") -> Prompt:
    return prompt_of([text], B, model, session)


def sent(*texts: str, slots: int | None = None, max_blocks: int = 10_000) -> PrefixIndex:
    index = PrefixIndex(max_blocks)
    for n, text in enumerate(texts):
        index.record(p(text), float(n))
    return index


SYSTEM = "You are a careful assistant. Answer briefly. " * 4  # 180 bytes: 11 whole blocks


@pytest.mark.parametrize(
    ("texts", "query", "slots", "expected_blocks"),
    [
        # nothing sent yet
        ((), SYSTEM, None, 0),
        # the same prompt again: every whole block
        ((SYSTEM,), SYSTEM, None, len(SYSTEM) // B),
        # a longer prompt that starts with it (the next turn of a conversation): what was sent
        ((SYSTEM,), SYSTEM + "user: and then?", None, len(SYSTEM) // B),
        # a different first block: nothing, even when the rest is equal
        ((SYSTEM,), "X" + SYSTEM[1:], None, 0),
        # a difference in the middle: the blocks before it
        ((SYSTEM,), SYSTEM[:40] + "!" + SYSTEM[41:], None, 40 // B),
        # two prompts sent, the engine keeps one (llama-cpp-python's server): only what the last one shares
        ((SYSTEM + "first question", "Other system prompt entirely. " * 3), SYSTEM, 1, 0),
        ((SYSTEM + "first question", SYSTEM + "second question"), SYSTEM + "first question", 1, len(SYSTEM) // B),
        # ... two slots keep both
        ((SYSTEM + "first question", "Other system prompt entirely. " * 3), SYSTEM, 2, len(SYSTEM) // B),
        # a paged cache (no slots) keeps both while they fit
        ((SYSTEM + "first question", "Other system prompt entirely. " * 3), SYSTEM, None, len(SYSTEM) // B),
    ],
)
def test_match(texts: tuple[str, ...], query: str, slots: int | None, expected_blocks: int) -> None:
    index = sent(*texts)
    assert index.match(p(query), float(len(texts)), TTL, slots).prefix == expected_blocks * B


def test_a_prompt_for_another_model_is_another_prefix() -> None:
    index = sent(SYSTEM)
    assert index.match(p(SYSTEM, model="other"), 1.0, TTL) == NO_MATCH


def test_parts_are_joined_with_a_boundary() -> None:
    assert prompt_of(["ab" * B, "c" * B], B, "m").keys != prompt_of(["a", "b" + "ab" * (B - 1) + "c" * B], B, "m").keys


@pytest.mark.parametrize(
    ("age_s", "expected"),
    [(0.0, 11), (TTL - 1, 11), (TTL, 11), (TTL + 1, 0)],
)
def test_keys_age_out(age_s: float, expected: int) -> None:
    index = sent(SYSTEM)
    assert index.match(p(SYSTEM), age_s, TTL).prefix == expected * B


def test_a_key_sent_again_is_young_again() -> None:
    index = PrefixIndex(100)
    index.record(p(SYSTEM), 0.0)
    index.record(p(SYSTEM + "more"), 500.0)
    assert index.match(p(SYSTEM), 900.0, TTL).prefix == 11 * B


def test_the_oldest_keys_go_first_and_a_prompt_loses_its_end_before_its_beginning() -> None:
    index = PrefixIndex(max_blocks=15)
    index.record(p(SYSTEM), 0.0)  # 11 blocks
    index.record(p("Z" * (B * 8)), 1.0)  # 8 more: 4 of SYSTEM's go, from its end
    assert len(index) == 15
    assert index.match(p(SYSTEM), 2.0, TTL).prefix == 7 * B


@pytest.mark.parametrize(
    ("recorded", "query", "slots", "expected"),
    [
        (("s1", 1000), ("s1", SYSTEM), None, len(SYSTEM)),  # the session's last prompt, up to this one's size
        (("s1", 100), ("s1", SYSTEM), None, 100),
        (("s1", 1000), ("s2", SYSTEM), None, 0),  # another session
        (("s1", 1000), (None, SYSTEM), None, 0),  # no session named
    ],
)
def test_sessions(recorded: tuple[str, int], query: tuple[str | None, str], slots: int | None, expected: int) -> None:
    index = PrefixIndex(100)
    session, size = recorded
    index.record(prompt_of([], B, "m", session)._replace(size=size), 0.0)
    assert index.match(p(query[1], query[0]), 1.0, TTL, slots).session == expected


def test_a_session_displaced_from_a_one_slot_engine_no_longer_counts() -> None:
    index = PrefixIndex(100)
    index.record(prompt_of([], B, "m", "s1")._replace(size=1000), 0.0)
    index.record(prompt_of([], B, "m", "s2")._replace(size=1000), 1.0)
    assert index.match(p(SYSTEM, "s1"), 2.0, TTL, slots=1).session == 0
    assert index.match(p(SYSTEM, "s1"), 2.0, TTL, slots=2).session == len(SYSTEM)


@pytest.mark.parametrize(
    ("sizes", "slots", "age_s", "expected"),
    [
        ((), 1, 0.0, 0),  # nothing held: nothing pushed out
        ((100,), 1, 0.0, 100),  # one slot holding a prompt: that one goes
        ((100,), 2, 0.0, 0),  # a slot still free
        ((100, 300), 2, 0.0, 100),  # both slots hold one: the oldest goes
        ((100, 300, 50), 2, 0.0, 300),
        ((100,), 1, TTL + 1, 0),  # what it held no longer counts
        ((100,), None, 0.0, 0),  # a paged cache evicts what was least recently used: not counted
    ],
)
def test_what_a_send_would_push_out(sizes: tuple[int, ...], slots: int | None, age_s: float, expected: int) -> None:
    index = PrefixIndex(100)
    for size in sizes:
        index.record(Prompt((), size, B), 0.0)
    assert index.match(p("x"), age_s, TTL, slots).evicts == expected


# -- properties ------------------------------------------------------------------------------------------------

texts = st.text(alphabet="abcdef ", max_size=B * 12)


@given(
    st.lists(st.tuples(texts, st.one_of(st.none(), st.sampled_from("pqrstu"))), max_size=60),
    st.integers(1, 40),
    st.integers(1, 5),
)
@settings(max_examples=200, deadline=None)
def test_the_bounds_hold(prompts: list[tuple[str, str | None]], max_blocks: int, max_sessions: int) -> None:
    index = PrefixIndex(max_blocks, max_sessions)
    for n, (text, session) in enumerate(prompts):
        index.record(p(text, session), float(n))
        assert len(index) <= max_blocks
        assert index.sends <= max_blocks
        assert index.sessions <= max_sessions


@given(texts, texts, st.integers(0, B * 12), st.integers(0, B * 12), st.one_of(st.none(), st.integers(1, 3)))
@settings(max_examples=300, deadline=None)
def test_a_longer_shared_prefix_never_matches_less(
    sent_text: str, tail: str, shorter: int, longer: int, slots: int | None
) -> None:
    shorter, longer = sorted((shorter, longer))
    index = sent("unrelated " * 5, sent_text)
    a = sent_text[:shorter] + "\x00" + tail  # shares at most `shorter` characters with what was sent
    b = sent_text[:longer] + "\x00" + tail
    assert index.match(p(b), 2.0, TTL, slots).prefix >= index.match(p(a), 2.0, TTL, slots).prefix


@given(texts, st.integers(1, 30))
@settings(max_examples=200, deadline=None)
def test_what_was_just_sent_matches_in_whole_blocks(text: str, max_blocks: int) -> None:
    index = PrefixIndex(max_blocks)
    prompt = p(text)
    index.record(prompt, 0.0)
    assert index.match(prompt, 0.0, TTL, slots=1).prefix == min(len(prompt.keys), max_blocks) * B


def test_memory_stays_within_the_documented_bound() -> None:
    """docs/configuration.md states at most 320 bytes a block (keys, their sends and the send window)."""
    cap = 5000
    rng = random.Random(7)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        index = PrefixIndex(cap, max_sessions=16)
        for n in range(3000):
            length = rng.choice((B, B * 3, B * 40))  # short and long prompts: one-block sends are the worst case
            index.record(p("".join(rng.choice("abcdefgh") for _ in range(length)), f"s{n % 16}"), float(n))
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    used = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert len(index) == cap
    assert used / cap <= 320, f"{used / cap:.0f} bytes a block"


def test_history_counts_what_was_sent_whether_or_not_a_slot_still_holds_it() -> None:
    """One slot, taken since by another group's prompt: nothing is held, but the worker was sent the group's
    beginning (history); past the time limit, not even that."""
    other = "Another group entirely, another system prompt. " * 4
    index = sent(SYSTEM + "user: one", other + "user: two", slots=1)
    match = index.match(p(SYSTEM + "user: three"), 2.0, TTL, slots=1)
    assert match.prefix == 0 and match.history == len(SYSTEM.encode()) // B * B
    assert index.match(p(SYSTEM + "user: three"), 2.0, TTL, slots=2).prefix == match.history
    # the last prompt is held (and sent): both
    held = index.match(p(other + "user: four"), 2.0, TTL, slots=1)
    assert held.prefix == held.history >= len(other.encode()) // B * B
    assert index.match(p(SYSTEM + "user: three"), 2.0 + TTL, TTL, slots=1).history == 0  # (time only goes on)
