"""The docs against the code: every error code in its table, every CLI flag documented, the README's config
error example exactly as the tool prints it.

Error codes are read from the source itself (``ast``), so a code added anywhere fails here until it is
documented: every ``TurnoutError`` subclass instantiated without ``code=`` gives its class default; ``code="x"``
(or ``"a" if ... else "b"``) on such a call, and ``code = "x"`` / ``err.code = "x"`` assignments, give
theirs; the routing reasons are read through the real ``no_route_error``. Where a code is produced decides
which table must list it:

- ``src/turnout/admin/**``: the admin API, the table under "Admin API" in docs/api.md;
- ``src/turnout/runtime/**``: the runtime agent's API, the table under "Runtime agent" in docs/runtime-pools.md;
- anything else reaches clients of ``/v1`` and ``/api``: the table under "Errors" in README.md.

A table row documents a code when its `code` column holds it in backticks; where the status is fixed by the
raising class, that row's status column must hold it too. A code in a table that nothing produces fails as well.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "turnout"

# Where each area's codes must be documented: (path prefix under src/turnout, doc file, section heading).
TABLES = (
    ("admin/", "docs/api.md", "Admin API"),
    ("runtime/", "docs/runtime-pools.md", "Runtime agent: `turnout agent`"),
    ("", "README.md", "Errors"),
)
# `code=<expression>` sites that only pass a code along (its literal is collected where it is made).
# A new non-literal `code=` must be added here with the reason, or made a literal.
PASS_THROUGH = {
    ("errors.py", "code"),  # Unprocessable.__init__ hands its own argument to TurnoutError
    ("upstream/client.py", "code"),  # the connection's own UpstreamError, re-raised with the URL label
    ("upstream/http1.py", "code"),  # `code = "dns_error" if ... else "connect_refused"` just above
    ("gateway/dispatch.py", "reason.value"),  # NoRouteReason: read through no_route_error below
    ("gateway/held_stream.py", "err.code"),  # a held stream's error event says the error it was answered (its code)
}


@dataclass
class Produced:
    """Every code produced in one documentation area, with the statuses known statically (None: set at run time)."""

    statuses: dict[str, set[int | None]] = field(default_factory=lambda: defaultdict(set))
    where: dict[str, str] = field(default_factory=dict)

    def add(self, code: str, status: int | None, where: str) -> None:
        self.statuses[code].add(status)
        self.where.setdefault(code, where)


def _files() -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(SRC).as_posix(), ast.parse(p.read_text(), str(p))) for p in sorted(SRC.rglob("*.py"))]


def _error_classes(files: list[tuple[str, ast.Module]]) -> dict[str, tuple[str, int]]:
    """name -> (default code, status) for TurnoutError and every subclass defined in src."""
    defs: dict[str, ast.ClassDef] = {}
    for _, tree in files:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                defs[node.name] = node

    def attrs(node: ast.ClassDef) -> dict[str, object]:
        found: dict[str, object] = {}
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = stmt.value.value
        return found

    root = attrs(defs["TurnoutError"])
    known: dict[str, tuple[str, int]] = {"TurnoutError": (str(root["code"]), int(str(root["status"])))}
    for _ in range(10):  # inheritance depth, bounded
        for name, node in defs.items():
            bases = [
                b.id if isinstance(b, ast.Name) else b.attr
                for b in node.bases
                if isinstance(b, ast.Name | ast.Attribute)
            ]
            parent = next((known[b] for b in bases if b in known), None)
            if parent is None or name in known:
                continue
            own = attrs(node)
            known[name] = (str(own.get("code", parent[0])), int(str(own.get("status", parent[1]))))
    return known


def _literals(node: ast.expr) -> list[str] | None:
    """The string(s) an expression can be, when it is a literal or a conditional between literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = _literals(node.body), _literals(node.orelse)
        return None if body is None or orelse is None else body + orelse
    return None


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def produced_codes() -> dict[str, Produced]:
    """Doc file -> the codes produced by the code that doc covers."""
    files = _files()
    classes = _error_classes(files)
    out: dict[str, Produced] = {doc: Produced() for _, doc, _ in TABLES}
    unreadable: list[str] = []
    for rel, tree in files:
        doc = next(d for prefix, d, _ in TABLES if rel.startswith(prefix))
        for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module)]:
            # names whose .status is set after construction: their status is decided at run time
            restatused = {
                t.value.id
                for n in ast.walk(func)
                if isinstance(n, ast.Assign)
                for t in n.targets
                if isinstance(t, ast.Attribute) and t.attr == "status" and isinstance(t.value, ast.Name)
            }
            assigned: dict[int, str] = {}
            for n in ast.walk(func):
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and len(n.targets) == 1:
                    target = n.targets[0]
                    if isinstance(target, ast.Name):
                        assigned[id(n.value)] = target.id
            for n in ast.walk(func):
                where = f"src/turnout/{rel}:{getattr(n, 'lineno', 0)}"
                if isinstance(n, ast.Call) and _call_name(n) in classes:
                    default_code, status = classes[_call_name(n) or ""]
                    dynamic = assigned.get(id(n)) in restatused
                    kw = next((k.value for k in n.keywords if k.arg == "code"), None)
                    if kw is None:
                        out[doc].add(default_code, None if dynamic else status, where)
                        continue
                    codes = _literals(kw)
                    if codes is None:
                        if (rel, ast.unparse(kw)) not in PASS_THROUGH:
                            unreadable.append(f"{where}: code={ast.unparse(kw)}")
                        continue
                    for code in codes:
                        out[doc].add(code, None if dynamic else status, where)
                elif isinstance(n, ast.Assign) and func is not tree:
                    for target in n.targets:
                        name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
                        codes = _literals(n.value)
                        if name == "code" and codes is not None:
                            for code in codes:
                                out[doc].add(code, None, where)
    # class-level defaults (`code = "..."` in a class body) count only where the class is raised (above)
    assert not unreadable, (
        "error codes the docs test cannot read; use a string literal, or add the expression to PASS_THROUGH "
        "in tests/test_docs.py with where its codes come from:\n" + "\n".join(unreadable)
    )
    from turnout.core.routing import NoRoute, NoRouteReason
    from turnout.gateway.dispatch import no_route_error

    for reason in NoRouteReason:
        if reason is NoRouteReason.SATURATED:
            continue  # never a NoRoute: the dispatcher raises its own 503 `saturated` (a literal, collected above)
        err = no_route_error(NoRoute(reason, "m"), 1)
        out["README.md"].add(err.code, err.status, "src/turnout/gateway/dispatch.py:no_route_error")
    return out


@dataclass(frozen=True)
class Row:
    line: int
    status: str
    codes: frozenset[str]


def section(doc: str, heading: str) -> list[tuple[int, str]]:
    """(line number, text) of the lines under the Markdown heading (any level) up to the next one of its level."""
    lines = (ROOT / doc).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if re.fullmatch(rf"#+ {re.escape(heading)}", line)), None)
    assert start is not None, f"{doc} has no heading '{heading}'"
    level = len(lines[start]) - len(lines[start].lstrip("#"))
    body: list[tuple[int, str]] = []
    for i in range(start + 1, len(lines)):
        stripped = lines[i].lstrip("#")
        if lines[i].startswith("#") and stripped.startswith(" ") and len(lines[i]) - len(stripped) <= level:
            break
        body.append((i + 1, lines[i]))
    return body


def code_rows(doc: str, heading: str) -> list[Row]:
    """Rows of the section's tables that have a `code` column (header cell `` `code` `` or ``code``)."""
    rows: list[Row] = []
    columns: dict[str, int] | None = None
    for number, line in section(doc, heading):
        if not line.startswith("|"):
            columns = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if columns is None:
            names = [c.strip("`").lower() for c in cells]
            columns = {name: i for i, name in enumerate(names)} if "code" in names and "status" in names else {}
            continue
        if not columns or set(line) <= set("|-: "):
            continue
        rows.append(
            Row(
                number,
                cells[columns["status"]],
                frozenset(re.findall(r"`([a-z][a-z0-9_]*)`", cells[columns["code"]])),
            )
        )
    return rows


def test_every_error_code_is_in_its_docs_table() -> None:
    produced = produced_codes()
    problems = []
    for _, doc, heading in TABLES:
        rows = code_rows(doc, heading)
        assert rows, f"{doc}: no table with `status` and `code` columns under '{heading}'"
        documented = {code for row in rows for code in row.codes}
        for code, statuses in sorted(produced[doc].statuses.items()):
            where = produced[doc].where[code]
            if code not in documented:
                problems.append(f"{doc} ({heading}): code `{code}` ({where}) is missing from the table")
                continue
            for status in sorted(s for s in statuses if s is not None):
                if not any(code in row.codes and str(status) in row.status for row in rows):
                    lines = [row.line for row in rows if code in row.codes]
                    problems.append(f"{doc}:{lines}: `{code}` is answered with status {status} ({where}); say so")
        for row in rows:
            for code in sorted(row.codes - set(produced[doc].statuses)):
                problems.append(f"{doc}:{row.line}: `{code}` is in the table but nothing in its area produces it")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("code", ["connect_refused", "model_not_found", "rate_limit_exceeded", "invalid_api_key"])
def test_the_collector_sees_codes_made_in_every_way(code: str) -> None:
    """A literal in an if-expression, a NoRoute reason, a class default and a keyword: all four are found."""
    assert code in produced_codes()["README.md"].statuses


# -- every CLI flag documented in docs/cli.md --------------------------------------------------------------


def _commands() -> list[tuple[str, object]]:
    """(`turnout key create`, the click command) for the root and every leaf command, from the real typer app."""
    import typer

    from turnout.cli import app

    found: list[tuple[str, object]] = []

    def walk(cmd: object, path: list[str]) -> None:
        subs = getattr(cmd, "commands", None)
        if subs is None or len(path) == 1:
            found.append((" ".join(path), cmd))
        for name, sub in sorted((subs or {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), ["turnout"])
    return found


def _flags(cmd: object) -> set[str]:
    return {
        flag
        for p in getattr(cmd, "params", [])
        if getattr(p, "param_type_name", "") == "option"
        for flag in (*p.opts, *p.secondary_opts)
    } | {"--help"}


def cli_sections() -> dict[str, list[tuple[int, str]]]:
    """docs/cli.md's sections by heading (`## `turnout key create``), with their lines."""
    lines = (ROOT / "docs" / "cli.md").read_text().splitlines()
    out: dict[str, list[tuple[int, str]]] = {}
    current: list[tuple[int, str]] | None = None
    for number, line in enumerate(lines, 1):
        if line.startswith("## "):
            current = out.setdefault(line[3:].strip().strip("`"), [])
        elif current is not None:
            current.append((number, line))
    return out


def test_every_cli_flag_is_in_docs_cli_md() -> None:
    sections = cli_sections()
    problems = []
    commands = dict(_commands())
    for name, cmd in commands.items():
        if name not in sections:
            problems.append(f"docs/cli.md has no section '## `{name}`'")
            continue
        documented: dict[str, int] = {}
        for number, line in sections[name]:
            if line.startswith("|"):
                first = line.strip("|").split("|")[0]
                for flag in re.findall(r"`(--?[A-Za-z][\w-]*)", first):
                    documented[flag] = number
        for flag in sorted(_flags(cmd) - set(documented) - {"--help"}):
            problems.append(f"docs/cli.md: `{name}` takes {flag}, which its options table does not list")
        for flag, number in sorted(documented.items()):
            if flag not in _flags(cmd):
                problems.append(f"docs/cli.md:{number}: `{name}` has no option {flag}")
    for name in sorted(set(sections) - set(commands)):
        problems.append(f"docs/cli.md: section '{name}' is not a turnout command")
    assert not problems, "\n".join(problems)
