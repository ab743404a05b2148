"""Golden-file tests for Ollama <-> OpenAI translation.

Each file in golden/ holds a case: the function, its input and the expected output. To refresh after
an intended change: TURNOUT_UPDATE_GOLDEN=1 pytest tests/core/test_translate.py, then review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from turnout.dialects.ollama import translate

GOLDEN = Path(__file__).parent / "golden"
TIMING = translate.Timing(created_at="2026-12-03T10:00:00Z", total_ns=2_000_000_000, first_token_ns=500_000_000)


def run_case(case: dict[str, Any]) -> Any:
    kind, data = case["kind"], case["input"]
    if kind == "chat_request":
        return translate.chat_to_openai(data, data["model"], stream=data.get("stream", True))
    if kind == "generate_request":
        path, body = translate.generate_to_openai(data, data["model"], stream=data.get("stream", True))
        return {"path": path, "body": body}
    if kind == "embed_request":
        return translate.embed_to_openai(data, data["model"], legacy="prompt" in data)
    if kind == "chat_response":
        generate, completions = case.get("generate", False), case.get("completions", False)  # a raw generate's
        return translate.chat_from_openai(data, "m", TIMING, generate=generate, completions=completions)
    if kind == "embed_response":
        return translate.embed_from_openai(data, "m", TIMING, legacy=case.get("legacy", False))
    if kind == "stream":
        generate, completions = case.get("generate", False), case.get("completions", False)
        t = translate.ChatStreamTranslator(model="m", generate=generate, completions=completions)
        out = [obj for event in data for obj in t.feed(event, TIMING.created_at)]
        return out + t.finish(TIMING)
    if kind == "error":
        return translate.ollama_error_from_openai(data["body"].encode(), data["status"])
    raise AssertionError(f"unknown kind {kind}")


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("*.json")), ids=lambda p: p.stem)
def test_golden(path: Path) -> None:
    case = json.loads(path.read_text())
    actual = run_case(case)
    if os.environ.get("TURNOUT_UPDATE_GOLDEN"):
        case["expected"] = actual
        path.write_text(json.dumps(case, indent=2) + "\n")
    assert actual == case["expected"]


def test_there_are_golden_cases() -> None:
    assert len(list(GOLDEN.glob("*.json"))) >= 10


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: translate.chat_to_openai({"messages": {}}, "m", stream=False), "messages must be a list"),
        (lambda: translate.chat_to_openai({"messages": [{"content": "x"}]}, "m", stream=False), "with a role"),
        (
            lambda: translate.chat_to_openai({"messages": [{"role": "user", "content": 3}]}, "m", stream=False),
            "content must be a string",
        ),
        (lambda: translate.chat_to_openai({"messages": [], "format": "yaml"}, "m", stream=False), "format must be"),
        (lambda: translate.chat_to_openai({"messages": [], "options": []}, "m", stream=False), "options must be"),
        (lambda: translate.generate_to_openai({"prompt": 1}, "m", stream=False), "prompt must be a string"),
        (lambda: translate.embed_to_openai({"input": []}, "m", legacy=False), "non-empty list"),
        (lambda: translate.embed_to_openai({"prompt": None}, "m", legacy=True), "prompt must be a string"),
    ],
)
def test_translation_errors(call: Any, fragment: str) -> None:
    with pytest.raises(translate.TranslationError, match=fragment):
        call()
