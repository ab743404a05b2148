"""What each dialect gives prefix routing: the prompt's parts in the worker's order, and the client's session."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.dialects import CLIENT_APIS
from turnout.dialects.base import Call, Dialect, Endpoint

SYSTEM = {"role": "system", "content": "You are terse."}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def call(dialect: Dialect, endpoint: Endpoint, payload: dict[str, Any]) -> Call:
    return Call(dialect, endpoint, "/", b"{}", payload, "m", False)  # the body is not read


def parts(dialect: Dialect, endpoint: Endpoint, payload: dict[str, Any]) -> list[str]:
    return CLIENT_APIS[dialect].prompt_parts(call(dialect, endpoint, payload))


@pytest.mark.parametrize("dialect", [Dialect.OPENAI, Dialect.OLLAMA])
def test_chat_parts_put_instructions_then_tools_then_the_conversation(dialect: Dialect) -> None:
    user = {"role": "user", "content": "2+2?"}
    got = parts(dialect, Endpoint.CHAT, {"messages": [SYSTEM, user], "tools": TOOLS})
    assert len(got) == 3
    assert "You are terse." in got[0] and "system" in got[0]
    assert '"name":"add"' in got[1]
    assert "2+2?" in got[2] and "user" in got[2]


@pytest.mark.parametrize("dialect", [Dialect.OPENAI, Dialect.OLLAMA])
def test_the_next_turn_extends_the_parts(dialect: Dialect) -> None:
    turn1 = [SYSTEM, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    first = parts(dialect, Endpoint.CHAT, {"messages": turn1, "tools": TOOLS})
    second = parts(dialect, Endpoint.CHAT, {"messages": turn2, "tools": TOOLS})
    assert second[: len(first)] == first and len(second) == len(first) + 2


@pytest.mark.parametrize(
    ("dialect", "change"),
    [
        (Dialect.OPENAI, {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {}}]}),
        (Dialect.OPENAI, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}),
        (Dialect.OPENAI, {"role": "tool", "content": "4", "tool_call_id": "call_9"}),
        (Dialect.OLLAMA, {"role": "user", "content": "look", "images": ["aGVsbG8="]}),
        (Dialect.OLLAMA, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add"}}]}),
    ],
)
def test_what_a_template_renders_besides_the_text_is_in_the_parts(dialect: Dialect, change: dict[str, Any]) -> None:
    plain = {key: value for key, value in change.items() if key in ("role",)} | {"content": ""}
    assert parts(dialect, Endpoint.CHAT, {"messages": [change]}) != parts(dialect, Endpoint.CHAT, {"messages": [plain]})


@pytest.mark.parametrize(
    ("dialect", "endpoint", "payload", "expected"),
    [
        (Dialect.OPENAI, Endpoint.COMPLETIONS, {"prompt": "Once upon"}, ["Once upon"]),
        (Dialect.OPENAI, Endpoint.COMPLETIONS, {}, []),
        (Dialect.OPENAI, Endpoint.EMBEDDINGS, {"input": "x"}, []),
        (Dialect.OLLAMA, Endpoint.GENERATE, {"system": "Be brief.", "prompt": "Why?"}, ["Be brief.", "Why?"]),
        (Dialect.OLLAMA, Endpoint.GENERATE, {"system": "Be brief.", "prompt": "Why?", "raw": True}, ["Why?"]),
        (Dialect.OLLAMA, Endpoint.GENERATE, {"prompt": "Why?"}, ["Why?"]),
        (Dialect.OLLAMA, Endpoint.EMBED, {"input": "x"}, []),
        (Dialect.OLLAMA, Endpoint.SHOW, {"model": "m"}, []),
    ],
)
def test_other_endpoints(dialect: Dialect, endpoint: Endpoint, payload: dict[str, Any], expected: list[str]) -> None:
    assert parts(dialect, endpoint, payload) == expected


@pytest.mark.parametrize(
    ("dialect", "payload", "headers", "expected"),
    [
        (Dialect.OPENAI, {"prompt_cache_key": "conv-1", "user": "alice"}, {}, "conv-1"),
        (Dialect.OPENAI, {"user": "alice"}, {}, "alice"),
        (Dialect.OPENAI, {"user": ""}, {}, None),
        (Dialect.OPENAI, {"user": 7}, {}, None),
        (Dialect.OPENAI, {}, {"X-Session-Id": "s"}, None),  # the operator's header is the gateway's to read
        (Dialect.OLLAMA, {"user": "alice"}, {}, None),  # Ollama's API names no session
    ],
)
def test_session_key(dialect: Dialect, payload: dict[str, Any], headers: dict[str, str], expected: str | None) -> None:
    assert CLIENT_APIS[dialect].session_key(call(dialect, Endpoint.CHAT, payload), headers) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)


# message-shaped objects whose fields hold anything (a role that is a list, content that is a number...)
messages = st.dictionaries(
    st.sampled_from(["role", "content", "tool_calls", "name", "images", "tool_name", "tool_call_id", "type"]),
    json_values,
    max_size=4,
)
fields = st.sampled_from(
    ["messages", "tools", "prompt", "system", "raw", "user", "input", "instructions", "metadata", "prompt_cache_key"]
)


@given(st.dictionaries(fields, json_values | st.lists(messages, max_size=3) | messages))
@settings(max_examples=500, deadline=None)
def test_parts_and_sessions_never_raise(payload: dict[str, Any]) -> None:
    for dialect, client in CLIENT_APIS.items():
        for endpoint in Endpoint:
            made = call(dialect, endpoint, payload)
            assert all(isinstance(part, str) for part in client.prompt_parts(made))
            key = client.session_key(made, {})
            assert key is None or isinstance(key, str)
