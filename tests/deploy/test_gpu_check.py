"""scripts/gpu-check (the prepared GPU check of issue 11) runs as far as this machine allows: without a GPU it
says why in one line and exits 2, so a CI log never mistakes "not run" for "passed"."""

from __future__ import annotations

import subprocess
import sys

from tests.support.manifests import ROOT


def test_gpu_check_says_why_it_cannot_run_without_a_gpu() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu-check")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},  # no nvidia-smi on it
    )
    assert out.returncode == 2, out
    assert out.stderr.strip() == "gpu-check: cannot run here: no NVIDIA GPU here: nvidia-smi is not installed"


def test_gpu_check_help_lists_its_options() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu-check"), "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    for flag in ("--vllm-python", "--model", "--sleep-hold-s", "--keep"):
        assert flag in out.stdout
