"""`turnout batch list|show|cancel` as a user runs them: through a real running gateway (`turnout serve`), and on
the store when none runs (a cancel written there is finished by the next gateway that takes the batch).

The worker is the Ollama emulator, slowed so that a batch runs long enough to be cancelled."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai

from tests.support.cli import gateway_url, run, serving, write_config
from tests.support.ollama_emulator import Behaviour, OllamaEmulator
from tests.support.threaded_gateway import LoopThread


def submit(url: str, key: str, lines: int) -> str:
    rows = [
        {
            "custom_id": f"l{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m:latest", "messages": [{"role": "user", "content": "hi"}]},
        }
        for n in range(lines)
    ]
    with openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as oa:
        data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
        uploaded = oa.files.create(file=("lines.jsonl", data), purpose="batch")
        return oa.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id


def listed(c: list[str], cwd: Path) -> list[dict[str, Any]]:
    done = run(["batch", "list", "--json", *c], cwd)
    assert done.returncode == 0, done.stderr
    views: list[dict[str, Any]] = json.loads(done.stdout)
    return views


def until(c: list[str], cwd: Path, batch_id: str, check: Any, limit_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while True:
        [view] = [v for v in listed(c, cwd) if v["id"] == batch_id]
        if check(view):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.2)


def test_batch_commands_through_the_gateway_and_on_the_store(tmp_path: Path) -> None:
    loop = LoopThread()
    emulator = OllamaEmulator("emu", Behaviour(models=["m:latest"], token_delay_s=0.02))
    loop.run(emulator.start)
    try:
        config = write_config(
            tmp_path / "config.json",
            workers=[{"name": "emu", "url": emulator.url}],
            batches={"poll_s": 0.2, "lease_s": 2, "lines_in_flight": 1},
        )
        c = ["--config", str(config)]
        key = run(["key", "create", "--app", "evals", *c], tmp_path).stdout.strip()
        with serving(config):
            quick = submit(gateway_url(config), key, 3)
            slow = submit(gateway_url(config), key, 400)
            done = until(c, tmp_path, quick, lambda v: v["status"] == "completed")
            assert (done["done"], done["progress"], done["app"], done["tenant"]) == (3, 1.0, "evals", "default")
            table = run(["batch", "list", *c], tmp_path)
            assert table.returncode == 0 and table.stderr == "", table.stderr
            lines = table.stdout.splitlines()
            assert lines[0].split() == ["ID", "APP", "STATE", "ANSWERED", "FAILED", "CREATED"]
            [row] = [line for line in lines if quick in line]
            assert row.split()[1:5] == ["evals", "completed", "3/3", "(100%)"]
            used = json.loads(run(["usage", "--json", "--batch", quick, *c], tmp_path).stdout)
            assert sum(r["requests"] for r in used) == 3  # each line a usage row tagged with its batch
            shown = run(["batch", "show", quick, *c], tmp_path)
            assert "answered   3 of 3 (100%): 3 in the output file, 0 in the error file" in shown.stdout
            assert f"output     {done['output_file_id']}" in shown.stdout
            assert "endpoint   /v1/chat/completions, model m:latest\n" in shown.stdout
            until(c, tmp_path, slow, lambda v: v["done"] >= 2)
            cancelled = run(["batch", "cancel", slow, *c], tmp_path)
            assert cancelled.returncode == 0 and cancelled.stdout.startswith(f"batch {slow}: cancel"), cancelled.stderr
            end = until(c, tmp_path, slow, lambda v: v["status"] == "cancelled")
            counts = end["request_counts"]
            assert counts["completed"] < 100 and counts["failed"] == 400 - counts["completed"]  # never sent: cancelled
            assert (end["done"], end["unanswered"]) == (counts["completed"], counts["failed"])
            shown = run(["batch", "show", slow, *c], tmp_path)
            answered = f"answered   {end['done']} of 400 ({end['progress']:.0%}): "
            assert answered in shown.stdout and f"({counts['failed']} of them never answered)" in shown.stdout
            again = run(["batch", "cancel", quick, *c], tmp_path)
            assert again.returncode == 2 and "completed: only a validating or in_progress batch" in again.stderr
            unknown = run(["batch", "show", "batch_nope", *c], tmp_path)
            assert unknown.returncode == 2 and "no batch batch_nope" in unknown.stderr
            for command in ("show", "cancel"):  # an empty id names no batch (it was the list's URL)
                empty = run(["batch", command, " ", *c], tmp_path)
                assert empty.returncode == 2 and "give the batch's id" in empty.stderr, empty.stderr
            nobody = run(["batch", "list", "--app", "nobody", *c], tmp_path)
            assert nobody.returncode == 0 and nobody.stdout.startswith("no batch with app nobody"), nobody.stdout
            third = submit(gateway_url(config), key, 400)
            until(c, tmp_path, third, lambda v: v["done"] >= 2)
        # no gateway: the store (the third batch was left in progress by the stopped gateway)
        offline = run(["batch", "list", *c], tmp_path)
        assert offline.returncode == 0 and "no gateway" in offline.stderr
        assert {line.split()[0] for line in offline.stdout.splitlines()[1:]} == {quick, slow, third}
        stored = run(["usage", "--json", "--batch", quick, *c], tmp_path)
        assert "no gateway" in stored.stderr and sum(r["requests"] for r in json.loads(stored.stdout)) == 3
        stopped = run(["batch", "cancel", third, *c], tmp_path)
        assert stopped.returncode == 0 and stopped.stdout.startswith(f"batch {third}: cancelling"), stopped.stderr
        audit = json.loads(run(["audit", "--json", "--action", "batch.cancel", *c], tmp_path).stdout)
        assert [(e["target"], e["actor"].startswith("cli:")) for e in audit] == [
            (f"batch:{third}", True),
            (f"batch:{slow}", True),
        ]
        with serving(config):  # the next gateway finishes the cancel
            until(c, tmp_path, third, lambda v: v["status"] == "cancelled")
    finally:
        loop.run(emulator.stop)
        loop.stop()
