"""A Responses API request as a Chat Completions request (pure).

What a Responses client sends, and what a chat worker gets:

* ``instructions`` (a string, or input items) and the leading ``system``/``developer`` messages become one
  ``system`` message, so the prompt's head stays the same from turn to turn (Codex sends its instructions as
  ``developer`` messages); a later ``developer`` message is a ``system`` message in its place.
* ``input`` (a string, or a list of items): ``message`` items (``type`` may be missing, as the Agents SDK sends
  them) with ``input_text`` / ``output_text`` / ``refusal`` parts (text) and ``input_image`` parts (``image_url``
  parts); ``function_call`` and ``custom_tool_call`` items become the assistant's ``tool_calls`` (arguments a JSON
  string), ``function_call_output`` and ``custom_tool_call_output`` ``tool`` messages with the same call id;
  ``tool_search_call`` / ``tool_search_output`` the call of a ``tool_search`` function and its answer, and the tools
  it found join the worker's tools. ``reasoning`` items (Codex sends them back with ``content: null`` and
  ``encrypted_content``), ``item_reference`` and item kinds a chat worker has no form for are dropped.
* ``tools``: ``function`` tools as they are; the functions of a ``namespace`` tool flattened as
  ``<namespace>__<name>`` (:data:`NAMESPACE_SEP`); a ``custom`` (freeform) tool as a function of one string
  argument ``input`` whose description carries the format (a lark grammar, say); a client-run ``tool_search`` as a
  function. The answer turns each back (:class:`ToolNames`). Hosted tools (``web_search``, ``file_search``,
  ``code_interpreter``, ``image_generation``, ``mcp``...) cannot run on a self-hosted worker: they are dropped and
  named (:func:`dropped_tools`), never an error.
* ``tool_choice`` (``auto``, ``none``, ``required``, a function, a custom tool, ``allowed_tools``),
  ``parallel_tool_calls``, ``max_output_tokens`` (``max_tokens``), ``temperature``, ``top_p``, ``user``,
  ``reasoning.effort`` (``reasoning_effort``), ``text.format`` (``json_schema`` and ``json_object`` as
  ``response_format``) carry over; ``stream`` asks for usage in the stream. Everything else (``store``,
  ``include``, ``metadata``, ``prompt_cache_key``, ``client_metadata``, ``text.verbosity``, ``truncation``...)
  is the gateway's or means nothing to a chat worker, and is not sent.

A request that cannot be expressed raises :class:`~turnout.dialects.base.TranslationError` naming the field (a 400).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from turnout.dialects.base import JSON, TranslationError

__all__ = [
    "HOSTED_TOOL_NOTE",
    "NAMESPACE_SEP",
    "ToolNames",
    "dropped_tools",
    "input_items",
    "stored_item",
    "to_chat",
    "tool_names",
]

NAMESPACE_SEP = "__"  # a namespace's function "ns" / "fn" is the worker's function "ns__fn"
TOOL_SEARCH = "tool_search"
HOSTED_TOOL_NOTE = "X-Turnout-Dropped-Tools"  # the answer's header naming the hosted tools that were dropped
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
_CONVERTED_TOOLS = frozenset({"function", "namespace", "custom", TOOL_SEARCH})
_CALL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output", "tool_search_output"})
_ROLES = frozenset({"user", "assistant", "system", "developer"})


@dataclass(frozen=True, slots=True)
class WorkerTool:
    """What a worker's function stands for in the client's terms."""

    kind: str  # "function", "custom" or "tool_search"
    name: str  # the client's name
    namespace: str | None = None


@dataclass(slots=True)
class ToolNames:
    """The worker's function names, each with the client's tool it stands for (restored in the answer)."""

    by_worker: dict[str, WorkerTool] = field(default_factory=dict)

    def add(self, worker_name: str, tool: WorkerTool) -> None:
        self.by_worker.setdefault(worker_name, tool)

    def client(self, worker_name: str) -> WorkerTool:
        """The client's tool for a function the worker called; a name it does not know is a plain function (a
        namespace's function called by its bare name is found too)."""
        known = self.by_worker.get(worker_name)
        if known is not None:
            return known
        bare = [t for t in self.by_worker.values() if t.name == worker_name and t.namespace is not None]
        if len(bare) == 1:
            return bare[0]
        return WorkerTool("function", worker_name)


def worker_name(name: str, namespace: str | None) -> str:
    return name if not namespace else f"{namespace}{NAMESPACE_SEP}{name}"


# -- input items ----------------------------------------------------------------------------------
def input_items(payload: JSON) -> list[JSON]:
    """The request's ``input`` as a list of items (a string is one user message). Raises on a wrong type."""
    value = payload.get("input")
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    if not isinstance(value, list):
        raise TranslationError("input must be a string or a list of input items")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise TranslationError(f"input[{index}] must be an object (an input item)")
    return value


def stored_item(item: JSON, response_id: str, index: int) -> JSON:
    """An input item as the API lists it (``GET /v1/responses/{id}/input_items``): with its ``type`` and an
    ``id`` (made from the response's id and the item's place when the client gave none), a message's text as
    content parts."""
    out = dict(item)
    if "type" not in out and "role" in out:
        out["type"] = "message"
    if out.get("type") == "message" and isinstance(out.get("content"), str):
        kind = "output_text" if out.get("role") == "assistant" else "input_text"
        out["content"] = [{"type": kind, "text": out["content"]}]
    if not isinstance(out.get("id"), str) or not out["id"]:
        prefix = "msg" if out.get("type") == "message" else "item"
        out["id"] = f"{prefix}_{response_id.removeprefix('resp_')}_in{index}"
    return out


def dropped_tools(payload: JSON) -> list[str]:
    """The types of the request's tools that a chat worker cannot run (hosted tools), each once, in order."""
    tools = payload.get("tools")
    if not isinstance(tools, list):
        return []
    out: list[str] = []
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind not in _CONVERTED_TOOLS and kind not in out:
            out.append(kind)
    return out


def tool_names(payload: JSON) -> ToolNames:
    """How the worker's function names map back to the request's tools (what :func:`to_chat` also gives), without
    translating the messages."""
    names = ToolNames()
    try:
        _tools(payload.get("tools"), names)
        found: list[JSON] = []
        for item in input_items(payload):
            if item.get("type") in ("tool_search_output", "additional_tools") and isinstance(item.get("tools"), list):
                found.extend(t for t in item["tools"] if isinstance(t, dict))
        _tools(found, names)
    except TranslationError:
        pass  # the request was translated before this is asked: a bad tool there would have been refused
    return names


# -- the request ----------------------------------------------------------------------------------
def to_chat(payload: JSON, model: str, *, stream: bool) -> tuple[JSON, ToolNames]:
    """The chat/completions request for a Responses request, and how the worker's tool names map back."""
    names = ToolNames()
    tools = _tools(payload.get("tools"), names)
    system, messages, found = _messages(payload, names)
    for tool in found:  # tools a client-run tool_search found, now available
        tools.extend(_tools([tool], names))
    if system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system)})
    out: JSON = {"model": model, "messages": messages}
    if tools:
        tools = _unique(tools)
        choice = _tool_choice(payload.get("tool_choice"), names)
        if isinstance(choice, tuple):
            allowed, choice = choice
            tools = [t for t in tools if t["function"]["name"] in allowed] or tools
        out["tools"] = tools
        if choice is not None:
            out["tool_choice"] = choice
        parallel = payload.get("parallel_tool_calls")
        if isinstance(parallel, bool):
            out["parallel_tool_calls"] = parallel
    _sampling(payload, out)
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out, names


def _sampling(payload: JSON, out: JSON) -> None:
    limit = payload.get("max_output_tokens")
    if limit is not None:
        if not _is_int(limit) or limit < 1:
            raise TranslationError("max_output_tokens must be a positive integer")
        out["max_tokens"] = limit
    for name in ("temperature", "top_p"):
        value = payload.get(name)
        if value is not None:
            if not _is_number(value):
                raise TranslationError(f"{name} must be a number")
            out[name] = value
    user = payload.get("user")
    if isinstance(user, str) and user:
        out["user"] = user
    reasoning = payload.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if isinstance(effort, str) and effort in ("minimal", "low", "medium", "high"):
        out["reasoning_effort"] = effort
    text = payload.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict):
        kind = fmt.get("type")
        if kind == "json_object":
            out["response_format"] = {"type": "json_object"}
        elif kind == "json_schema":
            schema = fmt.get("schema")
            if not isinstance(schema, dict):
                raise TranslationError("text.format.schema must be a JSON schema object")
            spec: JSON = {"name": fmt.get("name") if isinstance(fmt.get("name"), str) else "response", "schema": schema}
            if isinstance(fmt.get("strict"), bool):
                spec["strict"] = fmt["strict"]
            out["response_format"] = {"type": "json_schema", "json_schema": spec}


# -- tools ----------------------------------------------------------------------------------------
def _tools(value: object, names: ToolNames) -> list[JSON]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TranslationError("tools must be a list")
    out: list[JSON] = []
    for index, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise TranslationError(f"tools[{index}] must be an object")
        kind = tool.get("type")
        if kind == "namespace":
            space = tool.get("name")
            if not isinstance(space, str) or not space:
                raise TranslationError(f"tools[{index}].name: a namespace tool needs a name")
            inner = tool.get("tools")
            for n, sub in enumerate(inner if isinstance(inner, list) else []):
                if isinstance(sub, dict):
                    converted = _tool(sub, names, f"tools[{index}].tools[{n}]", space)
                    if converted is not None:
                        out.append(converted)
        else:
            converted = _tool(tool, names, f"tools[{index}]", None)
            if converted is not None:
                out.append(converted)
    return out


def _tool(tool: JSON, names: ToolNames, where: str, namespace: str | None) -> JSON | None:
    kind = tool.get("type")
    if kind == TOOL_SEARCH:
        names.add(TOOL_SEARCH, WorkerTool(TOOL_SEARCH, TOOL_SEARCH))
        params = tool.get("parameters")
        function: JSON = {"name": TOOL_SEARCH, "parameters": params if isinstance(params, dict) else _NO_PARAMS}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        return {"type": "function", "function": function}
    if kind not in ("function", "custom"):
        return None  # a hosted tool: dropped (dropped_tools names it)
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise TranslationError(f"{where}.name: a {kind} tool needs a name")
    flat = worker_name(name, namespace)
    names.add(flat, WorkerTool(kind, name, namespace))
    given = tool.get("description")
    description = given if isinstance(given, str) else ""
    if kind == "custom":
        function = {
            "name": flat,
            "description": _custom_description(description, tool.get("format")),
            "parameters": {
                "type": "object",
                "properties": {"input": {"type": "string", "description": "the tool's whole input, as free text"}},
                "required": ["input"],
            },
        }
        return {"type": "function", "function": function}
    params = tool.get("parameters")
    function = {"name": flat, "parameters": params if isinstance(params, dict) else _NO_PARAMS}
    if description:
        function["description"] = description
    if isinstance(tool.get("strict"), bool):
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


_NO_PARAMS: JSON = {"type": "object", "properties": {}}


def _custom_description(description: str, fmt: object) -> str:
    """A freeform tool's description for a worker that only calls functions: its input goes in ``input``."""
    text = description or "A tool that takes free text."
    text += "\nPut the tool's whole input, as it is, in the string argument `input`."
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        syntax = fmt.get("syntax") if isinstance(fmt.get("syntax"), str) else "grammar"
        text += f"\nThe input must match this {syntax} grammar:\n{fmt['definition']}"
    return text


def _unique(tools: list[JSON]) -> list[JSON]:
    seen: set[str] = set()
    out = []
    for tool in tools:
        name = tool["function"]["name"]
        if name not in seen:
            seen.add(name)
            out.append(tool)
    return out


def _tool_choice(value: object, names: ToolNames) -> object:
    """The worker's tool_choice; a (names, choice) pair for ``allowed_tools``; None: not sent."""
    if value is None:
        return None
    if isinstance(value, str):
        return value if value in ("auto", "none", "required") else None
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind in ("function", "custom") and isinstance(value.get("name"), str):
        space = value.get("namespace") if isinstance(value.get("namespace"), str) else None
        return {"type": "function", "function": {"name": _known(value["name"], space, names)}}
    if kind == TOOL_SEARCH:
        return {"type": "function", "function": {"name": TOOL_SEARCH}}
    if kind == "allowed_tools":
        mode = value.get("mode") if value.get("mode") in ("auto", "required") else "auto"
        allowed = value.get("tools")
        chosen = set()
        for tool in allowed if isinstance(allowed, list) else []:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                space = tool.get("namespace") if isinstance(tool.get("namespace"), str) else None
                chosen.add(_known(tool["name"], space, names))
            elif isinstance(tool, dict) and tool.get("type") == TOOL_SEARCH:
                chosen.add(TOOL_SEARCH)
        return chosen, mode
    return "auto"  # a hosted tool's choice: that tool was dropped, the model chooses among the others


def _known(name: str, namespace: str | None, names: ToolNames) -> str:
    flat = worker_name(name, namespace)
    if flat in names.by_worker or namespace is not None:
        return flat
    spaced = [w for w, t in names.by_worker.items() if t.name == name and t.namespace is not None]
    return spaced[0] if len(spaced) == 1 else name


# -- messages -------------------------------------------------------------------------------------
def _messages(payload: JSON, names: ToolNames) -> tuple[list[str], list[JSON], list[JSON]]:
    """(the system text's parts, the other messages, tools a tool_search found)."""
    system: list[str] = []
    instructions = payload.get("instructions")
    items = input_items(payload)
    if isinstance(instructions, str):
        if instructions:
            system.append(instructions)
    elif isinstance(instructions, list):
        items = [i for i in instructions if isinstance(i, dict)] + items
    elif instructions is not None:
        raise TranslationError("instructions must be a string or a list of input items")
    messages: list[JSON] = []
    found: list[JSON] = []
    leading = True  # system and developer messages before any other become the one system message
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message" or (kind is None and "role" in item):
            role, content = _message(item, index)
            if role in ("system", "developer"):
                if leading:
                    text = _text_only(content)
                    if text:
                        system.append(text)
                    continue
                role = "system"
            leading = False
            if role == "assistant":
                last = _assistant(messages)
                text = _text_only(content)
                last["content"] = text if not last.get("content") else f"{last['content']}\n\n{text}"
                continue
            messages.append({"role": role, "content": content})
            continue
        leading = False
        if kind in ("function_call", "custom_tool_call", "tool_search_call"):
            _assistant(messages).setdefault("tool_calls", []).append(_call(item, index, kind))
        elif kind in _CALL_OUTPUTS:
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                if kind != "tool_search_output":
                    raise TranslationError(f"input[{index}].call_id: a {kind} item needs the call_id it answers")
                call_id = f"call_{index}"
            if kind == "tool_search_output":
                tools = item.get("tools")
                listed = [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
                found.extend(listed)
                output: str = json.dumps([_summary(t) for t in listed])
            else:
                output = _output_text(item.get("output"), index)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "additional_tools":
            tools = item.get("tools")
            if isinstance(tools, list):
                found.extend(t for t in tools if isinstance(t, dict))
        # reasoning, item_reference, compaction and the hosted tools' items: nothing a chat worker can take
    return system, messages, found


def _message(item: JSON, index: int) -> tuple[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise TranslationError(f"input[{index}].role must be one of user, assistant, system, developer")
    content = item.get("content")
    if isinstance(content, str):
        return role, content
    if content is None:
        return role, ""
    if not isinstance(content, list):
        raise TranslationError(f"input[{index}].content must be a string or a list of content parts")
    texts: list[str] = []
    parts: list[JSON] = []
    images = False
    for n, part in enumerate(content):
        if not isinstance(part, dict):
            raise TranslationError(f"input[{index}].content[{n}] must be an object")
        kind = part.get("type")
        if kind in _TEXT_PARTS or kind == "refusal":
            text = part.get("text") if kind != "refusal" else part.get("refusal")
            if isinstance(text, str):
                texts.append(text)
                parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if isinstance(url, str) and url:
                image: JSON = {"url": url}
                if part.get("detail") in ("low", "high", "auto"):
                    image["detail"] = part["detail"]
                parts.append({"type": "image_url", "image_url": image})
                images = True
        # input_file, input_audio and others: no form a chat worker takes here
    if images and role == "user":
        return role, parts
    return role, "\n".join(texts)


def _text_only(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p.get("type") == "text")


def _assistant(messages: list[JSON]) -> JSON:
    """The assistant message at the end of ``messages`` (one is added when the last message is another's). Its
    content is a string even with only tool calls: llama-cpp-python's server refuses null (422)."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _call(item: JSON, index: int, kind: str) -> JSON:
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        if kind != "tool_search_call":
            raise TranslationError(f"input[{index}].call_id: a {kind} item needs a call_id")
        call_id = f"call_{index}"
    if kind == "tool_search_call":
        arguments = item.get("arguments")
        return _function_call(call_id, TOOL_SEARCH, arguments if isinstance(arguments, str) else _json(arguments))
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise TranslationError(f"input[{index}].name: a {kind} item needs the name of the tool it calls")
    namespace = item.get("namespace") if isinstance(item.get("namespace"), str) else None
    if kind == "custom_tool_call":
        given = item.get("input")
        return _function_call(
            call_id, worker_name(name, namespace), _json({"input": given if isinstance(given, str) else ""})
        )
    arguments = item.get("arguments")
    if not isinstance(arguments, str):  # a JSON string in OpenAI's API; an object is taken and written as one
        arguments = _json(arguments if arguments is not None else {})
    return _function_call(call_id, worker_name(name, namespace), arguments)


def _function_call(call_id: str, name: str, arguments: str) -> JSON:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output_text(output: object, index: int) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        texts = []
        for part in output:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "\n".join(texts)
    if output is None:
        return ""
    return _json(output)


def _summary(tool: JSON) -> JSON:
    return {k: tool[k] for k in ("type", "name", "description") if k in tool}


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
