"""A batch survives its gateway: real `turnout serve` processes killed with SIGKILL in the middle of a batch, and a
real llama.cpp engine answering the lines.

- One gateway, killed twice mid-batch and started again each time: the batch resumes where it stopped and, in the
  end, every line of the input file has exactly one answer in the output file.
- Two replicas on one store (SQLite with the SQL lease; PostgreSQL with the lease in Redis): the one running the
  batch is killed, twice, and the other takes the batch over once the lease lapses.

"Exactly once" is what :mod:`turnout.gateway.batch_runner` says: one answer per line in the files, whatever was in
flight when a process died (such a line is sent again, and its first answer, never written, is lost).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import Engine, free_port, fresh_postgres_database, start_llama
from tests.support.cli import TURNOUT, _env

LINES = 300


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    started = start_llama(tiny_model, "tiny", tmp_path_factory.mktemp("llama-durable") / "server.log")
    yield started
    started.stop()


class Gateway:
    """A `turnout serve` process; its output goes to a file (read when a test fails)."""

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*TURNOUT, "serve", "--config", str(config), "--port", str(port)],
                cwd=config.parent,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_env({"TURNOUT_ADMIN_TOKEN": "admin-token"}),
            )
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"turnout serve exited: {log.read_text()[-3000:]}"
            try:
                import urllib.request

                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1):
                    return
            except OSError:
                assert time.monotonic() < deadline, "turnout serve did not answer in 60 s"
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, no lease given back."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def gateways() -> Iterator[list[Gateway]]:
    started: list[Gateway] = []
    try:
        yield started
    finally:
        for gw in started:
            gw.stop()


def write_config(tmp: Path, engine: Engine, **storage: Any) -> Path:
    config = tmp / "config.json"
    config.write_text(
        json.dumps(
            {
                "storage": {"data_dir": "state", **storage},
                "health": {"interval_s": 3600},
                "workers": [{"name": "llama", "url": engine.url, "type": "openai"}],
                "batches": {"poll_s": 0.2, "lease_s": 2, "lines_in_flight": 4},
            }
        )
    )
    return config


def new_key(config: Path) -> str:
    made = subprocess.run(
        [*TURNOUT, "key", "create", "--app", "evals", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env({}),
        check=True,
    )
    return made.stdout.strip()


def submit(url: str, key: str) -> str:
    lines = [
        {
            "custom_id": f"line-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": f"count {n}"}], "max_tokens": 12},
        }
        for n in range(LINES)
    ]
    with openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as oa:
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        uploaded = oa.files.create(file=("lines.jsonl", data), purpose="batch")
        return oa.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id


def wait_for(url: str, key: str, batch_id: str, done_at_least: int | None, limit_s: float = 120) -> Any:
    """Poll until ``done_at_least`` lines are answered (None: until the batch ended)."""
    deadline = time.monotonic() + limit_s
    last = None
    with openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as oa:
        while time.monotonic() < deadline:
            last = oa.batches.retrieve(batch_id)
            if _reached(last, done_at_least):
                return last
            time.sleep(0.02)
    raise AssertionError(f"batch {batch_id}: not there in {limit_s} s: {last}")


def _reached(batch: Any, done_at_least: int | None) -> bool:
    counts = batch.request_counts
    answered = counts.completed + counts.failed
    if done_at_least is None:
        return batch.status in ("completed", "failed", "expired", "cancelled")
    if answered >= done_at_least:
        assert answered < LINES, "the batch ended before the gateway could be killed mid-way: make it longer"
        return True
    return False


def runner_pid(database: str, batch_id: str) -> int | None:
    """The pid of the process that holds the batch's SQL lease (``host:pid:random``), if any."""
    from turnout.store.batches import BatchStore
    from turnout.store.db import Database

    db = Database(database)
    try:
        record = BatchStore(db).batch(batch_id)
    finally:
        db.close()
    return int(record.runner.split(":")[1]) if record is not None and record.runner else None


def every_line_once(url: str, key: str, batch: Any) -> None:
    assert batch.status == "completed", batch
    assert batch.request_counts.total == LINES
    assert (batch.request_counts.completed, batch.request_counts.failed) == (LINES, 0)
    with openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as oa:
        text = oa.files.content(batch.output_file_id).text
        assert batch.error_file_id is None
    out = [json.loads(line) for line in text.splitlines()]
    assert len(out) == LINES
    assert [o["custom_id"] for o in out] == [f"line-{n}" for n in range(LINES)]  # each once, in the file's order
    assert len({o["id"] for o in out}) == LINES
    for o in out:
        assert o["response"]["status_code"] == 200, o
        openai.types.chat.ChatCompletion.model_validate(o["response"]["body"])


def billed_lines(url: str, batch_id: str) -> int:
    """Requests with a 200 that the usage API counts for the batch's lines."""
    request = urllib.request.Request(
        f"{url}/admin/api/usage?since=1h&batch={batch_id}", headers={"Authorization": "Bearer admin-token"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        rows = json.load(resp)["rows"]
    return sum(int((r.get("statuses") or {}).get("200", 0)) for r in rows)


def test_sigkill_twice_mid_batch_then_every_line_answered_once(engine: Engine, tmp_path: Path) -> None:
    config = write_config(tmp_path, engine)
    key = new_key(config)
    port = free_port()
    with gateways() as started:
        started.append(first := Gateway(config, port, tmp_path / "gateway.log"))
        batch_id = submit(first.url, key)
        for at in (LINES // 5, 2 * LINES // 5):
            wait_for(first.url, key, batch_id, at)
            first.kill()
            started.append(first := Gateway(config, port, tmp_path / "gateway.log"))
        done = wait_for(first.url, key, batch_id, None)
        every_line_once(first.url, key, done)
        billed = billed_lines(first.url, batch_id)
    assert billed >= LINES, billed  # every answer kept has its usage row (written before it); a line sent again
    # after a kill may be billed twice (its engine ran it twice)
    log = (tmp_path / "gateway.log").read_text()
    assert log.count(f"running batch {batch_id}") == 3, log[-3000:]


def test_a_replicas_death_hands_the_batch_to_another_sqlite(engine: Engine, tmp_path: Path) -> None:
    replicas_killed_twice(engine, tmp_path, f"sqlite:///{tmp_path / 'state' / 'turnout.db'}", None)


def test_a_replicas_death_hands_the_batch_to_another_postgresql_redis_lease(
    engine: Engine, tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    with fresh_postgres_database(postgres_url) as database:
        replicas_killed_twice(engine, tmp_path, database, redis_url)


def runner(replicas: list[Gateway], database: str, batch_id: str, in_redis: bool, limit_s: float = 60) -> Gateway:
    """The live replica that runs the batch. Just after a kill the SQL lease still names the dead one until another
    takes the batch over (the batch may already be past the next kill's line count by then)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if in_redis:  # the lease is in Redis: the replica that says it runs the batch (each has its own log)
            found = [g for g in replicas if f"running batch {batch_id}" in g.log.read_text()]
        else:
            pid = runner_pid(database, batch_id)
            found = [g for g in replicas if g.proc.pid == pid]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no live replica took batch {batch_id} over in {limit_s} s")


def replicas_killed_twice(engine: Engine, tmp_path: Path, database: str, redis_url: str | None) -> None:
    """Two replicas on one store; the one running the batch is killed, twice (a new replica starts each time)."""
    storage: dict[str, Any] = {}
    if redis_url is not None:
        storage = {"database_url": database, "redis_url": redis_url}
    config = write_config(tmp_path, engine, **storage)
    key = new_key(config)
    with gateways() as replicas:
        for n in range(2):
            replicas.append(Gateway(config, free_port(), tmp_path / f"replica{n}.log"))
        batch_id = submit(replicas[0].url, key)
        for kill, at in enumerate((LINES // 5, 2 * LINES // 5)):
            wait_for(replicas[0].url, key, batch_id, at)
            running = runner(replicas, database, batch_id, redis_url is not None)
            running.kill()
            replicas.remove(running)
            replicas.append(Gateway(config, free_port(), tmp_path / f"replica{kill + 2}.log"))
        done = wait_for(replicas[0].url, key, batch_id, None)
        every_line_once(replicas[0].url, key, done)
