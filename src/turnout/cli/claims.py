"""`turnout claim apply|list|events|delete` (ModelClaims of the local controller), `turnout controller` (that
controller on its own) and `turnout operator` (the Kubernetes operator). Claim changes are audited
(:func:`turnout.cli.common.audit_log`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from turnout.cli.common import (
    DEFAULT_CONFIG,
    LogFormatOption,
    LogLevelOption,
    OptionalConfigOption,
    audit_log,
    audited_claim,
    echo_json,
    fail,
    record,
    render,
    table,
    valid_interval,
    valid_optional_port,
)

__all__ = ["claim_app", "controller", "operator", "register"]

claim_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="ModelClaims for the local controller.")
DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="where claims and their status live (default: the config's data dir)")
]


def _claims_dir(config: Path | None, data_dir: Path | None) -> Path:
    """The data dir a gateway with this config reads its claims from (``--data-dir`` overrides it). Without
    ``--config`` and with no ./turnout-data/config.json yet, the default data dir ./turnout-data."""
    from turnout.config import ConfigError, load_settings

    if data_dir is not None:
        return data_dir
    if config is None and not DEFAULT_CONFIG.exists():
        return DEFAULT_CONFIG.parent
    try:
        return load_settings(config or DEFAULT_CONFIG).data_dir
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable: _fail exits


def _claims_database(config: Path | None, data_dir: Path | None) -> str | None:
    """The database URL the config names, where claim changes are audited (None: SQLite in the claims' data
    dir, as for a gateway on it)."""
    from turnout.config import ConfigError, load_settings

    if config is None and (data_dir is not None or not DEFAULT_CONFIG.exists()):
        return None
    try:
        return load_settings(config or DEFAULT_CONFIG).storage.database_url
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable: _fail exits


def _claim_doc(files: Any, name: str) -> Any:
    """A claim's stored document (None: there is none), for the audit entry's ``before``."""
    import orjson

    path = files.dir / f"{name}.json"
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


@claim_app.command("apply")
def claim_apply(
    file: Annotated[Path, typer.Option("-f", "--file", help="ModelClaim YAML or JSON (several documents allowed)")],
    config: OptionalConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Create or update claims; refused whole (nothing written) when any document is invalid. Audited."""
    from turnout.controller.local import ClaimFiles, load_claim_documents
    from turnout.core.claims import InvalidClaim

    try:
        docs = load_claim_documents(file.read_text())
    except (OSError, InvalidClaim, ValueError) as exc:
        fail(f"{file}: {exc}")
        return
    where = _claims_dir(config, data_dir)
    files = ClaimFiles(where)
    with audit_log(_claims_database(config, data_dir), where, "claims") as db:
        for doc in docs:
            before = _claim_doc(files, doc["metadata"]["name"])
            name = files.apply(doc)
            after = _claim_doc(files, name)
            record(
                db,
                str(files.dir / f"{name}.json"),
                action="claim.apply",
                target=f"claim:{name}",
                before=audited_claim(before),
                after=audited_claim(after),
            )
            typer.echo(f"modelclaim/{name} configured")


@claim_app.command("list")
def claim_list(
    config: OptionalConfigOption = None,
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Claims with their phase, pod and port, and why one is not Active."""
    from turnout.controller.local import ClaimFiles

    where = _claims_dir(config, data_dir)
    files = ClaimFiles(where)
    statuses = files.statuses()
    rows = []
    for doc in files.all():
        name = doc["metadata"]["name"]
        st = statuses.get(name, {})
        phase = "Deleting" if doc.get("deleting") else st.get("phase", "Pending")
        rows.append(
            {
                "name": name,
                "model": st.get("model") or (doc.get("spec") or {}).get("modelName") or name,
                "phase": phase,
                "pod": st.get("pod") or None,
                "port": st.get("port", 0),
                "reason": st.get("reason") or None,
                "message": st.get("message") or None,
            }
        )
    if as_json:
        echo_json(rows)
        return
    if not rows:
        typer.echo(f"no claims in {where}; create one with: turnout claim apply -f CLAIM.yaml")
        return
    out = []
    for r in rows:
        reason = r["reason"] or ""
        if r["message"] and r["phase"] not in ("Active", "Deleting"):
            reason = f"{reason}: {r['message']}"
        out.append([r["name"], r["model"], r["phase"], r["pod"], r["port"], reason])
    render(table(["NAME", "MODEL", "PHASE", "POD", "PORT", "REASON"], out, right=(4,)))


@claim_app.command("events")
def claim_events(config: OptionalConfigOption = None, data_dir: DataDirOption = None) -> None:
    """Recent controller events: phase changes, idle sleeps, invalid pool policies (repeats counted)."""
    from turnout.controller.local import ClaimFiles

    typer.echo(f"{'LAST SEEN':20} {'TYPE':8} {'REASON':18} {'OBJECT':28} {'COUNT':>5}  MESSAGE")
    for e in ClaimFiles(_claims_dir(config, data_dir)).events():
        typer.echo(
            f"{e['lastTimestamp']:20} {e['type']:8} {e['reason']:18} {e['object']:28} {e['count']:>5}  {e['message']}"
        )


@claim_app.command("delete")
def claim_delete(
    name: Annotated[str, typer.Argument(help="the claim's metadata.name")],
    config: OptionalConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Mark a claim deleted; the controller de-routes it, stops its engine, then forgets it. Audited."""
    from turnout.controller.local import ClaimFiles

    where = _claims_dir(config, data_dir)
    files = ClaimFiles(where)
    if _claim_doc(files, name) is None:
        fail(f'no claim "{name}" in {where}')
    with audit_log(_claims_database(config, data_dir), where, "claims") as db:
        before = _claim_doc(files, name)
        if not files.mark_deleted(name):
            fail(f'no claim "{name}" in {where}')
        record(
            db,
            str(files.dir / f"{name}.json"),
            action="claim.delete",
            target=f"claim:{name}",
            before=audited_claim(before),
            after=audited_claim(_claim_doc(files, name)),
        )
    typer.echo(f"modelclaim/{name} deleting")


def controller(
    pools: Annotated[
        Path, typer.Option(help='JSON list of pools: [{"name","agent_url","address","gpus","labels","policy"}]')
    ],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="where claims and their status live")] = Path(
        "turnout-data"
    ),
    interval: Annotated[float, typer.Option(callback=valid_interval, help="seconds between reconcile ticks")] = 2.0,
    metrics_port: Annotated[
        int,
        typer.Option(
            callback=valid_optional_port,
            help="serve the aibrix_modelclaim_* metrics on 127.0.0.1:PORT/metrics (0: off)",
        ),
    ] = 0,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "text",
) -> None:
    """Run the local ModelClaim controller against runtime agents."""
    import asyncio

    from turnout.controller.local import ClaimFiles, LocalController, load_pools
    from turnout.redaction import configure_logging
    from turnout.upstream.client import UpstreamClient

    configure_logging(log_level, log_format)
    try:
        pool_list = load_pools(pools)
    except (OSError, ValueError, KeyError) as exc:
        fail(f"{pools}: {exc}")
        return

    async def main() -> None:
        from prometheus_client import start_http_server

        client = UpstreamClient(connect_timeout_s=3, total_timeout_s=30)
        ctl = LocalController(ClaimFiles(data_dir), pool_list, client)
        if metrics_port:
            start_http_server(metrics_port, addr="127.0.0.1", registry=ctl.metrics.registry)
        try:
            await ctl.run(interval)
        finally:
            await client.close()

    asyncio.run(main())


def operator(
    namespace: Annotated[
        list[str] | None, typer.Option("--namespace", "-n", help="watch these namespaces (repeatable)")
    ] = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", help="watch the whole cluster")] = False,
    interval: Annotated[
        float, typer.Option(callback=valid_interval, help="seconds between reconcile passes per claim and pool")
    ] = 5.0,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="kubeconfig file (default: in-cluster service account, then ~/.kube/config)")
    ] = None,
    metrics_port: Annotated[
        int, typer.Option(callback=valid_optional_port, help="serve aibrix_modelclaim_* metrics on this port (0: off)")
    ] = 8080,
    liveness_port: Annotated[
        int, typer.Option(callback=valid_optional_port, help="kopf liveness endpoint /healthz on this port (0: off)")
    ] = 0,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "text",
) -> None:
    """Run the Kubernetes ModelClaim operator (CRD modelclaims.model.aibrix.ai; manifests in deploy/)."""
    try:
        import kopf
        from prometheus_client import start_http_server

        from turnout.controller.kube import OperatorConfig, build_registry
        from turnout.controller.metrics import ControllerMetrics
        from turnout.redaction import configure_logging
    except ImportError as exc:
        fail(f"the operator needs its extra: pip install 'turnout[operator]' ({exc})")
        return
    if not namespace and not all_namespaces:
        fail("say which namespaces to watch: --namespace NS (repeatable) or --all-namespaces")
    configure_logging(log_level, log_format)
    metrics = ControllerMetrics()
    if metrics_port:
        start_http_server(metrics_port, registry=metrics.registry)
    registry = build_registry(
        OperatorConfig(interval_s=interval, namespaces=tuple(namespace or ()), kubeconfig=kubeconfig), metrics
    )
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=all_namespaces,
        namespaces=namespace or (),
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
    )


def register(app: typer.Typer) -> None:
    app.command()(controller)
    app.command()(operator)
    app.add_typer(claim_app, name="claim")
