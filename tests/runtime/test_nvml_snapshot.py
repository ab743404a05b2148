"""Snapshot extras: accelerators and per-engine HBM peak through NVML (a stand-in module here: no GPU on this
machine; the real one is nvidia-ml-py), process groups read from the real /proc, cached artifacts from a
real cache directory: Hugging Face hub entries and AIBrix's served markers)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from tests.conftest import free_port, serve_app
from turnout.runtime.agent import SUPERVISOR, create_agent_app
from turnout.runtime.cache import cached_artifacts, write_served_marker
from turnout.runtime.nvml import Nvml, group_pids
from turnout.runtime.supervisor import EngineRecord, process_start_time


class FakeNvml:
    """The pynvml calls the agent makes, answering for one 141 GB device and the given PIDs."""

    def __init__(self, usage: dict[int, int]) -> None:
        self.usage = usage

    def nvmlInit(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:  # pynvml answers bytes on older bindings
        return b"GPU-5e2f6a70-0000-4000-8000-000000000000"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        used = sum(self.usage.values())
        return SimpleNamespace(total=141 << 30, used=used, free=(141 << 30) - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in self.usage.items()]


@pytest.fixture
def process_group() -> Iterator[tuple[int, int]]:
    """A real session leader with one child in its group: (leader pid, child pid)."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    yield proc.pid, child
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def test_group_pids_reads_the_real_process_group(process_group: tuple[int, int]) -> None:
    leader, child = process_group
    assert group_pids(leader) == {leader, child}
    assert group_pids(2**22 + 12345) == set()


def test_no_nvml_means_nothing_observable() -> None:
    class Broken:
        def nvmlInit(self) -> None:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    nv = Nvml(Broken())
    assert not nv.available and nv.accelerators() == [] and nv.process_memory() == {}


def test_cached_artifacts_from_hub_entries_and_served_markers(tmp_path: Path) -> None:
    (tmp_path / "models--Qwen--Qwen3-0.6B").mkdir()
    (tmp_path / "datasets--x--y").mkdir()
    (tmp_path / "models--not-a-dir").write_text("")
    markers = tmp_path / ".aibrix" / "served"
    markers.mkdir(parents=True)
    # as AIBrix's runtime writes them (model_runtime.py, write_cache_marker), and two it would skip
    (markers / "llama.json").write_text('{"model_name": "llama", "artifact_url": "s3://bucket/llama-3-8b"}')
    (markers / "broken.json").write_text("{not json")
    (markers / "empty.json").write_text('{"model_name": "empty"}')
    assert write_served_marker(tmp_path, "tiny", "file:///models/tiny.gguf") == markers / "tiny.json"
    assert write_served_marker(tmp_path, "../escape", "s3://x") is None
    assert cached_artifacts(tmp_path) == [
        "file:///models/tiny.gguf",
        "hf://Qwen/Qwen3-0.6B",
        "huggingface://Qwen/Qwen3-0.6B",
        "s3://bucket/llama-3-8b",
    ]
    assert cached_artifacts(tmp_path / "absent") == []
    # AIBrix's default cache is HF_HOME (~/.cache/huggingface): the hub entries are in its hub/ directory
    (tmp_path / "hub" / "models--org--in-hub").mkdir(parents=True)
    assert {"hf://org/in-hub", "huggingface://org/in-hub"} <= set(cached_artifacts(tmp_path))


async def test_snapshot_reports_accelerators_peak_and_cache(tmp_path: Path, process_group: tuple[int, int]) -> None:
    leader, child = process_group
    nv = FakeNvml({leader: 1 << 30, child: 3 << 30, 999_999_999: 7 << 30})  # the last PID is someone else's
    cache = tmp_path / "hub"
    (cache / "models--org--m").mkdir(parents=True)
    app = create_agent_app(
        registry_path=tmp_path / "engines.json",
        log_dir=tmp_path / "logs",
        port_range=(free_port(), free_port()),
        cache_dir=cache,
        nvml=Nvml(nv),
    )
    base, runner = await serve_app(app)
    try:
        # an engine record for the real process group (as if the agent had spawned it)
        record = EngineRecord("m", "vllm", "hf://org/m", 1, "m", {}, {}, phase="active", ready=False)
        record.pid, record.pid_start = leader, process_start_time(leader)
        app[SUPERVISOR].engines["m"] = record
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/v1/runtime/snapshot") as r:
                snap = await r.json()
            nv.usage[child] = 1 << 30  # usage falls: the peak stays
            async with http.get(f"{base}/v1/runtime/snapshot") as r:
                again = await r.json()
            async with http.get(f"{base}/metrics") as r:
                metrics = await r.text()
        assert snap["accelerators"] == [  # AIBrix's RuntimeAcceleratorSnapshot
            {
                "id": "GPU-5e2f6a70-0000-4000-8000-000000000000",
                "hbm_total_bytes": 141 << 30,
                "hbm_free_bytes": (141 << 30) - (11 << 30),
            }
        ]
        assert snap["cached_artifacts"] == ["hf://org/m", "huggingface://org/m"]
        assert snap["models"][0]["hbm_peak_bytes"] == 4 << 30  # leader + child, not the stranger
        assert again["models"][0]["hbm_peak_bytes"] == 4 << 30
        assert 'aibrix:modelclaim_hbm_peak_bytes{model="m"} 4.294967296e+09' in metrics
    finally:
        app[SUPERVISOR].engines.clear()  # the group belongs to the fixture, not to the agent
        await runner.cleanup()
