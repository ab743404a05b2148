"""The "AI models / endpoints" page in a real browser: add an endpoint and test it first (ok, unreachable,
a private address without the opt-in), see its key once, edit it, a stale edit refused, remove it."""

from __future__ import annotations

import aiohttp

from tests.conftest import ADMIN_TOKEN, free_port, worker
from tests.ui.conftest import sign_in
from turnout.gateway.keys import AUDIT, KEYS

PRIVATE_OK = {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def fill_form(page, name: str, url: str, api: str = "ollama") -> None:
    await page.fill("#ep-name", name)
    await page.fill("#ep-url", url)
    await page.select_option("#ep-api", api)


async def test_add_test_edit_and_remove(page, gateway, emulator) -> None:
    mac = await emulator("mac", ["llama3.2:latest", "qwen3:8b"])
    gw = await gateway([], env=PRIVATE_OK)
    await sign_in(page, gw)
    await page.click("nav >> text=AI models")
    await page.wait_for_url(f"{gw.url}/admin/endpoints")
    assert await page.locator("#no-endpoints").is_visible()
    assert await page.locator("#private-off").count() == 0  # this gateway allows private destinations

    await fill_form(page, "mac", mac.url)
    await page.click("#ep-test")
    summary = page.locator("#ep-result-summary.ok")
    await summary.wait_for()
    assert "models found: 2" in await summary.inner_text()
    assert await page.locator("#ep-result-models li").all_inner_texts() == ["llama3.2:latest", "qwen3:8b"]
    assert await page.locator("#endpoints-table").count() == 0  # a test saves nothing

    await page.click("#ep-save")
    await page.locator("#secret-reveal").wait_for()
    key = await page.input_value("#secret-value")
    assert key.startswith("tk_") and len(key) > 40
    row = page.locator("tr[data-endpoint=mac]")
    await row.wait_for()
    assert await row.get_attribute("data-state") == "online"
    assert "since" in await row.locator("[data-since]").inner_text()
    assert [r.app for r in gw.app[KEYS].all()] == ["endpoint-mac"]
    await page.click("#secret-done")
    assert await page.input_value("#secret-value") == ""  # gone from the page once hidden

    # a fallback model that is a pattern: the API's 422 is shown next to its field
    await row.get_by_role("button", name="Edit mac").click()
    assert await page.locator("#ep-name").get_attribute("readonly") is not None
    listed = len(mac.listings)
    await page.click("#ep-test")  # unchanged settings: the saved endpoint is checked, with its credential
    await page.locator("#ep-result-summary.ok").wait_for()
    assert len(mac.listings) > listed
    await page.fill("#ep-fallback", "bad*")
    await page.click("#ep-save")
    await page.locator("#ep-fallback-error").filter(has_text="pattern").wait_for()
    assert await page.get_attribute("#ep-fallback", "aria-invalid") == "true"
    await page.fill("#ep-fallback", "qwen3:8b")
    await page.fill("#ep-budget", "1500")
    await page.click("#ep-save")
    await row.locator("text=latency budget 1500 ms").wait_for()
    assert "qwen3:8b" in await row.inner_text()

    await row.get_by_role("button", name="Remove mac").click()
    await page.locator("#remove-dialog").wait_for()
    await page.click("#remove-confirm")
    await page.locator("#no-endpoints").wait_for()
    assert gw.app[KEYS].all()[0].revoked_at is not None  # the key it printed is revoked with it
    actions = [e.action for e in gw.app[AUDIT].entries(limit=50)]
    for action in ("endpoint.register", "endpoint.change", "endpoint.remove", "key.revoke"):
        assert action in actions, action


async def test_unreachable_shows_the_hint_next_to_the_url(page, gateway) -> None:
    gw = await gateway([], env=PRIVATE_OK)
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/endpoints")
    await fill_form(page, "gone", f"http://127.0.0.1:{free_port()}")
    await page.click("#ep-test")
    hint = page.locator("#ep-url-error")
    await hint.filter(has_text="connection refused").wait_for()
    assert await page.get_attribute("#ep-url", "aria-invalid") == "true"
    assert "Not reachable" in await page.inner_text("#ep-result-summary")
    await page.click("#ep-recheck")  # Re-check runs the same test again
    await hint.filter(has_text="connection refused").wait_for()
    assert await page.locator("#endpoints-table").count() == 0


async def test_private_address_without_opt_in_is_warned(page, gateway, emulator) -> None:
    mac = await emulator("mac")
    gw = await gateway([])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/endpoints")
    assert "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS" in await page.inner_text("#private-off")
    await fill_form(page, "mac", mac.url)
    await page.click("#ep-test")
    await page.locator("#ep-url-warning").filter(has_text="private network").wait_for()
    assert "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true" in await page.inner_text("#ep-url-error")
    assert mac.served() == 0  # nothing was dialed
    await page.click("#ep-save")  # it still registers (unreachable), and the list warns too
    row = page.locator("tr[data-endpoint=mac]")
    await row.wait_for()
    assert await row.get_attribute("data-state") == "unreachable"
    assert await row.locator("[data-private-warning]").is_visible()


async def test_stale_edit_is_refused_and_a_duplicate_name_named(page, gateway, emulator) -> None:
    mac = await emulator("mac")
    gw = await gateway([worker("gpu", mac.url)], env=PRIVATE_OK)
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        body = {"name": "mac", "url": mac.url, "api": "ollama"}
        async with http.post(f"{gw.url}/admin/api/endpoints", json=body) as r:
            assert r.status == 201
        await sign_in(page, gw)
        await page.goto(f"{gw.url}/admin/endpoints")
        await page.get_by_role("button", name="Edit mac").click()
        async with http.patch(f"{gw.url}/admin/api/endpoints/mac", json={"latency_budget_ms": 900}) as r:
            assert r.status == 200  # another admin changes it meanwhile
        await page.fill("#ep-budget", "2000")
        await page.click("#ep-save")
        await page.locator("#ep-form-error").filter(has_text="changed elsewhere").wait_for()
    async with aiohttp.ClientSession(headers=ADMIN) as http, http.get(f"{gw.url}/admin/api/endpoints/mac") as r:
        assert (await r.json())["latency_budget_ms"] == 900
    await page.click("#ep-cancel")
    # keyboard only: type the form and press Enter
    await page.focus("#ep-name")
    await page.keyboard.type("mac")
    await page.keyboard.press("Tab")
    await page.keyboard.type(mac.url)
    await page.keyboard.press("Enter")
    await page.locator("#ep-name-error").filter(has_text="already exists").wait_for()
    await page.fill("#ep-name", "gpu")  # a configured worker's name
    await page.click("#ep-test")
    await page.locator("#ep-name-error").filter(has_text="already taken").wait_for()


async def test_a_credential_named_by_a_variable_of_the_gateway(page, gateway, emulator) -> None:
    mac = await emulator("mac", ["llama3.2:latest"], require_key="sk-from-env")
    gw = await gateway([], env={**PRIVATE_OK, "MAC_KEY": "sk-from-env"})
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/endpoints")
    await fill_form(page, "mac", mac.url)
    await page.fill("#ep-credential-env", "NOPE_UNSET")
    await page.click("#ep-test")
    await page.locator("#ep-credential_env-error").filter(has_text="NOPE_UNSET is not set").wait_for()
    await page.fill("#ep-credential-env", "MAC_KEY")
    await page.click("#ep-test")
    await page.locator("#ep-result-summary.ok").wait_for()  # the server accepted the gateway's variable
    await page.click("#ep-save")
    await page.locator("#secret-reveal").wait_for()
    row = page.locator("tr[data-endpoint=mac]")
    await row.wait_for()
    assert await row.get_attribute("data-state") == "online"


async def test_a_pasted_api_suffix_is_dropped_and_said(page, gateway, emulator) -> None:
    mac = await emulator("mac")
    gw = await gateway([], env=PRIVATE_OK)
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/endpoints")
    await fill_form(page, "mac", f"{mac.url}/v1", api="openai")  # as LM Studio shows its address
    await page.click("#ep-test")
    await page.locator("#ep-url-warning").filter(has_text=f"Using {mac.url}").wait_for()
    assert await page.input_value("#ep-url") == mac.url  # the URL the gateway uses, in the field
    await page.click("#ep-save")
    await page.locator("#secret-reveal").wait_for()
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{gw.url}/admin/api/endpoints/mac", headers=ADMIN) as resp,
    ):
        assert (await resp.json())["url"] == mac.url
