"""The mock runtime (``turnout agent --mock``, or ``AIBRIX_MODEL_RUNTIME_MOCK=1`` as for AIBrix's runtime): the
agent's whole API without launching engines, for tests and demos of a controller, a gateway or a pool policy
on a machine with no GPU and no engine installed.

It follows AIBrix's mock mode (vllm-project/aibrix ``python/aibrix/aibrix/runtime/model_runtime.py``:
``MockEngineLauncher``, ``MockKVController``, ``get_model_runtime``): an activated model is ``active`` and
``ready`` at once with no process (``alive`` is false, there is no ``pid``), sleep and wake only change the
phase, a KV limit is remembered instead of written to a kvcached segment, and nothing is persisted
(``engines.json`` is neither read nor written: a restarted mock agent starts empty). Ports are still handed out
from the engine port range, so routing annotations carry real-looking ports; nothing listens on them.
"""

from __future__ import annotations

from typing import Any

from turnout.core.runtime import EnginePhase
from turnout.runtime.supervisor import EngineRecord, Supervisor

__all__ = ["MockSupervisor"]


class MockSupervisor(Supervisor):
    """A supervisor whose engines are records only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kv_limits: dict[str, int] = {}  # model -> last limit set (MockKVController)

    def save(self) -> None:
        """Nothing is persisted in mock mode."""

    async def recover(self) -> None:
        """Nothing to re-adopt: a mock agent starts empty."""

    async def _sharing_refusal(self, record: EngineRecord) -> str | None:
        """Nothing runs, so nothing shares a GPU."""
        return None

    async def _spawn(self, record: EngineRecord) -> None:
        record.pid = record.pid_start = None
        record.ready = True
        self._set(record, EnginePhase.ACTIVE)

    def _watch(self, name: str) -> None:
        """No process to watch."""

    async def _sleep(self, record: EngineRecord, level: int) -> EngineRecord:
        if record.phase != EnginePhase.SLEEPING.value:
            record.ready = False
            self._set(record, EnginePhase.SLEEPING)
        return record

    async def _wake(self, record: EngineRecord) -> EngineRecord:
        if record.phase == EnginePhase.SLEEPING.value:
            record.ready = True
            self._set(record, EnginePhase.ACTIVE)
        return record

    async def _deactivate(self, record: EngineRecord) -> None:
        self.kv_limits.pop(record.model_name, None)
        self.engines.pop(record.model_name, None)

    async def fetch_text(self, record: EngineRecord, path: str) -> str | None:
        return None  # no engine answers: request activity is not observable
