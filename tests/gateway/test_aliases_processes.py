"""`turnout serve --workers 2`: an alias set or removed through one process is in force in both at their next
request (the data dir's change counter), long before the 5 s refresh that other replicas rely on."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import EmulatorFactory, free_port
from tests.gateway.test_processes import _access, _config, _fresh, _key, _started, _stop, two_processes

ALIAS = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}], "stream": False}


async def test_an_alias_set_through_one_process_is_resolved_by_both(emulator: EmulatorFactory, tmp_path: Path) -> None:
    emu = await emulator("a", ["qwen3:8b"])
    config = _config(tmp_path, workers=[{"name": "a", "url": emu.url}], health={"interval_s": 600})
    key = _key(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with two_processes(config, port) as gateway:
        await _started(gateway)
        before = [await _fresh("POST", f"{url}/v1/chat/completions", key, ALIAS) for _ in range(20)]
        status, _ = await _fresh("PUT", f"{url}/admin/api/aliases/claude-sonnet-4-5", body={"model": "qwen3:8b"})
        assert status == 201
        during = [await _fresh("POST", f"{url}/v1/chat/completions", key, ALIAS) for _ in range(20)]
        status, _ = await _fresh("DELETE", f"{url}/admin/api/aliases/claude-sonnet-4-5")
        assert status == 200
        after = [await _fresh("POST", f"{url}/v1/chat/completions", key, ALIAS) for _ in range(20)]
        assert await _stop(gateway) == 0
    assert {s for s, _ in before} == {404} and {s for s, _ in after} == {404}, (before, after)
    assert {s for s, _ in during} == {200}, during
    assert {body["model"] for path, body in emu.calls if path == "/v1/chat/completions"} == {"qwen3:8b"}
    chat = _access(gateway.lines, "/v1/chat/completions")
    assert len({pid for pid, s in chat[20:40] if s == 200}) == 2  # served through the alias by both processes
    assert len({pid for pid, s in chat[40:] if s == 404}) == 2  # and its removal obeyed by both
