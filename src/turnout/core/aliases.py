"""Model aliases: names clients ask for that stand for a model (``claude-sonnet-4-5`` -> ``qwen3-coder:30b``).

Coding agents ask for their vendor's model ids; an alias lets them run unchanged against the fleet. The rules,
each decided here and nowhere else:

* **One step.** An alias names a model, never another alias: a chain (``a -> b -> c``) or a cycle is refused
  when it is written (:func:`alias_problem`, :func:`table_problems`), so resolution is one look-up.
* **Before everything else.** A request's model is resolved (:meth:`AliasTable.resolve`) before scopes, limits,
  placement and routing: a key is checked against the model the alias stands for, as if it had asked for it.
* **Same model, same name rules.** Names compare through :func:`turnout.core.names.canonical`
  (``foo`` and ``foo:latest`` are one alias), are validated like model names, and are never patterns.
* **An alias wins over a model of the same name** (it shadows it): what a name means must not change when a
  worker installs or drops a model.
* **Runtime over config.** An alias set through the admin API replaces a config alias of the same name; removing
  it restores the config one (:meth:`AliasTable.merge`), as placement overrides do.
* **Endpoints' own URLs.** On ``/endpoints/<e>/...`` an alias applies when it leads to one of that endpoint's
  models: the alias named ``<e>/<name>`` first (the shared URL's name for ``<name>`` there), else an alias
  ``<name>`` outside that namespace (:meth:`AliasTable.resolve`); listings there show the same names
  (:meth:`AliasTable.names_on`).

Pure: used by the config loader, the store, the gateway (intake and listings), the admin API and the CLI.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from turnout.core.endpoint_urls import own_name, shared_name
from turnout.core.names import canonical, model_name_problem

__all__ = ["Alias", "AliasSource", "AliasTable", "Problem", "alias_problem", "table_problems"]


class AliasSource(StrEnum):
    CONFIG = "config"  # config.json's ``aliases``
    RUNTIME = "runtime"  # the store, written through the admin API or the CLI


@dataclass(frozen=True, slots=True)
class Alias:
    name: str  # as written
    target: str  # the model it stands for, a shared name (``<endpoint>/<model>`` for an endpoint's)
    source: AliasSource = AliasSource.RUNTIME


def _name_problem(value: object, field: str) -> str | None:
    problem = model_name_problem(value, field)
    if problem is None and isinstance(value, str) and "*" in value:
        problem = f'"{field}" must be one model name, not a pattern ("*")'
    return problem


class Problem(NamedTuple):
    field: str  # "name" or "model"
    message: str  # what is wrong and what to change


def alias_problem(name: object, target: object, current: Iterable[Alias] = ()) -> Problem | None:
    """Why ``name -> target`` cannot be added to (or replace the alias of that name in) ``current``; None when
    it can."""
    for value, field in ((name, "name"), (target, "model")):
        problem = _name_problem(value, field)
        if problem is not None:
            return Problem(field, problem)
    assert isinstance(name, str) and isinstance(target, str)
    key, goal = canonical(name), canonical(target)
    if key == goal:
        return Problem("model", f'alias "{name}" cannot stand for itself: name another model')
    for other in current:
        if canonical(other.name) == key:
            continue  # the alias being replaced
        if canonical(other.name) == goal:
            return Problem(
                "model",
                f'"{target}" is itself an alias (of "{other.target}"): aliases do not chain; '
                f'point "{name}" at "{other.target}" instead',
            )
        if canonical(other.target) == key:
            return Problem(
                "name",
                f'alias "{other.name}" stands for "{name}": aliases do not chain; point "{other.name}" at '
                f'"{target}" (or remove it) first',
            )
    return None


def table_problems(aliases: Mapping[str, str], field: str = "aliases") -> list[str]:
    """Every problem of a whole set of aliases (the config's ``aliases``): bad names, two spellings of one name,
    chains and cycles; each message starts with ``<field>.<name>:`` (``"<name>":`` when ``field`` is empty)."""

    def at(name: str) -> str:
        return f"{field}.{name}" if field else f'"{name}"'

    out: list[str] = []
    seen: dict[str, str] = {}
    for name, target in aliases.items():
        problem = _name_problem(name, "name") or _name_problem(target, "model")
        if problem is not None:
            out.append(f"{at(name)}: {problem}")
            continue
        key = canonical(name)
        if key in seen:
            out.append(f'{at(name)}: "{seen[key]}" and "{name}" are one name (a tagless name means ":latest")')
            continue
        seen[key] = name
        if key == canonical(target):
            out.append(f"{at(name)}: an alias cannot stand for itself")
    targets = {canonical(n): t for n, t in aliases.items() if isinstance(n, str)}
    for name, target in aliases.items():
        if isinstance(target, str) and canonical(target) in targets and canonical(target) != canonical(name):
            out.append(
                f'{at(name)}: "{target}" is itself an alias (of "{targets[canonical(target)]}"): aliases do not '
                f'chain; point "{name}" at "{targets[canonical(target)]}" instead'
            )
    return out


class AliasTable:
    """The aliases in force (immutable): the config's, with the runtime ones over them."""

    __slots__ = ("_by_key",)

    def __init__(self, aliases: Iterable[Alias] = ()) -> None:
        self._by_key: dict[str, Alias] = {canonical(a.name): a for a in aliases}

    @classmethod
    def merge(cls, config: Mapping[str, str], runtime: Mapping[str, str]) -> AliasTable:
        """The config's aliases with the runtime ones over them (a runtime alias replaces the config alias of
        the same name)."""
        merged = {canonical(n): Alias(n, t, AliasSource.CONFIG) for n, t in config.items()}
        merged.update({canonical(n): Alias(n, t, AliasSource.RUNTIME) for n, t in runtime.items()})
        return cls(merged.values())

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[Alias]:
        return iter(sorted(self._by_key.values(), key=lambda a: a.name))

    def get(self, name: str) -> Alias | None:
        """The alias called ``name`` (either spelling of a tagless name)."""
        return self._by_key.get(canonical(name))

    def resolve(self, name: str, endpoint: str | None = None) -> Alias | None:
        """The alias a request for ``name`` means, or None (the name is a model's). ``endpoint``: the request
        came to that endpoint's own URL; only an alias leading to one of its models applies there."""
        if not self._by_key:
            return None
        if endpoint is None:
            return self.get(name)
        alias = self.get(shared_name(endpoint, name))
        if alias is None:
            alias = self.get(name)
            if alias is not None and own_name(endpoint, alias.name) is not None:
                return None  # "<e>/<x>" is asked for as "<x>" there
        return alias if alias is not None and own_name(endpoint, alias.target) is not None else None

    def names_on(self, endpoint: str | None = None) -> list[tuple[str, Alias]]:
        """(the name a client uses, the alias) for every alias that works on the shared URL (``endpoint``
        None) or on an endpoint's own URL: each name resolves to its alias there (:meth:`resolve`)."""
        if endpoint is None:
            return [(a.name, a) for a in self]
        out: dict[str, Alias] = {}
        for alias in self:
            for shown in (own_name(endpoint, alias.name), alias.name):
                if shown is not None and self.resolve(shown, endpoint) is alias:
                    out.setdefault(shown, alias)
        return sorted(out.items())

    def problems(self) -> list[str]:
        """Chains in force: possible only when the config gained an alias over a runtime one's target (or the
        other way round) after both were written. Each such alias still resolves one step."""
        return table_problems({a.name: a.target for a in self}, "alias")
