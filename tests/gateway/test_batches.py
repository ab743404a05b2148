"""The OpenAI Batch API end to end: the official openai SDK (``files.create``, ``batches.create/retrieve/list/
cancel``, ``files.content`` and the SDK's own parsing of what comes back) against a real gateway and a real llama.cpp
engine (the tiny generated model: gibberish, but real tokens and usage), and the Ollama emulator where a worker must
misbehave on purpose.

Each line runs through the normal path: the key's scopes (a line for a model the key may not use is that line's 403
error line), placement, routing, limits (daily tokens count, the rate does not stall the batch), usage rows tagged with
the batch's id, and the dispatcher's ``batch`` priority.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import (
    ADMIN_TOKEN,
    EmulatorFactory,
    Engine,
    Gateway,
    GatewayFactory,
    create_key,
    eventually,
    start_llama,
    worker,
)
from tests.gateway.test_usage_accounting import usage_rows
from turnout.gateway.dispatch import Dispatcher
from turnout.gateway.keys import DISPATCHER

FAST = {"poll_s": 0.2, "lease_s": 3}


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    started = start_llama(
        tiny_model, "tiny", tmp_path_factory.mktemp("llama-batches") / "server.log", "--embedding", "--parallel", "2"
    )
    yield started
    started.stop()


def client(gw: Gateway, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def chat_line(custom_id: str, model: str = "tiny", content: str = "hello", **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **body},
    }


async def finished(oa: openai.AsyncOpenAI, batch_id: str, limit_s: float = 60) -> Any:
    async def ended() -> Any:
        batch = await oa.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "expired", "cancelled") else None

    return await eventually(ended, f"batch {batch_id} to end", limit_s)


async def run_chat_batch(oa: openai.AsyncOpenAI, lines: list[dict[str, Any]]) -> Any:
    """Upload ``lines`` and create their chat completions batch (a 24 h window)."""
    uploaded = await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    return await oa.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")


async def until_answered(oa: openai.AsyncOpenAI, batch_id: str, count: int, what: str, limit_s: float = 60) -> None:
    """Wait (bounded) until ``count`` of the batch's lines are in its output file."""

    async def enough() -> bool:
        got = await oa.batches.retrieve(batch_id)
        return bool(got.request_counts and got.request_counts.completed >= count)

    await eventually(enough, what, limit_s=limit_s)


async def lines_of(oa: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await oa.files.content(file_id)
    return [json.loads(line) for line in content.text.splitlines()]


async def test_openai_sdk_runs_a_batch_of_every_kind_of_line(engine: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False}, batches=FAST)
    record, key = create_key(gw, app="evals")
    kinds = {
        "/v1/chat/completions": [chat_line(f"chat-{n}", content=f"question {n}") for n in range(5)],
        "/v1/completions": [
            {
                "custom_id": "c-1",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "tiny", "prompt": "a", "max_tokens": 3},
            }
        ],
        "/v1/embeddings": [
            {
                "custom_id": "e-1",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "tiny", "input": "some text"},
            }
        ],
        "/v1/responses": [
            {
                "custom_id": "r-1",
                "method": "POST",
                "url": "/v1/responses",
                "body": {"model": "tiny", "input": "hi", "max_output_tokens": 4},
            }
        ],
    }
    async with client(gw, key) as oa:
        for endpoint, lines in kinds.items():
            uploaded = await oa.files.create(file=("requests.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
            assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
            assert uploaded.filename == "requests.jsonl" and uploaded.expires_at is not None
            batch = await oa.batches.create(
                input_file_id=uploaded.id,
                endpoint=endpoint,  # type: ignore[arg-type]
                completion_window="24h",
                metadata={"suite": "nightly"},
            )
            assert batch.status in ("validating", "in_progress") and batch.request_counts is not None
            assert batch.request_counts.total == len(lines) and batch.metadata == {"suite": "nightly"}
            assert batch.model == "tiny"  # the model every line names, as OpenAI's batch object says it
            done = await finished(oa, batch.id)
            assert done.status == "completed", done
            assert done.request_counts.completed == len(lines) and done.request_counts.failed == 0
            assert done.in_progress_at and done.finalizing_at and done.completed_at and done.error_file_id is None
            assert done.usage is not None and done.usage.input_tokens > 0
            output = await lines_of(oa, done.output_file_id)
            assert [o["custom_id"] for o in output] == [line["custom_id"] for line in lines]
            for line in output:
                assert line["error"] is None and line["response"]["status_code"] == 200
                assert line["id"].startswith("batch_req_") and line["response"]["request_id"]
            bodies = [o["response"]["body"] for o in output]
            if endpoint == "/v1/chat/completions":
                parsed = [openai.types.chat.ChatCompletion.model_validate(b) for b in bodies]
                assert all(p.choices[0].message.role == "assistant" for p in parsed)
            elif endpoint == "/v1/embeddings":
                assert len(openai.types.CreateEmbeddingResponse.model_validate(bodies[0]).data[0].embedding) > 0
            elif endpoint == "/v1/responses":
                assert openai.types.responses.Response.model_validate(bodies[0]).status in ("completed", "incomplete")
            else:
                assert openai.types.Completion.model_validate(bodies[0]).choices
            out_file = await oa.files.retrieve(done.output_file_id)  # type: ignore[arg-type]
            assert out_file.purpose == "batch_output"
            text = (await oa.files.content(out_file.id)).text
            assert out_file.bytes == len(text.encode())
        listed = [b async for b in oa.batches.list(limit=2)]  # the SDK follows the cursor pages
        assert len(listed) == 4 and len({b.id for b in listed}) == 4
        batch_ids = [b.id for b in listed]
    for batch_id in batch_ids:  # each line a usage row of its key, tagged with its batch
        rows = await usage_rows(gw, batch=batch_id)
        assert sum(r["requests"] for r in rows) == 1 or batch_id == batch_ids[-1]
        assert {r["key"] for r in rows} == {record.prefix}
    assert sum(r["requests"] for r in await usage_rows(gw, batch=batch_ids[-1])) == 5  # the chat batch, made first


async def test_a_line_that_fails_is_its_error_line_and_the_batch_completes(
    engine: Engine, gateway: GatewayFactory
) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False}, batches=FAST)
    _, key = create_key(gw, app="evals", scopes=["tiny"])
    lines = [
        chat_line("ok-1"),
        chat_line("not-allowed", model="other-model"),  # the key's scopes: 403
        chat_line("bad-body", max_tokens="many"),  # the worker refuses it: its own 4xx answer
        chat_line("ok-2"),
    ]
    async with client(gw, key) as oa:
        batch = await run_chat_batch(oa, lines)
        done = await finished(oa, batch.id)
        assert done.status == "completed" and done.model is None  # its lines name two models
        assert (done.request_counts.completed, done.request_counts.failed) == (2, 2)
        ok = await lines_of(oa, done.output_file_id)
        errors = await lines_of(oa, done.error_file_id)
    assert [o["custom_id"] for o in ok] == ["ok-1", "ok-2"]
    assert [e["custom_id"] for e in errors] == ["not-allowed", "bad-body"]
    refused = errors[0]["response"]
    assert refused["status_code"] == 403 and refused["body"]["error"]["code"] == "model_not_allowed"
    assert errors[1]["response"]["status_code"] >= 400 and errors[0]["error"] is None


async def test_uploads_are_checked_line_by_line(engine: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False})
    _, key = create_key(gw, app="evals")
    cases = [
        (
            jsonl([chat_line("a")]) + b"not json\n",
            "line 2",
            "invalid_json_line",
        ),
        (jsonl([chat_line("a"), chat_line("a")]), "already used on line 1", "duplicate_custom_id"),
        (jsonl([{**chat_line("a"), "method": "GET"}]), '"method" must be "POST"', "invalid_method"),
        (jsonl([{**chat_line("a"), "url": "/v1/moderations"}]), '"url" must be one of', "invalid_url"),
        (jsonl([{**chat_line("a"), "body": {"messages": []}}]), '"body.model"', "missing_model"),
        (jsonl([{**chat_line("a"), "body": "text"}]), '"body" must be a JSON object', "invalid_body"),
        (jsonl([chat_line("a", stream=True)]), "body.stream", "stream_not_supported"),
        (b"\n\n", "holds no request", "empty_file"),
    ]
    async with client(gw, key) as oa:
        for data, said, code in cases:
            with pytest.raises(openai.BadRequestError) as caught:
                await oa.files.create(file=("r.jsonl", io.BytesIO(data)), purpose="batch")
            assert caught.value.status_code == 400
            body: Any = caught.value.body
            assert said in body["message"] and body["code"] == "invalid_batch_file", body
            assert code  # the line's own code: the batch's errors.data when a batch fails on it (core/batches.py)
        with pytest.raises(openai.BadRequestError) as wrong:
            await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="fine-tune")
        assert '"purpose" must be "batch"' in wrong.value.message
        uploaded = await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch")
        with pytest.raises(openai.BadRequestError) as mismatch:
            await oa.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        assert "line 1 (/v1/chat/completions)" in mismatch.value.message
        with pytest.raises(openai.BadRequestError) as window:
            await oa.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="forever",  # type: ignore[arg-type]
            )
        assert "completion_window" in window.value.message
        with pytest.raises(openai.NotFoundError):
            await oa.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    # nothing of the refused uploads was kept
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{gw.url}/v1/files", headers={"Authorization": f"Bearer {key}"}) as r,
    ):
        assert [f["id"] for f in (await r.json())["data"]] == [uploaded.id]


async def test_a_key_sees_only_its_apps_files_and_batches(engine: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False}, batches=FAST)
    _, mine = create_key(gw, app="mine")
    _, theirs = create_key(gw, app="theirs")
    async with client(gw, mine) as oa, client(gw, theirs) as other:
        uploaded = await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch")
        batch = await oa.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with pytest.raises(openai.NotFoundError):
            await other.files.retrieve(uploaded.id)
        with pytest.raises(openai.NotFoundError):
            await other.files.content(uploaded.id)
        with pytest.raises(openai.NotFoundError):
            await other.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            await other.batches.cancel(batch.id)
        assert [b async for b in other.batches.list()] == []
        with pytest.raises(openai.NotFoundError):
            await other.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert (await oa.files.content(uploaded.id)).content == jsonl([chat_line("a")])
        done = await finished(oa, batch.id)
        assert done.status == "completed"
        with pytest.raises(openai.ConflictError):
            await oa.batches.cancel(batch.id)
        deleted = await oa.files.delete(uploaded.id)
        assert deleted.deleted and deleted.id == uploaded.id
        with pytest.raises(openai.NotFoundError):
            await oa.files.retrieve(uploaded.id)


async def test_cancel_stops_new_lines_at_once(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("slow", ["m:latest"], token_delay_s=0.06)
    gw = await gateway([worker("slow", emu.url)], auth={"open": False}, batches={**FAST, "lines_in_flight": 2})
    _, key = create_key(gw, app="evals")
    lines = [chat_line(f"l{n}", model="m") for n in range(40)]
    async with client(gw, key) as oa:
        batch = await run_chat_batch(oa, lines)

        await until_answered(oa, batch.id, 2, "two lines answered")
        sent_before = emu.served()
        cancelling = await oa.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
        done = await finished(oa, batch.id)
        assert done.status == "cancelled" and done.cancelled_at
        assert emu.served() <= sent_before + 2  # at most the lines in flight at the cancel
        ok = await lines_of(oa, done.output_file_id)
        errors = await lines_of(oa, done.error_file_id)
    assert len(ok) + len(errors) == 40 and len(ok) == done.request_counts.completed
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"} and all(e["response"] is None for e in errors)
    assert sorted(o["custom_id"] for o in ok + errors) == sorted(line["custom_id"] for line in lines)
    # the admin view counts the lines answered, not the lines given batch_cancelled at the end (was 40 of 40, 100 %)
    view = await admin_view(gw, batch.id)
    assert (view["done"], view["unanswered"], view["progress"]) == (len(ok), len(errors), len(ok) / 40)


async def admin_view(gw: Gateway, batch_id: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(headers=gw.admin_headers) as http,
        http.get(f"{gw.url}/admin/api/batches/{batch_id}") as r,
    ):
        assert r.status == 200, await r.text()
        view: dict[str, Any] = await r.json()
    return view


async def test_the_completion_window_expires_the_lines_left(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("slow", ["m:latest"], token_delay_s=0.1)
    gw = await gateway([worker("slow", emu.url)], auth={"open": False}, batches={**FAST, "lines_in_flight": 1})
    _, key = create_key(gw, app="evals")
    lines = [chat_line(f"l{n}", model="m") for n in range(20)]
    async with client(gw, key) as oa:
        uploaded = await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
        batch = await oa.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="2s",  # type: ignore[arg-type]  # Turnout takes shorter windows than OpenAI's 24h
        )
        assert batch.expires_at == batch.created_at + 2
        done = await finished(oa, batch.id)
        assert done.status == "expired" and done.expired_at
        ok = await lines_of(oa, done.output_file_id)
        errors = await lines_of(oa, done.error_file_id)
    assert 1 <= len(ok) < 20 and len(ok) + len(errors) == 20
    assert errors[0]["error"] == {
        "code": "batch_expired",
        "message": "This request could not be executed before the completion window expired.",
    }
    assert (done.request_counts.completed, done.request_counts.failed) == (len(ok), len(errors))
    view = await admin_view(gw, batch.id)  # the lines the window's end left (or stopped) are not answered
    assert (view["done"], view["unanswered"]) == (len(ok), len(errors))


async def test_a_cancel_sends_none_of_the_lines_waiting_for_a_slot(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Lines in flight that still wait in the gateway's queue for the worker's one slot are never sent after a
    cancel (they had each run in turn, one full answer after another, while the batch said cancelling)."""
    emu = await emulator("slow", ["m:latest"], token_delay_s=0.1)
    gw = await gateway(
        [worker("slow", emu.url, max_concurrent=1)], auth={"open": False}, batches={**FAST, "lines_in_flight": 8}
    )
    _, key = create_key(gw, app="evals")
    lines = [chat_line(f"l{n}", model="m") for n in range(20)]
    async with client(gw, key) as oa:
        batch = await run_chat_batch(oa, lines)

        await until_answered(oa, batch.id, 1, "a line answered")
        sent_before = emu.served("/v1/chat/completions")
        await oa.batches.cancel(batch.id)
        done = await finished(oa, batch.id)
        assert (await oa.batches.cancel(batch.id)).status == "cancelled"  # sent again: answered as it is
        named = {(await oa.files.retrieve(f)).filename for f in (done.output_file_id, done.error_file_id) if f}
    assert named <= {f"{batch.id}_output.jsonl", f"{batch.id}_error.jsonl"} and named, named
    assert done.status == "cancelled"
    assert emu.served("/v1/chat/completions") <= sent_before + 1  # the one at work may have been sent as it came
    assert done.request_counts.completed <= sent_before + 1 and done.request_counts.total == 20


async def test_the_windows_end_stops_the_lines_at_work(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """At the window's end a line still generating is stopped, not waited for: the batch is expired within about
    a second of ``expires_at``, and that line's answer is ``batch_expired`` (none after the window is kept)."""
    emu = await emulator("slow", ["m:latest"], token_delay_s=0.2, tokens=60)  # 12 s an answer: none ends in time
    gw = await gateway([worker("slow", emu.url)], auth={"open": False}, batches={**FAST, "lines_in_flight": 2})
    _, key = create_key(gw, app="evals")
    lines = [chat_line(f"l{n}", model="m") for n in range(4)]
    async with client(gw, key) as oa:
        uploaded = await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
        batch = await oa.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="2s",  # type: ignore[arg-type]
        )
        await eventually(lambda: _served(emu, 1), "a line at work", limit_s=5)
        done = await finished(oa, batch.id, limit_s=8)
        errors = await lines_of(oa, done.error_file_id)
    assert done.status == "expired" and done.expired_at is not None
    assert done.expired_at - batch.expires_at <= 2, (done.expired_at, batch.expires_at)
    assert [e["custom_id"] for e in errors] == [f"l{n}" for n in range(4)]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert emu.served("/v1/chat/completions") <= 2  # those at work (stopped), none after the window
    assert sum(r["requests"] for r in await usage_rows(gw, batch=batch.id)) == 0  # stopped: nobody was answered


async def test_a_line_keeps_its_place_in_the_queue_past_queue_timeout(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """A line waits for a slot as long as its window lasts, in its place (where it ages: core.admission.served_as),
    not routing.queue_timeout_s and then again from the queue's end, with a 503 in the usage each time."""
    emu = await emulator("slow", ["m:latest"], token_delay_s=0.25, tokens=8)  # 2 s an answer
    gw = await gateway(
        [worker("slow", emu.url, max_concurrent=1)],
        auth={"open": False},
        routing={"queue_timeout_s": 0.3},
        batches=FAST,
    )
    _, key = create_key(gw, app="evals")
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "hold the slot"}], "stream": False}
        holding = asyncio.create_task(http.post(f"{gw.url}/v1/chat/completions", json=body))
        await eventually(lambda: _served(emu, 1), "the slot taken")
        async with client(gw, key) as oa:
            uploaded = await oa.files.create(
                file=("r.jsonl", io.BytesIO(jsonl([chat_line("l0", model="m")]))), purpose="batch"
            )
            batch = await oa.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            done = await finished(oa, batch.id)
        (await holding).close()
    assert done.status == "completed" and done.request_counts.completed == 1
    rows = await usage_rows(gw, batch=batch.id)
    assert sum(r["requests"] for r in rows) == 1, rows  # its answer only: no 503 for each queue_timeout_s


async def test_a_gateway_stopped_mid_batch_bills_nobody_for_the_lines_it_stopped(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """SIGTERM stops the lines at work (the gateway that resumes the batch sends them again): stopped, not failed,
    so no usage row says 500 for them; and every answer kept has its usage row (written before the answer)."""
    from sqlalchemy import select

    from turnout.store.db import Database, database_url
    from turnout.store.schema import usage

    emu = await emulator("slow", ["m:latest"], token_delay_s=0.1, tokens=10)  # 1 s an answer
    gw = await gateway([worker("slow", emu.url)], auth={"open": False}, batches={**FAST, "lines_in_flight": 3})
    _, key = create_key(gw, app="evals")
    lines = [chat_line(f"l{n}", model="m") for n in range(12)]
    async with client(gw, key) as oa:
        batch = await run_chat_batch(oa, lines)

        await until_answered(oa, batch.id, 2, "two lines answered")
        await eventually(lambda: _served(emu, 4), "more lines at work")
    await gw.stop()  # as SIGTERM does
    db = Database(database_url(None, gw.data_dir))
    try:
        query = select(usage.c.status, usage.c.requests).where(usage.c.batch_id == batch.id)
        with db.begin() as conn:
            rows = conn.execute(query).all()
        from turnout.store.batches import BatchStore

        answered = len(BatchStore(db).answered(batch.id))
    finally:
        db.close()
    statuses = {int(status) for status, _ in rows}
    assert statuses == {200}, rows  # no 500 for a line stopped on the way out
    assert sum(n for _, n in rows) >= answered >= 2, (rows, answered)  # every answer kept was billed


async def test_lines_that_cannot_go_yet_do_not_hold_the_batch_back(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """A line answered 503 (here: its model only on a worker that is down) waits to be sent again without holding
    one of the batch's places: the lines behind it run meanwhile (with one place, none had run)."""
    from tests.conftest import free_port
    from tests.gateway.test_endpoints import PRIVATE_OK, admin

    mac = await emulator("mac", ["m:latest"])
    gone = worker("gone", f"http://127.0.0.1:{free_port()}")  # nothing listens: down, its models unknown
    gw = await gateway([gone], env=PRIVATE_OK, auth={"open": False}, batches={**FAST, "lines_in_flight": 1})
    assert (await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"}))[0] == 201
    _, key = create_key(gw, app="evals")
    lines = [chat_line("stuck", model="nope"), *(chat_line(f"l{n}", model="mac/m") for n in range(6))]
    async with client(gw, key) as oa:
        batch = await run_chat_batch(oa, lines)

        await until_answered(oa, batch.id, 6, "the six lines that can go answered", limit_s=30)
        await oa.batches.cancel(batch.id)
        done = await finished(oa, batch.id)
        errors = await lines_of(oa, done.error_file_id)
    assert done.status == "cancelled" and done.request_counts.completed == 6
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("stuck", "batch_cancelled")]


async def test_daily_tokens_count_and_the_rate_does_not_stall_the_batch(
    engine: Engine, gateway: GatewayFactory
) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False}, batches=FAST)
    _, key = create_key(gw, app="evals", rpm=2, daily_tokens=1_000_000)
    async with client(gw, key) as oa:
        uploaded = await oa.files.create(
            file=("r.jsonl", io.BytesIO(jsonl([chat_line(f"l{n}") for n in range(12)]))), purpose="batch"
        )
        batch = await oa.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = await finished(oa, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 12  # 12 lines, rpm 2: not stalled
        # the key's own rate is untouched by the batch: its two requests this minute still go through
        for _ in range(2):
            await oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        with pytest.raises(openai.RateLimitError):
            await oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    rows = await usage_rows(gw, batch=done.id)
    assert sum(r["requests"] for r in rows) == 12


async def test_a_spent_daily_budget_makes_the_batch_wait_not_fail(engine: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False}, batches=FAST)
    _, key = create_key(gw, app="evals", daily_tokens=1)
    async with client(gw, key) as oa:
        uploaded = await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch")
        batch = await oa.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="3s",  # type: ignore[arg-type]
        )
        done = await finished(oa, batch.id)
        # refused (429) for the whole window: waited, then the line expired; never an error answer of its own
        assert done.status == "expired"
        errors = await lines_of(oa, done.error_file_id)
    assert [e["error"]["code"] for e in errors] == ["batch_expired"]


async def test_batch_lines_ask_the_dispatcher_at_batch_priority(
    engine: Engine, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False}, batches=FAST)
    _, key = create_key(gw, app="evals")
    asked: list[str] = []
    dispatcher: Dispatcher = gw.app[DISPATCHER]
    acquire = dispatcher.acquire

    async def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("priority", "standard"))
        return await acquire(*args, **kwargs)

    monkeypatch.setattr(dispatcher, "acquire", spy)
    async with client(gw, key) as oa:
        await oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        uploaded = await oa.files.create(
            file=("r.jsonl", io.BytesIO(jsonl([chat_line("a"), chat_line("b")]))), purpose="batch"
        )
        batch = await oa.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert (await finished(oa, batch.id)).status == "completed"
    assert asked == ["standard", "batch", "batch"]


async def test_a_revoked_key_fails_the_lines_left(engine: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False}, batches=FAST)
    record, key = create_key(gw, app="evals")
    async with client(gw, key) as oa:
        uploaded = await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch")
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        async with http.post(
            f"{gw.url}/v1/batches",
            json={"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
            headers={"Authorization": f"Bearer {key}"},
        ) as r:
            batch_id = (await r.json())["id"]
        from turnout.gateway.keys import KEYS

        gw.app[KEYS].revoke(str(record.id), now=time.time())
    # the key cannot ask about the batch any more; its lines fail with the key's own 401, in the store
    from turnout.gateway.keys import BATCH_STORE

    async def ended() -> Any:
        got = gw.app[BATCH_STORE].batch(batch_id)
        return got if got is not None and got.status == "completed" else None

    done = await eventually(ended, "the batch to end")
    assert done.failed == 1
    page = gw.app[BATCH_STORE].results(batch_id, False)
    answer = json.loads(page[0][1])["response"]
    assert answer["status_code"] == 401 and "revoked" in answer["body"]["error"]["message"]
    await asyncio.sleep(0)


async def test_redis_limits_take_a_line_from_the_daily_tokens_not_the_rate(redis_url: str) -> None:
    """The Redis limiter (every replica's) as the in-process one: an admission without a rate stays out of the
    window its key's own requests are counted in."""
    from turnout.gateway.limiter import RateLimited, RedisLimiter, Subject

    limiter = RedisLimiter(redis_url, prefix=f"batch-test-{time.time_ns()}")
    try:
        for _ in range(20):
            await limiter.admit(Subject("k1", None, 1000), 10)  # a batch line: line_limits drops the rate
        await limiter.admit(Subject("k1", 2, 1000), 10)
        await limiter.admit(Subject("k1", 2, 1000), 10)
        with pytest.raises(RateLimited, match="2 requests per minute"):
            await limiter.admit(Subject("k1", 2, 1000), 10)
        with pytest.raises(RateLimited, match="daily token limit of 1000"):  # 22 x 10 spent, 790 left
            await limiter.admit(Subject("k1", None, 1000), 800)
    finally:
        await limiter.close()


async def test_upload_sizes_are_the_batch_settings_and_expires_after_is_kept(
    engine: Engine, gateway: GatewayFactory
) -> None:
    """A file larger than a request body may be (limits.max_body_bytes) is taken up to batches.max_file_bytes; one
    over that is a 413 naming the setting, and nothing is kept."""
    gw = await gateway(
        [worker("llama", engine.url, type="openai")],
        auth={"open": False},
        limits={"max_body_bytes": 4096},
        batches={"max_file_bytes": 16384, "max_lines": 50},
    )
    _, key = create_key(gw, app="evals")
    padded = [chat_line(f"l{n}", content="x" * 150) for n in range(40)]  # about 10 KiB: over max_body_bytes
    async with client(gw, key) as oa:
        uploaded = await oa.files.create(
            file=("r.jsonl", io.BytesIO(jsonl(padded))),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 3600},
        )
        assert uploaded.bytes == len(jsonl(padded)) > 4096
        assert uploaded.expires_at == uploaded.created_at + 3600
        with pytest.raises(openai.APIStatusError) as big:
            await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl(padded * 2))), purpose="batch")
        assert big.value.status_code == 413 and "batches.max_file_bytes" in big.value.message
        with pytest.raises(openai.BadRequestError) as many:
            await oa.files.create(
                file=("r.jsonl", io.BytesIO(jsonl([chat_line(f"m{n}") for n in range(51)]))), purpose="batch"
            )
        assert "more than 50 requests (batches.max_lines)" in many.value.message
        with pytest.raises(openai.BadRequestError) as short:
            await oa.files.create(
                file=("r.jsonl", io.BytesIO(jsonl([chat_line("a")]))),
                purpose="batch",
                expires_after={"anchor": "created_at", "seconds": 60},
            )
        assert "expires_after.seconds" in short.value.message
        assert [f.id async for f in oa.files.list()] == [uploaded.id]


async def test_a_store_that_refuses_the_answers_holds_the_batch_back_and_loses_nothing(
    emulator: EmulatorFactory, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the store does not take the answers, they are kept and tried again, no line counts as done, and no new
    line is sent once a few wait (here 3); once it takes them again every line is answered once."""
    import turnout.gateway.batch_runner as runner_module
    from turnout.gateway.keys import BATCH_STORE
    from turnout.store.db import StoreError

    monkeypatch.setattr(runner_module, "_UNWRITTEN_MOST", 3)
    emu = await emulator("w", ["m:latest"])
    gw = await gateway([worker("w", emu.url)], auth={"open": False}, batches={**FAST, "lines_in_flight": 1})
    _, key = create_key(gw, app="evals")
    store = gw.app[BATCH_STORE]
    record = store.record
    down = asyncio.Event()
    down.set()

    def refusing(*args: Any, **kwargs: Any) -> int:
        if down.is_set():
            raise StoreError("database error: OperationalError: the disk is full")
        return record(*args, **kwargs)

    monkeypatch.setattr(store, "record", refusing)
    async with client(gw, key) as oa:
        uploaded = await oa.files.create(
            file=("r.jsonl", io.BytesIO(jsonl([chat_line(f"l{n}", model="m") for n in range(10)]))), purpose="batch"
        )
        batch = await oa.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await eventually(lambda: _served(emu, 3), "three lines sent")
        await asyncio.sleep(0.5)  # lets a runner that ignored the refusals send more (it must not)
        got = await oa.batches.retrieve(batch.id)
        assert emu.served("/v1/chat/completions") == 3 and got.request_counts.completed == 0
        down.clear()
        done = await finished(oa, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 10
        out = await lines_of(oa, done.output_file_id)
    assert [o["custom_id"] for o in out] == [f"l{n}" for n in range(10)]
    assert emu.served("/v1/chat/completions") == 10


async def _served(emu: Any, count: int) -> bool:
    return bool(emu.served("/v1/chat/completions") >= count)


async def test_open_access_batches(engine: Engine, gateway: GatewayFactory) -> None:
    """Under open access (no keys) files and batches belong to no app, as stored responses do; a key's app sees
    none of them."""
    gw = await gateway([worker("llama", engine.url, type="openai")], batches=FAST)
    _, key = create_key(gw, app="evals")
    async with client(gw) as oa, client(gw, key) as keyed:
        uploaded = await oa.files.create(file=("r.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch")
        batch = await oa.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert (await finished(oa, batch.id)).status == "completed"
        assert [b.id async for b in oa.batches.list()] == [batch.id]
        assert [b.id async for b in keyed.batches.list()] == []
        with pytest.raises(openai.NotFoundError):
            await keyed.files.retrieve(uploaded.id)


async def test_a_line_for_a_model_no_worker_is_known_to_hold_is_answered_after_a_bounded_wait(
    emulator: EmulatorFactory,
    gateway: GatewayFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A model named by mistake while a worker whose models were never listed is down (the starter config's Ollama
    on a machine without one): the line is answered 503, as a request sent directly is, once
    ``UNLISTED_WAIT_S`` has passed, and the batch completes; before, it waited for the whole window (24 h)."""
    from tests.conftest import free_port
    from tests.gateway.test_endpoints import PRIVATE_OK, admin

    monkeypatch.setattr("turnout.core.batches.UNLISTED_WAIT_S", 1.0)
    mac = await emulator("mac", ["m:latest"])
    gone = worker("gone", f"http://127.0.0.1:{free_port()}")  # nothing listens: down, its models never listed
    gw = await gateway([gone], env=PRIVATE_OK, auth={"open": False}, batches=FAST)
    assert (await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"}))[0] == 201
    _, key = create_key(gw, app="evals")
    lines = [chat_line("typo", model="nope"), chat_line("ok", model="mac/m"), chat_line("typo-2", model="nope")]
    async with client(gw, key) as oa:
        batch = await run_chat_batch(oa, lines)
        done = await finished(oa, batch.id, limit_s=30)
        errors = await lines_of(oa, done.error_file_id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
    assert [e["custom_id"] for e in errors] == ["typo", "typo-2"]
    for line in errors:
        assert line["response"]["status_code"] == 503
        assert line["response"]["body"]["error"]["code"] == "no_healthy_worker"
        assert "gone" in line["response"]["body"]["error"]["message"]
    told = [r.getMessage() for r in caplog.records if "wait (" in r.getMessage()]
    assert len(told) == 1 and "'nope'" in told[0] and "answered with that 503 after 1 s" in told[0], told


async def test_a_line_waits_for_a_down_worker_that_listed_its_model(
    emulator: EmulatorFactory,
    gateway: GatewayFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Where a worker that is down now listed the line's model, the line waits as long as the window lasts (an
    outage, not a missing model), however short ``UNLISTED_WAIT_S`` is."""
    monkeypatch.setattr("turnout.core.batches.UNLISTED_WAIT_S", 0.2)
    box = await emulator("box", ["m:latest"])
    gw = await gateway(
        [worker("box", box.url)], auth={"open": False}, batches=FAST, health={"interval_s": 0.2, "timeout_s": 1}
    )
    dispatcher = gw.app[DISPATCHER]
    state = dispatcher.fleet.workers["box"]

    async def listed() -> bool:
        return state.inventory is not None and state.healthy

    async def down() -> bool:
        return not state.healthy

    await eventually(listed, "the box listed", 10)
    await box.stop()
    await eventually(down, "the box seen down", 20)
    _, key = create_key(gw, app="evals")
    async with client(gw, key) as oa:
        batch = await run_chat_batch(oa, [chat_line("waits", model="m")])
        await asyncio.sleep(3)  # fifteen times the bound
        got = await oa.batches.retrieve(batch.id)
        assert got.status == "in_progress"
        assert (got.request_counts.completed, got.request_counts.failed) == (0, 0)
    assert dispatcher.worth_waiting_for("m") and not dispatcher.worth_waiting_for("nope")
