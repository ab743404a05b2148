"""Accelerator memory through NVML, when the machine has it (``pip install nvidia-ml-py``); otherwise nothing.

Best effort by design: a host without NVIDIA's library, or a container without device access, reports no
accelerators and ``null`` HBM figures instead of failing the agent.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["Nvml", "group_pids"]

log = logging.getLogger("turnout.agent")


class Nvml:
    def __init__(self, module: Any = None) -> None:
        self._nv: Any = None
        try:
            nv = module
            if nv is None:
                import pynvml as nv  # type: ignore[import-not-found,no-redef]
            nv.nvmlInit()
            self._nv = nv
        except Exception as exc:  # no library, no driver, no device: not observable
            log.debug("NVML not available: %s", exc)

    @property
    def available(self) -> bool:
        return self._nv is not None

    def accelerators(self) -> list[dict[str, Any]]:
        """Each visible GPU as AIBrix's ``RuntimeAcceleratorSnapshot``: ``{id, hbm_total_bytes,
        hbm_free_bytes}``, the id being the device's UUID as AIBrix reports it (vllm-project/aibrix
        ``python/aibrix/aibrix/runtime/model_runtime.py``, ``gpu_memory_observation``), or ``gpu-<index>``
        where the driver gives none."""
        if self._nv is None:
            return []
        nv, out = self._nv, []
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
                try:
                    uuid = nv.nvmlDeviceGetUUID(handle)
                except Exception:  # an old driver or binding without UUIDs
                    uuid = f"gpu-{index}"
                out.append(
                    {
                        "id": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                        "hbm_total_bytes": int(memory.total),
                        "hbm_free_bytes": int(memory.free),
                    }
                )
        except Exception as exc:  # a device that stops answering mid-read
            log.warning("NVML read failed: %s", exc)
        return out

    def process_memory(self) -> dict[int, int]:
        """Device memory per PID, summed over devices (compute processes)."""
        if self._nv is None:
            return {}
        nv = self._nv
        usage: dict[int, int] = {}
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = proc.usedGpuMemory
                    if used is not None:
                        usage[int(proc.pid)] = usage.get(int(proc.pid), 0) + int(used)
        except Exception as exc:
            log.warning("NVML process read failed: %s", exc)
        return usage


def group_pids(pgid: int, proc: Path = Path("/proc")) -> set[int]:
    """Every live process in a process group (an engine and the workers it forked)."""
    found = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:  # field 5 of stat: the process group
            found.add(int(entry.name))
    return found if found else ({pgid} if os.path.exists(proc / str(pgid)) else set())
