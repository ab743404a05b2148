"""`turnout serve`'s demo model: whether this start runs it, and the lines that say so.

The rule is :func:`turnout.core.demo.choose`; this module asks the machine what the rule needs: whether anything
answers where the starter config's Ollama worker points (one HTTP request, 1 s at most), and what of the demo is
installed (:func:`turnout.runtime.demo.missing`). ``./scripts/serve`` asks the same question first
(``turnout serve --demo-needs``, which changes nothing) and installs what is missing before it starts the gateway.
"""

from __future__ import annotations

import http.client
import shlex
import urllib.parse
from dataclasses import dataclass

from turnout.core import demo as rules

__all__ = ["Decision", "curl_command", "decide", "ollama_answers", "ready_lines"]

PROBE_TIMEOUT_S = 1.0
PROMPT = "What is the capital of France?"


def ollama_answers(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether anything answers HTTP at ``url`` (Ollama's ``GET /api/version``; any status counts as an answer)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s)
    try:
        connection.request("GET", "/api/version")
        connection.getresponse().read(0)
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return True


@dataclass(frozen=True, slots=True)
class Decision:
    wanted: bool  # the demo is to run, as far as the rule goes (whatever is installed)
    missing: tuple[str, ...]  # what it lacks here (asked only when wanted)
    choice: rules.Choice


def decide(*, flag: bool | None, configured: bool, creating_starter: bool, processes: int, ollama_url: str) -> Decision:
    from turnout.runtime.demo_install import missing

    probe = creating_starter and flag is None and not configured
    answers = ollama_answers(ollama_url) if probe else None

    def choice(lacking: tuple[str, ...]) -> rules.Choice:
        return rules.choose(
            flag=flag,
            configured=configured,
            creating_starter=creating_starter,
            ollama_answers=answers,
            missing=lacking,
            processes=processes,
            ollama_url=ollama_url,
        )

    wanted = choice(()).run
    lacking = missing() if wanted else ()
    return Decision(wanted, lacking, choice(lacking))


def curl_command(host: str, port: int, key: str | None, *, open_auth: bool = False) -> str:
    """The banner's curl: a streamed chat with the demo model, ready to paste (the key inline when known)."""
    where = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in where and not where.startswith("["):
        where = f"[{where}]"
    body = '{"model":"' + rules.MODEL + '","stream":true,"messages":[{"role":"user","content":"' + PROMPT + '"}]}'
    auth = ""
    if not open_auth:
        auth = " -H " + (shlex.quote(f"Authorization: Bearer {key}") if key else '"Authorization: Bearer $KEY"')
    return f"curl -sSN --retry 3 http://{where}:{port}/v1/chat/completions{auth} -d {shlex.quote(body)}"


def ready_lines(threads: int, seconds: float, curl: str, key_known: bool, open_auth: bool) -> list[str]:
    lines = [
        f"turnout: {rules.describe(threads)}: ready {seconds:.1f} s after start; try it (the answer streams back):",
        f"  {curl}",
    ]
    if not key_known and not open_auth:
        lines.append(
            "  with KEY set to an API key: the starter key printed at the first start, or a new one: "
            "KEY=$(turnout key create --app my-app)"
        )
    return lines
