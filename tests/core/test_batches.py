"""The Batch API's rules (turnout.core.batches): input lines, windows, what a line's answer makes the runner do, the
end of a batch, the limits a line counts against, the output lines' shapes (OpenAI's)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnout.core.batches import (
    CANCELLED,
    EXPIRED,
    UNLISTED_WAIT_S,
    FileProblem,
    Verdict,
    can_cancel,
    end_status,
    failed_line,
    line_limits,
    metadata_problem,
    one_model,
    output_line,
    parse_batch_file,
    parse_window,
    retry_wait_s,
    verdict,
)


def line(custom_id: str = "a", **over: object) -> bytes:
    base: dict[str, object] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    base.update(over)
    return json.dumps(base).encode()


def test_a_good_file_gives_every_request_in_order() -> None:
    data = b"\xef\xbb\xbf" + line("a") + b"\n\n" + line("b", url="/v1/embeddings", body={"model": "e", "input": "x"})
    data += b"\r\n"
    parsed = parse_batch_file(data, 10)
    assert [(p.number, p.custom_id, p.url) for p in parsed] == [
        (1, "a", "/v1/chat/completions"),
        (3, "b", "/v1/embeddings"),
    ]
    assert json.loads(parsed[1].body) == {"model": "e", "input": "x"}


@pytest.mark.parametrize(
    ("raw", "code", "said"),
    [
        (b"{", "invalid_json_line", "not valid JSON"),
        (b"[1]", "invalid_json_line", "a line must be a JSON object"),
        (line(custom_id=""), "invalid_custom_id", '"custom_id" must be a non-empty string'),
        (line(custom_id=3), "invalid_custom_id", '"custom_id" must be a non-empty string'),
        (line(custom_id="x" * 513), "invalid_custom_id", "longer than 512"),
        (line(method="GET"), "invalid_method", '"method" must be "POST", got "GET"'),
        (line(method=None), "invalid_method", "got nothing"),
        (line(url="/v1/moderations"), "invalid_url", '"url" must be one of'),
        (line(url="/v1/messages"), "invalid_url", 'got "/v1/messages"'),
        (line(body=[]), "invalid_body", '"body" must be a JSON object'),
        (line(body={"messages": []}), "missing_model", '"body.model"'),
        (line(body={"model": "  "}), "missing_model", '"body.model"'),
        (line(body={"model": "m", "stream": True}), "stream_not_supported", "body.stream"),
    ],
)
def test_a_bad_line_is_named_with_what_is_wrong(raw: bytes, code: str, said: str) -> None:
    with pytest.raises(FileProblem) as caught:
        parse_batch_file(line("first") + b"\n" + raw + b"\n", 10)
    problem = caught.value.problems[0]
    assert (problem.line, problem.code) == (2, code)
    assert said in str(caught.value) and str(caught.value).startswith("line 2: ")


def test_a_duplicate_custom_id_names_its_first_line() -> None:
    with pytest.raises(FileProblem) as caught:
        parse_batch_file(line("a") + b"\n" + line("b") + b"\n" + line("a"), 10)
    assert str(caught.value) == 'line 3: "custom_id" "a" is already used on line 1; each request needs its own'


def test_many_bad_lines_name_the_first_ten_and_count_the_rest() -> None:
    data = b"\n".join([b"nope"] * 25)
    with pytest.raises(FileProblem) as caught:
        parse_batch_file(data, 100)
    assert len(caught.value.problems) == 10 and caught.value.count == 25
    assert str(caught.value).endswith("(and 15 more lines with problems)")


@pytest.mark.parametrize(("data", "summary"), [(b"", "holds no request"), (b"\n \n", "holds no request")])
def test_an_empty_file(data: bytes, summary: str) -> None:
    with pytest.raises(FileProblem, match=summary):
        parse_batch_file(data, 10)


def test_too_many_lines() -> None:
    with pytest.raises(FileProblem, match="more than 2 requests"):
        parse_batch_file(b"\n".join(line(str(n)) for n in range(3)), 2)
    assert len(parse_batch_file(b"\n".join(line(str(n)) for n in range(2)), 2)) == 2


@given(st.binary(max_size=300))
def test_any_bytes_give_requests_or_a_problem(data: bytes) -> None:
    try:
        parsed = parse_batch_file(data, 1000)
    except FileProblem as exc:
        assert str(exc) and exc.code
    else:
        assert parsed and len({p.custom_id for p in parsed}) == len(parsed)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("24h", 86_400), ("1s", 1), ("90m", 5400), ("7d", 604_800), ("2d", 172_800)],
)
def test_windows(text: str, seconds: float) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["", "24", "0s", "8d", "1.5h", "24H", " 24h", "-1h", 24, None, "1000000d"])
def test_bad_windows(text: object) -> None:
    with pytest.raises(ValueError, match="completion_window"):
        parse_window(text)


@pytest.mark.parametrize(
    ("status", "attempt", "expected"),
    [
        (200, 1, Verdict.RECORD),
        (201, 1, Verdict.RECORD),
        (400, 1, Verdict.RECORD),
        (401, 1, Verdict.RECORD),
        (403, 1, Verdict.RECORD),
        (404, 1, Verdict.RECORD),
        (413, 1, Verdict.RECORD),
        (429, 1, Verdict.WAIT),
        (429, 9, Verdict.WAIT),
        (503, 1, Verdict.WAIT),
        (503, 9, Verdict.WAIT),
        (500, 1, Verdict.RETRY),
        (502, 2, Verdict.RETRY),
        (502, 3, Verdict.RECORD),
        (504, 5, Verdict.RECORD),
    ],
)
def test_what_an_answer_makes_the_runner_do(status: int, attempt: int, expected: Verdict) -> None:
    assert verdict(status, attempt, 3) is expected


@pytest.mark.parametrize(
    ("status", "unlisted_s", "expected"),
    [
        (503, None, Verdict.WAIT),  # capacity, or a worker known to hold the model: the window's end
        (503, 0.0, Verdict.WAIT),
        (503, UNLISTED_WAIT_S - 0.1, Verdict.WAIT),
        (503, UNLISTED_WAIT_S, Verdict.RECORD),  # no worker known to hold the model, for long enough
        (503, 10 * UNLISTED_WAIT_S, Verdict.RECORD),
        (429, 10 * UNLISTED_WAIT_S, Verdict.WAIT),  # a spent budget is not a missing model
        (200, 10 * UNLISTED_WAIT_S, Verdict.RECORD),
    ],
)
def test_a_model_no_worker_is_known_to_hold_is_waited_for_a_while(
    status: int, unlisted_s: float | None, expected: Verdict
) -> None:
    assert verdict(status, 1, 3, unlisted_s=unlisted_s) is expected


@pytest.mark.parametrize(
    ("retry_after", "waits", "unlisted_s", "seconds"),
    [
        (None, 0, 0.0, 1),
        (None, 8, UNLISTED_WAIT_S - 5, 5),  # tried again as the wait for the model ends
        (3600, 0, UNLISTED_WAIT_S - 5, 5),
        (None, 8, UNLISTED_WAIT_S + 5, 0),
    ],
)
def test_waits_end_when_the_wait_for_an_unlisted_model_does(
    retry_after: int | None, waits: int, unlisted_s: float, seconds: float
) -> None:
    assert retry_wait_s(retry_after, waits, unlisted_s=unlisted_s) == seconds


@pytest.mark.parametrize(
    ("retry_after", "waits", "seconds"),
    [(None, 0, 1), (None, 1, 2), (None, 5, 32), (None, 6, 60), (None, 100, 60), (0, 2, 4), (7200, 0, 7200)],
)
def test_waits(retry_after: int | None, waits: int, seconds: float) -> None:
    assert retry_wait_s(retry_after, waits) == seconds


@pytest.mark.parametrize(
    ("status", "now", "answered_all", "expected"),
    [
        ("in_progress", 10, True, "completed"),
        ("finalizing", 10, True, "completed"),
        ("in_progress", 100, True, "completed"),  # everything answered just as the window passed
        ("in_progress", 100, False, "expired"),
        ("in_progress", 10, False, None),  # lines left, no reason to end
        ("cancelling", 10, False, "cancelled"),
        ("cancelling", 10, True, "cancelled"),
        ("cancelling", 100, False, "cancelled"),
    ],
)
def test_where_a_batch_ends(status: str, now: float, answered_all: bool, expected: str | None) -> None:
    assert end_status(status, now, 50, answered_all=answered_all) == expected


@pytest.mark.parametrize(
    ("status", "ok"),
    [
        ("validating", True),
        ("in_progress", True),
        ("finalizing", False),
        ("cancelling", False),
        ("completed", False),
        ("failed", False),
        ("expired", False),
        ("cancelled", False),
    ],
)
def test_which_batches_can_be_cancelled(status: str, ok: bool) -> None:
    assert can_cancel(status) is ok


@pytest.mark.parametrize(
    ("rpm", "daily", "expected"), [(60, 1000, (None, 1000)), (None, None, (None, None)), (5, None, (None, None))]
)
def test_a_line_counts_against_daily_tokens_never_the_rate(
    rpm: int | None, daily: int | None, expected: tuple[int | None, int | None]
) -> None:
    assert line_limits(rpm, daily) == expected


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, None),
        ({}, None),
        ({"a": "b"}, None),
        ({str(n): "v" for n in range(16)}, None),
        ({str(n): "v" for n in range(17)}, "at most 16 pairs"),
        ({"k" * 65: "v"}, "longer than 64"),
        ({"k": "v" * 513}, "at most 512"),
        ({"k": 1}, "must be a string"),
        ([], "must be an object"),
    ],
)
def test_metadata(value: object, problem: str | None) -> None:
    found = metadata_problem(value)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_output_lines_are_openais() -> None:
    assert output_line("batch_req_1", "a", 200, "req_1", {"id": "x"}) == {
        "id": "batch_req_1",
        "custom_id": "a",
        "response": {"status_code": 200, "request_id": "req_1", "body": {"id": "x"}},
        "error": None,
    }
    assert failed_line("batch_req_2", "b", EXPIRED) == {
        "id": "batch_req_2",
        "custom_id": "b",
        "response": None,
        "error": {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        },
    }
    assert failed_line("r", "c", CANCELLED)["error"]["code"] == "batch_cancelled"


def test_a_batchs_model_is_the_one_every_line_names() -> None:
    def lines(*models: str) -> list[Any]:
        text = "".join(
            json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/embeddings", "body": {"model": m}}) + "\n"
            for n, m in enumerate(models)
        )
        return parse_batch_file(text.encode(), 10)

    assert one_model(lines("a", "a", "a")) == "a"
    assert one_model(lines("a", "b", "a")) is None
    assert one_model(lines("gemma4")) == "gemma4"
    assert one_model([]) is None
