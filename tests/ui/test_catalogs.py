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


def test_package_data_ships_every_ui_file() -> None:
    """A wheel (``pip install turnout``) must carry every template, catalog and static file."""
    import fnmatch
    import tomllib

    root = TEMPLATES.parent
    pyproject = tomllib.loads((root.parents[3] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["turnout"]
    package = root.parents[1]  # src/turnout
    files = [p for d in ("templates", "i18n", "static") for p in (root / d).rglob("*") if p.is_file()]
    assert files
    for path in files:
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, g) and relative.count("/") == g.count("/") for g in globs), relative
