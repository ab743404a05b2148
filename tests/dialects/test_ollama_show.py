"""What ``/api/show`` says a model on an OpenAI-style worker can do (:mod:`turnout.dialects.ollama.show`): what is
known, from llama.cpp's ``/props``, the worker's listing and an embedding it answered, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from turnout.dialects.ollama.show import capabilities, embeds

# llama.cpp's /props, as llama-server (xllamacpp 2026.10) answers it for SmolLM2: no tools in its template
PLAIN_PROPS = {
    "modalities": {"vision": False, "video": False, "audio": False},
    "chat_template_caps": {
        "supports_parallel_tool_calls": False,
        "supports_preserve_reasoning": False,
        "supports_reasoning_effort": False,
        "supports_system_role": True,
        "supports_tool_calls": False,
        "supports_tools": False,
    },
}


def props(**changes: Any) -> dict[str, Any]:
    out = {k: dict(v) for k, v in PLAIN_PROPS.items()}
    for key, value in changes.items():
        section, flag = key.split("__")
        out[section][flag] = value
    return out


@pytest.mark.parametrize(
    ("entry", "engine", "embedding", "said"),
    [
        ({}, None, False, ["completion"]),  # nothing known but that the gateway serves it
        ({}, None, True, ["completion", "embedding"]),
        ({}, PLAIN_PROPS, False, ["completion"]),
        ({}, props(chat_template_caps__supports_tools=True), False, ["completion", "tools"]),
        ({}, props(chat_template_caps__supports_tool_calls=True), False, ["completion"]),  # calls, not tools
        ({}, props(chat_template_caps__supports_preserve_reasoning=True), False, ["completion", "thinking"]),
        ({}, props(chat_template_caps__supports_reasoning_effort=True), False, ["completion", "thinking"]),
        ({}, props(chat_template_caps__supports_enable_thinking=True), False, ["completion", "thinking"]),
        ({}, props(modalities__vision=True), False, ["completion", "vision"]),
        (
            {},
            props(modalities__audio=True, modalities__vision=True),
            True,
            ["completion", "embedding", "vision", "audio"],
        ),
        ({"architecture": {"input_modalities": ["text", "image"]}}, None, False, ["completion", "vision"]),
        ({"architecture": {"input_modalities": ["text", "audio"]}}, None, False, ["completion", "audio"]),
        ({"architecture": {"input_modalities": "image"}}, None, False, ["completion"]),  # not a list: nothing said
        ({}, {"modalities": "vision", "chat_template_caps": ["supports_tools"]}, False, ["completion"]),
        ({}, props(modalities__vision="true"), False, ["completion"]),  # only true is true
    ],
)
def test_capabilities(entry: dict[str, Any], engine: dict[str, Any] | None, embedding: bool, said: list[str]) -> None:
    assert capabilities(entry, engine, embedding) == said


@pytest.mark.parametrize(
    ("answer", "embedding"),
    [
        ({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1, -2, 3e-5]}]}, True),
        ({"data": [{"embedding": []}]}, False),
        ({"data": [{"embedding": [0.1, "x"]}]}, False),
        ({"data": [{"embedding": [True]}]}, False),
        ({"data": []}, False),
        ({"error": {"message": "This server does not support embeddings. Start it with `--embeddings`"}}, False),
        (None, False),
        ([1, 2], False),
    ],
)
def test_embeds(answer: Any, embedding: bool) -> None:
    assert embeds(answer) is embedding
