"""Model aliases: one-step resolution, chains refused, runtime over config, endpoints' own URLs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.core.aliases import Alias, AliasSource, AliasTable, alias_problem, table_problems

CONFIG, RUNTIME = AliasSource.CONFIG, AliasSource.RUNTIME


SHARED = AliasTable(
    [
        Alias("claude-sonnet-4-5", "qwen3-coder:30b"),
        Alias("gpt-5-codex", "mac/qwen2.5:7b"),  # leads to an endpoint's model
        Alias("mac/claude", "mac/llama3.2"),  # named in the endpoint's namespace
        Alias("small", "gemma4"),
    ]
)


@pytest.mark.parametrize(
    ("asked", "endpoint", "expected"),
    [
        ("claude-sonnet-4-5", None, "qwen3-coder:30b"),
        ("claude-sonnet-4-5:latest", None, "qwen3-coder:30b"),  # the other spelling of a tagless name
        ("claude-sonnet-4-5:2", None, None),  # another tag is another name
        ("qwen3-coder:30b", None, None),  # a model's own name
        ("gpt-5-codex", None, "mac/qwen2.5:7b"),
        ("mac/claude", None, "mac/llama3.2"),
        ("small", None, "gemma4"),
        # on mac's own URL: only aliases that lead to mac's models
        ("claude", "mac", "mac/llama3.2"),  # "mac/claude" is the shared URL's name for "claude" there
        ("gpt-5-codex", "mac", "mac/qwen2.5:7b"),  # the alias itself leads to one of mac's models
        ("claude-sonnet-4-5", "mac", None),  # leads to the fleet: not on an endpoint's URL
        ("small", "mac", None),
        ("gpt-5-codex", "pc", None),  # leads to mac's model, not pc's
        ("mac/claude", "mac", None),  # asked for as "claude" there
        ("claude", None, None),
    ],
)
def test_resolve(asked: str, endpoint: str | None, expected: str | None) -> None:
    hit = SHARED.resolve(asked, endpoint)
    assert (None if hit is None else hit.target) == expected


def test_a_namespaced_alias_comes_first_on_an_endpoints_url() -> None:
    aliases = AliasTable([Alias("claude", "mac/a"), Alias("mac/claude", "mac/b")])
    assert aliases.resolve("claude", "mac").target == "mac/b"  # type: ignore[union-attr]
    assert aliases.resolve("claude").target == "mac/a"  # type: ignore[union-attr]
    assert aliases.names_on("mac") == [("claude", Alias("mac/claude", "mac/b"))]


@pytest.mark.parametrize(
    ("endpoint", "names"),
    [
        (None, ["claude-sonnet-4-5", "gpt-5-codex", "mac/claude", "small"]),
        ("mac", ["claude", "gpt-5-codex"]),
        ("pc", []),
    ],
)
def test_names_on(endpoint: str | None, names: list[str]) -> None:
    listed = SHARED.names_on(endpoint)
    assert [shown for shown, _ in listed] == names
    for shown, alias in listed:  # every name listed resolves to its alias there
        assert SHARED.resolve(shown, endpoint) is alias


def test_empty_table_is_false_and_resolves_nothing() -> None:
    assert not AliasTable()
    assert AliasTable().resolve("anything") is None
    assert AliasTable().resolve("anything", "mac") is None


@pytest.mark.parametrize(
    ("config", "runtime", "expected"),
    [
        ({"a": "m1"}, {}, {"a": ("m1", CONFIG)}),
        ({"a": "m1"}, {"a": "m2"}, {"a": ("m2", RUNTIME)}),  # runtime over config
        ({"a": "m1"}, {"a:latest": "m2"}, {"a:latest": ("m2", RUNTIME)}),  # one name, either spelling
        ({"a": "m1"}, {"b": "m2"}, {"a": ("m1", CONFIG), "b": ("m2", RUNTIME)}),
        ({}, {}, {}),
    ],
)
def test_merge(config: dict[str, str], runtime: dict[str, str], expected: dict[str, tuple[str, AliasSource]]) -> None:
    merged = AliasTable.merge(config, runtime)
    assert {a.name: (a.target, a.source) for a in merged} == expected


@pytest.mark.parametrize(
    ("name", "target", "current", "field", "fragment"),
    [
        ("claude", "qwen3:8b", {}, None, None),
        ("claude", "qwen3:8b", {"claude": "llama3"}, None, None),  # replacing an alias
        ("claude:latest", "qwen3:8b", {"claude": "llama3"}, None, None),  # the same alias, other spelling
        ("gpt", "mac/qwen", {"claude": "qwen3:8b"}, None, None),
        ("claude", "claude", {}, "model", "cannot stand for itself"),
        ("claude", "claude:latest", {}, "model", "cannot stand for itself"),
        ("a", "b", {"b": "c"}, "model", 'point "a" at "c" instead'),  # a -> b -> c
        ("a", "b:latest", {"b": "c"}, "model", "is itself an alias"),
        ("b", "c", {"a": "b"}, "name", 'alias "a" stands for "b"'),  # a -> b, then b -> c
        ("b", "a", {"a": "b"}, "model", "aliases do not chain"),  # a cycle
        ("a", "a2", {"a": "b", "b2": "a2"}, None, None),
        ("qwen*", "qwen3:8b", {}, "name", "not a pattern"),
        ("claude", "qwen*", {}, "model", "not a pattern"),
        ("", "qwen3:8b", {}, "name", '"name" is empty'),
        ("claude", "", {}, "model", '"model" is empty'),
        ("cla\nude", "m", {}, "name", "control character"),
        ("x" * 257, "m", {}, "name", "at most 256"),
        (None, "m", {}, "name", "must be a string"),
        ("claude", 7, {}, "model", "must be a string"),
    ],
)
def test_alias_problem(
    name: object, target: object, current: dict[str, str], field: str | None, fragment: str | None
) -> None:
    problem = alias_problem(name, target, [Alias(n, t) for n, t in current.items()])
    if fragment is None:
        assert problem is None
    else:
        assert problem is not None and problem.field == field and fragment in problem.message


@pytest.mark.parametrize(
    ("aliases", "fragments"),
    [
        ({"claude-sonnet-4-5": "qwen3-coder:30b", "gpt-5-codex": "qwen3-coder:30b"}, []),
        ({"a": "b", "b": "c"}, ['aliases.a: "b" is itself an alias']),
        ({"a": "b", "b": "a"}, ["aliases.a:", "aliases.b:"]),
        ({"a": "a:latest"}, ["cannot stand for itself"]),
        ({"a": "m", "a:latest": "n"}, ["are one name"]),
        ({"a*": "m"}, ["aliases.a*:", "not a pattern"]),
        ({"a": ""}, ['"model" is empty']),
    ],
)
def test_table_problems(aliases: dict[str, str], fragments: list[str]) -> None:
    problems = table_problems(aliases)
    if not fragments:
        assert problems == []
    for fragment in fragments:
        assert any(fragment in p for p in problems), problems


def test_problems_of_a_table_in_force() -> None:
    """A config alias added over a runtime alias's target after both were written: reported, still one step."""
    merged = AliasTable.merge({"b": "c"}, {"a": "b"})
    assert merged.problems() and "aliases do not chain" in merged.problems()[0]
    assert merged.resolve("a").target == "b"  # type: ignore[union-attr]


_NAMES = st.sampled_from(["a", "a:latest", "b", "c", "c:1", "mac/a", "mac/b", "mac/c", "pc/a", "d*", ""])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_NAMES, _NAMES), max_size=12))
def test_writes_checked_one_by_one_never_make_a_chain(writes: list[tuple[str, str]]) -> None:
    """Whatever order aliases are written in, those :func:`alias_problem` lets through never chain, and every name
    an endpoint's own URL lists resolves to its alias there."""
    stored: dict[str, str] = {}
    for name, target in writes:
        table = AliasTable(Alias(n, t) for n, t in stored.items())
        if alias_problem(name, target, table) is None:
            existing = table.get(name)
            stored.pop(existing.name if existing is not None else name, None)
            stored[name] = target
    table = AliasTable(Alias(n, t) for n, t in stored.items())
    assert table.problems() == []
    for alias in table:
        assert table.get(alias.target) is None  # one step: a model, never another alias
    for endpoint in (None, "mac", "pc"):
        for shown, alias in table.names_on(endpoint):
            assert table.resolve(shown, endpoint) is alias
