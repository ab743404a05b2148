"""Running the real Claude Code CLI (`claude -p`) against a gateway, as docs/clients.md says, for tests.

The CLI comes from npm, pinned and cached, through ``scripts/agent-clis`` (``scripts/test`` exports its bin folder
as ``TURNOUT_AGENT_CLIS``; without it the script is run here, which installs once and prints the folder). Each run
gets its own ``HOME`` and an empty working directory; nothing leaves the machine: the proxies point at a dead
loopback port, with loopback excepted (RECIPES.md, "Agent CLIs").
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["ClaudeRun", "agent_clis", "run_claude"]

ROOT = Path(__file__).resolve().parents[2]


@cache
def agent_clis() -> Path:
    """The bin folder holding ``claude`` (and ``codex``)."""
    folder = os.environ.get("TURNOUT_AGENT_CLIS")
    if not folder:
        folder = subprocess.run(
            [str(ROOT / "scripts" / "agent-clis")], check=True, capture_output=True, text=True, timeout=1200
        ).stdout.strip()
    path = Path(folder)
    assert (path / "claude").exists(), f"no claude in {path}: run scripts/agent-clis"
    return path


@dataclass
class ClaudeRun:
    returncode: int
    stdout: str
    stderr: str


async def run_claude(
    base_url: str,
    model: str,
    prompt: str,
    tmp: Path,
    *,
    api_key: str | None = None,
    auth_token: str | None = None,
    extra: dict[str, str] | None = None,
    flags: tuple[str, ...] = (),
    limit_s: float = 240,
) -> ClaudeRun:
    """``claude FLAGS -p PROMPT`` in ``tmp/work`` with ``ANTHROPIC_BASE_URL`` the gateway and the key as
    ``ANTHROPIC_API_KEY`` (sent as x-api-key) or ``ANTHROPIC_AUTH_TOKEN`` (sent as Bearer)."""
    home, work = tmp / "home", tmp / "work"
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": f"{agent_clis()}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
        **({"ANTHROPIC_API_KEY": api_key} if api_key else {}),
        **({"ANTHROPIC_AUTH_TOKEN": auth_token} if auth_token else {}),
        **(extra or {}),
    }
    proc = await asyncio.create_subprocess_exec(
        str(agent_clis() / "claude"),
        *flags,
        "-p",
        prompt,
        cwd=work,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"claude -p did not finish within {limit_s} s") from None
    return ClaudeRun(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))
