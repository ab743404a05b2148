"""Message catalogs of the admin UI: one per language, ``i18n/<lang>/*.json`` merged into one flat table.

A page keeps its messages in its own file (``i18n/en/placement.json``) so pages can be added side by side; a
key defined twice in one language is an error at start, and every language must define the same keys (a test
checks). Keys are dotted (``placement.legend.blocked``); values are ``str.format`` templates with named fields
(``"{count} models"``). Templates never hold literal labels: they call ``t("key", field=value)``.

The language is the ``turnout_lang`` cookie when set, else the first supported one in ``Accept-Language``,
else English.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COOKIE", "DEFAULT", "LANGUAGES", "Catalogs", "pick_language"]

COOKIE = "turnout_lang"
DEFAULT = "en"
LANGUAGES = ("en", "de")  # the language switch lists these, each named in its own catalog ("lang.name")

_ROOT = Path(__file__).with_name("i18n")


@dataclass(frozen=True, slots=True)
class Catalogs:
    messages: Mapping[str, Mapping[str, str]]  # language -> key -> template

    @classmethod
    def load(cls, root: Path = _ROOT) -> Catalogs:
        out: dict[str, dict[str, str]] = {}
        for lang in LANGUAGES:
            table: dict[str, str] = {}
            for path in sorted((root / lang).glob("*.json")):
                entries = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(entries, dict):
                    raise ValueError(f"{path}: a message catalog is one JSON object of key -> text")
                for key, text in entries.items():
                    if key in table:
                        raise ValueError(f"{path}: message {key!r} is defined twice for {lang!r}")
                    if not isinstance(text, str):
                        raise ValueError(f"{path}: message {key!r} is not a string")
                    table[key] = text
            out[lang] = table
        return cls(out)

    def text(self, lang: str, key: str, **fields: object) -> str:
        """The message in ``lang`` (English when that language lacks it); a missing key is a KeyError."""
        table = self.messages.get(lang) or self.messages[DEFAULT]
        template = table.get(key)
        if template is None:
            template = self.messages[DEFAULT][key]
        return template.format(**fields) if fields else template


def pick_language(cookie: str | None, accept_language: str | None) -> str:
    if cookie in LANGUAGES:
        return str(cookie)
    for part in (accept_language or "").split(","):
        tag = part.split(";", 1)[0].strip().lower()[:2]
        if tag in LANGUAGES:
            return tag
    return DEFAULT
