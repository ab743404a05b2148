"""Ollama <-> OpenAI translation of requests, responses and stream events (pure).

Used (through :class:`turnout.dialects.ollama.OllamaOnOpenAI`) when an Ollama-dialect client reaches an
OpenAI-compatible worker (llama.cpp, vLLM, SGLang,
LM Studio, mlx_lm). Only standard OpenAI request fields are produced, so strict servers accept them;
Ollama options without an OpenAI equivalent (``top_k``, ``num_ctx``, ``keep_alive``...) are dropped.
Timestamps and durations are parameters: this module reads no clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from turnout.dialects.base import Timing, TranslationError
from turnout.dialects.readable import (
    ResponseShapeError,
    answer_message,
    chunk_choices,
    chunk_delta,
    chunk_text,
    completion_text,
    first_choice,
)

__all__ = [
    "ChatStreamTranslator",
    "ResponseShapeError",
    "Timing",
    "TranslationError",
    "chat_from_openai",
    "chat_to_openai",
    "embed_from_openai",
    "embed_to_openai",
    "generate_to_openai",
    "ollama_error_from_openai",
    "schema_as_json_object",
]

JSON = dict[str, Any]

# Ollama option -> OpenAI request field, for the options both sides share.
_OPTION_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "stop": "stop",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
}
_DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop", "content_filter": "stop"}


# -- requests -------------------------------------------------------------------------------------
def chat_to_openai(body: JSON, model: str, *, stream: bool) -> JSON:
    messages = body.get("messages", [])
    if not isinstance(messages, list):
        raise TranslationError("messages must be a list")
    pending: list[tuple[str, str]] = []  # (call id, function name) awaiting a tool answer
    converted = []
    for index, message in enumerate(messages):
        item = _message_to_openai(message, index)
        for call in item.get("tool_calls", []):
            pending.append((call["id"], call["function"]["name"]))
        if item["role"] == "tool" and "tool_call_id" not in item:
            item["tool_call_id"] = _answered_call(pending, message.get("tool_name"), index)
        converted.append(item)
    out: JSON = {"model": model, "messages": converted}
    _apply_common(body, out, stream=stream)
    if isinstance(body.get("tools"), list) and body["tools"]:
        out["tools"] = body["tools"]
    return out


def generate_to_openai(body: JSON, model: str, *, stream: bool) -> tuple[str, JSON]:
    """(OpenAI path, request). ``raw`` prompts go to /v1/completions, others through the chat template."""
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise TranslationError("prompt must be a string")
    if body.get("raw"):
        out: JSON = {"model": model, "prompt": prompt}
        path = "/v1/completions"
    else:
        messages: list[JSON] = []
        if isinstance(body.get("system"), str) and body["system"]:
            messages.append({"role": "system", "content": body["system"]})
        user: JSON = {"role": "user", "content": prompt}
        if body.get("images"):
            user = _message_to_openai({"role": "user", "content": prompt, "images": body["images"]}, 0)
        messages.append(user)
        out = {"model": model, "messages": messages}
        path = "/v1/chat/completions"
    _apply_common(body, out, stream=stream)
    return path, out


def embed_to_openai(body: JSON, model: str, *, legacy: bool) -> JSON:
    """``/api/embed`` (``input``: str or list) or legacy ``/api/embeddings`` (``prompt``: str)."""
    value = body.get("prompt") if legacy else body.get("input")
    if legacy and not isinstance(value, str):
        raise TranslationError("prompt must be a string")
    if not legacy and not (isinstance(value, str) or (isinstance(value, list) and value)):
        raise TranslationError("input must be a string or a non-empty list of strings")
    out: JSON = {"model": model, "input": value}
    if isinstance(body.get("dimensions"), int):
        out["dimensions"] = body["dimensions"]
    return out


def _apply_common(body: JSON, out: JSON, *, stream: bool) -> None:
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise TranslationError("options must be an object")
    for name, target in _OPTION_FIELDS.items():
        if name in options and options[name] is not None:
            out[target] = options[name]
    num_predict = options.get("num_predict")
    if isinstance(num_predict, int) and num_predict > 0:
        out["max_tokens"] = num_predict
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    elif fmt not in (None, ""):
        raise TranslationError('format must be "json" or a JSON schema object')
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}


def schema_as_json_object(req: JSON) -> JSON | None:
    """The same request with an Ollama ``format`` schema in llama-cpp-python's form, or None when the
    request carries no schema.

    Which form a worker takes (``response_format``):

    * OpenAI's ``{"type": "json_schema", "json_schema": {"name", "schema"}}``, sent first: the OpenAI API,
      vLLM, SGLang, Ollama's ``/v1`` and LM Studio.
    * ``{"type": "json_object", "schema": {...}}``: llama-cpp-python's server, whose request model
      (``llama_cpp/llama_types.py`` ``ChatCompletionRequestResponseFormat``) allows only ``text`` and
      ``json_object`` and answers 422 to ``json_schema``. The proxy retries once in this form after a 4xx
      and keeps using it for that worker.
    """
    fmt = req.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return {**req, "response_format": {"type": "json_object", "schema": schema}}


def _message_to_openai(message: object, index: int) -> JSON:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise TranslationError(f"messages[{index}] must be an object with a role")
    role = message["role"]
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise TranslationError(f"messages[{index}].content must be a string")
    out: JSON = {"role": role, "content": content}
    images = message.get("images")
    if images:
        if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
            raise TranslationError(f"messages[{index}].images must be a list of base64 strings")
        out["content"] = [{"type": "text", "text": content}] + [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{i}"}} for i in images
        ]
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        out["tool_calls"] = [_tool_call_to_openai(c, index, n) for n, c in enumerate(calls)]
    if role == "tool" and isinstance(message.get("tool_call_id"), str):
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _answered_call(pending: list[tuple[str, str]], tool_name: object, index: int) -> str:
    """The id of the earlier tool call this tool message answers: same function name first, else the oldest."""
    for position, (_, name) in enumerate(pending):
        if name == tool_name:
            return pending.pop(position)[0]
    if pending:
        return pending.pop(0)[0]
    return f"call_{index}"


def _tool_call_to_openai(call: object, index: int, n: int) -> JSON:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise TranslationError(f"messages[{index}].tool_calls[{n}] needs function.name")
    arguments = function.get("arguments", {})
    return {
        "id": f"call_{index}_{n}",
        "type": "function",
        "function": {
            "name": function["name"],
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


# -- responses ------------------------------------------------------------------------------------
def chat_from_openai(
    resp: JSON, model: str, timing: Timing, *, generate: bool = False, completions: bool = False, estimate: int = 0
) -> JSON:
    """A non-streamed OpenAI answer as Ollama's final object: a ``/v1/chat/completions`` answer, or with
    ``completions`` a ``/v1/completions`` one (a ``raw`` generate). A worker answer of the wrong shape, or whose
    message cannot be read (:mod:`turnout.dialects.readable`), raises :class:`ResponseShapeError`, never anything
    else. ``estimate``: the prompt's tokens as the gateway bills them when the worker counts none."""
    choice = first_choice(resp)
    if completions:
        message: JSON = {}
        text = completion_text(choice)
    else:
        message = answer_message(choice)
        text = message["content"]
    out = _ollama_head(model, timing, text, generate=generate)
    calls = _tool_calls_from_openai(message.get("tool_calls"))
    if calls and not generate:
        out["message"]["tool_calls"] = calls
    stats = _final_stats(choice.get("finish_reason"), resp.get("usage"), timing, fallback_tokens=0, estimate=estimate)
    out.update(stats)
    return out


def embed_from_openai(resp: JSON, model: str, timing: Timing, *, legacy: bool, estimate: int = 0) -> JSON:
    """An OpenAI embeddings answer as Ollama's (``estimate``: the input's tokens as the gateway bills them when
    the worker counts none)."""
    data = resp.get("data")
    if not isinstance(data, list):
        raise ResponseShapeError("embedding response has no data list")
    items = [d for d in data if isinstance(d, dict)]
    ordered = sorted(items, key=lambda d: _count(d.get("index")) or 0)
    vectors = [d.get("embedding") for d in ordered]
    if not all(isinstance(v, list) and all(_is_number(x) for x in v) for v in vectors):
        raise ResponseShapeError("an embedding is not a list of numbers")
    if legacy:
        return {"embedding": vectors[0] if vectors else []}
    counted = _count(_obj(resp.get("usage")).get("prompt_tokens"))
    return {
        "model": model,
        "embeddings": vectors,
        "total_duration": timing.total_ns,
        "load_duration": 0,
        "prompt_eval_count": estimate if counted is None else counted,
    }


def ollama_error_from_openai(body: bytes, status: int) -> JSON:
    """An OpenAI-style error body (or anything else) as Ollama's ``{"error": "..."}``."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        err = parsed.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return {"error": err["message"]}
        if isinstance(err, str):
            return {"error": err}
        if isinstance(parsed.get("detail"), str):
            return {"error": parsed["detail"]}
    text = body.decode("utf-8", "replace").strip()[:500]
    return {"error": f"upstream returned HTTP {status}" + (f": {text}" if text else "")}


@dataclass(slots=True)
class ChatStreamTranslator:
    """Feeds OpenAI stream events (decoded ``data:`` objects) and yields Ollama NDJSON objects."""

    model: str
    generate: bool = False
    completions: bool = False  # a /v1/completions stream (a raw generate): choices carry text, not a delta
    estimate: int = 0  # the prompt's tokens as the gateway bills them when the worker counts none
    content_chunks: int = 0
    finish_reason: str | None = None
    usage: JSON | None = None
    _calls: dict[int, JSON] = field(default_factory=dict)

    def feed(self, event: JSON, created_at: str) -> list[JSON]:
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        out: list[JSON] = []
        for choice in chunk_choices(event):
            if self.completions:
                text = chunk_text(choice)
            else:
                delta = choice.get("delta")
                if type(delta) is not dict or not (delta.get("content") is None or type(delta["content"]) is str):
                    delta = chunk_delta(choice) or {}  # the rules' own read: text parts joined, the rest refused
                text = _text(delta.get("content"))
                calls = delta.get("tool_calls")
                for call in calls if isinstance(calls, list) else []:
                    self._merge_call(call)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finish_reason = reason
            if text:
                self.content_chunks += 1
                chunk = _ollama_head(self.model, Timing(created_at), text, generate=self.generate)
                chunk["done"] = False
                out.append(chunk)
        return out

    def finish(self, timing: Timing) -> list[JSON]:
        out: list[JSON] = []
        calls = _tool_calls_from_openai(list(self._calls.values()))
        if calls and not self.generate:
            chunk = _ollama_head(self.model, timing, "", generate=False)
            chunk["message"]["tool_calls"] = calls
            chunk["done"] = False
            out.append(chunk)
        final = _ollama_head(self.model, timing, "", generate=self.generate)
        stats = _final_stats(
            self.finish_reason, self.usage, timing, fallback_tokens=self.content_chunks, estimate=self.estimate
        )
        final.update(stats)
        out.append(final)
        return out

    def _merge_call(self, call: object) -> None:
        """Tool-call fragments (OpenAI streams them by ``index``); fragments of the wrong shape are ignored."""
        if not isinstance(call, dict):
            return
        index = call.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = len(self._calls)
        slot = self._calls.setdefault(index, {"function": {"name": "", "arguments": ""}})
        function = _obj(call.get("function"))
        if isinstance(function.get("name"), str):
            slot["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            slot["function"]["arguments"] += function["arguments"]


def _ollama_head(model: str, timing: Timing, text: str, *, generate: bool) -> JSON:
    head: JSON = {"model": model, "created_at": timing.created_at}
    if generate:
        head["response"] = text
    else:
        head["message"] = {"role": "assistant", "content": text}
    return head


def _final_stats(finish_reason: object, usage: object, timing: Timing, *, fallback_tokens: int, estimate: int) -> JSON:
    """Ollama's final stats. Counts the worker did not report are what the gateway bills: the prompt ``estimate``,
    and ``fallback_tokens`` for the answer (the content pieces a stream carried)."""
    counts = _obj(usage)
    eval_count = _count(counts.get("completion_tokens"))
    prompt_count = _count(counts.get("prompt_tokens"))
    prompt_ns = min(timing.first_token_ns, timing.total_ns)
    return {
        "done": True,
        "done_reason": _DONE_REASONS.get(finish_reason, "stop") if isinstance(finish_reason, str) else "stop",
        "total_duration": timing.total_ns,
        "load_duration": 0,
        "prompt_eval_count": estimate if prompt_count is None else prompt_count,
        "prompt_eval_duration": prompt_ns,
        "eval_count": fallback_tokens if eval_count is None else eval_count,
        "eval_duration": max(timing.total_ns - prompt_ns, 0),
    }


def _obj(value: object) -> JSON:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _tool_calls_from_openai(calls: object) -> list[JSON]:
    if not isinstance(calls, list):
        return []
    out: list[JSON] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            continue
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except (ValueError, RecursionError):
            parsed = {"_raw": arguments}
        if not isinstance(parsed, dict):  # Ollama's arguments are an object
            parsed = {"_raw": arguments}
        out.append({"function": {"name": function["name"], "arguments": parsed}})
    return out
