"""Where the CLI looks before any config is loaded: the default data dir and config file.

Plain constants, no imports, so that every command (and `turnout --help`) can name them without loading
the config model. :mod:`turnout.config` and the CLI modules use them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CONFIG_FILE_NAME", "DATA_DIR", "DEFAULT_CONFIG"]

CONFIG_FILE_NAME = "config.json"
DATA_DIR = Path("turnout-data")
DEFAULT_CONFIG = DATA_DIR / CONFIG_FILE_NAME
