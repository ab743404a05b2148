"""What a translation reads of a worker's answer: the message, or refusal of an answer that carries none (pure).

Every translation onto a worker (an Ollama, Anthropic or Responses client on an OpenAI-style worker's
``/v1/chat/completions`` or ``/v1/completions``, an Anthropic client on an Ollama worker's ``/api/chat``) reads the
worker's message through these functions, so that an answer whose message cannot be read is a
:class:`ResponseShapeError` (the proxy's 502, or the stream's error frame once the client's stream has started)
and never an empty success. What is refused:

* a whole chat answer whose first choice has no ``message`` object: ``message`` a string or missing, or the
  shape of a stream chunk (``delta``) sent as a whole answer; a message with none of the fields an answer
  message has (``content``, ``tool_calls``, ``function_call``, ``refusal``, reasoning);
* a stream chunk whose choice has no ``delta`` object (a choice with only its ``finish_reason``, as some servers
  end a stream, is read as that finish), or has a whole answer's ``message`` instead;
* ``choices`` that is not a list; a choice that is not an object;
* text that is not text: ``content`` of another type than a string, null or a list of text parts (OpenAI's
  ``[{"type": "text", "text": ...}]``, which some servers answer with: joined); a completion's ``text`` that is
  not a string;
* an Ollama chat answer, or a chunk of its stream before the last, without a ``message`` object.

An answer that is well formed and empty (a model that stopped at once) is an answer: only the shape is judged.
OpenAI's shapes: ``ChatCompletion`` and ``ChatCompletionChunk`` of the OpenAI API reference (openai-python
``types/chat/chat_completion.py``, ``chat_completion_chunk.py``); Ollama's: ``api.ChatResponse`` (ollama
``api/types.go``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ResponseShapeError",
    "answer_message",
    "check_chunks",
    "chunk_choices",
    "chunk_delta",
    "chunk_text",
    "completion_text",
    "first_choice",
    "ollama_message",
]

JSON = dict[str, Any]

# The fields of an answer's message besides its role: one at least must be there for the message to say anything.
_MESSAGE_FIELDS = ("content", "tool_calls", "function_call", "refusal", "reasoning_content", "reasoning")


class ResponseShapeError(ValueError):
    """A worker's answer does not have the shape its dialect promises (the proxy answers 502)."""


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def first_choice(answer: JSON) -> JSON:
    """The first choice of a whole ``/v1/chat/completions`` or ``/v1/completions`` answer."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ResponseShapeError("the answer has no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ResponseShapeError(f"the answer's choices[0] is {_kind(choice)}, not an object")
    return choice


def answer_message(choice: JSON) -> JSON:
    """The message of a whole chat answer's choice, its ``content`` as a string ("" for null) and ``refusal``
    (OpenAI's own API: the text of a refusal, with ``content`` null) as its text when it has no other."""
    if "message" not in choice and isinstance(choice.get("delta"), dict):
        raise ResponseShapeError("choices[0] has a delta and no message: a stream chunk, not a whole answer")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ResponseShapeError(f"choices[0].message is {_kind(message)}, not a message object")
    if not any(name in message for name in _MESSAGE_FIELDS):
        raise ResponseShapeError("choices[0].message has no content, tool calls or reasoning")
    text = _content(message.get("content"), "choices[0].message.content")
    if not text and isinstance(message.get("refusal"), str):
        text = message["refusal"]
    return {**message, "content": text}


def completion_text(choice: JSON) -> str:
    """The text of a whole ``/v1/completions`` answer's choice."""
    text = choice.get("text")
    if not isinstance(text, str):
        raise ResponseShapeError(f"choices[0].text is {_kind(text)}, not text")
    return text


def chunk_choices(event: JSON) -> list[JSON]:
    """The choices of one stream chunk (none: a chunk with only usage, or nothing, to say)."""
    choices = event.get("choices")
    if choices is None:
        return []
    if not isinstance(choices, list):
        raise ResponseShapeError(f"a stream chunk's choices is {_kind(choices)}, not a list")
    for choice in choices:
        if not isinstance(choice, dict):
            raise ResponseShapeError(f"a stream chunk's choice is {_kind(choice)}, not an object")
    return choices


def check_chunks(events: list[JSON], *, completions: bool = False, ollama: bool = False) -> None:
    """Raise for the first of a batch of stream events whose message cannot be read, before a translator turns
    any of them into the client's frames: the client's stream then ends with the error frame right after what it
    was sent, nothing of the batch half-said (a Responses stream's event numbers stay in order)."""
    field = "text" if completions else "delta"
    for event in events:
        if ollama:
            message = event.get("message")
            if type(message) is not dict or type(message.get("content", "")) is not str:
                ollama_message(event, chunk=True)  # says what is wrong, unless a last object without one
            continue
        choices = event.get("choices")
        if type(choices) is list and len(choices) == 1:  # the usual chunk, one choice: decided at once
            choice = choices[0]
            read = choice.get(field) if type(choice) is dict else None
            if completions and type(read) is str:
                continue
            if type(read) is dict:
                content = read.get("content")
                if content is None or type(content) is str:
                    continue
        for choice in chunk_choices(event):
            if completions:
                chunk_text(choice)
            else:
                chunk_delta(choice)


def _finish_only(choice: JSON) -> bool:
    return choice.get("finish_reason") not in (None, "") and "message" not in choice and "text" not in choice


def chunk_delta(choice: JSON) -> JSON | None:
    """The ``delta`` of a chat stream chunk's choice, its ``content`` a string or None; None for a choice that
    only says the model finished."""
    delta = choice.get("delta")
    if delta is None and _finish_only(choice):
        return None
    if not isinstance(delta, dict):
        if "message" in choice:
            raise ResponseShapeError("a stream chunk's choice has a message and no delta: a whole answer's shape")
        raise ResponseShapeError(f"a stream chunk's choice has a delta that is {_kind(delta)}, not an object")
    content = delta.get("content")
    if content is not None and not isinstance(content, str):
        return {**delta, "content": _content(content, "a stream chunk's delta.content") or None}
    return delta


def chunk_text(choice: JSON) -> str:
    """The ``text`` of a ``/v1/completions`` stream chunk's choice ("" for one that only finishes)."""
    text = choice.get("text")
    if text is None and _finish_only(choice):
        return ""
    if not isinstance(text, str):
        raise ResponseShapeError(f"a completion stream chunk's text is {_kind(text)}, not text")
    return text


def ollama_message(answer: JSON, *, chunk: bool = False) -> JSON | None:
    """The ``message`` of an Ollama ``/api/chat`` answer (``chunk``: an object of its stream; the last one, with
    ``done: true``, may have none: None then), its ``content`` a string."""
    message = answer.get("message")
    if message is None and chunk and answer.get("done") is True:
        return None
    if not isinstance(message, dict):
        where = "an Ollama stream object" if chunk else "the Ollama answer"
        raise ResponseShapeError(f"{where} has a message that is {_kind(message)}, not a message object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise ResponseShapeError(f"an Ollama message's content is {_kind(content)}, not text")
    return message


def _content(value: object, where: str) -> str:
    """Message content as text: a string, null (""), or a list of text parts (joined)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in value
    ):
        return "".join(part["text"] for part in value)
    raise ResponseShapeError(f"{where} is {_kind(value)}, not text")
