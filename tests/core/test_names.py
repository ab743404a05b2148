"""Model names: one rule for which spellings are the same model, and which names are acceptable."""

from __future__ import annotations

import pytest

from turnout.core.names import MAX_MODEL_NAME, canonical, lookup, model_name_problem


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gemma4", "gemma4:latest"),
        ("gemma4:latest", "gemma4:latest"),
        ("gemma4:2b", "gemma4:2b"),
        ("org/gemma4", "org/gemma4:latest"),
        ("host:5000/gemma4", "host:5000/gemma4:latest"),
        ("host:5000/gemma4:q4", "host:5000/gemma4:q4"),
    ],
)
def test_canonical(name: str, expected: str) -> None:
    assert canonical(name) == expected


@pytest.mark.parametrize(
    ("model", "names", "expected"),
    [
        ("gemma4", {"gemma4:latest"}, "gemma4:latest"),
        ("gemma4:latest", {"gemma4"}, "gemma4"),
        ("gemma4", {"gemma4", "gemma4:latest"}, "gemma4"),  # the same spelling first
        ("gemma4:2b", {"gemma4:latest"}, None),
        ("gemma4:latest", {"gemma4:2b"}, None),
        ("org/m:latest", {"org/m"}, "org/m"),
        ("gemma4", None, None),
    ],
)
def test_lookup(model: str, names: set[str] | None, expected: str | None) -> None:
    assert lookup(model, None if names is None else frozenset(names)) == expected


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("llama\r\nX-Injected: 1", "U+000D"),
        ("llama\n", "U+000A"),
        ("llama\x00", "U+0000"),
        ("llama\x7f", "U+007F"),
        ("llama\u2028", "U+2028"),
        ("x" * (MAX_MODEL_NAME + 1), "at most 256"),
        ("   ", "empty"),
        (5, "must be a string"),
        (None, "must be a string"),
    ],
)
def test_bad_names(name: object, fragment: str) -> None:
    problem = model_name_problem(name)
    assert problem is not None and fragment in problem


@pytest.mark.parametrize("name", ["llama3.2", "qwen3:8b", "hf.co/org/repo:Q4_K_M", "x" * MAX_MODEL_NAME, "modèle"])
def test_good_names(name: str) -> None:
    assert model_name_problem(name) is None


def test_exactly_the_control_characters_are_refused() -> None:
    """Every code point: refused when it is a C0/C1 control, DEL or a line/paragraph separator, accepted
    otherwise (non-printable but harmless ones too, such as a no-break space or a zero-width joiner)."""
    for code in range(0x110000):
        ch = chr(code)
        control = code < 0x20 or 0x7F <= code <= 0x9F or code in (0x2028, 0x2029)
        problem = model_name_problem(f"m{ch}x")
        assert (problem is not None) is control, hex(code)
        if control:
            assert f"U+{code:04X}" in str(problem)
