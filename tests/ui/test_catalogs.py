"""The message catalogs and templates: the same keys in every language, every key a template uses exists,
and templates hold no literal labels (text and labelling attributes come from the catalogs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from turnout.admin.ui.i18n import LANGUAGES, Catalogs, pick_language
from turnout.admin.ui.render import TEMPLATES

CATALOGS = Catalogs.load()
TEMPLATE_FILES = sorted(TEMPLATES.glob("*.html"))
JINJA = re.compile(r"{{.*?}}|{%.*?%}|{#.*?#}", re.S)
LABEL_ATTRS = re.compile(r'\b(?:title|aria-label|placeholder|alt)="([^"]*)"')


def test_every_language_has_the_same_keys() -> None:
    english = set(CATALOGS.messages["en"])
    for lang in LANGUAGES:
        keys = set(CATALOGS.messages[lang])
        assert keys == english, f"{lang}: missing {sorted(english - keys)}, extra {sorted(keys - english)}"
    assert CATALOGS.text("de", "nav.persistence") == "Persistenz"


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=lambda p: p.name)
def test_template_keys_exist(path: Path) -> None:
    for key in re.findall(r"""\bt\(\s*["']([\w.]+)["']\s*[,)]""", path.read_text()):
        assert key in CATALOGS.messages["en"], f"{path.name} uses unknown message {key!r}"


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=lambda p: p.name)
def test_templates_hold_no_literal_labels(path: Path) -> None:
    source = path.read_text()
    for value in LABEL_ATTRS.findall(source):
        assert re.search(r"[A-Za-zÄÖÜäöü]", JINJA.sub("", value)) is None, f"{path.name}: literal label {value!r}"
    text = JINJA.sub("", source)
    text = re.sub(r"<script.*?</script>|<style.*?</style>", "", text, flags=re.S)
    text = re.sub(r"<!doctype[^>]*>|<[^>]*>", " ", text, flags=re.S | re.I)
    words = re.findall(r"[A-Za-zÄÖÜäöü]{2,}", text)
    assert not words, f"{path.name}: literal text {words[:10]}"


@pytest.mark.parametrize(
    ("cookie", "accept", "expected"),
    [
        (None, None, "en"),
        ("de", "en-US", "de"),
        ("xx", "de-DE,de;q=0.9", "de"),
        (None, "fr-FR, de;q=0.5", "de"),
        (None, "fr", "en"),
    ],
)
def test_pick_language(cookie: str | None, accept: str | None, expected: str) -> None:
    assert pick_language(cookie, accept) == expected
