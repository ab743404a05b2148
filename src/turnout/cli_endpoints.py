"""`turnout endpoint ...`: register, test, change and remove external endpoints (on the store directly).

A running gateway picks registrations up within 5 seconds. Credentials are read from an environment
variable named on the command line, never from a flag value, and stored encrypted.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Annotated

import typer

from turnout.cli_accounts import DEFAULT_CONFIG, ConfigOption, cli_audit, cli_input, fail, open_store
from turnout.core.endpoint_urls import base_urls
from turnout.store.bounds import MAX_LATENCY_BUDGET_MS

NameArgument = Annotated[str, typer.Argument(help="the endpoint's name (letters, digits, '.', '_', '-')")]

if TYPE_CHECKING:
    from turnout.config import Settings
    from turnout.fleet.endpoints import Probe

# The store, the admin input models and the upstream client are imported inside the commands, so that
# `turnout --help` does not pay for them.

__all__ = ["endpoint_app"]

endpoint_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="External endpoints: servers Turnout routes to but never manages."
)


def _probe(settings: Settings, url: str, api: str, credential: str | None) -> Probe:
    import asyncio

    from turnout.fleet.endpoints import probe
    from turnout.upstream.client import UpstreamClient
    from turnout.upstream.http1 import DialGuard

    async def run() -> Probe:
        client = UpstreamClient(connect_timeout_s=settings.limits.connect_timeout_s, total_timeout_s=30)
        try:
            guard = DialGuard(allow_private=settings.endpoint_env.allow_private)
            return await probe(client, url, api, credential, guard, settings.health.timeout_s)
        finally:
            await client.close()

    return asyncio.run(run())


def _report(name: str, result: Probe) -> None:
    if result.ok:
        typer.echo(
            f"{name}: online, {result.latency_ms:.0f} ms, {len(result.models)} models: "
            + ", ".join(result.models[:20])
            + (" ..." if len(result.models) > 20 else "")
        )
    else:
        typer.echo(f"{name}: check failed: {result.error}", err=True)
        typer.echo(f"  what to change: {result.hint}", err=True)


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
    url: Annotated[str, typer.Option(help="base URL, e.g. http://mac-studio.lan:11434")],
    api: Annotated[str, typer.Option(help="ollama or openai")] = "openai",
    credential_from_env: Annotated[str | None, typer.Option(help="environment variable holding the API key")] = None,
    fallback_model: Annotated[str | None, typer.Option(help="Turnout model to use when this endpoint fails")] = None,
    latency_budget_ms: Annotated[
        int | None, typer.Option(help=f"time to response headers before fallback (1 to {MAX_LATENCY_BUDGET_MS})")
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Register an endpoint, test it, and print a gateway key for its models (once)."""
    from turnout.admin.endpoints_api import endpoint_key
    from turnout.admin.inputs import EndpointCreate, parse_input
    from turnout.store.endpoints import EndpointStore
    from turnout.store.keys import KeyStore
    from turnout.store.secrets import SecretBox

    credential = _credential(credential_from_env)
    with cli_input(credential="credential-from-env", name=""):
        spec = parse_input(
            EndpointCreate,
            {
                "name": name,
                "url": url,
                "api": api,
                "credential": credential,
                "fallback_model": fallback_model or None,
                "latency_budget_ms": latency_budget_ms,
            },
        )
    now = time.time()
    with open_store(config) as (settings, db):
        secrets = SecretBox.load(settings.data_dir, settings.endpoint_env.secret_key)
        record = EndpointStore(db).add(
            name=spec.name,
            url=spec.url,
            api=spec.api,
            credential=None if not spec.credential else secrets.encrypt(spec.credential),
            fallback_model=spec.fallback_model,
            latency_budget_ms=spec.latency_budget_ms,
            now=now,
        )
        key_record, key = endpoint_key(KeyStore(db), name, now)
        cli_audit(db, action="endpoint.register", target=f"endpoint:{name}", after=record.to_json(), now=now)
        result = _probe(settings, record.url, record.api, credential)
    typer.echo(key)
    typer.echo(f"registered {name}; key {key_record.prefix} (shown only once) reaches its models", err=True)
    for line in url_lines(base_urls(_origin(settings), name), name):
        typer.echo(line, err=True)
    _report(name, result)


def _origin(settings: Settings) -> str:
    """The gateway's URL as a client on this machine reaches it (a wildcard listen address: on loopback)."""
    host = settings.listen.host.strip("[]")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{settings.listen.port}" if ":" in host else f"http://{host}:{settings.listen.port}"


def url_lines(urls: dict[str, str], name: str) -> list[str]:
    """Where an endpoint's key works (:func:`turnout.core.endpoint_urls.base_urls`), said in two lines."""
    return [
        f"  at its own URL:   {urls['openai']} (OpenAI), {urls['ollama']} (Ollama); models as <model>",
        f"  at the shared URL: {urls['shared_openai']} (OpenAI), {urls['shared_ollama']} (Ollama); "
        f"models as {name}/<model>",
    ]


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
    from turnout.store.endpoints import EndpointStore
    from turnout.store.secrets import SecretBox

    if (name is None) == (url is None):
        fail("give a registered endpoint's NAME, or --url (with --api) for a dry run")
    if url is not None:
        credential = _credential(credential_from_env)
        with cli_input(credential="credential-from-env"):
            spec = parse_input(EndpointTest, {"url": url, "api": api, "credential": credential})
        with open_store(config) as (settings, _):
            result = _probe(settings, spec.url, spec.api, spec.credential or None)
        _report(spec.url, result)
    else:
        assert name is not None
        with open_store(config) as (settings, db):
            record = EndpointStore(db).get(name)
            secrets = SecretBox.load(settings.data_dir, settings.endpoint_env.secret_key)
            credential = None if record.credential is None else secrets.decrypt(record.credential)
            result = _probe(settings, record.url, record.api, credential)
        _report(name, result)
    if not result.ok:
        raise typer.Exit(1)


@endpoint_app.command("show")
def show(name: NameArgument, config: ConfigOption = DEFAULT_CONFIG) -> None:
    """One registered endpoint (never its credential) and how many requests fell back from it."""
    from turnout.store.endpoints import EndpointStore
    from turnout.store.usage import UsageStore

    with open_store(config) as (_, db):
        record = EndpointStore(db).get(name)
        counts = UsageStore(db).fallback_counts(since=time.time() - 86_400).get(name, {"total": 0, "since": 0})
    typer.echo(json.dumps({**record.to_json(), "fallbacks": counts}, indent=2))


@endpoint_app.command("list")
def list_endpoints(config: ConfigOption = DEFAULT_CONFIG) -> None:
    """Registered endpoints (never their credentials)."""
    from turnout.store.endpoints import EndpointStore

    with open_store(config) as (_, db):
        records = EndpointStore(db).all()
    typer.echo(json.dumps([r.to_json() for r in records], indent=2))


@endpoint_app.command("set")
def set_endpoint(
    name: NameArgument,
    url: Annotated[str | None, typer.Option(help="new base URL")] = None,
    api: Annotated[str | None, typer.Option(help="ollama or openai")] = None,
    credential_from_env: Annotated[
        str | None, typer.Option(help="environment variable holding the new API key")
    ] = None,
    fallback_model: Annotated[str | None, typer.Option(help="'' removes the fallback")] = None,
    latency_budget_ms: Annotated[int | None, typer.Option(help=f"1 to {MAX_LATENCY_BUDGET_MS} ms")] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Change an endpoint's URL, API type, credential or fallback."""
    from turnout.admin.inputs import EndpointChange, parse_input
    from turnout.store.endpoints import EndpointStore
    from turnout.store.secrets import SecretBox

    given = {"url": url, "api": api, "latency_budget_ms": latency_budget_ms, "fallback_model": fallback_model}
    if credential_from_env is not None:
        given["credential"] = _credential(credential_from_env)
    with cli_input(credential="credential-from-env"):
        changes = parse_input(EndpointChange, {k: v for k, v in given.items() if v is not None}).changes()
    if not changes:
        fail("nothing to change: give --url, --api, --credential-from-env, --fallback-model or --latency-budget-ms")
    now = time.time()
    with open_store(config) as (settings, db):
        if changes.get("credential"):
            secrets = SecretBox.load(settings.data_dir, settings.endpoint_env.secret_key)
            changes["credential"] = secrets.encrypt(changes["credential"])
        before, after = EndpointStore(db).update(name, changes, now=now)
        cli_audit(
            db,
            action="endpoint.change",
            target=f"endpoint:{name}",
            before=before.to_json(),
            after=after.to_json(),
            now=now,
        )
    typer.echo(json.dumps(after.to_json(), indent=2))


@endpoint_app.command("remove")
def remove(
    name: NameArgument,
    keep_keys: Annotated[
        bool, typer.Option("--keep-keys", help="keep the keys its registration printed (default: revoke them)")
    ] = False,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Forget an endpoint and revoke the keys its registration printed (unless --keep-keys)."""
    from turnout.store.endpoints import EndpointStore
    from turnout.store.keys import KeyStore

    now = time.time()
    with open_store(config) as (_, db):
        keys = KeyStore(db)
        record, revoked = EndpointStore(db).remove_and(
            name, then=lambda conn: [] if keep_keys else keys.revoke_endpoint_keys(name, now=now, conn=conn)
        )
        revoked = revoked or []
        prefixes = [after.prefix for _, after in revoked]
        for before, after in revoked:
            cli_audit(
                db,
                action="key.revoke",
                target=f"key:{after.prefix}",
                before=before.to_json(now),
                after=after.to_json(now),
                now=now,
            )
        cli_audit(
            db,
            action="endpoint.remove",
            target=f"endpoint:{name}",
            before=record.to_json(),
            after={"revoked_keys": prefixes},
            now=now,
        )
    typer.echo(f"removed {name}" + (f"; revoked keys {', '.join(prefixes)}" if prefixes else ""))
