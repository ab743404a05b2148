"""What an answer teaches: its token counts for accounting, and, where the router had a choice of workers, the
worker's prefill and decode rates (:func:`turnout.core.signals.speeds`), which rank candidates. Used by the proxy
(:mod:`turnout.gateway.proxy`) once per answer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from turnout.config import Settings
from turnout.core.prefix import BYTES_PER_TOKEN
from turnout.core.signals import Reported, Sample, input_counts, reported
from turnout.dialects.base import Call, Endpoint
from turnout.fleet.state import Fleet
from turnout.gateway.accounting import Outcome
from turnout.gateway.dispatch import Lease
from turnout.metrics import Metrics

__all__ = ["AnswerLearner"]


class AnswerLearner:
    def __init__(self, settings: Settings, fleet: Fleet, metrics: Metrics) -> None:
        self.settings = settings
        self.fleet = fleet
        self.metrics = metrics

    def learn(
        self,
        lease: Lease,
        call: Call,
        answer: dict[str, Any],
        started: float,
        first: float | None,
        outcome: Outcome,
        *,
        stream_events: int = 0,
    ) -> None:
        """Token counts for accounting (None when the worker reported none: accounting estimates), and, where the
        router had a choice of workers, what the answer says of the worker's speed (its learned rates rank
        candidates, and nothing else reads them). ``started``, ``first``: ``perf_counter`` times of sending and
        of the first bytes of a stream."""
        if not lease.choice or call.endpoint is Endpoint.COUNT_TOKENS:
            # the usual single-worker model: the counts alone, as cheaply as they come (a token count is no answer)
            usage = _obj(answer.get("usage"))
            outcome.prompt_tokens = _first(
                _count(answer, "prompt_eval_count"), _count(usage, "prompt_tokens"), input_counts(usage)[0]
            )
            completion = _first(
                _count(answer, "eval_count"), _count(usage, "completion_tokens"), _count(usage, "output_tokens")
            )
            if completion is None and outcome.prompt_tokens is None and "timings" in answer:
                rep = reported(answer)  # a llama.cpp stream sent without usage: its timings count
                outcome.prompt_tokens, completion = rep.prompt_tokens, rep.completion_tokens
            outcome.completion_tokens = completion if completion is not None else (stream_events or None)
            return
        rep = reported(answer)
        outcome.prompt_tokens = rep.prompt_tokens
        completion = rep.completion_tokens if rep.completion_tokens is not None else (stream_events or None)
        outcome.completion_tokens = completion
        now = time.perf_counter()
        self.observe(lease, call, rep, completion, None if first is None else first - started, now - started)

    def observe(
        self,
        lease: Lease,
        call: Call,
        rep: Reported,
        completion: int | None,
        first_s: float | None,
        total_s: float,
    ) -> None:
        """Learn the worker's prefill and decode rates from one answer (:func:`turnout.core.signals.speeds`): the
        prompt's tokens as reported (else the prefix index's estimate), those served from the engine's cache as it
        reported them (else what the prefix index expected it to hold)."""
        worker = lease.worker
        if first_s is None and (rep.prefill_s is not None or rep.decode_s is not None):
            # an answer in one piece: the span the engine's own timings say it worked on it
            lease.worked((rep.prefill_s or 0.0) + (rep.decode_s or 0.0), asyncio.get_running_loop().time())
        if completion:
            self.fleet.answered(call.model, completion)
        prompt_tokens = rep.prompt_tokens
        if prompt_tokens is None and lease.prompt is not None:
            prompt_tokens = round(lease.prompt.size / BYTES_PER_TOKEN)
        cached = rep.cached_tokens
        if cached is not None and rep.prompt_tokens:
            worker.engine_counted(rep.prompt_tokens, cached)
            self.metrics.engine_tokens(worker.name, rep.prompt_tokens, cached)
        else:
            cached = round((prompt_tokens or 0) * lease.share)
            if lease.share:
                # the index's word only: when the engine no longer held what it expected, a prefill rate from this
                # would be far too slow, so only answers expected cold (or counted by the engine) teach it
                prompt_tokens = None
        prefill_tokens = rep.prefill_tokens
        if prefill_tokens is not None and rep.prefill_counts_cache:  # Ollama's count includes its cache
            prefill_tokens = None if prompt_tokens is None else max(prefill_tokens - cached, 0)
        sample = Sample(
            prompt_tokens,
            cached,
            completion,
            first_s,
            total_s,
            lease.queued,
            prefill_tokens,
            rep.prefill_s,
            rep.decode_tokens,
            rep.decode_s,
        )
        now = time.monotonic()
        slots = worker.parallelism(call.model, now).slots
        # where its engine runs several at once, the others beside it teach how much they slow each other
        beside = None
        if slots is not None and slots > 1:
            beside = lease.beside(now)
            beside = None if beside is None else min(beside, slots - 1.0)
        worker.observe(call.model, sample, now, self.settings.routing.speed_ttl_s, beside)


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(obj: dict[str, Any], key: str) -> int | None:
    """A non-negative integer field, or None (absent, wrong type, negative)."""
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)
