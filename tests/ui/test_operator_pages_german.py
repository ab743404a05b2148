"""German labels on the Endpoints, Keys, Usage, Audit, Runtime pools and Persistenz pages, also in what their
scripts write (a connection test's result), and every operator page reachable from the nav with the keyboard."""

from __future__ import annotations

import pytest

from tests.conftest import free_port
from tests.ui.conftest import sign_in

PAGES = [
    ("/admin/endpoints", "KI-Modelle / Endpunkte", ["Endpunkt hinzufügen", "Verbindung testen", "API-Typ"]),
    ("/admin/keys", "Schlüssel", ["Schlüssel erstellen", "Mandant", "Anfragen pro Minute"]),
    ("/admin/usage", "Nutzung", ["Zeitraum", "Anfragen und Fehler", "Diese Tabelle herunterladen (CSV)"]),
    ("/admin/audit", "Audit", ["Aktion", "Akteur", "Vorher"]),
    ("/admin/pools", "Laufzeit-Pools", ["Auf diesem Gateway sind keine Laufzeit-Pools konfiguriert"]),
    ("/admin/persistence", "Persistenz", ["Sicherung herunterladen", "Geheimen Schlüssel einschließen"]),
]


@pytest.mark.parametrize(("path", "title", "labels"), PAGES, ids=[p for p, _, _ in PAGES])
async def test_german_labels(page, gateway, path: str, title: str, labels: list[str]) -> None:
    gw = await gateway([], env={"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"})
    await sign_in(page, gw, lang="de")
    await page.goto(gw.url + path)
    assert await page.inner_text("main h1") == title
    text = await page.inner_text("main")
    for label in labels:
        assert label in text or await page.get_by_text(label).count() > 0, label
    assert await page.locator("nav a[aria-current=page]").count() == 1


async def test_german_messages_from_scripts(page, gateway) -> None:
    gw = await gateway([], env={"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"})
    await sign_in(page, gw, lang="de")
    await page.goto(f"{gw.url}/admin/endpoints")
    await page.fill("#ep-name", "weg")
    await page.fill("#ep-url", f"http://127.0.0.1:{free_port()}")
    await page.click("text=Verbindung testen")
    await page.locator("#ep-result-summary").filter(has_text="Nicht erreichbar").wait_for()


async def test_nav_by_keyboard(page, gateway) -> None:
    gw = await gateway([])
    await sign_in(page, gw)
    for label, url in (("Keys", "/admin/keys"), ("Usage", "/admin/usage"), ("Persistence", "/admin/persistence")):
        await page.locator("nav").get_by_role("link", name=label).focus()
        await page.keyboard.press("Enter")
        await page.wait_for_url(gw.url + url)
    # the create form by keyboard alone: Tab from field to field, Enter submits
    await page.goto(f"{gw.url}/admin/keys")
    await page.focus("#k-app")
    await page.keyboard.type("by-keyboard")
    await page.keyboard.press("Enter")
    await page.locator("#secret-reveal").wait_for()
    assert await page.evaluate("document.activeElement.id") in ("secret-reveal", "secret-value")
