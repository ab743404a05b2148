"""The Model aliases page in a real browser: add an alias and use it, a chain refused next to its field, change
one (a stale change refused), a config alias replaced and restored, remove, the usage page naming the alias, the
German labels, and a viewer's page without the controls the server would refuse."""

from __future__ import annotations

import time

import aiohttp

from tests.conftest import ADMIN_TOKEN, worker
from tests.ui.conftest import sign_in
from turnout.admin.keys import PEOPLE
from turnout.admin.ui.security import SESSION_COOKIE, SESSION_STORE
from turnout.admin.ui.sessions import Identity
from turnout.gateway.keys import AUDIT

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def chat(gw, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
        await r.read()
        return r.status


async def test_add_use_change_remove(page, gateway, emulator) -> None:
    emu = await emulator("w1", ["qwen3-coder:30b", "llama3.2:latest", "gpt-4o:latest"])
    gw = await gateway([worker("w1", emu.url)], aliases={"gpt-5-codex": "qwen3-coder:30b"})
    await sign_in(page, gw)
    await page.locator("nav").get_by_role("link", name="Aliases").click()
    await page.wait_for_url(f"{gw.url}/admin/models")
    config_row = page.locator("tr[data-alias='gpt-5-codex']")
    assert "config file" in await config_row.inner_text() and "w1" in await config_row.inner_text()
    assert await config_row.get_by_role("button", name="Remove alias gpt-5-codex").count() == 0
    served = page.locator("#served-table tr[data-name='gpt-5-codex']")
    assert "qwen3-coder:30b" in await served.inner_text()

    # add; the alias is in force at once
    await page.fill("#a-name", "claude-sonnet-4-5")
    await page.fill("#a-model", "qwen3-coder:30b")
    await page.click("#a-save")
    await page.locator("#toast").filter(has_text="claude-sonnet-4-5 -> qwen3-coder:30b added").wait_for()
    row = page.locator("tr[data-alias='claude-sonnet-4-5']")
    await row.wait_for()
    assert (
        await row.get_attribute("data-source") == "runtime" and "w1" in await row.locator("[data-served]").inner_text()
    )
    assert await chat(gw, "claude-sonnet-4-5") == 200 and emu.calls[-1][1]["model"] == "qwen3-coder:30b"

    # a chain is refused next to the field it is about, and nothing changes
    await page.fill("#a-name", "sonnet")
    await page.fill("#a-model", "claude-sonnet-4-5")
    await page.click("#a-save")
    await page.locator("#a-model-error").filter(has_text="aliases do not chain").wait_for()
    assert await page.get_attribute("#a-model", "aria-invalid") == "true"
    assert await page.locator("tr[data-alias='sonnet']").count() == 0
    await page.fill("#a-name", "")
    await page.click("#a-save")
    await page.locator("#a-name-error").filter(has_text="Give the alias a name").wait_for()

    # change: the row's ETag goes with it; a change made elsewhere meanwhile is refused
    await row.get_by_role("button", name="Change alias claude-sonnet-4-5").click()
    assert await page.input_value("#a-name") == "claude-sonnet-4-5"
    async with (
        aiohttp.ClientSession(headers=ADMIN) as http,
        http.put(f"{gw.url}/admin/api/aliases/claude-sonnet-4-5", json={"model": "gpt-4o"}) as r,
    ):
        assert r.status == 200  # someone else, meanwhile
    await page.fill("#a-model", "llama3.2")
    await page.click("#a-save")
    await page.locator("#alias-form [data-error-for='']").filter(has_text="changed elsewhere").wait_for()
    await row.locator("[data-model]").filter(has_text="gpt-4o").wait_for()  # the list was reloaded
    await row.get_by_role("button", name="Change alias claude-sonnet-4-5").click()
    await page.fill("#a-model", "llama3.2")
    await page.click("#a-save")
    await page.locator("#toast").filter(has_text="now stands for llama3.2").wait_for()
    await row.locator("[data-model]").filter(has_text="llama3.2").wait_for()
    assert await chat(gw, "claude-sonnet-4-5") == 200 and emu.calls[-1][1]["model"] == "llama3.2:latest"

    # an alias hiding a model of its name says so
    await page.fill("#a-name", "gpt-4o")
    await page.fill("#a-model", "qwen3-coder:30b")
    await page.click("#a-save")
    hiding = page.locator("tr[data-alias='gpt-4o']")
    await hiding.filter(has_text="hides the model of this name on w1").wait_for()

    # replace the config alias here, then remove it: the config one applies again
    await config_row.get_by_role("button", name="Change alias gpt-5-codex").click()
    await page.fill("#a-model", "llama3.2")
    await page.click("#a-save")
    await config_row.filter(has_text="replaces the config file's qwen3-coder:30b").wait_for()
    await config_row.get_by_role("button", name="Remove alias gpt-5-codex").click()
    assert "Remove alias gpt-5-codex?" in await page.inner_text("#remove-what")
    await page.click("#remove-confirm")
    await page.locator("#toast").filter(has_text="gpt-5-codex -> qwen3-coder:30b applies again").wait_for()
    await config_row.filter(has_text="config file").wait_for()

    # remove a runtime alias: requests for it fail from then on
    await row.get_by_role("button", name="Remove alias claude-sonnet-4-5").click()
    await page.click("#remove-confirm")
    await page.locator("#toast").filter(has_text="Alias claude-sonnet-4-5 removed.").wait_for()
    await row.wait_for(state="detached")
    assert await chat(gw, "claude-sonnet-4-5") == 404

    # the usage page says which alias the requests named
    await page.goto(f"{gw.url}/admin/usage")
    served = page.locator("tr[data-model='qwen3-coder:30b']").filter(has_text="asked for as claude-sonnet-4-5")
    assert await served.count() == 1

    entries = [(e.action, e.target, e.actor) for e in gw.app[AUDIT].entries(limit=50)]
    assert ("alias.set", "alias:claude-sonnet-4-5", "token") in entries
    assert ("alias.remove", "alias:claude-sonnet-4-5", "token") in entries


async def test_german_labels(page, gateway, emulator) -> None:
    emu = await emulator("w1", ["qwen3-coder:30b"])
    gw = await gateway([worker("w1", emu.url)], aliases={"gpt-5-codex": "qwen3-coder:30b"})
    await sign_in(page, gw, lang="de")
    await page.goto(f"{gw.url}/admin/models")
    assert await page.inner_text("main h1") == "Modell-Aliasse"
    text = await page.inner_text("main")
    for label in ("Alias hinzufügen oder ändern", "Konfigurationsdatei", "Modelle, nach denen Clients fragen können"):
        assert label in text, label
    await page.fill("#a-name", "x")
    await page.fill("#a-model", "gpt-5-codex")
    await page.click("#a-save")
    await page.locator("#a-model-error").filter(has_text="is itself an alias").wait_for()  # the API's words
    await page.fill("#a-model", "qwen3-coder:30b")
    await page.click("#a-save")
    await page.locator("#toast").filter(has_text="Alias x -> qwen3-coder:30b hinzugefügt.").wait_for()


async def test_a_viewer_sees_the_aliases_and_no_way_to_change_them(page, gateway, emulator) -> None:
    emu = await emulator("w1", ["qwen3-coder:30b"])
    gw = await gateway([worker("w1", emu.url)], aliases={"gpt-5-codex": "qwen3-coder:30b"})
    now = time.time()
    person = gw.app[PEOPLE].sign_in(subject="v", email="v@example.com", name=None, role="viewer", teams=[], now=now)
    identity = Identity(person.person.actor, person.person.id, "viewer", (), person.person.label)
    cookie, _ = gw.app[SESSION_STORE].create(remote="127.0.0.1", now=now, identity=identity)
    await page.context.add_cookies([{"name": SESSION_COOKIE, "value": cookie, "domain": "127.0.0.1", "path": "/admin"}])
    await page.goto(f"{gw.url}/admin/models")
    assert await page.inner_text("main h1") == "Model aliases"
    assert "qwen3-coder:30b" in await page.inner_text("tr[data-alias='gpt-5-codex']")
    assert await page.locator("#alias-form").count() == 0
    assert await page.locator("#models-list button").count() == 0  # the server would refuse them (403)
