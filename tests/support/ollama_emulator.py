"""A faithful stand-in for the Ollama server (which cannot be installed here), for tests only.

Implements the routes Turnout uses with Ollama's field names and framing: ``/api/tags``, ``/api/ps``
(``size_vram``, ``expires_at``), ``/api/version``, ``/api/chat`` and ``/api/generate`` (NDJSON streams
ending in the stats object, ``stream`` defaulting to true), ``/api/embed``, ``/api/embeddings``,
``/api/show``, Ollama's OpenAI-compatible ``/v1`` routes (SSE with ``data: [DONE]``), ``/v1/responses`` (the
OpenAI Responses API, which Ollama serves itself: a worker configured with ``native_apis: ["responses"]`` gets
Responses calls passed through) and its Anthropic Messages route ``/v1/messages`` (SSE with ``event:`` lines).

Models can think and call tools, as Ollama's ``ChatHandler`` (server/routes.go) answers them: a model in
``thinking_models`` thinks unless ``think`` is false (``message.thinking`` chunks before the content), and
``think: true`` for any other model is a 400 (``"<model>" does not support thinking``); with ``tool_call`` set, a
request that offers tools and does not end with a tool result is answered with that call (``tool_calls`` with
an ``id`` of ``call_`` and 8 characters, arguments an object; on ``/v1`` a JSON string) and ``done_reason``
``stop``. ``/v1/messages`` converts as Ollama's anthropic package does (anthropic/anthropic.go
``FromMessagesRequest``, ``ToMessagesResponse``, ``StreamConverter``; middleware/anthropic.go frames each event
as ``event: <type>`` + ``data:``).

Behaviour is configurable at run time: inventory, residency, per-token latency, HTTP failures,
dropping the connection mid-stream, broken listings (``/api/tags`` slow, 500 or not JSON while
inference still works), and being down. Each reply's first token names the emulator so
tests can see which worker answered.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

OLLAMA_VERSION = "0.12.3"


@dataclass
class Behaviour:
    models: list[str] = field(default_factory=lambda: ["llama3.2:latest"])
    loaded: list[str] = field(default_factory=list)
    tokens: int = 5
    token_delay_s: float = 0.0
    fail_status: int | None = None  # answer every inference call with this status
    drop_after_chunks: int | None = None  # close the connection after N stream chunks
    vram_fraction: float = 1.0  # size_vram / size reported by /api/ps
    hang_s: float = 0.0  # delay before the first byte of an inference answer
    tags_hang_s: float = 0.0  # delay before /api/tags and /v1/models answer (a machine going to sleep)
    require_key: str | None = None  # answer 401 unless "Authorization: Bearer <key>" is sent
    stall_after_chunks: int | None = None  # stop sending (but keep the connection) after N stream chunks
    # Listing failures that leave inference working. Ollama's ListHandler answers 500 {"error": ...} when
    # it cannot read the manifest store; a proxy in front may answer with a page that is not JSON.
    tags_status: int | None = None  # answer /api/tags and /v1/models with this status and Ollama's error object
    tags_garbled: bool = False  # answer /api/tags and /v1/models 200 with a body that is not JSON
    ps_status: int | None = None  # answer /api/ps with this status and Ollama's error object
    version_hang_s: float = 0.0  # delay before /api/version answers (a machine too loaded to answer)
    # Faults of single models (the name as listed), while the others answer: "http_500" (Ollama's error object,
    # as its server answers a runner that crashed), "invalid_json" (200 with a body that is not JSON),
    # "broken_stream" (the answer starts, then the connection closes mid-body), "reset" (the connection closes
    # before any answer).
    model_faults: dict[str, str] = field(default_factory=dict)
    thinking_models: list[str] = field(default_factory=list)  # models with Ollama's "thinking" capability
    tool_call: dict[str, Any] | None = None  # {"name": ..., "arguments": {...}}: the call made when tools are offered
    native_no_stop: bool = False  # /v1/messages streams end without message_stop (a worker that omits it)
    # OLLAMA_NUM_PARALLEL: requests one model runs at once; more wait for a slot before any byte of their answer
    # (Ollama's llm/server.go: llmServer.sem, a semaphore of numParallel acquired in Completion). None: no limit.
    num_parallel: int | None = None
    # Prefill: seconds per KiB of the prompt its slot does not hold, before the first token. Each slot keeps the
    # last prompt it ran, and a request takes the free slot holding the longest prefix of its prompt (Ollama's
    # runner/ollamarunner/cache.go: LoadCacheSlot, findLongestCacheSlot; only the rest is evaluated). 0: free.
    prefill_s_per_kib: float = 0.0
    owned_by: str = "library"  # what /v1/models says owns each model (Ollama's openai/openai.go: "library")


def _held(cached: str, prompt: str) -> int:
    """How many leading characters of ``prompt`` a slot holding ``cached`` holds."""
    n = 0
    for a, b in zip(cached, prompt, strict=False):
        if a != b:
            break
        n += 1
    return n


class _Slots:
    """One model's slots: how many are free, which are busy, and the last prompt each ran."""

    def __init__(self, size: int) -> None:
        self.free = asyncio.Semaphore(size)
        self.busy = [False] * size
        self.prompts = [""] * size


class OllamaEmulator:
    def __init__(self, name: str, behaviour: Behaviour | None = None) -> None:
        self.name = name
        self.behaviour = behaviour or Behaviour()
        self.calls: list[tuple[str, dict[str, Any]]] = []  # inference and /api/show calls with their bodies
        self.listings: list[str] = []  # /api/version, /api/tags and /v1/models calls, in order
        self.active = 0
        self.peak_active = 0
        self._slots: dict[str, _Slots] = {}  # model -> its num_parallel slots
        self.waited = 0  # requests that found every slot busy and waited for one
        self.cancelled = 0
        self.headers_seen: list[dict[str, str]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle -------------------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.headers_seen.append(dict(request.headers))
        key = self.behaviour.require_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            if request.path.startswith("/v1/"):
                # An OpenAI-style server's answer to a wrong key (OpenAI's documented 401 body; it quotes part
                # of the key it refused), which reads to a client as if its own key were wrong.
                sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
                message = f"Incorrect API key provided: {sent[:3]}***{sent[-4:]}."
                error = {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
                return web.json_response({"error": error}, status=401)
            return web.json_response({"error": "unauthorized"}, status=401)
        if request.path in ("/api/tags", "/v1/models") and self.behaviour.tags_hang_s:
            await asyncio.sleep(self.behaviour.tags_hang_s)
        result: web.StreamResponse = await handler(request)
        return result

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        r = app.router
        r.add_get("/", self.root)
        r.add_get("/api/version", self.version)
        r.add_get("/api/tags", self.tags)
        r.add_get("/api/ps", self.ps)
        r.add_post("/api/show", self.show)
        r.add_post("/api/chat", self.chat)
        r.add_post("/api/generate", self.generate)
        r.add_post("/api/embed", self.embed)
        r.add_post("/api/embeddings", self.embeddings)
        r.add_get("/v1/models", self.v1_models)
        r.add_post("/v1/chat/completions", self.v1_chat)
        r.add_post("/v1/completions", self.v1_completions)
        r.add_post("/v1/embeddings", self.v1_embeddings)
        r.add_post("/v1/responses", self.v1_responses)
        r.add_post("/v1/messages", self.v1_messages)
        return app

    async def start(self, port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def served(self, path: str | None = None) -> int:
        return sum(1 for p, _ in self.calls if path is None or p == path)

    # -- metadata --------------------------------------------------------------------------------
    async def root(self, _: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def version(self, _: web.Request) -> web.Response:
        # Ollama answers this from the HTTP router alone (server/routes.go: GET and HEAD /api/version).
        self.listings.append("/api/version")
        if self.behaviour.version_hang_s:
            await asyncio.sleep(self.behaviour.version_hang_s)
        return web.json_response({"version": OLLAMA_VERSION})

    async def tags(self, _: web.Request) -> web.Response:
        self.listings.append("/api/tags")
        broken = self._listing_failure()
        if broken is not None:
            return broken
        return web.json_response({"models": [self._entry(m) for m in self.behaviour.models]})

    def _listing_failure(self) -> web.Response | None:
        """Ollama serves /api/tags and /v1/models with one ListHandler (server/routes.go): both fail alike."""
        if self.behaviour.tags_status is not None:
            return web.json_response({"error": "open manifests: input/output error"}, status=self.behaviour.tags_status)
        if self.behaviour.tags_garbled:
            return web.Response(text="<html><body>upstream hiccup</body></html>", content_type="text/html")
        return None

    async def ps(self, _: web.Request) -> web.Response:
        if self.behaviour.ps_status is not None:
            return web.json_response({"error": "scheduler unavailable"}, status=self.behaviour.ps_status)
        expires = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
        models = []
        for m in self.behaviour.loaded:
            entry = self._entry(m)
            entry.pop("modified_at")
            entry["expires_at"] = expires
            entry["size_vram"] = int(entry["size"] * self.behaviour.vram_fraction)
            entry["context_length"] = 4096
            models.append(entry)
        return web.json_response({"models": models})

    async def show(self, request: web.Request) -> web.Response:
        body = await request.json()
        model = self._resolve(body.get("model") or body.get("name") or "")
        if model is None:
            return web.json_response({"error": f"model '{body.get('model')}' not found"}, status=404)
        self.calls.append(("/api/show", body))
        return web.json_response(
            {
                "modelfile": f"FROM {model}\n",
                "parameters": 'stop "<|eot_id|>"',
                "template": "{{ .Prompt }}",
                "details": self._entry(model)["details"],
                "model_info": {"general.architecture": "llama", "llama.context_length": 131072},
                "capabilities": ["completion", "tools"],
                "modified_at": datetime.now(UTC).isoformat(),
            }
        )

    # -- Ollama inference -------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, "/api/chat", lambda t: {"message": {"role": "assistant", "content": t}})

    def _thinks(self, model: str, think: object) -> bool | str:
        """Whether ``model`` thinks for this request; a string: Ollama's 400 for think on a model that cannot."""
        if model in self.behaviour.thinking_models:
            return think is not False
        if think is True or think in ("low", "medium", "high"):
            return f'"{model}" does not support thinking'
        return False

    def _calls_tool(self, body: dict[str, Any]) -> bool:
        messages = body.get("messages") or []
        last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        return bool(self.behaviour.tool_call and body.get("tools") and last.get("role") != "tool")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._infer(request, "/api/generate", lambda t: {"response": t}, final_extra={"context": [1, 2]})

    async def _infer(
        self, request: web.Request, path: str, piece: Any, final_extra: dict[str, Any] | None = None
    ) -> web.StreamResponse:
        body = await request.json()
        self.calls.append((path, body))
        model = self._resolve(body.get("model", ""))
        if model is None:
            return web.json_response(
                {"error": f'model "{body.get("model")}" not found, try pulling it first'}, status=404
            )
        if self.behaviour.fail_status:
            return web.json_response({"error": "emulated failure"}, status=self.behaviour.fail_status)
        fault = await self._fault(request, model, body, openai=False)
        if fault is not None:
            return fault
        chat = path == "/api/chat"
        thinks = self._thinks(model, body.get("think")) if chat else False
        if isinstance(thinks, str):
            return web.json_response({"error": thinks}, status=400)
        self._load(model)
        started = time.monotonic_ns()
        stream = body.get("stream", True)
        slot = await self._slot(model, body)
        self._enter()
        try:
            if self.behaviour.hang_s:
                await asyncio.sleep(self.behaviour.hang_s)
            words = self._words()
            parts: list[dict[str, Any]] = [piece(w) for w in words]
            if thinks:
                parts = [{"message": {"role": "assistant", "content": "", "thinking": w}} for w in self._thoughts()]
                parts += [piece(w) for w in words]
            if chat and self._calls_tool(body):
                call = {"id": "call_" + uuid.uuid4().hex[:8], "function": {"index": 0, **self.behaviour.tool_call}}  # type: ignore[dict-item]
                parts = [p for p in parts if p["message"].get("thinking")]
                parts.append({"message": {"role": "assistant", "content": "", "tool_calls": [call]}})
            if not stream:
                await asyncio.sleep(self.behaviour.token_delay_s * len(parts))
                out = {"model": body["model"], "created_at": _now(), **piece("".join(w for w in words))}
                if chat:
                    out["message"] = _accumulate(parts)
                out.update(self._stats(started, len(parts)), **(final_extra or {}))
                return web.json_response(out)
            resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await resp.prepare(request)
            for i, part in enumerate(parts):
                if self.behaviour.drop_after_chunks is not None and i >= self.behaviour.drop_after_chunks:
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                if self.behaviour.stall_after_chunks is not None and i >= self.behaviour.stall_after_chunks:
                    await asyncio.sleep(3600)
                chunk = {"model": body["model"], "created_at": _now(), **part, "done": False}
                await resp.write(json.dumps(chunk).encode() + b"\n")
                await asyncio.sleep(self.behaviour.token_delay_s)
            final = {"model": body["model"], "created_at": _now(), **piece("")}
            final.update(self._stats(started, len(parts)), **(final_extra or {}))
            await resp.write(json.dumps(final).encode() + b"\n")
            await resp.write_eof()
            return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
            self._free(model, slot)

    async def _fault(
        self, request: web.Request, model: str, body: dict[str, Any], *, openai: bool
    ) -> web.StreamResponse | None:
        """The configured fault of ``model`` (``Behaviour.model_faults``), or None: answer normally."""
        fault = self.behaviour.model_faults.get(model)
        if fault is None:
            return None
        if fault == "http_500":
            error: Any = (
                {"message": "llama runner process has terminated", "type": "api_error"}
                if openai
                else ("llama runner process has terminated: exit status 2")
            )
            return web.json_response({"error": error}, status=500)
        if fault == "invalid_json":
            return web.Response(body=b"<html>upstream hiccup</html>", content_type="application/json")
        if fault == "reset":
            assert request.transport is not None
            request.transport.close()
            return web.Response()  # never sent: the connection is gone
        assert fault == "broken_stream", fault
        if body.get("stream", not openai):
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream" if openai else "application/x-ndjson"}
            )
            await resp.prepare(request)
            chunk = {"model": model, "created_at": _now(), "message": {"role": "assistant", "content": "Hel"}}
            await resp.write(
                (b"data: " if openai else b"") + json.dumps(chunk).encode() + (b"\n\n" if openai else b"\n")
            )
        else:  # a body shorter than its Content-Length
            resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "400"})
            await resp.prepare(request)
            await resp.write(b'{"model": "')
        assert request.transport is not None
        request.transport.close()
        return resp

    async def embed(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("/api/embed", body))
        if self._resolve(body.get("model", "")) is None:
            return web.json_response({"error": f'model "{body.get("model")}" not found'}, status=404)
        inputs = body.get("input")
        items = [inputs] if isinstance(inputs, str) else list(inputs or [])
        return web.json_response(
            {
                "model": body["model"],
                "embeddings": [_vector(s) for s in items],
                "total_duration": 1000,
                "load_duration": 10,
                "prompt_eval_count": sum(len(s.split()) for s in items),
            }
        )

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("/api/embeddings", body))
        return web.json_response({"embedding": _vector(body.get("prompt", ""))})

    # -- OpenAI-compatible routes ----------------------------------------------------------------
    async def v1_models(self, _: web.Request) -> web.Response:
        self.listings.append("/v1/models")
        broken = self._listing_failure()
        if broken is not None:
            return broken
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 1700000000, "owned_by": self.behaviour.owned_by}
                    for m in self.behaviour.models
                ],
            }
        )

    async def v1_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._v1_infer(request, "/v1/chat/completions", chat=True)

    async def v1_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._v1_infer(request, "/v1/completions", chat=False)

    async def _v1_infer(self, request: web.Request, path: str, *, chat: bool) -> web.StreamResponse:
        body = await request.json()
        self.calls.append((path, body))
        model = self._resolve(body.get("model", ""))
        if model is None:
            return web.json_response(
                {
                    "error": {
                        "message": f'model "{body.get("model")}" not found, try pulling it first',
                        "type": "api_error",
                        "param": None,
                        "code": None,
                    }
                },
                status=404,
            )
        if self.behaviour.fail_status:
            return web.json_response(
                {"error": {"message": "emulated failure", "type": "api_error"}}, status=self.behaviour.fail_status
            )
        fault = await self._fault(request, model, body, openai=True)
        if fault is not None:
            return fault
        self._load(model)
        words = self._words()
        kind = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": 7, "completion_tokens": len(words), "total_tokens": 7 + len(words)}
        call = None
        if chat and self._calls_tool(body):
            # Ollama's /v1 middleware (openai/openai.go toToolCalls): arguments as a JSON string, finish_reason
            # "tool_calls"
            arguments = json.dumps(self.behaviour.tool_call.get("arguments", {}))  # type: ignore[union-attr]
            call = {
                "id": "call_" + uuid.uuid4().hex[:8],
                "index": 0,
                "type": "function",
                "function": {"name": self.behaviour.tool_call["name"], "arguments": arguments},  # type: ignore[index]
            }
        slot = await self._slot(model, body)
        self._enter()
        try:
            if call is not None:
                return await self._v1_tool_call(request, body, call, kind, usage)
            if not body.get("stream"):
                await asyncio.sleep(self.behaviour.token_delay_s * len(words))
                text = "".join(words)
                choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
                choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
                return web.json_response(
                    {
                        "id": "chatcmpl-1",
                        "object": kind,
                        "created": int(time.time()),
                        "model": body["model"],
                        "system_fingerprint": "fp_ollama",
                        "choices": [choice],
                        "usage": usage,
                    }
                )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i, word in enumerate([*words, None]):
                if self.behaviour.drop_after_chunks is not None and i >= self.behaviour.drop_after_chunks:
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                finish = "stop" if word is None else None
                delta = {"role": "assistant", "content": word or ""}
                choice = {"index": 0, "finish_reason": finish}
                choice.update({"delta": delta} if chat else {"text": word or ""})
                event = {
                    "id": "chatcmpl-1",
                    "object": f"{kind}.chunk",
                    "created": int(time.time()),
                    "model": body["model"],
                    "system_fingerprint": "fp_ollama",
                    "choices": [choice],
                }
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                await asyncio.sleep(self.behaviour.token_delay_s)
            if (body.get("stream_options") or {}).get("include_usage"):
                event = {
                    "id": "chatcmpl-1",
                    "object": f"{kind}.chunk",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [],
                    "usage": usage,
                }
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
            self._free(model, slot)

    async def v1_responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API: one message of the emulator's words; a stream of Responses events (``event:`` lines,
        ``sequence_number``s, ``response.completed`` with the usage) that ``drop_after_chunks`` cuts short."""
        body = await request.json()
        self.calls.append(("/v1/responses", body))
        model = self._resolve(body.get("model", ""))
        if model is None:
            error = {
                "message": f'model "{body.get("model")}" not found',
                "type": "api_error",
                "param": None,
                "code": None,
            }
            return web.json_response({"error": error}, status=404)
        if self.behaviour.fail_status:
            return web.json_response(
                {"error": {"message": "emulated failure", "type": "api_error"}}, status=self.behaviour.fail_status
            )
        self._load(model)
        words = self._words()
        rid = f"resp_{self.name}_{len(self.calls)}"
        message = {"id": f"msg_{self.name}", "type": "message", "status": "completed", "role": "assistant"}
        text = {"type": "output_text", "text": "".join(words), "annotations": []}
        usage = {"input_tokens": 7, "output_tokens": len(words), "total_tokens": 7 + len(words)}
        response = {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "model": body["model"],
            "status": "completed",
            "output": [{**message, "content": [text]}],
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(response)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        started = {**response, "status": "in_progress", "output": [], "usage": None}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": started},
            {"type": "response.in_progress", "response": started},
            {"type": "response.output_item.added", "output_index": 0, "item": {**message, "content": []}},
        ]
        events += [
            {
                "type": "response.output_text.delta",
                "item_id": message["id"],
                "output_index": 0,
                "content_index": 0,
                "delta": w,
            }
            for w in words
        ]
        events += [
            {"type": "response.output_item.done", "output_index": 0, "item": response["output"][0]},
            {"type": "response.completed", "response": response},
        ]
        for seq, event in enumerate(events):
            if self.behaviour.drop_after_chunks is not None and seq >= 3 + self.behaviour.drop_after_chunks:
                request.transport.close()  # type: ignore[union-attr]
                return resp
            data = json.dumps({**event, "sequence_number": seq})
            await resp.write(f"event: {event['type']}\ndata: {data}\n\n".encode())
            await asyncio.sleep(self.behaviour.token_delay_s)
        await resp.write_eof()
        return resp

    async def _v1_tool_call(
        self, request: web.Request, body: dict[str, Any], call: dict[str, Any], kind: str, usage: dict[str, int]
    ) -> web.StreamResponse:
        head = {"id": "chatcmpl-1", "object": kind, "created": int(time.time()), "model": body["model"]}
        if not body.get("stream"):
            message = {
                "role": "assistant",
                "content": "",
                "tool_calls": [{k: v for k, v in call.items() if k != "index"}],
            }
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return web.json_response({**head, "choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head["object"] = f"{kind}.chunk"
        delta = {"role": "assistant", "content": "", "tool_calls": [call]}
        for choice in (
            {"index": 0, "delta": delta, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
        ):
            await resp.write(b"data: " + json.dumps({**head, "choices": [choice]}).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(b"data: " + json.dumps({**head, "choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # -- Anthropic Messages (Ollama's own /v1/messages) -------------------------------------------------
    async def v1_messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls.append(("/v1/messages", body))
        model = self._resolve(body.get("model", ""))
        if model is None:
            return _anthropic_error(404, f'model "{body.get("model")}" not found, try pulling it first')
        if self.behaviour.fail_status:
            return _anthropic_error(self.behaviour.fail_status, "emulated failure")
        thinking = body.get("thinking") or {}
        # FromMessagesRequest: thinking enabled -> think true, disabled -> false; the Anthropic route relaxes a
        # think the model cannot do to nil (server/routes.go "relax_thinking")
        think = {"enabled": True, "disabled": False}.get(thinking.get("type")) if isinstance(thinking, dict) else None
        thinks = self._thinks(model, think) is True
        self._load(model)
        chat = {"messages": body.get("messages") or [], "tools": body.get("tools")}
        last = chat["messages"][-1] if chat["messages"] else {}
        answered = isinstance(last.get("content"), list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in last["content"]
        )
        blocks: list[dict[str, Any]] = []
        if thinks:
            blocks.append({"type": "thinking", "thinking": "".join(self._thoughts())})
        tool = self.behaviour.tool_call if body.get("tools") and not answered else None
        if tool is None:
            blocks.append({"type": "text", "text": "".join(self._words())})
        else:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": "call_" + uuid.uuid4().hex[:8],
                    "name": tool["name"],
                    "input": tool.get("arguments", {}),
                }
            )
        usage = {"input_tokens": 7, "output_tokens": len(self._words())}
        msg_id = "msg_" + uuid.uuid4().hex[:24]
        stop = "tool_use" if tool is not None else "end_turn"
        slot = await self._slot(model, body)
        self._enter()
        try:
            if not body.get("stream"):
                await asyncio.sleep(self.behaviour.token_delay_s)
                answer = {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": blocks,
                    "stop_reason": stop,
                    "usage": usage,
                }
                return web.json_response(answer)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            events = _anthropic_events(msg_id, body["model"], blocks, stop, usage, self._words())
            if self.behaviour.native_no_stop:
                events = events[:-1]
            for i, event in enumerate(events):
                if self.behaviour.drop_after_chunks is not None and i >= self.behaviour.drop_after_chunks:
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                await resp.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
                await asyncio.sleep(self.behaviour.token_delay_s)
            await resp.write_eof()
            return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
            self._free(model, slot)

    async def v1_embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("/v1/embeddings", body))
        inputs = body.get("input")
        items = [inputs] if isinstance(inputs, str) else list(inputs or [])
        return web.json_response(
            {
                "object": "list",
                "model": body.get("model"),
                "data": [{"object": "embedding", "index": i, "embedding": _vector(s)} for i, s in enumerate(items)],
                "usage": {"prompt_tokens": len(items), "total_tokens": len(items)},
            }
        )

    # -- helpers ---------------------------------------------------------------------------------
    async def _slot(self, model: str, body: dict[str, Any]) -> int | None:
        """Wait for one of ``model``'s slots (``num_parallel``) and prefill what that slot does not hold of the
        prompt; the slot taken (None: unlimited and free, nothing to emulate)."""
        behaviour = self.behaviour
        if behaviour.num_parallel is None and not behaviour.prefill_s_per_kib:
            return None
        slots = self._slots.get(model)
        if slots is None:
            slots = self._slots[model] = _Slots(behaviour.num_parallel or 64)
        if slots.free.locked():
            self.waited += 1
        await slots.free.acquire()
        prompt = json.dumps(body.get("messages") or body.get("prompt") or "")
        idle = [i for i, busy in enumerate(slots.busy) if not busy]
        taken = max(idle, key=lambda i: _held(slots.prompts[i], prompt))
        held = _held(slots.prompts[taken], prompt)
        slots.busy[taken] = True
        slots.prompts[taken] = prompt
        try:
            if behaviour.prefill_s_per_kib:
                await asyncio.sleep((len(prompt) - held) / 1024 * behaviour.prefill_s_per_kib)
        except BaseException:
            self._free(model, taken)
            raise
        return taken

    def _free(self, model: str, slot: int | None) -> None:
        slots = self._slots.get(model)
        if slots is not None and slot is not None:
            slots.busy[slot] = False
            slots.free.release()

    def _enter(self) -> None:
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)

    def _resolve(self, name: str) -> str | None:
        if name in self.behaviour.models:
            return name
        if ":" not in name and f"{name}:latest" in self.behaviour.models:
            return f"{name}:latest"
        return None

    def _load(self, model: str) -> None:
        if model not in self.behaviour.loaded:
            self.behaviour.loaded.append(model)

    def _words(self) -> list[str]:
        return [f"[{self.name}]"] + [f" w{i}" for i in range(1, self.behaviour.tokens)]

    def _thoughts(self) -> list[str]:
        return [f"[{self.name} thinks]", " t1"]

    def _stats(self, started: int, count: int) -> dict[str, Any]:
        total = max(time.monotonic_ns() - started, 1000)
        return {
            "done_reason": "stop",
            "done": True,
            "total_duration": total,
            "load_duration": 1000,
            "prompt_eval_count": 7,
            "prompt_eval_duration": 1000,
            "eval_count": count,
            "eval_duration": max(total - 2000, 1000),
        }

    def _entry(self, model: str) -> dict[str, Any]:
        family = model.split(":")[0].split("/")[-1]
        return {
            "name": model,
            "model": model,
            "modified_at": "2025-05-01T10:00:00.000000+00:00",
            "size": 2_000_000_000,
            "digest": hashlib.sha256(model.encode()).hexdigest(),
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": family,
                "families": [family],
                "parameter_size": "3.2B",
                "quantization_level": "Q4_K_M",
            },
        }


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _accumulate(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A non-streamed /api/chat message: the chunks' content, thinking and tool calls joined (routes.go)."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    for part in parts:
        chunk = part["message"]
        message["content"] += chunk.get("content", "")
        if chunk.get("thinking"):
            message["thinking"] = message.get("thinking", "") + chunk["thinking"]
        if chunk.get("tool_calls"):
            message.setdefault("tool_calls", []).extend(chunk["tool_calls"])
    return message


def _anthropic_error(status: int, message: str) -> web.Response:
    """anthropic.NewError: the error type of the status, a request id."""
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        503: "overloaded_error",
    }
    body = {
        "type": "error",
        "error": {"type": kinds.get(status, "api_error"), "message": message},
        "request_id": "req_" + uuid.uuid4().hex[:24],
    }
    return web.json_response(body, status=status)


def _anthropic_events(
    msg_id: str, model: str, blocks: list[dict[str, Any]], stop: str, usage: dict[str, int], words: list[str]
) -> list[dict[str, Any]]:
    """StreamConverter.Process's events for these blocks: text word by word, thinking and tool input whole."""
    start = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            )
            for word in words:
                events.append(
                    {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": word}}
                )
        elif block["type"] == "thinking":
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}}
            )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "thinking_delta", "thinking": block["thinking"]},
                }
            )
        else:
            start_block = {**block, "input": {}}
            events.append({"type": "content_block_start", "index": index, "content_block": start_block})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    events.append({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": usage})
    events.append({"type": "message_stop"})
    return events


def _vector(text: str) -> list[float]:
    seed = sum(map(ord, text)) or 1
    return [((seed * (i + 3)) % 97) / 97.0 for i in range(8)]
