"""The `turnout` command as a user runs it: real subprocesses, real files."""

from __future__ import annotations

import getpass
import json
import os
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.support.cli import TURNOUT
from turnout.store.audit import AuditLog
from turnout.store.db import Database, database_url


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "TURNOUT_ADMIN_TOKEN"}
    return subprocess.run([*TURNOUT, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env={**clean, **env})


def test_bad_config_exits_nonzero_and_touches_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "storage": {"data_dir": "state"},
                "workers": [{"name": "a", "url": "http://x", "model_placement": {"mode": "x"}}],
            }
        )
    )
    result = run(["serve", "--config", str(config)], tmp_path)
    assert result.returncode == 2
    assert "workers[0].model_placement.mode" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    check = run(["config", "check", "--config", str(config)], tmp_path)
    assert check.returncode == 2 and "workers[0].model_placement.mode" in check.stderr


def test_config_check_ok(tmp_path: Path) -> None:
    result = run(["config", "check", "--config", str(Path(__file__).parents[1] / "config.example.json")], tmp_path)
    assert result.returncode == 0 and "3 workers" in result.stdout


def test_config_check_warns_about_a_pool_policy_the_controller_would_disable(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    agent = {"name": "gpu-0", "agent_url": "http://127.0.0.1:1", "policy": {"lifecycle": {"sleepAfter": 5}}}
    config.write_text(json.dumps({"workers": [], "pools": {"agents": [agent]}}))
    result = run(["config", "check", "--config", str(config)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pools.agents[0].policy (gpu-0)" in result.stderr and "sleepAfter" in result.stderr


@contextmanager
def serving(cwd: Path, **env: str) -> Iterator[tuple[int, list[str]]]:
    """Run `turnout serve` until the block ends; yields (port, output lines once it has stopped)."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if k != "TURNOUT_ADMIN_TOKEN"}
    proc = subprocess.Popen(
        [*TURNOUT, "serve", "--port", str(port), "--no-demo"],  # whatever answers at Ollama's address here
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**clean, **env},
    )
    output: list[str] = []
    try:
        _wait_ready(port, proc)
        yield port, output
    finally:
        proc.terminate()
        output.extend(proc.communicate(timeout=20)[0].splitlines())


def admin_get(port: int, token: str) -> tuple[int, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/api/inventory", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status, json.load(resp)


def test_first_start_creates_data_dir_and_token(tmp_path: Path) -> None:
    with serving(tmp_path) as (port, first):
        token_file = tmp_path / "turnout-data" / "admin-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        status, inventory = admin_get(port, token)
        assert status == 200 and isinstance(inventory, dict)
        assert [w["name"] for w in inventory["workers"]] == ["local"]  # the starter config's worker
    assert any(token in line for line in first)  # printed once on first start
    starter = json.loads((tmp_path / "turnout-data" / "config.json").read_text())
    assert starter["storage"]["data_dir"] == "."
    assert starter["workers"] == [{"name": "local", "url": "http://127.0.0.1:11434", "type": "ollama"}]
    with serving(tmp_path) as (_, second):
        pass
    assert not any(token in line for line in second)  # not printed again


def test_env_token_wins_and_no_file_is_written(tmp_path: Path) -> None:
    with serving(tmp_path, TURNOUT_ADMIN_TOKEN="from-env") as (port, _):
        assert admin_get(port, "from-env")[0] == 200
    assert not (tmp_path / "turnout-data" / "admin-token").exists()


def _wait_ready(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "turnout exited early"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("turnout did not start in 30 s")


def test_key_commands(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"storage": {"data_dir": "state"}, "listen": {"port": free_port()}}))
    c = ["--config", str(config)]
    created = run(["key", "create", "--app", "web", "--models", "model:qwen3:*", "--rpm", "5", *c], tmp_path)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert key.startswith("tk_") and "shown only once" in created.stderr
    listing = run(["key", "list", *c], tmp_path)
    assert key[:10] in listing.stdout and key not in listing.stdout and "qwen3:*" in listing.stdout
    rotated = run(["key", "rotate", key[:10], "--grace", "60", *c], tmp_path)
    assert rotated.returncode == 0 and rotated.stdout.strip().startswith("tk_")
    assert run(["key", "revoke", key[:10], *c], tmp_path).returncode == 0
    assert "revoked" in run(["key", "list", *c], tmp_path).stdout
    bad = run(["key", "revoke", "tk_nothing", *c], tmp_path)
    assert bad.returncode == 2 and "no key" in bad.stderr
    bad = run(["key", "create", "--app", "x", "--models", "q*x", *c], tmp_path)
    assert bad.returncode == 2 and "last character" in bad.stderr
    audit = json.loads(run(["audit", "--json", *c], tmp_path).stdout)
    assert [e["action"] for e in audit] == ["key.revoke", "key.rotate", "key.create"]
    assert all(e["actor"].startswith("cli") for e in audit)
    assert json.loads(run(["usage", "--since", "7d", "--json", *c], tmp_path).stdout) == []


def test_first_start_prints_a_starter_key_that_works(tmp_path: Path) -> None:
    with serving(tmp_path) as (port, output):
        pass
    lines = [line.strip() for line in output]
    key = next(line for line in lines if line.startswith("tk_"))
    with serving(tmp_path) as (port, again):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            listing = json.load(resp)  # the starter worker (127.0.0.1:11434) may or may not answer here
            assert listing["object"] == "list" and isinstance(listing["data"], list)
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
            raise AssertionError("no key must be refused")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
    assert not any(line.strip().startswith("tk_") for line in again)  # printed once only


def test_open_access_refuses_a_public_bind(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"listen": {"host": "0.0.0.0"}, "auth": {"open": True}}))
    result = run(["serve", "--config", str(config)], tmp_path)
    assert result.returncode == 2 and "only allowed on a loopback bind" in result.stderr
    config.write_text(json.dumps({"auth": {"open": True}}))
    result = run(["serve", "--config", str(config), "--host", "0.0.0.0"], tmp_path)
    assert result.returncode == 2 and "loopback" in result.stderr


def test_endpoint_commands(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    gw_port = free_port()  # nothing listens there: the commands work on the store
    config.write_text(
        json.dumps({"storage": {"data_dir": "state"}, "health": {"timeout_s": 1}, "listen": {"port": gw_port}})
    )
    c = ["--config", str(config)]
    port = free_port()  # nothing listens: registration still works, the test says what to change
    env = {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true", "MAC_KEY": "upstream-secret"}
    added = run(
        [
            "endpoint",
            "add",
            "mac",
            "--url",
            f"http://127.0.0.1:{port}",
            "--api",
            "ollama",
            "--credential-from-env",
            "MAC_KEY",
            *c,
        ],
        tmp_path,
        **env,
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip().startswith("tk_") and "connection refused" in added.stderr
    assert "OLLAMA_HOST" in added.stderr
    # both URLs the key works at (the config's listen address)
    origin = f"http://127.0.0.1:{gw_port}"
    assert f"{origin}/endpoints/mac/v1 (OpenAI)" in added.stderr and "models as <model>" in added.stderr
    assert f"{origin}/v1 (OpenAI)" in added.stderr and "models as mac/<model>" in added.stderr
    listing = json.loads(run(["endpoint", "list", "--json", *c], tmp_path).stdout)
    assert listing[0]["credential"] is True and "upstream-secret" not in json.dumps(listing)
    tested = run(["endpoint", "test", "mac", *c], tmp_path, **env)
    assert tested.returncode == 1 and "what to change" in tested.stderr
    strict = run(["endpoint", "test", "mac", *c], tmp_path)
    assert "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true" in strict.stderr
    missing = run(["endpoint", "add", "x", "--url", "http://h", "--credential-from-env", "NOPE_UNSET", *c], tmp_path)
    assert missing.returncode == 2 and "NOPE_UNSET" in missing.stderr
    assert run(["endpoint", "set", "mac", "--fallback-model", "llama3.2", *c], tmp_path).returncode == 0
    shown = json.loads(run(["endpoint", "show", "mac", *c], tmp_path).stdout)
    assert shown["fallback_model"] == "llama3.2" and shown["fallbacks"] == {"total": 0, "since": 0}
    # a dry run of an unsaved URL: nothing is stored
    dry = run(["endpoint", "test", "--url", f"http://127.0.0.1:{port}", "--api", "ollama", *c], tmp_path, **env)
    assert dry.returncode == 1 and "connection refused" in dry.stderr
    assert run(["endpoint", "test", *c], tmp_path).returncode == 2  # neither a name nor --url
    removed = run(["endpoint", "remove", "mac", *c], tmp_path)
    assert removed.returncode == 0 and "revoked keys tk_" in removed.stdout
    assert json.loads(run(["endpoint", "list", "--json", *c], tmp_path).stdout) == []
    [key] = json.loads(run(["key", "list", "--json", *c], tmp_path).stdout)
    assert key["app"] == "endpoint-mac" and key["state"] == "revoked"  # the key registration printed
    assert [e["action"] for e in json.loads(run(["audit", "--json", *c], tmp_path).stdout)][:5] == [
        "endpoint.remove",
        "key.revoke",
        "endpoint.change",
        "key.create",  # the key registration printed
        "endpoint.register",
    ]
    again = run(["endpoint", "add", "mac", "--url", f"http://127.0.0.1:{port}", *c], tmp_path, **env)
    assert again.returncode == 0
    kept = run(["endpoint", "remove", "mac", "--keep-keys", *c], tmp_path)
    assert kept.returncode == 0 and "revoked" not in kept.stdout
    states = [k["state"] for k in json.loads(run(["key", "list", "--json", *c], tmp_path).stdout)]
    assert states == ["revoked", "active"]


def test_key_edit_list_filters_and_usage_in_process(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from turnout.cli import app
    from turnout.config import load_settings
    from turnout.store.db import Database, database_url
    from turnout.store.usage import UsageRow, UsageStore

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"storage": {"data_dir": "state"}, "listen": {"port": free_port()}}))
    c = ["--config", str(config)]
    runner = CliRunner()

    def cli(*args: str) -> str:
        result = runner.invoke(app, [*args, *c])
        assert result.exit_code == 0, (result.output, result.exception)
        return result.stdout

    cli("key", "create", "--app", "web", "--tenant", "team-a", "--models", "qwen3:*", "--rpm", "5")
    cli("key", "create", "--app", "batch", "--tenant", "team-b", "--models", "mac/*")
    edited = json.loads(cli("key", "edit", "1", "--models", "llama3.2", "--rpm", "none", "--daily-tokens", "900"))
    assert edited["models"] == ["model:llama3.2"] and edited["rpm"] is None and edited["daily_tokens"] == 900
    assert json.loads(cli("key", "edit", "1", "--expires", "never"))["expires_at"] is None
    audit = json.loads(cli("audit", "--json", "--action", "key.change"))
    assert audit[-1]["before"]["rpm"] == 5 and audit[-1]["after"]["rpm"] is None
    assert [k["app"] for k in json.loads(cli("key", "list", "--json", "--tenant", "team-b"))] == ["batch"]
    assert [k["app"] for k in json.loads(cli("key", "list", "--json", "--endpoint", "mac"))] == ["batch"]
    assert json.loads(cli("key", "list", "--json", "--state", "revoked")) == []
    settings = load_settings(config)
    db = Database(database_url(settings.storage.database_url, settings.data_dir))
    now = time.time()
    UsageStore(db).insert_many(
        [
            UsageRow(now, 1, "openai:chat", "llama3.2", "a", 200, False, 3, 4, 12.0),
            UsageRow(now, 2, "openai:chat", "mac/x", "mac", 200, False, 1, 1, 30.0),
        ]
    )
    db.close()
    [listed] = json.loads(cli("key", "list", "--json", "--app", "web"))
    assert listed["last_used"] == now // 60 * 60 and listed["state"] == "active"
    assert "LAST USED" in cli("key", "list")
    rows = json.loads(cli("usage", "--json", "--worker", "a"))
    assert [(r["model"], r["requests"]) for r in rows] == [("llama3.2", 1)]
    assert [r["worker"] for r in json.loads(cli("usage", "--json", "--endpoint", "mac"))] == ["mac"]
    points = json.loads(cli("usage", "--json", "--series", "--since", "5m", "--bucket", "minute"))
    assert sum(p["requests"] for p in points) == 2 and len(points) >= 5
    table = cli("usage", "--format", "csv", "--model", "mac/x").splitlines()
    assert table[0].startswith("bucket_start,bucket_start_utc,key") and len(table) == 2 and ",mac/x," in table[1]


def test_claim_commands(tmp_path: Path) -> None:
    claim = tmp_path / "claim.yaml"
    claim.write_text(
        "kind: ModelClaim\nmetadata: {name: qwen}\nspec:\n  podSelector: {matchLabels: {pool: a}}\n"
        "  artifactURL: hf://Qwen/Qwen3-8B\n"
    )
    d = ["--data-dir", str(tmp_path / "data")]
    applied = run(["claim", "apply", "-f", str(claim), *d], tmp_path)
    assert applied.returncode == 0 and "modelclaim/qwen configured" in applied.stdout
    assert "qwen" in run(["claim", "list", *d], tmp_path).stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kind: ModelClaim\nmetadata: {name: x}\nspec: {podSelector: {matchLabels: {a: b}}, "
        "artifactURL: hf://x, engineConfig: {args: {--gpu-memory-utilization: '0.9'}}}\n"
    )
    refused = run(["claim", "apply", "-f", str(bad), *d], tmp_path)
    assert refused.returncode == 2 and "gpu-memory-utilization" in refused.stderr
    assert "x " not in run(["claim", "list", *d], tmp_path).stdout
    assert run(["claim", "delete", "qwen", *d], tmp_path).returncode == 0
    assert "Deleting" in run(["claim", "list", *d], tmp_path).stdout
    assert run(["claim", "delete", "nope", *d], tmp_path).returncode == 2
    # both changes are audited, with the actor, in the data dir's store; the refused ones are not
    db = Database(database_url(None, tmp_path / "data"))
    try:
        entries = list(reversed(AuditLog(db).entries(target="claim:")))
    finally:
        db.close()
    assert [(e.action, e.target, e.actor) for e in entries] == [
        ("claim.apply", "claim:qwen", f"cli:{getpass.getuser()}"),
        ("claim.delete", "claim:qwen", f"cli:{getpass.getuser()}"),
    ]
    applied_entry, deleted_entry = entries
    assert applied_entry.before is None and applied_entry.after["spec"]["artifactURL"] == "hf://Qwen/Qwen3-8B"
    assert deleted_entry.before["deleting"] is False and deleted_entry.after["deleting"] is True
    assert deleted_entry.after["metadata"]["uid"] == applied_entry.after["metadata"]["uid"]


def test_claim_commands_use_the_configs_data_dir(tmp_path: Path) -> None:
    """`turnout claim ... --config F` writes where a gateway started with F reads its claims (``-c`` too)."""
    from turnout.config import load_settings
    from turnout.controller.local import ClaimFiles

    config = tmp_path / "etc" / "turnout.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"storage": {"data_dir": "../state"}}))
    claim = tmp_path / "claim.yaml"
    claim.write_text(
        "kind: ModelClaim\nmetadata: {name: qwen}\nspec:\n  podSelector: {matchLabels: {pool: a}}\n"
        "  artifactURL: hf://Qwen/Qwen3-8B\n"
    )
    applied = run(["claim", "apply", "-f", str(claim), "--config", str(config)], tmp_path)
    assert applied.returncode == 0, applied.stderr
    seen_by_gateway = ClaimFiles(load_settings(config).data_dir)
    assert [d["metadata"]["name"] for d in seen_by_gateway.all()] == ["qwen"]
    assert not (tmp_path / "turnout-data").exists(), "nothing written to the default data dir"
    assert "qwen" in run(["claim", "list", "-c", str(config)], tmp_path).stdout
    assert run(["claim", "delete", "qwen", "-c", str(config)], tmp_path).returncode == 0
    assert "Deleting" in run(["claim", "list", "--config", str(config)], tmp_path).stdout
    missing = run(["claim", "list", "--config", str(tmp_path / "nope.json")], tmp_path)
    assert missing.returncode == 2 and "nope.json" in missing.stderr and "Traceback" not in missing.stderr


def test_claim_events_lists_what_the_controller_recorded(tmp_path: Path) -> None:
    from turnout.controller.local import ClaimFiles

    d = ["--data-dir", str(tmp_path / "data")]
    event = {
        "object": "Pool/gpu-0",
        "type": "Warning",
        "reason": "InvalidPoolPolicy",
        "message": "pool policy disabled: lifecycle: unknown field(s) ['x']",
        "count": 3,
        "firstTimestamp": "2026-12-03T08:00:00Z",
        "lastTimestamp": "2026-12-03T08:01:00Z",
    }
    ClaimFiles(tmp_path / "data").save_events([event])
    out = run(["claim", "events", *d], tmp_path)
    assert out.returncode == 0
    line = out.stdout.splitlines()[1]
    assert "InvalidPoolPolicy" in line and "Pool/gpu-0" in line and " 3 " in line and "unknown field" in line


def test_operator_needs_a_scope(tmp_path: Path) -> None:
    out = run(["operator", "--metrics-port", "0"], tmp_path)
    assert out.returncode == 2 and "--namespace" in out.stderr and "--all-namespaces" in out.stderr


def test_agent_refuses_a_bad_engine_python(tmp_path: Path) -> None:
    out = run(["agent", "--engine-python", "tgi=/usr/bin/python3", "--registry", str(tmp_path / "e.json")], tmp_path)
    assert out.returncode == 2 and "ENGINE=PATH" in out.stderr and "vllm" in out.stderr


# -- the admin API's input bounds, on the command line (in process: typer's runner, a real store) -----------
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["key", "create", "--app", "x", "--rpm", str(2**63)], "--rpm"),
        (["key", "create", "--app", "x", "--rpm", str(2**31)], "--rpm"),
        (["key", "create", "--app", "x", "--daily-tokens", str(2**31)], "--daily-tokens"),
        (["key", "create", "--app", "x", "--expires", "nan"], "--expires"),
        (["key", "create", "--app", "x", "--expires", "inf"], "--expires"),
        (["key", "create", "--app", "x", "--expires", "99999999d"], "--expires"),
        (["key", "create", "--app", "x\x01y"], "--app"),
        (["key", "create", "--app", "a" * 129], "--app"),
        (["key", "create", "--app", "x", "--tenant", "t\nu"], "--tenant"),
        (["key", "create", "--app", "x", "--models", "ok,m\x00"], "--models"),
        (["key", "rotate", "1", "--grace", "nan"], "--grace"),
        (["key", "rotate", "1", "--grace", "inf"], "--grace"),
        (["key", "rotate", "1", "--grace", "1e300"], "--grace"),
        (["usage", "--since", "nan"], "--since"),
        (["usage", "--since", "-inf"], "--since"),
        (["usage", "--bucket", "week"], "--bucket"),
        (["audit", "--limit", str(2**63)], "--limit"),
        (["audit", "--limit", "0"], "--limit"),
        (["audit", "--since", "1e999"], "--since"),
        (["endpoint", "add", "mac", "--url", "http://h", "--latency-budget-ms", str(2**40)], "--latency-budget-ms"),
        (["endpoint", "add", "mac", "--url", "http://h", "--latency-budget-ms", "0"], "--latency-budget-ms"),
        (["endpoint", "add", "mac", "--url", "http://h:99999"], "--url"),
        (["endpoint", "add", "mac", "--url", "http://h", "--api", "grpc"], "--api"),
        (["endpoint", "add", "mac", "--url", "http://h", "--fallback-model", "q*"], "--fallback-model"),
        (["endpoint", "add", "mac", "--url", "http://h", "--credential-from-env", "BAD_CRED"], "--credential-from-env"),
        (["endpoint", "add", "bad name", "--url", "http://h"], '"name"'),
        (["endpoint", "set", "mac", "--latency-budget-ms", "600001"], "--latency-budget-ms"),
        (["endpoint", "set", "mac", "--url", ""], "--url"),
        (["key", "edit", "1", "--rpm", "0"], "--rpm"),
        (["key", "edit", "1", "--rpm", "lots"], "--rpm"),
        (["key", "edit", "1", "--daily-tokens", str(2**31)], "--daily-tokens"),
        (["key", "edit", "1", "--models", "q*x"], "--models"),
        (["key", "edit", "1", "--expires", "someday"], "--expires"),
        (["key", "edit", "1"], "nothing to change"),
        (["key", "list", "--state", "sleeping"], "--state"),
        (["usage", "--format", "xml"], "--format"),
        (["usage", "--series", "--since", "30d", "--bucket", "minute"], "--bucket"),
    ],
)
def test_cli_refuses_what_the_admin_api_refuses(tmp_path: Path, args: list[str], flag: str) -> None:
    from typer.testing import CliRunner

    from turnout.cli import app

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"storage": {"data_dir": "state"}, "listen": {"port": free_port()}}))
    runner = CliRunner(env={"BAD_CRED": "k\r\nX-Injected: 1"})
    result = runner.invoke(app, [*args, "--config", str(config)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert flag in result.stderr and "Traceback" not in result.output, result.stderr
    listed = runner.invoke(app, ["key", "list", "--json", "--config", str(config)])
    assert json.loads(listed.stdout) == []
    assert json.loads(runner.invoke(app, ["endpoint", "list", "--json", "--config", str(config)]).stdout) == []
    assert json.loads(runner.invoke(app, ["audit", "--json", "--config", str(config)]).stdout) == []


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["serve", "--port", "70000"], "--port"),
        (["serve", "--port", "0"], "--port"),
        (["serve", "--host", "a b"], "--host"),
        (["serve", "--log-level", "loud"], "--log-level"),
        (["agent", "--port", "-1"], "--port"),
        (["controller", "--pools", "p.json", "--interval", "nan"], "--interval"),
        (["controller", "--pools", "p.json", "--interval", "inf"], "--interval"),
        (["controller", "--pools", "p.json", "--metrics-port", "65536"], "--metrics-port"),
        (["operator", "--all-namespaces", "--interval", "nan"], "--interval"),
        (["operator", "--all-namespaces", "--liveness-port", "99999"], "--liveness-port"),
    ],
)
def test_cli_refuses_out_of_range_options(tmp_path: Path, args: list[str], flag: str) -> None:
    from typer.testing import CliRunner

    from turnout.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert flag in result.stderr, result.stderr


def test_backup_create_and_restore(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"storage": {"data_dir": "state"}, "listen": {"port": free_port()}}))
    c = ["--config", str(config)]
    key = run(["key", "create", "--app", "web", *c], tmp_path).stdout.strip()
    assert key.startswith("tk_")
    created = run(["backup", "create", "-o", str(tmp_path / "b.zip"), *c], tmp_path)
    assert created.returncode == 0, created.stderr
    assert "b.zip" in created.stdout and "secret key is not in it" in created.stdout
    assert stat.S_IMODE((tmp_path / "b.zip").stat().st_mode) == 0o600
    default = run(["backup", "create", "--include-secret-key", *c], tmp_path)
    assert default.returncode == 0 and "no secret key yet" in default.stdout
    (tmp_path / "state" / "secret.key").write_text("cw_0x689RpI-jtRR7oE8h9Tg3bmVD8MhlC3OLBOgBHU=\n")
    with_key = run(["backup", "create", "--include-secret-key", "-o", str(tmp_path / "k.zip"), *c], tmp_path)
    assert with_key.returncode == 0 and "holds the secret key" in with_key.stdout
    assert len(list(tmp_path.glob("turnout-backup-*.zip"))) == 1

    assert run(["key", "revoke", key[:10], *c], tmp_path).returncode == 0
    restored = run(["backup", "restore", str(tmp_path / "b.zip"), *c], tmp_path)
    assert restored.returncode == 0, restored.stderr
    assert "restored  store" in restored.stdout and "unchanged config.json" in restored.stdout
    listing = run(["key", "list", *c], tmp_path).stdout
    assert key[:10] in listing and "revoked" not in listing
    audit = [e["action"] for e in json.loads(run(["audit", "--json", *c], tmp_path).stdout)]
    assert audit[:3] == ["backup.restore", "key.revoke", "backup.create"]  # later entries kept

    (tmp_path / "bad.zip").write_bytes((tmp_path / "b.zip").read_bytes()[:200])
    bad = run(["backup", "restore", str(tmp_path / "bad.zip"), *c], tmp_path)
    assert bad.returncode == 2 and "nothing was changed" in bad.stderr and "truncated" in bad.stderr
    missing = run(["backup", "restore", str(tmp_path / "nope.zip"), *c], tmp_path)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_backup_restore_refuses_while_the_gateway_runs(tmp_path: Path) -> None:
    with serving(tmp_path):
        created = run(["backup", "create", "-o", "b.zip", "--config", "turnout-data/config.json"], tmp_path)
        assert created.returncode == 0, created.stderr  # safe while it runs
        before = (tmp_path / "turnout-data" / "config.json").read_bytes()
        refused = run(["backup", "restore", "b.zip", "--config", "turnout-data/config.json"], tmp_path)
        assert refused.returncode == 2 and "a gateway is running" in refused.stderr
        assert (tmp_path / "turnout-data" / "config.json").read_bytes() == before
    restored = run(["backup", "restore", "b.zip", "--config", "turnout-data/config.json"], tmp_path)
    assert restored.returncode == 0, restored.stderr


def test_agent_engine_ports_default_to_aibrix_runtime_range() -> None:
    """AIBrix's runtime takes engine ports from range(20000, 21000) (model_runtime.py, ModelRuntime)."""
    import typer.main

    from turnout.cli import app

    agent = typer.main.get_command(app).commands["agent"]  # type: ignore[attr-defined]
    (ports,) = [p for p in agent.params if p.name == "engine_ports"]
    assert ports.default == "20000-20999"
