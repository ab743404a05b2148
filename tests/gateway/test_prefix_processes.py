"""`turnout serve --workers 2` keeps prefix routing: what one process records in a worker's prefix index reaches
the other through the supervisor (turnout.gateway.shared_prefixes), so a conversation whose turns land on
different processes (a fresh connection each) still goes where its beginning is held."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import aiohttp

from tests.conftest import EmulatorFactory, free_port
from tests.gateway.test_processes import ACCESS, _config, _key, _started, _stop, two_processes

SYSTEMS = [f"You are assistant {g}. " + f"Group {g} answers in its own careful way. " * 12 for g in range(3)]


async def test_conversations_keep_their_worker_across_two_processes(emulator: EmulatorFactory, tmp_path: Path) -> None:
    names = ["a", "b", "c"]
    workers = []
    for name in names:
        emu = await emulator(name, ["m:1"])
        workers.append({"name": name, "url": emu.url, "type": "openai", "slots": 1})
    config = _config(tmp_path, workers=workers, routing={"explain_header": True}, health={"interval_s": 600})
    key = _key(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    where: dict[int, set[str]] = {g: set() for g in range(3)}
    with two_processes(config, port) as gateway:
        await _started(gateway)
        for turn in range(4):
            for group in range(3):
                for session in range(2):
                    messages = [{"role": "system", "content": SYSTEMS[group]}]
                    messages += [
                        {"role": "user", "content": f"{group}.{session}: question {n}"} for n in range(turn + 1)
                    ]
                    body = {"model": "m:1", "messages": messages}
                    async with (
                        aiohttp.ClientSession(
                            connector=aiohttp.TCPConnector(force_close=True),  # a connection each: both processes
                            headers={"Authorization": f"Bearer {key}"},
                        ) as http,
                        http.post(f"{url}/v1/chat/completions", json=body) as resp,
                    ):
                        assert resp.status == 200, await resp.text()
                        answer = (await resp.json())["choices"][0]["message"]["content"]
                        match = re.match(r"\[(\w+)\]", answer)
                        assert match is not None
                        where[group].add(match.group(1))
        assert await _stop(gateway) == 0
    processes = Counter(
        int(m[1]) for line in gateway.lines if (m := ACCESS.search(line)) and m[3].endswith("/chat/completions")
    )
    assert len(processes) == 2, processes  # both processes served the conversations
    assert all(len(served) == 1 for served in where.values()), where  # and each group stayed on one worker
    assert len(set().union(*where.values())) == 3, where
    routes = [line for line in gateway.lines if 'route="prefix' in line]
    assert len(routes) >= 24 - 3, routes  # every request but each group's first found its prefix
