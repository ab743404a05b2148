"""A Messages request read into one neutral prompt, then written as the worker's chat request (pure).

:func:`read_prompt` takes everything an agent sends and keeps what a chat model can use: ``system`` (a string or
text blocks; Claude Code's ``x-anthropic-billing-header`` block is dropped: it belongs to the client, and its
varying suffix at the very start would spoil every worker's prompt cache), text, image and document blocks,
``tool_use`` / ``tool_result`` (with ``is_error`` and content blocks), ``thinking`` blocks echoed in history, and
``role: "system"`` messages inside ``messages`` (Claude Code sends them for models it does not know): those are
joined to the system prompt when nothing came before them, else to the user or tool message before them, or
they start a user message, so that user and assistant still alternate and the same history always gives the
same prompt (prefix caches keep working from one turn to the next). A string and a list of text blocks are the
same text. Adjacent user messages are joined, as Anthropic's API joins them.

:func:`openai_request` and :func:`ollama_request` write the prompt and the sampling fields in the worker's
dialect. Fields a worker cannot take (``cache_control``, ``context_management``, beta fields...) are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from turnout.dialects.base import TranslationError

__all__ = [
    "BILLING_HEADER",
    "EXTRA_FIELDS",
    "Image",
    "Prompt",
    "ToolUse",
    "Turn",
    "ollama_request",
    "openai_alternate",
    "openai_request",
    "prompt_parts",
    "read_prompt",
    "user_id",
]

JSON = dict[str, Any]
BILLING_HEADER = "x-anthropic-billing-header:"
_JOIN = "\n\n"
# Fields of an OpenAI chat request that are not OpenAI's own: sent when the client asked for what they carry, and
# left out of the alternate request a strict server (OpenAI's own API) is sent after it refuses them.
EXTRA_FIELDS = ("top_k", "reasoning_effort", "chat_template_kwargs")
_OPENAI_STOPS = 4  # stop sequences OpenAI's own API takes
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high", "xhigh": "high"}


@dataclass(frozen=True, slots=True)
class Image:
    media_type: str
    data: str = ""  # base64
    url: str = ""  # or an URL


@dataclass(frozen=True, slots=True)
class ToolUse:
    id: str
    name: str
    input: JSON


@dataclass(slots=True)
class Turn:
    """One message of the neutral prompt: ``user``, ``assistant`` or ``tool`` (the answer to one tool_use)."""

    role: str
    text: str = ""
    images: list[Image] = field(default_factory=list)
    order: list[str | Image] = field(default_factory=list)  # user: its texts and images as they came
    calls: list[ToolUse] = field(default_factory=list)  # assistant
    thinking: str = ""  # assistant: reasoning echoed in history
    call_id: str = ""  # tool: the tool_use it answers
    name: str = ""  # tool: that tool's name (Ollama's tool_name)

    def add_text(self, text: str) -> None:
        if text:
            self.text = f"{self.text}{_JOIN}{text}" if self.text else text
            self.order.append(text)


@dataclass(slots=True)
class Prompt:
    system: str
    turns: list[Turn]
    tools: list[JSON]  # OpenAI function tools: {"type": "function", "function": {name, description, parameters}}
    tool_choice: JSON | None  # Anthropic's, checked


# -- reading ----------------------------------------------------------------------------------
def read_prompt(body: JSON) -> Prompt:
    """The neutral prompt of a Messages (or count_tokens) request; a TranslationError (400) names a bad field."""
    system = _system_text(body.get("system"))
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise TranslationError('"messages" must be a list of messages')
    turns: list[Turn] = []
    names: dict[str, str] = {}  # tool_use id -> tool name
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TranslationError(f"messages[{i}] must be an object with role and content")
        role = message.get("role")
        blocks = _blocks(message.get("content"), f"messages[{i}].content")
        if role == "user":
            _read_user(blocks, turns, names, i)
        elif role == "assistant":
            turns.append(_read_assistant(blocks, names, i))
        elif role in ("system", "developer"):
            text = _join(_text_of(b) for b in blocks)
            if not turns:
                system = f"{system}{_JOIN}{text}" if system and text else system or text
            elif turns[-1].role in ("user", "tool"):
                turns[-1].add_text(text)
            elif text:
                turns.append(Turn("user", text))
        else:
            raise TranslationError(f'messages[{i}].role must be "user" or "assistant", not {role!r}')
    return Prompt(system, _merge_users(turns), _tools(body.get("tools")), _tool_choice(body.get("tool_choice")))


def _blocks(content: object, where: str) -> list[JSON]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if content is None:
        return []
    if not isinstance(content, list):
        raise TranslationError(f"{where} must be a string or a list of content blocks")
    return [b for b in content if isinstance(b, dict)]


def _system_text(system: object) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise TranslationError('"system" must be a string or a list of text blocks')
    texts = (_text_of(b) for b in system if isinstance(b, dict))
    return _join(t for t in texts if not t.startswith(BILLING_HEADER))


def _text_of(block: JSON) -> str:
    """The text a block carries for a chat model: text, a text document, a search result; else ""."""
    kind = block.get("type")
    if kind == "text":
        return _str(block.get("text"))
    if kind == "document":
        source = block.get("source")
        if isinstance(source, dict):
            if source.get("type") == "text":
                return _str(source.get("data"))
            if source.get("type") == "content":
                return _join(_text_of(b) for b in _blocks(source.get("content"), "document"))
        return ""
    if kind == "search_result":
        return _join(_text_of(b) for b in _blocks(block.get("content"), "search_result"))
    return ""


def _image(block: JSON, where: str) -> Image | None:
    source = block.get("source")
    if not isinstance(source, dict):
        raise TranslationError(f"{where}: an image block needs a source")
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return Image(_str(source.get("media_type")) or "image/png", data=source["data"])
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return Image("", url=source["url"])
    raise TranslationError(f"{where}: an image must be base64 data or an url (a file_id is Anthropic's own)")


def _read_user(blocks: list[JSON], turns: list[Turn], names: dict[str, str], i: int) -> None:
    """Tool results first (each a tool turn, in order, as a chat template wants them right after the call),
    then the rest of the message as one user turn."""
    user = Turn("user")
    for n, block in enumerate(blocks):
        kind = block.get("type")
        where = f"messages[{i}].content[{n}]"
        if kind == "tool_result":
            turns.append(_tool_result(block, names, where))
        elif kind == "image":
            image = _image(block, where)
            if image is not None:
                user.images.append(image)
                user.order.append(image)
        else:
            text = _text_of(block)
            if text:
                user.order.append(text)
    user.text = _join(t for t in user.order if isinstance(t, str))
    if user.text or user.images:
        turns.append(user)


def _tool_result(block: JSON, names: dict[str, str], where: str) -> Turn:
    call_id = _str(block.get("tool_use_id"))
    turn = Turn("tool", call_id=call_id, name=names.get(call_id, ""))
    texts = []
    for n, part in enumerate(_blocks(block.get("content"), f"{where}.content")):
        if part.get("type") == "image":
            image = _image(part, f"{where}.content[{n}]")
            if image is not None:
                turn.images.append(image)
        else:
            texts.append(_text_of(part))
    text = _join(texts)
    turn.text = f"Error: {text}" if block.get("is_error") is True else text
    return turn


def _read_assistant(blocks: list[JSON], names: dict[str, str], i: int) -> Turn:
    turn = Turn("assistant")
    texts: list[str] = []
    thoughts: list[str] = []
    for n, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "tool_use":
            name = block.get("name")
            call_id = block.get("id")
            if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
                raise TranslationError(f"messages[{i}].content[{n}]: a tool_use block needs an id and a name")
            arguments = block.get("input")
            turn.calls.append(ToolUse(call_id, name, arguments if isinstance(arguments, dict) else {}))
            names[call_id] = name
        elif kind == "thinking":
            thoughts.append(_str(block.get("thinking")))
        else:
            texts.append(_text_of(block))
    turn.text = _join(texts)
    turn.thinking = _join(thoughts)
    return turn


def _merge_users(turns: list[Turn]) -> list[Turn]:
    merged: list[Turn] = []
    for turn in turns:
        if merged and turn.role == "user" and merged[-1].role == "user":
            last = merged[-1]
            last.text = _join((last.text, turn.text))
            last.images.extend(turn.images)
            last.order.extend(turn.order)
        else:
            merged.append(turn)
    return merged


def _tools(tools: object) -> list[JSON]:
    """Client tools as OpenAI function tools. Left out: tools with ``defer_loading`` (the client loads them into
    the model's context only once found through its tool search) and Anthropic's server tools (a ``type`` of
    their own, such as ``web_search_20250305``, and no ``input_schema``: a self-hosted worker cannot run them)."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise TranslationError('"tools" must be a list of tools')
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("defer_loading") is True:
            continue
        name = tool.get("name")
        kind = tool.get("type")
        if not isinstance(name, str) or not name or kind not in (None, "custom"):
            continue
        schema = tool.get("input_schema")
        function: JSON = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = schema if isinstance(schema, dict) else {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: object) -> JSON | None:
    if choice is None:
        return None
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise TranslationError('"tool_choice" must be {"type": "auto" | "any" | "tool" | "none"}')
    if choice["type"] == "tool" and not isinstance(choice.get("name"), str):
        raise TranslationError('"tool_choice" of type "tool" needs the tool\'s "name"')
    return choice


def _join(texts: Any) -> str:
    return _JOIN.join(t for t in texts if t)


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


# -- sampling fields ----------------------------------------------------------------------------------
def _number(body: JSON, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TranslationError(f'"{name}" must be a number')
    return value


def _integer(body: JSON, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TranslationError(f'"{name}" must be an integer')
    return value


def _stops(body: JSON) -> list[str]:
    stops = body.get("stop_sequences")
    if stops is None:
        return []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise TranslationError('"stop_sequences" must be a list of strings')
    return [s for s in stops if s]


def _thinking_off(body: JSON) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") == "disabled"


def _effort(body: JSON) -> str | None:
    config = body.get("output_config")
    effort = config.get("effort") if isinstance(config, dict) else None
    return _EFFORTS.get(effort.strip().lower()) if isinstance(effort, str) else None


def user_id(body: JSON) -> str | None:
    metadata = body.get("metadata")
    value = metadata.get("user_id") if isinstance(metadata, dict) else None
    return value if isinstance(value, str) and value else None


# -- writing: OpenAI ----------------------------------------------------------------------------------
def openai_request(body: JSON, model: str, *, stream: bool) -> JSON:
    """The ``/v1/chat/completions`` request. Beside OpenAI's own fields it carries, when the client asked for what
    they mean, ``top_k``, ``reasoning_effort`` (from ``output_config.effort``) and ``chat_template_kwargs``
    (``enable_thinking: false`` for ``thinking: {"type": "disabled"}``), which llama.cpp, vLLM and SGLang take
    (:func:`openai_alternate` is the form without them)."""
    prompt = read_prompt(body)
    out: JSON = {"model": model, "messages": openai_messages(prompt)}
    max_tokens = _integer(body, "max_tokens")
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        value = _number(body, name)
        if value is not None:
            out[name] = value
    stops = _stops(body)
    if stops:
        out["stop"] = stops
    if prompt.tools:
        out["tools"] = prompt.tools
        choice = prompt.tool_choice
        if choice is not None:
            kind = choice["type"]
            if kind == "tool":
                out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
            else:
                out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
            if choice.get("disable_parallel_tool_use") is True:
                out["parallel_tool_calls"] = False
    user = user_id(body)
    if user is not None:
        out["user"] = user
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    top_k = _integer(body, "top_k")
    if top_k is not None:
        out["top_k"] = top_k
    effort = _effort(body)
    if effort is not None:
        out["reasoning_effort"] = effort
    if _thinking_off(body):
        out["chat_template_kwargs"] = {"enable_thinking": False}
    return out


def openai_alternate(request: JSON) -> JSON | None:
    """``request`` in the plainest form a strict or older server takes: without the fields that are not OpenAI's
    own, ``tool_choice: "required"`` as ``"auto"`` (best effort: the model may then answer in text) and at most
    the 4 stop sequences OpenAI's API takes. None when it is that already."""
    required = request.get("tool_choice") == "required"
    stops = request.get("stop")
    stops = stops if isinstance(stops, list) else []
    many = len(stops) > _OPENAI_STOPS
    if not required and not many and not any(name in request for name in EXTRA_FIELDS):
        return None
    plain = {k: v for k, v in request.items() if k not in EXTRA_FIELDS}
    if required:
        plain["tool_choice"] = "auto"
    if many:
        plain["stop"] = stops[:_OPENAI_STOPS]
    return plain


def openai_messages(prompt: Prompt) -> list[JSON]:
    out: list[JSON] = [{"role": "system", "content": prompt.system}] if prompt.system else []
    held: list[Image] = []  # images of tool results: a tool message takes text only, so a user message follows
    for turn in prompt.turns:
        if held and turn.role != "tool":
            if turn.role == "user":
                turn = Turn("user", turn.text, [*held, *turn.images], order=[*held, *turn.order])
            else:
                out.append(_openai_user(Turn("user", images=held, order=list(held))))
            held = []
        if turn.role == "user":
            out.append(_openai_user(turn))
        elif turn.role == "tool":
            out.append({"role": "tool", "tool_call_id": turn.call_id, "content": turn.text})
            held.extend(turn.images)
        else:
            message: JSON = {"role": "assistant", "content": turn.text}
            if turn.calls:
                message["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": orjson.dumps(call.input).decode()},
                    }
                    for call in turn.calls
                ]
            out.append(message)
    if held:
        out.append(_openai_user(Turn("user", images=held, order=list(held))))
    return out


def _openai_user(turn: Turn) -> JSON:
    """A user message: its text, or with images its parts in the order they came (adjacent texts joined)."""
    if not turn.images:
        return {"role": "user", "content": turn.text}
    parts: list[JSON] = []
    for part in turn.order:
        if isinstance(part, Image):
            url = part.url or f"data:{part.media_type};base64,{part.data}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif parts and parts[-1]["type"] == "text":
            parts[-1]["text"] += _JOIN + part
        else:
            parts.append({"type": "text", "text": part})
    return {"role": "user", "content": parts}


# -- writing: Ollama ----------------------------------------------------------------------------------
def ollama_request(body: JSON, model: str, *, stream: bool) -> JSON:
    """The ``/api/chat`` request. ``think`` is sent only as false (``thinking: {"type": "disabled"}``): Ollama
    answers ``think: true`` for a model that cannot think with a 400, and a model that can thinks by default."""
    prompt = read_prompt(body)
    messages: list[JSON] = [{"role": "system", "content": prompt.system}] if prompt.system else []
    for n, turn in enumerate(prompt.turns):
        message: JSON = {"role": turn.role, "content": turn.text}
        if turn.images:
            message["images"] = [_ollama_image(image, n) for image in turn.images]
        if turn.thinking:
            message["thinking"] = turn.thinking
        if turn.calls:
            message["tool_calls"] = [
                {"id": call.id, "function": {"index": k, "name": call.name, "arguments": call.input}}
                for k, call in enumerate(turn.calls)
            ]
        if turn.role == "tool":
            message["tool_call_id"] = turn.call_id
            if turn.name:
                message["tool_name"] = turn.name
        messages.append(message)
    out: JSON = {"model": model, "messages": messages, "stream": stream}
    choice = prompt.tool_choice
    if prompt.tools and not (choice is not None and choice["type"] == "none"):
        out["tools"] = prompt.tools
    options: JSON = {}
    max_tokens = _integer(body, "max_tokens")
    if max_tokens is not None:
        options["num_predict"] = max_tokens
    for name in ("temperature", "top_p"):
        value = _number(body, name)
        if value is not None:
            options[name] = value
    top_k = _integer(body, "top_k")
    if top_k is not None:
        options["top_k"] = top_k
    stops = _stops(body)
    if stops:
        options["stop"] = stops
    if options:
        out["options"] = options
    if _thinking_off(body):
        out["think"] = False
    return out


def _ollama_image(image: Image, n: int) -> str:
    if image.url:
        raise TranslationError(
            f"messages[{n}]: an image by URL cannot be sent to an Ollama worker (it takes base64 data only); "
            "send the image as base64"
        )
    return image.data


# -- the prompt as text ----------------------------------------------------------------------------------
def prompt_parts(body: JSON) -> list[str]:
    """The prompt's parts in the order a worker sees them (system, each tool, each message), each as one string:
    what prefix-aware routing hashes, and what a tokenizer counts."""
    prompt = read_prompt(body)
    parts = [prompt.system] if prompt.system else []
    parts.extend(orjson.dumps(tool["function"]).decode() for tool in prompt.tools)
    for message in openai_messages(prompt):
        if message["role"] == "system":
            continue
        content = message["content"]
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        calls = message.get("tool_calls")
        if calls:
            text += orjson.dumps([c["function"] for c in calls]).decode()
        parts.append(f"{message['role']}: {text}")
    return parts
