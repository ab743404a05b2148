"""Calls that ask a worker about a model or a prompt instead of generating: Ollama's ``/api/show`` and Anthropic's
``count_tokens`` on a worker that does not serve the Messages API. Used by the proxy (:mod:`turnout.gateway.proxy`),
which hands its own call to a worker (:data:`~turnout.gateway.capabilities.Post`: the worker's headers, never the
client's key, and its SSRF guard).

* ``/api/show``: an Ollama worker's own answer; for a model on an OpenAI-style worker, what is known of it, its
  ``capabilities`` among it (:mod:`turnout.dialects.ollama.show`, :mod:`turnout.gateway.capabilities`).
* ``count_tokens``: the worker's tokenizer where it has one (the request form that worked is remembered per worker),
  else the gateway's estimate; ``X-Turnout-Token-Count`` says which (``tokenizer`` or ``estimate``).
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web

from turnout.config import Settings
from turnout.core.routing import NoRoute
from turnout.dialects.base import Call, TokenCounter, TranslationError
from turnout.dialects.ollama import show
from turnout.dialects.streams import FrameError, parse_object
from turnout.errors import BadRequest, UpstreamError
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.accounting import Outcome
from turnout.gateway.answers import WorkerAnswers, json_answer, raw_json
from turnout.gateway.capabilities import EmbeddingProbe, Post
from turnout.gateway.catalog import modified_at, unknown_details
from turnout.gateway.dispatch import Dispatcher, Lease, no_route_error
from turnout.upstream.client import ConnectFailed

__all__ = ["COUNT_SOURCE", "Inspector"]

COUNT_SOURCE = "X-Turnout-Token-Count"  # on a count_tokens answer: "tokenizer" (the worker's) or "estimate"
_TOKENIZER_S = 10.0  # a tokenizer's answer later than this: the gateway's estimate instead
_TOKENIZER_ANSWER = 64 << 20  # bytes: a tokenizer's answer (a list of token ids) larger than this is not read


class Inspector:
    def __init__(
        self, settings: Settings, fleet: Fleet, dispatcher: Dispatcher, answers: WorkerAnswers, post: Post
    ) -> None:
        self.settings = settings
        self.fleet = fleet
        self.dispatcher = dispatcher
        self.answers = answers
        self._post = post
        self._tokenizers: dict[str, int] = {}  # worker -> which of a TokenCounter's requests its tokenizer took
        self._embedding = EmbeddingProbe()  # whether a model on an OpenAI-style worker embeds (/api/show)

    async def count_tokens(
        self, call: Call, lease: Lease, counter: TokenCounter, outcome: Outcome
    ) -> web.StreamResponse:
        """A token count on a worker that does not serve the client's API: its tokenizer where it has one, else
        the gateway's estimate. Never a worker error: a tokenizer that fails gives the estimate. Costs the key a
        request and no tokens."""
        worker = lease.worker
        try:
            tries = counter.tokenize(call, worker.upstream_name(lease.model))
        except TranslationError as exc:
            raise BadRequest(str(exc)) from None
        known = self._tokenizers.get(worker.name)
        order = sorted(enumerate(tries), key=lambda t: t[0] != known)  # the form this worker took first
        tokens = None
        for n, (path, body) in order:
            try:
                async with self._post(worker, path, orjson.dumps(body), timeout_s=_TOKENIZER_S) as up:
                    data = await up.read(_TOKENIZER_ANSWER) if up.status < 300 else b""
            except ConnectFailed:
                raise  # the worker cannot be reached: the next one is tried
            except UpstreamError:
                continue
            try:
                tokens = counter.count(parse_object(data)) if data else None
            except FrameError:
                tokens = None
            if tokens is not None:
                self._tokenizers[worker.name] = n
                break
        outcome.prompt_tokens = outcome.completion_tokens = 0
        reply = json_answer(counter.answer(call, tokens), 200, call)
        reply.headers[COUNT_SOURCE] = "estimate" if tokens is None else "tokenizer"
        return reply

    async def show(self, call: Call) -> web.StreamResponse:
        """``/api/show`` for ``call.model``, on the worker the router would pick for it."""
        decision = self.dispatcher.locate(call.model)
        if isinstance(decision, NoRoute):
            raise no_route_error(decision, int(self.settings.health.interval_s))
        worker, model = self.fleet.workers[decision.best.worker], decision.best.model
        if not self.fleet.is_openai(worker.name):
            return await self._passthrough_show(call, worker, model)
        entry = worker.tags.get(model, {})
        embeds = await self._embedding.embeds(worker, model, worker.upstream_name(model), self._post)
        return json_answer(
            {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": unknown_details(),
                "model_info": {"general.architecture": "", "turnout.owned_by": entry.get("owned_by", "")},
                "capabilities": show.capabilities(entry, worker.engine_props, embeds),
                "modified_at": modified_at(self.fleet, decision.best.model, entry, time.time()),
            }
        )

    async def _passthrough_show(self, call: Call, worker: WorkerState, model: str) -> web.StreamResponse:
        upstream = worker.upstream_name(model)
        body = call.body if upstream == call.model else orjson.dumps({**call.payload, "model": upstream})
        async with self._post(worker, "/api/show", body) as up:
            now = asyncio.get_running_loop().time()
            if up.status >= 300:
                return self.answers.worker_error(call, worker, model, up.status, await up.read(), now)
            data = await up.read()
            self.answers.checked(worker, model, data, now)
            return raw_json(data, up.status, call)
