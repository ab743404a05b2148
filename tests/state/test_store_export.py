"""The store export module loads Alembic only when it migrates or reads revisions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_gateway_does_not_load_alembic() -> None:
    """The gateway imports this module (its backup routes) and never migrates through it: Alembic and its
    templates (about 12 MB resident) stay out of a serving process."""
    code = "import sys, turnout.wiring; print(sorted(m for m in ('alembic', 'mako') if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
