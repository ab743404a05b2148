import pytest

from turnout.core.patterns import PatternError, best_match, best_value, parse_pattern


@pytest.mark.parametrize(
    ("text", "model", "matches"),
    [
        ("qwen3:8b", "qwen3:8b", True),
        ("qwen3:8b", "qwen3:8b-q4", False),
        ("qwen3:8b", "qwen3", False),
        ("gemma4:*", "gemma4:2b", True),
        ("gemma4:*", "gemma4:latest", True),
        ("gemma4:*", "gemma4", True),  # a tagless name is gemma4:latest
        ("gemma4", "gemma4:latest", True),
        ("gemma4:latest", "gemma4", True),
        ("gemma4", "gemma4:2b", False),
        ("host:5000/m", "host:5000/m:latest", True),
        ("host:5000/m:*", "host:5000/m", True),
        ("gemma4:*", "gemma40:2b", False),
        ("orcarouter/*", "orcarouter/llama", True),
        ("orcarouter/*", "orcarouter", False),
        ("*", "anything", True),
        ("*", "", True),
        ("gemma*", "gemma4:2b", True),
        ("Qwen3:8b", "qwen3:8b", False),
    ],
)
def test_match(text: str, model: str, matches: bool) -> None:
    assert parse_pattern(text).matches(model) is matches


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("ge*ma", "last character"),
        ("*gemma", "last character"),
        ("**", "last character"),
        ("a*b*", "last character"),
        (" qwen3", "whitespace"),
        ("qwen3 ", "whitespace"),
    ],
)
def test_invalid(text: str, fragment: str) -> None:
    with pytest.raises(PatternError, match=fragment):
        parse_pattern(text)


@pytest.mark.parametrize(
    ("patterns", "model", "best"),
    [
        (["*", "gemma4:*", "gemma4:2b"], "gemma4:2b", "gemma4:2b"),
        (["*", "gemma4:*"], "gemma4:2b", "gemma4:*"),
        (["*", "gem*", "gemma4:*"], "gemma4:2b", "gemma4:*"),
        (["*"], "x", "*"),
        (["gemma4:*"], "qwen3:8b", None),
        # an exact name beats a longer prefix
        (["a", "a*"], "a", "a"),
    ],
)
def test_best_match(patterns: list[str], model: str, best: str | None) -> None:
    found = best_match(model, [parse_pattern(p) for p in patterns])
    assert (found.text if found else None) == best


def test_best_value() -> None:
    table = {parse_pattern("qwen3:*"): 8, parse_pattern("*"): 100, parse_pattern("qwen3:32b"): 1}
    assert best_value("qwen3:8b", table) == 8
    assert best_value("qwen3:32b", table) == 1
    assert best_value("llama", table) == 100
    assert best_value("llama", {}) is None
