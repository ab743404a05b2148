"""`turnout alias list|set|remove`: model aliases (docs/aliases.md), the same actions as the admin API.

When the gateway named by the config answers, each command is its admin API call (:mod:`turnout.cli.client`): the
change is in force in every process of that gateway at once, and ``list`` shows where each alias's model is
served now. When none answers, the command says so in one line and works on the store directly, under the same
rules (one step, no chains, names like model names) and with the same audit entries; gateways on that store pick
the change up within seconds.
"""

from __future__ import annotations

import time
import urllib.parse
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.cli.common import (
    DEFAULT_CONFIG,
    ConfigOption,
    admin_errors,
    cli_audit,
    cli_input,
    echo_json,
    gateway,
    load_config,
    open_store,
    render,
    table,
)

if TYPE_CHECKING:
    from turnout.config import Settings

# The store and the admin API's rules are imported inside the commands: `turnout --help` does not pay for them.

__all__ = ["alias_app", "register"]

alias_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Model aliases: names clients ask for that stand for a model (claude-sonnet-4-5 -> qwen3-coder:30b).",
)
NameArgument = Annotated[str, typer.Argument(help="the alias, e.g. claude-sonnet-4-5")]
ARGUMENTS = {"name": "", "model": ""}  # problems with the arguments are said without an option name


def _path(name: str) -> str:
    return "/admin/api/aliases/" + urllib.parse.quote(name, safe="/:")


@alias_app.command("list")
def alias_list(
    config: ConfigOption = DEFAULT_CONFIG,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Every alias in force: the config file's and the ones set here or through the admin API (which replace a
    config alias of the same name), and, from a running gateway, where each model is served now."""
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            views: list[dict[str, Any]] = admin.call("GET", "/admin/api/aliases")["aliases"]
    else:
        views = _stored_views(settings)
    if as_json:
        echo_json(views)
        return
    if not views:
        typer.echo('no aliases; add one with: turnout alias set NAME MODEL (or "aliases" in the config file)')
        return
    render(alias_table(views))
    if admin is None:
        typer.echo("(where each model is served is known to a running gateway only)")


def _stored_views(settings: Settings) -> list[dict[str, Any]]:
    from turnout.admin.aliases_api import alias_views
    from turnout.store.aliases import AliasStore

    with open_store(settings) as (_, db):
        return alias_views(settings.aliases, AliasStore(db).all())


def alias_table(views: list[dict[str, Any]]) -> list[str]:
    """ALIAS, MODEL, SOURCE, SERVED BY; under a row, what it replaces or hides and why its model is not served."""
    rows = []
    for v in views:
        served = ", ".join(v["workers"]) if v.get("workers") else ("-" if "workers" not in v else "nowhere now")
        rows.append([v["name"], v["model"], v["source"], served])
    lines = table(["ALIAS", "MODEL", "SOURCE", "SERVED BY"], rows)
    out = [lines[0]]
    for v, line in zip(views, lines[1:], strict=True):
        out.append(line)
        if v.get("config_model"):
            out.append(f"  replaces the config file's {v['name']} -> {v['config_model']}")
        if v.get("shadows"):
            out.append(f"  hides the model of that name on {', '.join(v['shadows'])}")
        if v.get("problem"):
            out.append(f"  {v['problem']['message']}")
    return out


@alias_app.command("set")
def alias_set(
    name: NameArgument,
    model: Annotated[str, typer.Argument(help="the model it stands for, as clients name it on the shared URL")],
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Make NAME stand for MODEL (a new alias, or a new model for one; prints the alias as JSON)."""
    from turnout.admin.inputs import AliasSet, parse_input

    with cli_input(**ARGUMENTS):
        spec = parse_input(AliasSet, {"name": name, "model": model})
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors(**ARGUMENTS):
            echo_json(admin.call("PUT", _path(name), {"model": model})["alias"])
        return
    from turnout.admin.aliases_api import alias_views, check_set
    from turnout.core.names import canonical
    from turnout.store.aliases import AliasStore

    with open_store(settings) as (_, db), cli_input(**ARGUMENTS):
        store = AliasStore(db)
        before, after = store.put(spec.name, spec.model, now=time.time(), check=check_set(settings.aliases, spec))
        configured = {canonical(n): t for n, t in settings.aliases.items()}.get(canonical(spec.name))
        was = before.model if before is not None else configured
        cli_audit(
            db,
            action="alias.set",
            target=f"alias:{spec.name}",
            before=None if was is None else {"model": was, "source": "runtime" if before else "config"},
            after={"model": after.model, "source": "runtime"},
            now=time.time(),
        )
        views = alias_views(settings.aliases, store.all())
    echo_json(next(v for v in views if v["name"] == after.name))


@alias_app.command("remove")
def alias_remove(name: NameArgument, config: ConfigOption = DEFAULT_CONFIG) -> None:
    """Remove an alias set here or through the admin API (a config file alias of that name applies again;
    one only in the config file is removed there)."""
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            answer = admin.call("DELETE", _path(name))
        restored = answer["alias"]
    else:
        restored = _remove_on_store(settings, name)
    typer.echo(f"removed {name}" + (f"; the config file's {name} -> {restored['model']} applies" if restored else ""))


def _remove_on_store(settings: Settings, name: str) -> dict[str, Any] | None:
    from turnout.admin.aliases_api import alias_views, check_removal
    from turnout.core.names import canonical
    from turnout.store.aliases import AliasStore

    with open_store(settings) as (_, db):
        store = AliasStore(db)
        where = str(settings.config_path or "config.json")
        removed = store.remove(name, check=check_removal(settings.aliases, name, where))
        views = alias_views(settings.aliases, store.all())
        restored = next((v for v in views if canonical(v["name"]) == canonical(name)), None)
        cli_audit(
            db,
            action="alias.remove",
            target=f"alias:{removed.name}",
            before={"model": removed.model, "source": "runtime"},
            after=None if restored is None else {"model": restored["model"], "source": restored["source"]},
            now=time.time(),
        )
    return restored


def register(app: typer.Typer) -> None:
    app.add_typer(alias_app, name="alias")
