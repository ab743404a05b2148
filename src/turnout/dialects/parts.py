"""The prompt's parts for prefix routing, as chat APIs share them (:meth:`~turnout.dialects.base.ClientAPI.
prompt_parts`): instructions first, then tools, then the conversation, each a string.

Used by the dialects whose requests carry chat messages (OpenAI chat, Ollama chat). The strings are hashed, never
sent: they only need to stay equal while the prompt stays equal and to differ from where it differs. Total: a
value of an unexpected type becomes its JSON text (or ``repr``), never an exception.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["chat_parts", "stable_text", "text_field"]

_INSTRUCTIONS = frozenset({"system", "developer"})
_SEP = "\x1f"  # between a message's role and its content: no text a client sends in a role contains it


def stable_text(value: object) -> str:
    """A string as it is; anything else as JSON with sorted keys (the same value gives the same text)."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)


def _message(message: object, extra: tuple[str, ...]) -> str:
    if not isinstance(message, dict):
        return stable_text(message)
    text = f"{stable_text(message.get('role'))}{_SEP}{stable_text(message.get('content', ''))}"
    for field in extra:  # what a template renders besides the content (tool calls, images, names)
        value = message.get(field)
        if value is not None:
            text += _SEP + stable_text(value)
    return text


def chat_parts(messages: object, tools: object, extra: tuple[str, ...]) -> list[str]:
    """The leading system/developer messages, then the tools' definitions, then the other messages in order;
    ``extra``: the message fields the API's templates render besides role and content."""
    if not isinstance(messages, list):
        messages = []
    lead = 0
    while lead < len(messages):
        message = messages[lead]
        role = message.get("role") if isinstance(message, dict) else None
        if not (isinstance(role, str) and role in _INSTRUCTIONS):
            break
        lead += 1
    parts = [_message(m, extra) for m in messages[:lead]]
    if tools:
        parts.append(stable_text(tools))
    parts.extend(_message(m, extra) for m in messages[lead:])
    return parts


def text_field(payload: dict[str, Any], name: str) -> str | None:
    """A non-empty string field, or None."""
    value = payload.get(name)
    return value if isinstance(value, str) and value else None
