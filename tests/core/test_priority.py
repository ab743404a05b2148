"""The one rule for a request's priority class (turnout.core.priority): the key's class, its tenant's default,
standard; a header that lowers it and never raises it; every value that is not a class refused, naming the
header and the classes."""

from __future__ import annotations

import pytest

from turnout.core.admission import Priority
from turnout.core.priority import (
    HEADER,
    Chosen,
    InvalidPriority,
    Ordering,
    engine_priority,
    key_class,
    parse_class,
    request_class,
    tenant_default,
)

INT, S, B = Priority.INTERACTIVE, Priority.STANDARD, Priority.BATCH


@pytest.mark.parametrize(
    ("key", "tenant", "expected"),
    [
        (None, None, S),  # neither says: standard
        (None, B, B),  # the tenant's default
        (None, INT, INT),
        (INT, B, INT),  # the key's own class wins over its tenant's (either way)
        (B, INT, B),
        (S, B, S),
        (B, None, B),
    ],
)
def test_a_keys_class(key: Priority | None, tenant: Priority | None, expected: Priority) -> None:
    assert key_class(key, tenant) is expected


@pytest.mark.parametrize(
    ("configured", "stored", "expected"),
    [(None, None, None), (B, None, B), (None, INT, INT), (S, INT, S), (B, INT, B)],
)
def test_the_config_sets_a_tenants_default_before_the_store(
    configured: Priority | None, stored: Priority | None, expected: Priority | None
) -> None:
    assert tenant_default(configured, stored) is expected


@pytest.mark.parametrize(
    ("ceiling", "header", "expected"),
    [
        (S, [], Chosen(S)),  # no header: the key's class
        (INT, [], Chosen(INT)),
        (B, [], Chosen(B)),
        (S, ["batch"], Chosen(B, B)),  # lowered
        (INT, ["standard"], Chosen(S, S)),
        (INT, ["batch"], Chosen(B, B)),
        (INT, ["interactive"], Chosen(INT, INT)),  # the same class: as asked
        (S, ["standard"], Chosen(S, S)),
        (S, ["interactive"], Chosen(S, INT, capped=True)),  # above the key's: the key's, and said so
        (B, ["interactive"], Chosen(B, INT, capped=True)),
        (B, ["standard"], Chosen(B, S, capped=True)),
        (S, ["Batch"], Chosen(B, B)),  # any case, spaces around ignored
        (S, [" BATCH "], Chosen(B, B)),
        (S, ["\tinteractive"], Chosen(S, INT, capped=True)),
        (S, ["batch", "batch"], Chosen(B, B)),  # sent twice, the same: one
        (INT, ["Batch", "batch "], Chosen(B, B)),
    ],
)
def test_a_header_lowers_the_class_and_never_raises_it(ceiling: Priority, header: list[str], expected: Chosen) -> None:
    assert request_class(ceiling, header) == expected


@pytest.mark.parametrize(
    ("header", "said"),
    [
        (["urgent"], '(got "urgent")'),
        ([""], '(got "")'),
        (["   "], '(got "   ")'),
        (["high"], '(got "high")'),
        (["0"], '(got "0")'),
        (["-1"], '(got "-1")'),
        (["batch,standard"], '(got "batch,standard")'),  # one value, not a list
        (["interactive;q=1"], '(got "interactive;q=1")'),
        (["bätch"], '(got "bätch")'),
        (["batch\x00"], '(got "batch?")'),  # a control character is not repeated as it is
        (["x" * 500], '(got "' + "x" * 40 + '...")'),  # a long value is cut
        (["batch", "urgent"], '(got "urgent")'),  # every value is checked
    ],
)
def test_a_value_that_is_not_a_class_is_refused_naming_the_header_and_the_classes(header: list[str], said: str) -> None:
    with pytest.raises(InvalidPriority) as caught:
        request_class(Priority.STANDARD, header)
    message = str(caught.value)
    assert message.startswith(f"{HEADER} must be one of interactive, standard, batch ") and message.endswith(said)


@pytest.mark.parametrize("header", [["batch", "standard"], ["interactive", "batch", "interactive"]])
def test_the_header_twice_with_different_classes_is_refused(header: list[str]) -> None:
    with pytest.raises(InvalidPriority, match=f"{HEADER} was sent {len(header)} times with different classes"):
        request_class(Priority.INTERACTIVE, header)


@pytest.mark.parametrize(
    ("text", "expected"), [("interactive", INT), ("STANDARD", S), (" batch\n", B), ("Interactive", INT)]
)
def test_a_class_by_its_name(text: str, expected: Priority) -> None:
    assert parse_class(text) is expected


@pytest.mark.parametrize("text", ["", "low", "inter", "batches", "1"])
def test_a_name_that_is_not_a_class(text: str) -> None:
    with pytest.raises(InvalidPriority, match="is not a priority class: use interactive, standard, batch"):
        parse_class(text)


def test_the_engine_serves_lower_numbers_first_in_the_classes_order() -> None:
    """vLLM orders its waiting requests by (priority, arrival): interactive < standard < batch, and standard is its
    default 0 (a client of the engine itself ranks with standard traffic)."""
    numbers = [engine_priority(p) for p in (INT, S, B)]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3 and engine_priority(S) == 0


def test_an_engine_that_serves_higher_values_first_gets_the_signs_turned() -> None:
    """SGLang's default order (--enable-priority-scheduling alone): interactive still goes first, standard is 0."""
    high = [engine_priority(p, Ordering.HIGH_FIRST) for p in (INT, S, B)]
    assert high == sorted(high, reverse=True) and high[1] == 0
    assert high == [-engine_priority(p, Ordering.LOW_FIRST) for p in (INT, S, B)]
