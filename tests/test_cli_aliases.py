"""`turnout alias list|set|remove` as a user runs it: on the store while no gateway runs, then through a real
running gateway (`turnout serve`) whose worker is a real llama.cpp server on the tiny generated model."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from tests.conftest import Engine
from tests.support.cli import call, gateway_url, run, serving, write_config


def _chat(config: Path, model: str) -> tuple[int, dict[str, object]]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()
    request = urllib.request.Request(
        f"{gateway_url(config)}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


def test_alias_commands_on_the_store_then_through_the_gateway(tmp_path: Path, llama_engine: Engine) -> None:
    config = write_config(
        tmp_path / "config.json",
        auth={"open": True},
        health={"timeout_s": 2, "interval_s": 3600},
        workers=[{"name": "llama", "url": llama_engine.url, "type": "openai"}],
        aliases={"gpt-5-codex": "tiny"},
    )
    c = ["--config", str(config)]

    # no gateway: the store, under the admin API's rules
    made = run(["alias", "set", "claude-sonnet-4-5", "tiny", *c], tmp_path)
    assert made.returncode == 0, made.stderr
    assert "no gateway" in made.stderr and "working on the store" in made.stderr
    assert json.loads(made.stdout)["model"] == "tiny" and json.loads(made.stdout)["source"] == "runtime"
    chained = run(["alias", "set", "sonnet", "claude-sonnet-4-5", *c], tmp_path)
    assert chained.returncode == 2 and 'point "sonnet" at "tiny" instead' in chained.stderr, chained.stderr
    pattern = run(["alias", "set", "claude-*", "tiny", *c], tmp_path)
    assert pattern.returncode == 2 and "not a pattern" in pattern.stderr and "--name" not in pattern.stderr
    in_config = run(["alias", "remove", "gpt-5-codex", *c], tmp_path)
    assert in_config.returncode == 2 and "set in the config file" in in_config.stderr, in_config.stderr
    listed = run(["alias", "list", *c], tmp_path)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["ALIAS", "MODEL", "SOURCE", "SERVED", "BY"]
    assert [line.split()[:3] for line in lines[1:3]] == [
        ["claude-sonnet-4-5", "tiny", "runtime"],
        ["gpt-5-codex", "tiny", "config"],
    ]
    assert "known to a running gateway only" in listed.stdout

    with serving(config) as output:
        # the alias written while no gateway ran is in force from the start
        status, answer = _chat(config, "claude-sonnet-4-5")
        assert status == 200 and answer["model"], answer
        # through the running gateway: in force at the next request, no store fallback
        made = run(["alias", "set", "sonnet", "tiny", *c], tmp_path)
        assert made.returncode == 0 and "no gateway" not in made.stderr, made.stderr
        assert json.loads(made.stdout)["workers"] == ["llama"]
        assert _chat(config, "sonnet")[0] == 200
        status, body = call(f"{gateway_url(config)}/v1/models")
        assert [m["id"] for m in json.loads(body)["data"]] == ["claude-sonnet-4-5", "gpt-5-codex", "sonnet", "tiny"]
        listed = run(["alias", "list", *c], tmp_path)
        assert listed.returncode == 0 and "no gateway" not in listed.stderr
        assert [line.split() for line in listed.stdout.splitlines()[1:4]] == [
            ["claude-sonnet-4-5", "tiny", "runtime", "llama"],
            ["gpt-5-codex", "tiny", "config", "llama"],
            ["sonnet", "tiny", "runtime", "llama"],
        ]
        views = json.loads(run(["alias", "list", "--json", *c], tmp_path).stdout)
        assert {v["name"]: v["source"] for v in views} == {
            "claude-sonnet-4-5": "runtime",
            "gpt-5-codex": "config",
            "sonnet": "runtime",
        }
        chained = run(["alias", "set", "opus", "sonnet", *c], tmp_path)
        assert chained.returncode == 2 and "aliases do not chain" in chained.stderr, chained.stderr
        over = run(["alias", "set", "gpt-5-codex", "sonnet", *c], tmp_path)
        assert over.returncode == 2 and "is itself an alias" in over.stderr
        gone = run(["alias", "remove", "sonnet", *c], tmp_path)
        assert gone.returncode == 0 and gone.stdout.strip() == "removed sonnet", gone.stderr
        status, answer = _chat(config, "sonnet")
        assert status == 404, answer
    assert not any("Traceback" in line for line in output), output

    # who did what: the CLI's user on the store and through the gateway alike
    entries = json.loads(run(["audit", "--json", "--action", "alias.set", *c], tmp_path).stdout)
    assert [(e["target"], e["actor"][:4]) for e in entries] == [
        ("alias:sonnet", "cli:"),
        ("alias:claude-sonnet-4-5", "cli:"),
    ]
    removed = json.loads(run(["audit", "--json", "--action", "alias.remove", *c], tmp_path).stdout)
    assert [e["before"] for e in removed] == [{"model": "tiny", "source": "runtime"}]
    # no gateway again: removing on the store
    gone = run(["alias", "remove", "claude-sonnet-4-5", *c], tmp_path)
    assert gone.returncode == 0 and "removed claude-sonnet-4-5" in gone.stdout, gone.stderr
    missing = run(["alias", "remove", "claude-sonnet-4-5", *c], tmp_path)
    assert missing.returncode == 2 and 'no alias "claude-sonnet-4-5"' in missing.stderr
