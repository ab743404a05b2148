"""The OpenAI Batch API's rules: the input file, the batch's states, what happens to a line's answer, the output.

Pure (no I/O, no clock: times are parameters). Used by :mod:`turnout.gateway.batch_api` (uploads, batches) and
:mod:`turnout.gateway.batch_runner` (running the lines). The shapes are OpenAI's, as its API reference and its
Python SDK (``openai/types/batch.py``, ``batch_error.py``, ``batch_request_counts.py``, ``file_object.py``) give them:

- an input file is JSONL, one request a line: ``{"custom_id", "method": "POST", "url", "body"}``; ``custom_id``
  unique in the file, ``url`` one of :data:`BATCH_URLS`, ``body`` an object naming its ``model``. A problem is
  reported with its line number (1 = the file's first line; blank lines count, and are skipped);
- a batch goes ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed``; or ``expired`` when its
  ``completion_window`` passed first, ``cancelling`` -> ``cancelled`` when cancelled, ``failed`` when it could not
  start (its input file unreadable);
- each line's answer is one line of the output file (a 2xx answer) or of the error file (any other answer, and the
  lines never run): ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``, or
  ``{"id", "custom_id", "response": null, "error": {"code", "message"}}`` for a line that never ran
  (``batch_expired``, ``batch_cancelled``).

What a line's answer means for the batch (:func:`verdict`): a line's failure is its error line, never the batch's
end; a refusal that says "later" (429: the key's daily token budget; 503: no capacity now) makes the batch wait
and try the line again, within its completion window; a worker that failed (5xx) is tried again a few times. A
503 for a model that no worker which may serve it is known to hold (every such worker is down and never listed it,
nor was it up lately: a model named by mistake while an Ollama box is off) is waited for at most
:data:`UNLISTED_WAIT_S`, then written as the line's answer, as a request sent directly gets it at once; where a
down worker's last listing held the model, or it was up lately, the line waits as long as the window lasts.

Limits (:func:`line_limits`, the one place this is decided): a line counts against its key's (and tenant's) daily
token budget like any request, and never against their requests per minute, so a batch neither stalls on a key's
rate nor takes the rate its interactive requests need; how fast a batch runs is the dispatcher's ``batch`` class's
business (idle capacity) and ``batches.lines_in_flight``.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

import orjson

__all__ = [
    "ACTIVE",
    "BATCH_URLS",
    "CANCELLED",
    "ENDED",
    "EXPIRED",
    "MAX_CUSTOM_ID",
    "MAX_METADATA",
    "STATUSES",
    "UNLISTED_WAIT_S",
    "FileProblem",
    "Line",
    "LineProblem",
    "Never",
    "Verdict",
    "can_cancel",
    "end_status",
    "failed_line",
    "kept",
    "line_limits",
    "metadata_problem",
    "one_model",
    "output_line",
    "parse_batch_file",
    "parse_window",
    "retry_wait_s",
    "verdict",
]

# Routes a line may name (OpenAI's Batch API takes more, for its own hosted models: moderations, images, videos).
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled")
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")  # a runner has work to do
ENDED = ("failed", "completed", "expired", "cancelled")
MAX_CUSTOM_ID = 512  # characters
MAX_METADATA = 16  # key-value pairs: keys up to 64 characters, values up to 512 (OpenAI's)
MAX_PROBLEMS = 10  # lines named in one upload error
MIN_WINDOW_S = 1.0
MAX_WINDOW_S = 7 * 86_400.0
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class Never(NamedTuple):
    """Why a line never ran: its error line's ``error`` (OpenAI's codes and messages)."""

    code: str
    message: str


EXPIRED = Never("batch_expired", "This request could not be executed before the completion window expired.")
CANCELLED = Never("batch_cancelled", "This request could not be executed before the batch was cancelled.")


class Line(NamedTuple):
    """One request of an input file: its line number (1-based), ``custom_id``, ``url``, ``body`` (the JSON
    object, re-encoded) and the ``model`` it names."""

    number: int
    custom_id: str
    url: str
    body: bytes
    model: str


@dataclass(frozen=True, slots=True)
class LineProblem:
    line: int
    message: str
    code: str
    param: str | None = None

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class FileProblem(ValueError):
    """An input file the Batch API cannot take: every problem found (the first :data:`MAX_PROBLEMS` lines) and how
    many lines had one. ``str()`` is the message a client reads."""

    def __init__(self, problems: list[LineProblem], lines_with_problems: int, summary: str | None = None) -> None:
        self.problems = problems
        self.count = lines_with_problems
        self.summary = summary
        text = summary or "; ".join(str(p) for p in problems)
        more = lines_with_problems - len(problems)
        if more > 0:
            text += f" (and {more} more line{'s' if more != 1 else ''} with problems)"
        super().__init__(text)

    @property
    def code(self) -> str:
        return self.problems[0].code if self.problems else "invalid_file"

    @property
    def param(self) -> str | None:
        return self.problems[0].param if self.problems else None


def parse_batch_file(data: bytes, max_lines: int) -> list[Line]:
    """Every request of a JSONL input file, in order. Raises :class:`FileProblem` naming the lines that are not
    requests the Batch API can run (see the module's docstring), or a file with no request, or more than
    ``max_lines``."""
    problems: list[LineProblem] = []
    bad = 0
    seen: dict[str, int] = {}
    lines: list[Line] = []
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark, as some editors write
    for number, raw in enumerate(io.BytesIO(data), 1):  # one line at a time (not a list of them all at once)
        if not raw.strip():
            continue
        found = _line(number, raw, seen)
        if isinstance(found, LineProblem):
            bad += 1
            if len(problems) < MAX_PROBLEMS:
                problems.append(found)
            continue
        lines.append(found)
        if len(lines) + bad > max_lines:
            raise FileProblem(
                [LineProblem(number, f"the file has more than {max_lines} requests", "too_many_requests")],
                1,
                f"the file has more than {max_lines} requests (batches.max_lines); split it into several batches",
            )
    if problems:
        raise FileProblem(problems, bad)
    if not lines:
        raise FileProblem(
            [LineProblem(1, "the file holds no request", "empty_file")],
            1,
            "the file holds no request: a batch input file is JSONL, one request per line "
            '({"custom_id": ..., "method": "POST", "url": ..., "body": {...}})',
        )
    return lines


def _line(number: int, raw: bytes, seen: dict[str, int]) -> Line | LineProblem:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return LineProblem(number, f"not valid JSON ({exc})", "invalid_json_line")
    if not isinstance(obj, dict):
        return LineProblem(number, "a line must be a JSON object", "invalid_json_line")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineProblem(number, '"custom_id" must be a non-empty string', "invalid_custom_id", "custom_id")
    if len(custom_id) > MAX_CUSTOM_ID:
        return LineProblem(
            number, f'"custom_id" is longer than {MAX_CUSTOM_ID} characters', "invalid_custom_id", "custom_id"
        )
    first = seen.get(custom_id)
    if first is not None:
        return LineProblem(
            number,
            f'"custom_id" {_quoted(custom_id)} is already used on line {first}; each request needs its own',
            "duplicate_custom_id",
            "custom_id",
        )
    seen[custom_id] = number
    method = obj.get("method")
    if method != "POST":
        return LineProblem(number, f'"method" must be "POST", got {_quoted(method)}', "invalid_method", "method")
    url = obj.get("url")
    if url not in BATCH_URLS:
        return LineProblem(
            number, f'"url" must be one of {", ".join(BATCH_URLS)}, got {_quoted(url)}', "invalid_url", "url"
        )
    assert isinstance(url, str)
    body = obj.get("body")
    if not isinstance(body, dict):
        return LineProblem(number, '"body" must be a JSON object (the request)', "invalid_body", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        return LineProblem(number, '"body.model" must name the model to use', "missing_model", "body.model")
    if body.get("stream") is True:
        return LineProblem(
            number, 'a batch answers each request whole: leave out "body.stream"', "stream_not_supported", "body.stream"
        )
    return Line(number, custom_id, url, kept(orjson.dumps(body)), model)


def one_model(lines: list[Line]) -> str | None:
    """The model every line names (its ``body.model``, as written), or None where they name several: OpenAI's Batch
    object's ``model`` (its API takes one model a batch; Turnout takes several, and says none then)."""
    models = {line.model for line in lines}
    return models.pop() if len(models) == 1 else None


def kept(encoded: bytes) -> bytes:
    """``encoded`` (orjson's output) as a bytes object of its own size, for what is kept for long: orjson returns
    the buffer it wrote into, at least 4 KB of memory however short the text (measured: 50,000 lines of 0.5 KB held
    206 MB as parsed, against 25 MB of file)."""
    return bytes(memoryview(encoded))


def _quoted(value: object) -> str:
    text = orjson.dumps(value).decode() if value is not None else "nothing"
    return text if len(text) <= 80 else text[:77] + "..."


def metadata_problem(value: Any) -> str | None:
    """Why ``metadata`` is not OpenAI's: at most 16 string pairs, keys up to 64 characters, values up to 512."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return '"metadata" must be an object of strings'
    if len(value) > MAX_METADATA:
        return f'"metadata" holds at most {MAX_METADATA} pairs, got {len(value)}'
    for key, item in value.items():
        if len(key) > 64:
            return f'"metadata": key {_quoted(key)} is longer than 64 characters'
        if not isinstance(item, str) or len(item) > 512:
            return f'"metadata.{key}" must be a string of at most 512 characters'
    return None


def parse_window(text: object) -> float:
    """``completion_window`` in seconds: OpenAI's ``24h``, or any ``<n>s``, ``<n>m``, ``<n>h``, ``<n>d`` from one
    second to seven days. Raises ValueError saying what is accepted."""
    match = _WINDOW.match(text) if isinstance(text, str) else None
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)] if match else math.nan
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise ValueError(
            f'"completion_window" must be a duration such as "24h" (OpenAI\'s), "90m" or "2d", from 1s to 7d; '
            f"got {_quoted(text)}"
        )
    return seconds


def can_cancel(status: str) -> bool:
    """Whether a batch in ``status`` can still be cancelled (once it is finalizing, every line has its answer)."""
    return status in ("validating", "in_progress")


def end_status(status: str, now: float, expires_at: float, *, answered_all: bool) -> str | None:
    """Where a batch whose runner stopped taking lines goes: ``cancelled`` when cancelling; ``completed`` (through
    ``finalizing``) when every line has its answer; ``expired`` when its window passed first; None when it has lines
    left and no reason to end (they are for the next run)."""
    if status == "cancelling":
        return "cancelled"
    if answered_all:
        return "completed"
    if now >= expires_at:
        return "expired"
    return None


class Verdict(Enum):
    RECORD = "record"  # the line's answer: written to the output (2xx) or error file
    RETRY = "retry"  # the worker failed: try again, counted against the line's attempts
    WAIT = "wait"  # later: the key's token budget is spent, or no capacity now; not an attempt


# How long a batch's lines wait for a model that no worker which may serve it is known to hold (:func:`verdict`):
# long enough for a box switched off at a gateway's restart (its listing not yet read again) to come back, short
# enough that a batch with a line naming a model nobody has ends within minutes, not at its window's end.
UNLISTED_WAIT_S = 300.0


def verdict(status: int, attempt: int, max_attempts: int, *, unlisted_s: float | None = None) -> Verdict:
    """What to do with a line's answer of HTTP ``status``, on its ``attempt`` (1, 2, ...). ``unlisted_s``: for a
    503 that no worker can serve the model now, where none that may serve it is known to hold it, how long the
    batch has been answered that way for that model (None: not that case)."""
    if status < 400:
        return Verdict.RECORD
    if status == 503 and unlisted_s is not None and unlisted_s >= UNLISTED_WAIT_S:
        return Verdict.RECORD
    if status in (429, 503):
        return Verdict.WAIT
    if status >= 500 and attempt < max_attempts:
        return Verdict.RETRY
    return Verdict.RECORD


def retry_wait_s(
    retry_after: int | None, waits: int, *, most_s: float = 60.0, unlisted_s: float | None = None
) -> float:
    """How long to wait before trying a line again: the answer's ``Retry-After`` when it gave one (a daily token
    budget says when it renews), else doubling from one second (``waits``: how many waits before this one), never
    more than ``most_s``; and never past the end of :data:`UNLISTED_WAIT_S` where that applies (``unlisted_s``, as
    :func:`verdict` takes it), so that the line is answered then."""
    if retry_after is not None and retry_after > 0:
        wait = float(retry_after)
    else:
        wait = min(float(2 ** min(waits, 16)), most_s)
    if unlisted_s is not None:
        wait = min(wait, max(UNLISTED_WAIT_S - unlisted_s, 0.0))
    return wait


def line_limits(rpm: int | None, daily_tokens: int | None) -> tuple[int | None, int | None]:
    """The limits a batch line is counted against, given a key's (or tenant's): its daily tokens, never its rate
    (see the module's docstring)."""
    del rpm
    return None, daily_tokens


def output_line(line_id: str, custom_id: str, status: int, request_id: str, body: object) -> dict[str, Any]:
    """A line of the output file (2xx) or the error file (any other status): the answer as the route gave it."""
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def failed_line(line_id: str, custom_id: str, never: Never) -> dict[str, Any]:
    """A line of the error file for a request that never ran (``batch_expired``, ``batch_cancelled``)."""
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": None,
        "error": {"code": never.code, "message": never.message},
    }
