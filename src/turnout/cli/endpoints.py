"""`turnout endpoint ...`: register, test, list, change and remove external endpoints.

When the gateway named by the config runs, each command is its admin API call (:mod:`turnout.cli.client`):
the change is live at once, and a test dials from the gateway, under its network policy (the private-network
opt-in set where the gateway runs). When none runs, the command says so in one line and works on the store
(a gateway started later reads it; tests then dial from this shell, under this shell's environment).

The rules are the admin API's in both cases: the same input models (a URL pasted with its API suffix is
trimmed, and the command says so), the same worker-name clash rule, the same audit entries. Credentials are
read from an environment variable named on the command line, never from a flag value, and stored encrypted.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.cli.client import gateway_origin
from turnout.cli.common import (
    DEFAULT_CONFIG,
    ConfigOption,
    admin_errors,
    cli_audit,
    cli_audit_key,
    cli_input,
    echo_json,
    fail,
    gateway,
    load_config,
    local_time,
    ms,
    open_store,
    render,
    table,
)
from turnout.core.endpoint_rules import name_clash, url_note
from turnout.core.endpoint_urls import base_urls
from turnout.store.bounds import MAX_LATENCY_BUDGET_MS

if TYPE_CHECKING:
    from turnout.admin.inputs import EndpointCreate
    from turnout.config import Settings
    from turnout.fleet.endpoints import Probe

# The store, the admin input models and the upstream client are imported inside the commands, so that
# `turnout --help` does not pay for them, nor a command that talks to a running gateway.

__all__ = ["endpoint_app", "register"]

endpoint_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="External endpoints: servers Turnout routes to but never manages."
)
NameArgument = Annotated[str, typer.Argument(help="the endpoint's name (letters, digits, '.', '_', '-')")]
CREDENTIAL_FLAG = {"credential": "credential-from-env"}
NATIVE_FLAG = {"native_apis": "native-api"}
NativeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--native-api",
        help="a client API the endpoint serves itself, passed through unchanged: anthropic or responses "
        "(repeatable; set: 'none' removes them)",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def _path(name: str) -> str:
    return "/admin/api/endpoints/" + urllib.parse.quote(name, safe="")


def _probe(settings: Settings, url: str, api: str, credential: str | None) -> Probe:
    """A check from this shell (no gateway runs): this process's network policy and environment."""
    import asyncio

    from turnout.fleet.endpoints import probe
    from turnout.upstream.client import UpstreamClient
    from turnout.upstream.http1 import DialGuard

    async def run() -> Probe:
        client = UpstreamClient(connect_timeout_s=settings.limits.connect_timeout_s, total_timeout_s=30)
        try:
            guard = DialGuard(allow_private=settings.endpoint_env.allow_private, nat64=settings.network.nat64)
            return await probe(client, url, api, credential, guard, settings.health.timeout_s)
        finally:
            await client.close()

    return asyncio.run(run())


def _report(name: str, result: dict[str, Any] | None) -> bool:
    """Say how a check went (the admin API's test object); True when it found the endpoint online."""
    if result is None:
        typer.echo(f"{name}: not checked (see the gateway log)", err=True)
        return False
    if result["ok"]:
        models = result["models"]
        typer.echo(
            f"{name}: online, {result['latency_ms']:.0f} ms, {len(models)} models: "
            + ", ".join(models[:20])
            + (" ..." if len(models) > 20 else "")
        )
        return True
    typer.echo(f"{name}: check failed: {result['error']}", err=True)
    typer.echo(f"  what to change: {result['hint']}", err=True)
    return False


def _note(given: str | None) -> None:
    note = None if given is None else url_note(given)
    if note:
        typer.echo(f"turnout: {note}", err=True)


def _credential(var: str | None) -> str | None:
    if var is None:
        return None
    value = os.environ.get(var)
    if not value:
        fail(f"--credential-from-env {var}: the variable is not set (or empty) in this environment")
    return value


@endpoint_app.command("add")
def add(
    name: NameArgument,
    url: Annotated[str, typer.Option(help="base URL, e.g. http://mac-studio.lan:11434 (a /v1 or /api is dropped)")],
    api: Annotated[str, typer.Option(help="ollama or openai")] = "openai",
    credential_from_env: Annotated[str | None, typer.Option(help="environment variable holding the API key")] = None,
    fallback_model: Annotated[str | None, typer.Option(help="Turnout model to use when this endpoint fails")] = None,
    latency_budget_ms: Annotated[
        int | None, typer.Option(help=f"time to response headers before fallback (1 to {MAX_LATENCY_BUDGET_MS})")
    ] = None,
    native_api: NativeOption = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Register an endpoint, test it, and print a gateway key for its models (once), with the URLs it works at."""
    from turnout.admin.inputs import EndpointCreate, parse_input

    credential = _credential(credential_from_env)
    body = {
        "name": name,
        "url": url,
        "api": api,
        "credential": credential,
        "fallback_model": fallback_model or None,
        "latency_budget_ms": latency_budget_ms,
        "native_apis": native_api or None,
    }
    with cli_input(**CREDENTIAL_FLAG, **NATIVE_FLAG, name=""):
        spec = parse_input(EndpointCreate, body)
    settings = load_config(config)
    _note(url)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors(**CREDENTIAL_FLAG, **NATIVE_FLAG, name=""):
            answer = admin.call("POST", "/admin/api/endpoints", {k: v for k, v in body.items() if v is not None})
        key, prefix, result, urls = answer["key"], answer["key_prefix"], answer["test"], answer["urls"]
    else:
        key, prefix, result = _add_on_store(settings, spec, credential)
        urls = base_urls(gateway_origin(settings), name)
    typer.echo(key)
    typer.echo(f"registered {name}; key {prefix} (shown only once) reaches its models", err=True)
    for line in url_lines(urls, name):
        typer.echo(line, err=True)
    _report(name, result)


def url_lines(urls: dict[str, str], name: str) -> list[str]:
    """Where an endpoint's key works (:func:`turnout.core.endpoint_urls.base_urls`), said in two lines."""
    return [
        f"  at its own URL:   {urls['openai']} (OpenAI), {urls['ollama']} (Ollama); models as <model>",
        f"  at the shared URL: {urls['shared_openai']} (OpenAI), {urls['shared_ollama']} (Ollama); "
        f"models as {name}/<model>",
    ]


def _add_on_store(settings: Settings, spec: EndpointCreate, credential: str | None) -> tuple[str, str, Any]:
    from turnout.admin.endpoints_api import endpoint_key
    from turnout.store.endpoints import EndpointStore
    from turnout.store.keys import KeyStore
    from turnout.store.secrets import SecretBox

    clash = name_clash(spec.name, {w.name for w in settings.workers})
    if clash is not None:
        fail(clash)
    now = time.time()
    with open_store(settings) as (_, db):
        secrets = SecretBox.load(settings.data_dir, settings.endpoint_env.secret_key)
        record = EndpointStore(db).add(
            name=spec.name,
            url=spec.url,
            api=spec.api,
            credential=None if not spec.credential else secrets.encrypt(spec.credential),
            fallback_model=spec.fallback_model,
            latency_budget_ms=spec.latency_budget_ms,
            native_apis=spec.native_apis,
            now=now,
        )
        key_record, key = endpoint_key(KeyStore(db), spec.name, now)
        cli_audit(db, action="endpoint.register", target=f"endpoint:{spec.name}", after=record.to_json(), now=now)
        cli_audit(db, action="key.create", target=f"key:{key_record.prefix}", after=key_record.to_json(now), now=now)
        result = _probe(settings, record.url, record.api, credential)
    return key, key_record.prefix, result.to_json()


@endpoint_app.command("test")
def test(
    name: Annotated[str | None, typer.Argument(help="a registered endpoint (omit with --url)")] = None,
    url: Annotated[
        str | None, typer.Option(help="test an unsaved endpoint at this URL instead (nothing stored)")
    ] = None,
    api: Annotated[str, typer.Option(help="with --url: ollama or openai")] = "openai",
    credential_from_env: Annotated[
        str | None, typer.Option(help="with --url: environment variable holding the API key")
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Call the endpoint's list-models route and say what to change when it fails (exit 1). With --url, a
    dry run of an endpoint that is not registered (POST /admin/api/endpoints/test)."""
    from turnout.admin.inputs import EndpointTest, parse_input

    if (name is None) == (url is None):
        fail("give a registered endpoint's NAME, or --url (with --api) for a dry run")
    settings = load_config(config)
    if url is not None:
        credential = _credential(credential_from_env)
        body = {"url": url, "api": api, "credential": credential}
        with cli_input(**CREDENTIAL_FLAG):
            spec = parse_input(EndpointTest, body)
        _note(url)
        admin = gateway(settings)
        if admin is not None:
            with admin_errors(**CREDENTIAL_FLAG):
                answer = admin.call(
                    "POST", "/admin/api/endpoints/test", {k: v for k, v in body.items() if v is not None}
                )
            result = answer["test"]
        else:
            result = _probe(settings, spec.url, spec.api, spec.credential or None).to_json()
        ok = _report(spec.url, result)
    else:
        assert name is not None
        admin = gateway(settings)
        if admin is not None:
            with admin_errors():
                result = admin.call("POST", _path(name) + "/test")["test"]
        else:
            from turnout.store.endpoints import EndpointStore
            from turnout.store.secrets import SecretBox

            with open_store(settings) as (_, db):
                record = EndpointStore(db).get(name)
                secrets = SecretBox.load(settings.data_dir, settings.endpoint_env.secret_key)
                credential = None if record.credential is None else secrets.decrypt(record.credential)
                result = _probe(settings, record.url, record.api, credential).to_json()
        ok = _report(name, result)
    if not ok:
        raise typer.Exit(1)


@endpoint_app.command("show")
def show(name: NameArgument, config: ConfigOption = DEFAULT_CONFIG) -> None:
    """One registered endpoint (never its credential), its live state when a gateway runs, and how many
    requests fell back from it in the last 24 hours (JSON)."""
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            echo_json(admin.call("GET", _path(name)))
        return
    from turnout.store.endpoints import EndpointStore
    from turnout.store.usage import UsageStore

    with open_store(settings) as (_, db):
        record = EndpointStore(db).get(name)
        counts = UsageStore(db).fallback_counts(since=time.time() - 86_400).get(name, {"total": 0, "since": 0})
    echo_json({**record.to_json(), "fallbacks": counts})


@endpoint_app.command("list")
def list_endpoints(config: ConfigOption = DEFAULT_CONFIG, as_json: JsonOption = False) -> None:
    """Registered endpoints: state and since when, latency, models and what to change when one is down
    (the live state comes from the running gateway; never a credential)."""
    settings = load_config(config)
    admin = gateway(settings)
    views: list[dict[str, Any]]
    if admin is not None:
        with admin_errors():
            views = admin.call("GET", "/admin/api/endpoints")["endpoints"]
    else:
        from turnout.store.endpoints import EndpointStore

        with open_store(settings) as (_, db):
            views = [r.to_json() for r in EndpointStore(db).all()]
    if as_json:
        echo_json(views)
        return
    if not views:
        typer.echo("no endpoints registered; add one with: turnout endpoint add NAME --url URL --api ollama|openai")
        return
    render(endpoint_table(views))
    if admin is None:
        typer.echo("(state, latency and models are known to a running gateway only)")


def endpoint_table(views: list[dict[str, Any]]) -> list[str]:
    """NAME, API, STATE, SINCE, LATENCY, MODELS; under each row its URL and, when down, what to change."""
    rows = []
    for v in views:
        models = [m.removeprefix(f"{v['name']}/") for m in v.get("models") or []]
        shown = ", ".join(models[:3]) + (f" +{len(models) - 3}" if len(models) > 3 else "")
        rows.append(
            [
                v["name"],
                v["api"],
                v.get("state") or "-",
                local_time(v.get("state_since"), seconds=False) if v.get("state_since") else "-",
                ms(v.get("latency_ms")),
                shown or "-",
            ]
        )
    lines = table(["NAME", "API", "STATE", "SINCE", "LATENCY", "MODELS"], rows, right=(4,))
    out = [lines[0]]
    for v, line in zip(views, lines[1:], strict=True):
        out.append(line)
        out.append(f"  {v['url']}" + (f"  fallback: {v['fallback_model']}" if v.get("fallback_model") else ""))
        if v.get("hint") and v.get("state") not in ("online", None):
            out.append(f"  what to change: {v['hint']}")
    return out


@endpoint_app.command("set")
def set_endpoint(
    name: NameArgument,
    url: Annotated[str | None, typer.Option(help="new base URL (a /v1 or /api is dropped)")] = None,
    api: Annotated[str | None, typer.Option(help="ollama or openai")] = None,
    credential_from_env: Annotated[
        str | None, typer.Option(help="environment variable holding the new API key")
    ] = None,
    fallback_model: Annotated[str | None, typer.Option(help="'' removes the fallback")] = None,
    latency_budget_ms: Annotated[int | None, typer.Option(help=f"1 to {MAX_LATENCY_BUDGET_MS} ms")] = None,
    native_api: NativeOption = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Change an endpoint's URL, API type, credential, fallback or native APIs (prints the endpoint as JSON)."""
    from turnout.admin.inputs import EndpointChange, parse_input

    given: dict[str, Any] = {"url": url, "api": api, "latency_budget_ms": latency_budget_ms}
    given["fallback_model"] = fallback_model
    if native_api is not None:
        given["native_apis"] = [] if native_api == ["none"] else native_api
    if credential_from_env is not None:
        given["credential"] = _credential(credential_from_env)
    body = {k: v for k, v in given.items() if v is not None}
    with cli_input(**CREDENTIAL_FLAG, **NATIVE_FLAG):
        changes = parse_input(EndpointChange, body).changes()
    if not changes:
        fail(
            "nothing to change: give --url, --api, --credential-from-env, --fallback-model, --latency-budget-ms "
            "or --native-api"
        )
    settings = load_config(config)
    _note(url)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors(**CREDENTIAL_FLAG, **NATIVE_FLAG):
            echo_json(admin.call("PATCH", _path(name), body)["endpoint"])
        return
    from turnout.admin.endpoints_api import change_audit
    from turnout.store.endpoints import EndpointStore
    from turnout.store.secrets import SecretBox

    now = time.time()
    with open_store(settings) as (_, db):
        if changes.get("credential"):
            secrets = SecretBox.load(settings.data_dir, settings.endpoint_env.secret_key)
            changes["credential"] = secrets.encrypt(changes["credential"])
        before, after = EndpointStore(db).update(name, changes, now=now)
        old, new = change_audit(before, after, changes)
        cli_audit(db, action="endpoint.change", target=f"endpoint:{name}", before=old, after=new, now=now)
    echo_json(after.to_json())


@endpoint_app.command("remove")
def remove(
    name: NameArgument,
    keep_keys: Annotated[
        bool, typer.Option("--keep-keys", help="keep the keys its registration printed (default: revoke them)")
    ] = False,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Forget an endpoint and revoke the keys its registration printed (unless --keep-keys)."""
    settings = load_config(config)
    admin = gateway(settings)
    if admin is not None:
        with admin_errors():
            answer = admin.call("DELETE", _path(name), query={"keep_keys": "true" if keep_keys else "false"})
        prefixes = answer["revoked_keys"]
    else:
        prefixes = _remove_on_store(settings, name, keep_keys)
    typer.echo(f"removed {name}" + (f"; revoked keys {', '.join(prefixes)}" if prefixes else ""))


def _remove_on_store(settings: Settings, name: str, keep_keys: bool) -> list[str]:
    from turnout.store.endpoints import EndpointStore
    from turnout.store.keys import KeyStore

    now = time.time()
    with open_store(settings) as (_, db):
        keys = KeyStore(db)
        record, revoked = EndpointStore(db).remove_and(
            name, then=lambda conn: [] if keep_keys else keys.revoke_endpoint_keys(name, now=now, conn=conn)
        )
        revoked = revoked or []
        prefixes = [after.prefix for _, after in revoked]
        for before, after in revoked:
            cli_audit_key(db, "key.revoke", before, after, now)
        cli_audit(
            db,
            action="endpoint.remove",
            target=f"endpoint:{name}",
            before=record.to_json(),
            after={"revoked_keys": prefixes},
            now=now,
        )
    return prefixes


def register(app: typer.Typer) -> None:
    app.add_typer(endpoint_app, name="endpoint")
