"""`turnout endpoint ...` as a user runs it: through a real running gateway (`turnout serve`), and on the
store when none runs. The endpoint is a real llama.cpp server (OpenAI API) on the tiny generated model."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Engine, free_port
from tests.support.cli import call, gateway_url, run, serving, write_config

OPT_IN = {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"}


def _config(tmp_path: Path) -> tuple[Path, list[str]]:
    dead = f"http://127.0.0.1:{free_port()}"
    config = write_config(
        tmp_path / "config.json",
        health={"timeout_s": 2, "interval_s": 3600},
        workers=[{"name": "box", "url": dead, "type": "ollama"}],
    )
    return config, ["--config", str(config)]


def test_endpoint_commands_act_through_the_running_gateway(tmp_path: Path, llama_engine: Engine) -> None:
    config, c = _config(tmp_path)
    with serving(config, **OPT_IN):  # the private-network opt-in is the gateway's, not this shell's
        added = run(["endpoint", "add", "lab", "--url", f"{llama_engine.url}/v1/", *c], tmp_path, SECRET="one")
        assert added.returncode == 0, added.stderr
        assert f"using {llama_engine.url} (dropped /v1/)" in added.stderr
        assert "no gateway" not in added.stderr
        assert "lab: online" in added.stdout and "tiny" in added.stdout  # tested from the gateway
        key = added.stdout.splitlines()[0]
        assert key.startswith("tk_")
        # the gateway's live state changed at once: the printed key reaches the endpoint's model
        status, body = call(f"{gateway_url(config)}/v1/models", key)
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["lab/tiny"]
        # and at the endpoint's own URL, which the gateway's answer named, by the model's own name
        own = f"{gateway_url(config)}/endpoints/lab/v1"
        assert f"{own} (OpenAI)" in added.stderr
        status, body = call(f"{own}/models", key)
        assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["tiny"]

        listed = run(["endpoint", "list", *c], tmp_path)
        assert listed.returncode == 0, listed.stderr
        header, row, url_line = listed.stdout.splitlines()[:3]
        assert header.split() == ["NAME", "API", "STATE", "SINCE", "LATENCY", "MODELS"]
        assert row.split()[:3] == ["lab", "openai", "online"] and " ms " in row and row.endswith("tiny")
        assert url_line.strip() == llama_engine.url
        assert max(len(line) for line in listed.stdout.splitlines()) <= 80
        [view] = json.loads(run(["endpoint", "list", "--json", *c], tmp_path).stdout)
        assert view["state"] == "online" and view["state_since"] and view["models"] == ["lab/tiny"]
        assert view["url"] == llama_engine.url

        tested = run(["endpoint", "test", "lab", *c], tmp_path)
        assert tested.returncode == 0 and "lab: online" in tested.stdout, tested.stderr
        dry = run(["endpoint", "test", "--url", f"{llama_engine.url}/v1", *c], tmp_path)
        assert dry.returncode == 0 and "online" in dry.stdout, dry.stderr

        # one rule for names: a configured worker's name is refused, as the admin API refuses it
        clash = run(["endpoint", "add", "box", "--url", llama_engine.url, *c], tmp_path)
        assert clash.returncode == 2 and "configured worker" in clash.stderr

        # a new credential in place of the old one shows in the audit as "replaced", never the value
        for value in ("first-secret", "second-secret"):
            changed = run(["endpoint", "set", "lab", "--credential-from-env", "SECRET", *c], tmp_path, SECRET=value)
            assert changed.returncode == 0, changed.stderr
        audit = run(["audit", "--action", "endpoint.change", *c], tmp_path)
        lines = audit.stdout.splitlines()
        assert lines[0].split() == ["TIME", "ACTOR", "ACTION", "TARGET"]
        assert lines[1].split()[2:] == ["cli:" + lines[1].split()[2][4:], "endpoint.change", "endpoint:lab"]
        assert lines[2].strip() == "credential: replaced" and lines[4].strip() == "credential: none -> set"
        assert "secret" not in audit.stdout and all(len(line) <= 80 for line in lines)
        entries = json.loads(run(["audit", "--json", *c], tmp_path).stdout)
        assert "second-secret" not in json.dumps(entries)
        assert all(e["actor"].startswith("cli:") for e in entries), entries  # who ran the command
        actions = [e["action"] for e in entries if e["action"] != "admin.signin"]
        # oldest last: the starter key `serve` printed, the registration and the key `endpoint add` printed
        assert actions[-3:] == ["key.create", "endpoint.register", "key.create"]
        created = [e["after"]["app"] for e in entries if e["action"] == "key.create"]
        assert created == ["endpoint-lab", "starter"]

        removed = run(["endpoint", "remove", "lab", *c], tmp_path)
        assert removed.returncode == 0 and f"revoked keys {key[:10]}" in removed.stdout, removed.stderr
        assert call(f"{gateway_url(config)}/v1/models", key)[0] == 401  # at once


def test_endpoint_commands_work_on_the_store_when_no_gateway_runs(tmp_path: Path, llama_engine: Engine) -> None:
    config, c = _config(tmp_path)
    added = run(["endpoint", "add", "lab", "--url", f"{llama_engine.url}/v1", *c], tmp_path, **OPT_IN)
    assert added.returncode == 0, added.stderr
    notice = [line for line in added.stderr.splitlines() if "no gateway" in line]
    assert notice == [
        f"turnout: no gateway at {gateway_url(config)} (connection refused); working on the store in "
        f"{tmp_path / 'state'} directly"
    ]
    assert f"using {llama_engine.url} (dropped /v1)" in added.stderr and "lab: online" in added.stdout
    [view] = json.loads(run(["endpoint", "list", "--json", *c], tmp_path).stdout)
    assert view["url"] == llama_engine.url  # stored without the suffix
    listed = run(["endpoint", "list", *c], tmp_path).stdout.splitlines()
    assert listed[1].split()[:3] == ["lab", "openai", "-"] and "running gateway" in listed[-1]

    clash = run(["endpoint", "add", "box", "--url", llama_engine.url, *c], tmp_path)
    assert clash.returncode == 2 and "configured worker" in clash.stderr
    for value in ("first-secret", "second-secret"):
        assert run(["endpoint", "set", "lab", "--credential-from-env", "S", *c], tmp_path, S=value).returncode == 0
    [latest] = json.loads(run(["audit", "--json", "--action", "endpoint.change", "--limit", "1", *c], tmp_path).stdout)
    assert latest["after"]["credential"] == "replaced" and latest["before"]["credential"] is True
    actions = [e["action"] for e in json.loads(run(["audit", "--json", *c], tmp_path).stdout)]
    assert actions[-2:] == ["key.create", "endpoint.register"]

    # the same registration is then served by a gateway that starts later
    with serving(config, **OPT_IN):
        [view] = json.loads(run(["endpoint", "list", "--json", *c], tmp_path).stdout)
        assert view["name"] == "lab" and view["state"] in ("online", "unknown")
