"""Is the data dir usable? Checked by `turnout serve` before it binds or writes anything.

A data dir that is a file, sits under a file, or cannot be listed and written by this user would otherwise
fail later, deep in the store or the token writer, with a traceback. :func:`data_dir_problem` says what is
wrong in a few words, or None.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["data_dir_problem"]


def data_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot serve as the data dir (created when missing), or None when it can."""
    if path.exists() and not path.is_dir():
        return "it is a file, not a directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with os.scandir(path) as entries:
            next(entries, None)
        fd, probe = tempfile.mkstemp(prefix=".turnout-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return str(exc.strerror or exc).lower()
    return None
