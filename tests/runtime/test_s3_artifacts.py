"""s3:// artifacts: the agent downloads them (boto3, credentials and endpoint from the environment) before it starts
the engine, with the download's progress in its snapshot and in the claim's status, against a real S3 API
server (moto's server mode, tests/support/s3.py). gcs:// is refused when the claim is read."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import eventually, free_port
from tests.runtime.conftest import AgentStarter
from tests.runtime.test_agent import Agent
from tests.support.s3 import AWS_ENV, HeldRelay, S3Server, moto_server
from turnout.controller.local import ClaimFiles, LocalController, Pool, load_claim_documents
from turnout.core.claims import POOL_LABEL, ClaimPhase, InvalidClaim, parse_claim_spec
from turnout.runtime.agent import SUPERVISOR
from turnout.runtime.artifacts import ArtifactError, Progress, fetch_s3, s3_destination
from turnout.upstream.client import UpstreamClient


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server, with the agent's environment pointed at it (as a pod's would be at its S3 endpoint)."""
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.url)
    return s3_server


def bucket(s3: S3Server, name: str, objects: dict[str, bytes]) -> None:
    with s3.client() as client:
        client.create_bucket(Bucket=name)
        for key, body in objects.items():
            client.put_object(Bucket=name, Key=key, Body=body)


def contents(path: Path) -> bytes:
    return path.read_bytes()


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def chat(port: int, model: str) -> tuple[int, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r,
    ):
        return r.status, await r.json()


async def test_a_llama_cpp_engine_starts_on_a_model_downloaded_from_s3(
    s3: S3Server, start_agent: AgentStarter, tiny_model: Path, tmp_path: Path
) -> None:
    weights = contents(tiny_model)
    bucket(s3, "models", {"tiny/tiny.gguf": weights})
    cache = tmp_path / "cache"
    url, runner = await start_agent(cache_dir=cache)
    agent = Agent(url, runner)
    body = {"model_name": "tiny", "artifact_url": "s3://models/tiny/tiny.gguf", "engine": "llamacpp"}
    status, activated = await agent.call("POST", "/v1/runtime/models/activate", body)
    assert status == 200 and activated["phase"] == "booting", activated
    engine = await agent.until("tiny", "active")
    status, answer = await chat(engine["port"], "tiny")
    assert status == 200 and answer["usage"]["completion_tokens"] >= 1  # a real llama.cpp on the downloaded file
    local = s3_destination(cache, "s3://models/tiny/tiny.gguf")
    assert local == cache / "s3" / "models" / "tiny%2Ftiny.gguf" and contents(local) == weights
    record = runner.app[SUPERVISOR].engines["tiny"]
    assert record.local_path == str(local) and f"file://{local}" not in record.artifact_url
    assert engine["download"] is None and engine["artifact_url"] == "s3://models/tiny/tiny.gguf"
    _, snap = await agent.call("GET", "/v1/runtime/snapshot")
    assert "s3://models/tiny/tiny.gguf" in snap["cached_artifacts"]  # marked served once complete (AIBrix's marker)
    assert names(local.parent) == ["tiny%2Ftiny.gguf"]  # no partial download left beside it


def test_a_prefix_is_a_model_directory_and_a_finished_download_is_used_again(s3: S3Server, tmp_path: Path) -> None:
    files = {"dir/m/config.json": b'{"a": 1}', "dir/m/weights/part-1.bin": os.urandom(300_000), "dir/other": b"x"}
    bucket(s3, "prefixes", files)
    progress = Progress("s3://prefixes/dir/m")
    path = fetch_s3("s3://prefixes/dir/m/", tmp_path, progress)
    assert path.is_dir() and (path / "config.json").read_bytes() == b'{"a": 1}'
    assert (path / "weights" / "part-1.bin").read_bytes() == files["dir/m/weights/part-1.bin"]
    assert not (path / "other").exists() and sorted(p.name for p in path.iterdir()) == ["config.json", "weights"]
    assert (progress.done, progress.total, progress.files, progress.files_total) == (300_008, 300_008, 2, 2)
    # the enclosing prefix is another artifact, staged beside it, not around it
    outer = fetch_s3("s3://prefixes/dir", tmp_path, Progress("s3://prefixes/dir"))
    assert outer != path and not str(path).startswith(str(outer) + "/") and (outer / "other").read_bytes() == b"x"
    # already complete: used as it is, nothing fetched (the server would answer the changed object)
    with s3.client() as client:
        client.put_object(Bucket="prefixes", Key="dir/m/config.json", Body=b"changed")
    again = Progress("s3://prefixes/dir/m")
    assert fetch_s3("s3://prefixes/dir/m", tmp_path, again) == path and again.done == 0
    assert (path / "config.json").read_bytes() == b'{"a": 1}'


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("s3://nowhere-bucket/m", "no such bucket"),
        ("s3://errors/missing", "there is no object 'missing' and nothing under 'missing/'"),
    ],
)
def test_what_cannot_be_downloaded_says_why(s3: S3Server, tmp_path: Path, url: str, fragment: str) -> None:
    bucket(s3, "errors", {"present": b"1"})
    with pytest.raises(ArtifactError) as info:
        fetch_s3(url, tmp_path, Progress(url))
    assert fragment in str(info.value)
    assert not list((tmp_path / "s3").rglob("*partial*")) if (tmp_path / "s3").exists() else True


def test_no_credentials_and_no_endpoint_say_what_to_change(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket(s3, "creds", {"m": b"1"})
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ArtifactError, match="no AWS credentials in the agent's environment"):
        fetch_s3("s3://creds/m", tmp_path, Progress("s3://creds/m"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(ArtifactError, match="cannot reach the S3 endpoint"):
        fetch_s3("s3://creds/m", tmp_path, Progress("s3://creds/m"))


CLAIM = """\
kind: ModelClaim
metadata: {name: big}
spec: {podSelector: {matchLabels: {pool: gpu}}, artifactURL: "s3://weights/big", engine: vllm}
"""


async def test_the_claim_status_shows_the_download_as_it_goes(
    s3: S3Server, start_agent: AgentStarter, emulator_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = {f"big/model-{n}.safetensors": os.urandom(700_000) for n in range(2)}
    bucket(s3, "weights", {"big/config.json": b"{}", **shards})
    relay = HeldRelay(int(s3.url.rsplit(":", 1)[1]), hold_after=600_000)  # answers stop after ~600 kB
    monkeypatch.setenv("AWS_ENDPOINT_URL", await relay.start())
    url, runner = await start_agent(engine_python={"vllm": emulator_python}, cache_dir=tmp_path / "cache")
    pool = Pool("gpu-0", url, "127.0.0.1", 1, {"pool": "gpu", POOL_LABEL: "true"}, json.dumps({}))
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=30)
    try:
        ctl = LocalController(ClaimFiles(tmp_path / "data"), [pool], client)
        for doc in load_claim_documents(CLAIM):
            ctl.files.apply(doc)

        async def downloading() -> dict[str, Any] | None:
            await ctl.tick()
            status = ctl.statuses.get("big", {})
            # boto3 reports in 256 KiB reads, the last of them after the relay has stopped: wait for the count
            # to settle where the held bytes put it (it is never more: nothing more arrives)
            settled = "512.0 KiB" in str(status.get("message"))
            return status if relay.held.is_set() and settled else None

        status = await eventually(downloading, "the claim's status to show the download", limit_s=60)
        assert ctl.phase("big") is ClaimPhase.LOADING and status["reason"] == "Downloading", status
        assert status["message"].startswith("downloading s3://weights/big: 512.0 KiB of 1.3 MiB (37 %)"), status
        assert status["message"].endswith(", 1 of 3 files"), status  # config.json is in, a shard under way
        engine = runner.app[SUPERVISOR].engines["big"]
        assert engine.phase == "booting" and engine.pid is None  # not started before its weights are there
        relay.release()

        async def active() -> bool:
            await ctl.tick()
            return ctl.phase("big") is ClaimPhase.ACTIVE

        await eventually(active, "the claim Active once downloaded", limit_s=60)
        local = Path(runner.app[SUPERVISOR].engines["big"].local_path or "")
        assert names(local) == ["config.json", "model-0.safetensors", "model-1.safetensors"]
        got = hashlib.sha256(contents(local / "model-1.safetensors")).hexdigest()
        assert got == hashlib.sha256(shards["big/model-1.safetensors"]).hexdigest()
    finally:
        await client.close()
        await relay.stop()


async def test_a_deactivation_stops_the_download_and_starts_nothing(
    s3: S3Server, start_agent: AgentStarter, emulator_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket(s3, "stopped", {"m/a.bin": os.urandom(900_000)})
    relay = HeldRelay(int(s3.url.rsplit(":", 1)[1]), hold_after=600_000)
    monkeypatch.setenv("AWS_ENDPOINT_URL", await relay.start())
    url, runner = await start_agent(engine_python={"vllm": emulator_python}, cache_dir=tmp_path / "cache")
    agent = Agent(url, runner)
    try:
        body = {"model_name": "m", "artifact_url": "s3://stopped/m", "engine": "vllm"}
        assert (await agent.call("POST", "/v1/runtime/models/activate", body))[0] == 200

        async def progressing() -> Any:
            engine = await agent.engine("m")
            return engine if relay.held.is_set() and (engine["download"] or {}).get("bytes_done") else None

        engine = await eventually(progressing, "the download under way", limit_s=60)
        assert engine["download"] == {
            "url": "s3://stopped/m",
            "bytes_done": 524288,
            "bytes_total": 900_000,
            "files_done": 0,
            "files_total": 1,
        }
        assert (await agent.call("POST", "/v1/runtime/models/deactivate", {"model_name": "m"}))[0] == 200
        relay.release()
        dest = s3_destination(tmp_path / "cache", "s3://stopped/m")

        async def cleaned() -> bool:
            return not any(dest.parent.glob(".*partial*")) and "m" not in runner.app[SUPERVISOR].engines

        await eventually(cleaned, "the partial download removed", limit_s=30)
        assert not dest.exists()
        # the stopped answer's connection is closed with the download, not left to the garbage collector (which
        # warns of an unclosed socket whenever it gets there: boto3 never returns it to the pool it closes)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            gc.collect()
        assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    finally:
        await relay.stop()


async def test_an_agent_without_boto3_refuses_s3_artifacts(
    start_agent: AgentStarter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` fails, as in a Python without it
    url, runner = await start_agent()
    status, body = await Agent(url, runner).call(
        "POST", "/v1/runtime/models/activate", {"model_name": "m", "artifact_url": "s3://bucket/m", "engine": "vllm"}
    )
    assert status == 400 and "pip install 'turnout[s3]'" in body["error"]["message"], body


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("gcs://bucket/model", "gcs:// is not taken: no engine reads it and the agent downloads only s3://"),
        ("gs://bucket/model", "AWS_ENDPOINT_URL=https://storage.googleapis.com"),
        ("GCS://bucket/model", "GCS:// is not taken"),
        ("S3://bucket/model", "must spell its scheme in lower case (s3://)"),
        ("s3://Bad_Bucket/m", "is not an S3 bucket name"),
        ("s3://ab/m", "is not an S3 bucket name"),
        ("s3://key:secret@bucket/m", "takes no credentials"),
        ("s3://bucket/a/../b", "'..' segments"),
        ("s3://bucket/m?versionId=1", "no query or fragment"),
        ("s3://", "names nothing after s3://"),
        ("tos://bucket/m", "must start with one of huggingface://, hf://, file://, s3://"),
        ("bucket/model", "must start with one of"),
    ],
)
def test_artifact_urls_the_agent_cannot_use_are_refused_with_the_claim(url: str, fragment: str) -> None:
    spec = {"podSelector": {"matchLabels": {"pool": "a"}}, "artifactURL": url}
    with pytest.raises(InvalidClaim) as info:
        parse_claim_spec("c", spec)
    assert str(info.value).startswith("spec.artifactURL ") and fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("url", ["s3://bucket", "s3://my.bucket-1/models/llama/", "hf://org/m", "file:///m.gguf"])
def test_artifact_urls_that_are_taken(url: str) -> None:
    spec = {"podSelector": {"matchLabels": {"pool": "a"}}, "artifactURL": url}
    assert parse_claim_spec("c", spec).artifact_url == url
