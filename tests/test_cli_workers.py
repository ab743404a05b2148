"""`turnout worker add|list|remove`: the real command on real config files, a real store, a real gateway."""

from __future__ import annotations

import getpass
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.support.cli import TURNOUT
from tests.support.served import Served


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_")}
    return subprocess.run([*TURNOUT, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env={**clean, **env})


CONFIG = {
    "listen": {"host": "127.0.0.1", "port": 8080},
    "storage": {"data_dir": "state"},
    "routing": {"max_concurrent": 64, "model_max_concurrent": {"qwen3:*": 2}},
    "workers": [
        {
            "name": "node-1",
            "url": "http://10.10.11.10:11434",
            "type": "ollama",
            "model_placement": {"mode": "whitelist", "allowed_models": ["qwen3:*"], "denied_models": []},
        }
    ],
}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG, indent=4))
    path.chmod(0o600)  # it may hold a worker's api_key
    return path


def test_add_list_remove_keep_the_rest_of_the_file(tmp_path: Path, config: Path) -> None:
    c = ["--config", str(config)]
    added = run(["worker", "add", "gpu-box", "--url", "http://10.0.0.5:8000", "--type", "openai", *c], tmp_path)
    assert added.returncode == 0, added.stderr
    assert 'added worker "gpu-box"' in added.stdout and "the next `turnout serve` uses it" in added.stdout
    document = json.loads(config.read_text())
    assert list(document) == list(CONFIG)  # same sections, same order
    assert {k: v for k, v in document.items() if k != "workers"} == {k: v for k, v in CONFIG.items() if k != "workers"}
    assert document["workers"] == [
        *CONFIG["workers"],
        {"name": "gpu-box", "url": "http://10.0.0.5:8000", "type": "openai"},
    ]
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert run(["config", "check", *c], tmp_path).returncode == 0

    listed = run(["worker", "list", *c], tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "MAX", "PLACEMENT", "URL"]
    assert lines[1].split() == ["node-1", "ollama", "-", "whitelist", "http://10.10.11.10:11434"]
    assert lines[2].split() == ["gpu-box", "openai", "-", "allow_all", "http://10.0.0.5:8000"]
    as_json = json.loads(run(["worker", "list", "--json", *c], tmp_path).stdout)
    assert [w["name"] for w in as_json] == ["node-1", "gpu-box"]

    removed = run(["worker", "remove", "node-1", *c], tmp_path)
    assert removed.returncode == 0, removed.stderr
    document = json.loads(config.read_text())
    assert [w["name"] for w in document["workers"]] == ["gpu-box"]
    assert document["routing"] == CONFIG["routing"]
    assert not list(tmp_path.glob(".config.json.*"))  # the atomic writer left no temporary file


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["add", "node-1", "--url", "http://h:11434"], 'already has a worker "node-1"'),
        (["add", "x", "--url", "not a url"], "--url: "),
        (["add", "x", "--url", "ftp://h"], "--url: "),
        (["add", "x", "--url", "http://h", "--type", "grpc"], "--type: Input should be 'ollama' or 'openai'"),
        (["add", "bad name", "--url", "http://h"], "NAME: use letters, digits"),
        (["add", "x", "--url", "http://h", "--max-concurrent", "0"], "--max-concurrent: "),
        (["remove", "nope"], 'has no worker "nope"'),
    ],
)
def test_refused_changes_write_nothing(tmp_path: Path, config: Path, args: list[str], says: str) -> None:
    before = config.read_bytes()
    result = run(["worker", *args, "--config", str(config)], tmp_path)
    assert result.returncode == 2, result.stdout
    assert says in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert config.read_bytes() == before


def test_a_pasted_api_suffix_is_dropped_and_said(tmp_path: Path, config: Path) -> None:
    added = run(
        ["worker", "add", "lmstudio", "--url", "http://10.0.0.7:1234/v1/", "--type", "openai", "-c", str(config)],
        tmp_path,
    )
    assert added.returncode == 0, added.stderr
    assert "dropped /v1/" in added.stdout
    assert json.loads(config.read_text())["workers"][-1]["url"] == "http://10.0.0.7:1234"


def test_a_broken_config_is_not_edited(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"workers": [{"name": "a", "url": "http://h", "model_placement": {"mode": "x"}}]}))
    before = config.read_bytes()
    result = run(["worker", "add", "b", "--url", "http://h2", "--config", str(config)], tmp_path)
    assert result.returncode == 2 and "workers[0].model_placement.mode" in result.stderr
    assert "turnout config check" in result.stderr
    assert config.read_bytes() == before
    missing = run(["worker", "list", "--config", str(tmp_path / "nope.json")], tmp_path)
    assert missing.returncode == 2 and "turnout serve" in missing.stderr


def test_a_registered_endpoint_name_is_refused(tmp_path: Path, config: Path) -> None:
    c = ["--config", str(config)]
    port = free_port()  # nothing listens: the registration is stored all the same
    registered = run(
        ["endpoint", "add", "mac", "--url", f"http://127.0.0.1:{port}", "--api", "ollama", *c],
        tmp_path,
        APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS="true",
    )
    assert registered.returncode in (0, 1), registered.stderr  # stored; the check of it may fail
    before = config.read_bytes()
    refused = run(["worker", "add", "mac", "--url", "http://h:11434", *c], tmp_path)
    assert refused.returncode == 2 and "registered endpoint" in refused.stderr, refused.stderr
    assert config.read_bytes() == before
    assert run(["worker", "add", "studio", "--url", "http://h:11434", *c], tmp_path).returncode == 0


def test_an_unreachable_store_refuses_the_change(tmp_path: Path) -> None:
    """Every change to routing is audited: a change whose audit entry cannot be written is not made."""
    config = tmp_path / "config.json"
    url = f"postgresql://turnout:x@127.0.0.1:{free_port()}/turnout"  # nothing listens there
    config.write_text(json.dumps({"storage": {"data_dir": "state", "database_url": url}}))
    before = config.read_bytes()
    result = run(["worker", "add", "gpu", "--url", "http://h:11434", "--config", str(config)], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "not changed: every change to the workers is audited" in result.stderr, result.stderr
    assert "x@" not in result.stderr and "Traceback" not in result.stderr  # the password stays out of it
    assert config.read_bytes() == before


def test_add_and_remove_are_audited_with_the_actor(tmp_path: Path, config: Path) -> None:
    c = ["--config", str(config)]
    # a URL with a password is refused (the credential belongs in api_key), said without it, and not audited
    refused = run(
        ["worker", "add", "gpu-box", "--url", "http://u:secret@10.0.0.5:8000", "--type", "openai", *c], tmp_path
    )
    assert refused.returncode == 2 and "user or password" in refused.stderr and "secret" not in refused.stderr
    added = run(["worker", "add", "gpu-box", "--url", "http://10.0.0.5:8000", "--type", "openai", *c], tmp_path)
    assert added.returncode == 0, added.stderr
    document = json.loads(config.read_text())
    document["workers"][0]["api_key"] = "sk-worker-secret"  # as an operator would put it there by hand
    config.write_text(json.dumps(document))
    removed = run(["worker", "remove", "node-1", *c], tmp_path)
    assert removed.returncode == 0, removed.stderr
    audit = run(["audit", "--json", "--target", "worker:", *c], tmp_path)
    assert audit.returncode == 0, audit.stderr
    entries = {e["action"]: e for e in json.loads(audit.stdout)}
    assert set(entries) == {"worker.add", "worker.remove"}
    user = getpass.getuser()
    add, remove = entries["worker.add"], entries["worker.remove"]
    assert (add["actor"], add["target"], add["before"]) == (f"cli:{user}", "worker:gpu-box", None)
    assert add["after"] == {"name": "gpu-box", "url": "http://10.0.0.5:8000", "type": "openai"}
    assert (remove["actor"], remove["target"], remove["after"]) == (f"cli:{user}", "worker:node-1", None)
    assert remove["before"]["name"] == "node-1" and remove["before"]["api_key_set"] is True
    assert "secret" not in audit.stdout  # neither the key nor the URL's password
    # a refused change is not audited
    assert run(["worker", "remove", "nope", *c], tmp_path).returncode == 2
    assert len(json.loads(run(["audit", "--json", "--target", "worker:", *c], tmp_path).stdout)) == 2


def test_a_running_gateway_is_told_to_restart(tmp_path: Path, config: Path) -> None:
    c = ["--config", str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_")}
    gateway = Served([*TURNOUT, "serve", *c, "--port", str(free_port())], tmp_path, env)
    try:
        gateway.wait_for("serving on")
        added = run(["worker", "add", "gpu", "--url", "http://h:11434", *c], tmp_path)
        assert added.returncode == 0, added.stderr
        assert "a gateway is running" in added.stdout and "restart it" in added.stdout
        removed = run(["worker", "remove", "gpu", *c], tmp_path)
        assert "a gateway is running" in removed.stdout
        assert gateway.stop() == 0
    finally:
        gateway.kill()
    after = run(["worker", "add", "gpu", "--url", "http://h:11434", *c], tmp_path)
    assert "no gateway is running" in after.stdout


def test_list_shows_what_a_running_gateway_knows(tmp_path: Path) -> None:
    """With the config's gateway running, each worker's health and what its engine runs at once (and how that was
    found); without, the config's columns and one line saying why."""
    from tests.support.cli import serving, write_config

    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens: down, and nothing learned of it
    config = write_config(
        tmp_path / "config.json",
        workers=[
            {"name": "quiet", "url": nobody, "type": "openai"},
            {"name": "wide", "url": nobody, "type": "openai", "slots": 4},
        ],
    )
    c = ["--config", str(config)]
    with serving(config):
        listed = run(["worker", "list", *c], tmp_path)
        as_json = json.loads(run(["worker", "list", "--json", *c], tmp_path).stdout)
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "MAX", "PLACEMENT", "HEALTH", "AT", "ONCE", "URL"]
    assert lines[1].split() == ["quiet", "openai", "-", "allow_all", "down", "1", "(assumed)", nobody]
    assert lines[2].split() == ["wide", "openai", "-", "allow_all", "down", "4", "(declared)", nobody]
    quiet = as_json[0]["parallelism"]["*"]
    assert quiet["slots"] == 1 and quiet["source"] == "assumed" and "until" in quiet["why"]
    stopped = run(["worker", "list", *c], tmp_path)
    assert stopped.stdout.splitlines()[0].split() == ["NAME", "TYPE", "MAX", "PLACEMENT", "URL"]
    assert "no gateway at" in stopped.stderr and "showing the config's workers only" in stopped.stderr
