"""Whether a model on an OpenAI-style worker embeds, for ``/api/show``'s ``capabilities``.

Nothing a worker lists or llama.cpp's ``/props`` says tells it (:mod:`turnout.dialects.ollama.show`), so the worker
is asked: one word through its ``/v1/embeddings``, a vector back or not. The answer is kept for
:data:`KNOWN_S` per worker and model (a model swapped behind the same name is seen again after that); a worker
that cannot be asked now (unreachable, slow, an answer too large) is asked again next time. Only the gateway's
own workers are asked: an external endpoint (a paid API, perhaps) is never sent a call its client did not make,
and its models are not said to embed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import orjson

from turnout.dialects.ollama import show
from turnout.dialects.streams import FrameError, parse_object
from turnout.errors import TurnoutError
from turnout.fleet.state import WorkerState
from turnout.upstream.client import UpstreamResponse

__all__ = ["KNOWN_S", "EmbeddingProbe"]

KNOWN_S = 600.0
_PROBE_S = 10.0  # the call may take this long
_ANSWER = 16 << 20  # bytes: its answer may be this large
_KEPT = 10_000  # (worker, model) answers kept

# (worker, path, body, extra headers, timeout): the proxy's call to a worker with its own headers and guard
Post = Callable[..., AbstractAsyncContextManager[UpstreamResponse]]


class EmbeddingProbe:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._known: dict[tuple[str, str], tuple[bool, float]] = {}  # (worker, model) -> (embeds, when asked)

    async def embeds(self, worker: WorkerState, model: str, upstream: str, post: Post) -> bool:
        """Whether ``worker`` answers an embedding for ``model`` (``upstream``: the name the worker knows it by)."""
        if worker.external is not None:
            return False
        key = (worker.name, model)
        now = self._clock()
        known = self._known.get(key)
        if known is not None and now - known[1] < KNOWN_S:
            return known[0]
        body = orjson.dumps({"model": upstream, "input": show.EMBEDDING_PROBE})
        try:
            async with post(worker, "/v1/embeddings", body, timeout_s=_PROBE_S) as up:
                data = await up.read(_ANSWER) if up.status == 200 else b""
        except TurnoutError:
            return False
        try:
            answer: object = parse_object(data) if data else None
        except FrameError:
            answer = None
        if len(self._known) >= _KEPT:
            self._known.clear()
        embeds = show.embeds(answer)
        self._known[key] = (embeds, now)
        return embeds
