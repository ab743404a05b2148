"""The Model Placement matrix and the worker ruleset editor, clicked through in Chromium against a real gateway
with emulated Ollama workers. What the page shows is checked against what the gateway then does."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.conftest import free_port, worker
from tests.ui.conftest import sign_in
from turnout.admin.api import placement_matrix
from turnout.admin.ui.placement import cell_state
from turnout.core.placement import resolve_placement
from turnout.gateway.keys import AUDIT, FLEET, POLLER

# The marks are drawn (inline SVG) with their text for screen readers; data-mark names them. Written here as the
# symbols they draw, so that the assertions read as the matrix looks.
SYMBOLS = {"installed": "✓", "loaded": "●", "allowed": "○", "blocked": "⛔", "exact": "↳", "unknown": "?", "na": "·"}


async def mark_of(cell: Any) -> str:
    """The symbols a cell draws (``↳⛔`` for ``data-mark="exact blocked"``), each checked to be drawn as SVG."""
    names = (await cell.get_attribute("data-mark")).split()
    drawn = await cell.evaluate("td => [...td.querySelectorAll('svg.mk use')].map(u => u.getAttribute('href'))")
    assert drawn == [f"#mk-{n}" for n in names], drawn
    return "".join(SYMBOLS[n] for n in names)


async def cell_at(page: Any, model: str, worker_name: str) -> Any:
    """The matrix cell of ``model`` on ``worker_name`` (the header's order decides the column)."""
    index = await page.evaluate(
        "([w]) => [...document.querySelectorAll('#matrix thead th[data-worker]')]"
        ".findIndex(th => th.dataset.worker === w)",
        [worker_name],
    )
    assert index >= 0, f"no column for {worker_name}"
    return page.locator(f'#matrix tbody tr:has(th[data-model="{model}"]) td').nth(index)


async def explanation(target: Any) -> str:
    """What hovering the cell shows (its tooltip, and the line above the matrix)."""
    await target.hover()
    return str(await target.get_attribute("title"))


async def toggled(page: Any, target: Any) -> Any:
    """Click a cell and wait for the page's own "toggled" event (the cell is re-rendered by then)."""
    await page.evaluate(
        "() => { window.__toggled = new Promise(r => document.getElementById('matrix')"
        ".addEventListener('turnout:toggled', e => r(e.detail), {once: true})); }"
    )
    await target.click()
    return await page.evaluate("() => window.__toggled")


async def test_toggle_a_cell_twice_and_it_survives_reload(page, gateway, emulator) -> None:
    w1 = await emulator("w1", models=["llama3.2:latest", "qwen3:8b"], loaded=["llama3.2:latest"])
    w2 = await emulator("w2", models=["llama3.2:latest"])
    gw = await gateway([worker("w1", w1.url), worker("w2", w2.url)])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement")
    target = await cell_at(page, "qwen3:8b", "w1")
    assert await mark_of(target) == "✓"
    assert await mark_of(await cell_at(page, "llama3.2:latest", "w1")) == "●"
    assert await mark_of(await cell_at(page, "qwen3:8b", "w2")) == "○"
    assert "Decided by the worker's mode “Allow all” (from the config file)" in await explanation(target)
    assert await page.inner_text("#cell-info") == "qwen3:8b on w1: allowed, installed. " + (
        "Decided by the worker's mode “Allow all” (from the config file). Click to block it here."
    )

    detail = await toggled(page, target)
    assert detail == {"worker": "w1", "model": "qwen3:8b"}
    assert await mark_of(target) == "↳⛔"
    assert "UI exception" in await target.get_attribute("title")
    assert await page.inner_text("#cell-info") == await target.get_attribute("title")
    rules, source = gw.app[FLEET].rules("w1")
    assert source == "override" and not resolve_placement(rules, "qwen3:8b").allowed  # what the router uses

    await page.reload()
    target = await cell_at(page, "qwen3:8b", "w1")
    assert await mark_of(target) == "↳⛔"
    assert "UI rules" in await page.inner_text('#matrix thead th[data-worker="w1"]')

    await toggled(page, target)
    assert await mark_of(target) == "✓"
    rules, _ = gw.app[FLEET].rules("w1")
    assert rules.exact_rule("qwen3:8b") is None and resolve_placement(rules, "qwen3:8b").allowed
    await page.reload()
    assert await mark_of(await cell_at(page, "qwen3:8b", "w1")) == "✓"
    toggles = gw.app[AUDIT].entries(action="placement.toggle")
    assert [(e.action, e.actor) for e in toggles] == [("placement.toggle", "token")] * 2  # not a script's


async def test_a_click_outvotes_an_exact_config_rule_and_the_next_restores_it(page, gateway, emulator) -> None:
    w1 = await emulator("w1", models=["llama3.2:latest", "qwen3:8b"])
    gw = await gateway([worker("w1", w1.url, model_placement={"mode": "allow_all", "denied_models": ["qwen3:8b"]})])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement")
    target = await cell_at(page, "qwen3:8b", "w1")
    assert await mark_of(target) == "↳⛔"
    said = await explanation(target)
    assert "exact rule “qwen3:8b” (from the config file)" in said and "Click to allow it here" in said
    assert "outrank the config file" in said

    detail = await toggled(page, target)
    assert detail == {"worker": "w1", "model": "qwen3:8b"}
    assert await mark_of(target) == "↳✓"
    said = await explanation(target)
    assert "exact rule “qwen3:8b” (UI exception)" in said and "Click to remove this exception" in said
    rules, source = gw.app[FLEET].rules("w1")
    assert source == "override" and resolve_placement(rules, "qwen3:8b").allowed  # what the router uses
    assert "UI rules" in await page.inner_text('#matrix thead th[data-worker="w1"]')

    await toggled(page, target)
    assert await mark_of(target) == "↳⛔"
    assert "(from the config file)" in await explanation(target)
    rules, _ = gw.app[FLEET].rules("w1")
    assert rules == gw.app[FLEET].workers["w1"].baseline  # the config's own rule, in force again
    await page.reload()
    assert await mark_of(await cell_at(page, "qwen3:8b", "w1")) == "↳⛔"


async def sr_text(cell: Any) -> str:
    """What a screen reader reads of a cell: its marks are hidden from it, so the text beside them."""
    return str(await cell.evaluate("td => td.querySelector('.sr-only').textContent"))


async def test_a_click_on_a_redundant_ui_exception_removes_it(page, gateway, emulator) -> None:
    """An exact allow made through the API on an allow_all worker agrees with the mode; it is still a UI exception,
    its cell says so (↳, also to a screen reader), and clicking it removes it instead of writing a deny."""
    w1 = await emulator("w1", models=["llama3.2:latest", "qwen3:8b"])
    gw = await gateway([worker("w1", w1.url)])
    rules = {"mode": "allow_all", "allowed_models": ["qwen3:8b"], "denied_models": []}
    async with (
        aiohttp.ClientSession() as http,
        http.put(f"{gw.url}/admin/api/placement/workers/w1", json=rules, headers=gw.admin_headers) as resp,
    ):
        assert resp.status == 200, await resp.text()
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement")
    target = await cell_at(page, "qwen3:8b", "w1")
    assert await mark_of(target) == "↳✓"
    assert await sr_text(target) == "allowed, installed, decided by an exact rule"
    said = await explanation(target)
    assert "exact rule “qwen3:8b” (UI exception)" in said and "Click to remove this exception" in said
    assert await sr_text(await cell_at(page, "llama3.2:latest", "w1")) == "allowed, installed"  # the mode decides

    await toggled(page, target)
    assert await mark_of(target) == "✓"
    assert await sr_text(target) == "allowed, installed"
    assert "Decided by the worker's mode “Allow all” (from the config file)" in await explanation(target)
    rules_now, _ = gw.app[FLEET].rules("w1")
    assert rules_now.exact_rule("qwen3:8b") is None and not rules_now.denied  # removed, no deny written
    await page.reload()
    assert await mark_of(await cell_at(page, "qwen3:8b", "w1")) == "✓"


async def test_screen_readers_hear_the_exact_rule_in_german(page, gateway, emulator) -> None:
    w1 = await emulator("w1", models=["qwen3:8b"])
    gw = await gateway([worker("w1", w1.url, model_placement={"mode": "allow_all", "denied_models": ["qwen3:8b"]})])
    await sign_in(page, gw, lang="de")
    await page.goto(f"{gw.url}/admin/placement")
    target = await cell_at(page, "qwen3:8b", "w1")
    assert await mark_of(target) == "↳⛔"
    assert await sr_text(target) == "gesperrt (dort installiert), durch eine exakte Regel entschieden"


async def test_matrix_keyboard_navigation(page, gateway, emulator) -> None:
    w1 = await emulator("w1", models=["a:latest", "b:latest"])
    w2 = await emulator("w2", models=["a:latest"])
    gw = await gateway([worker("w1", w1.url), worker("w2", w2.url)])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement")
    # one tab stop for the whole grid: Tab from the last link before it lands on the first cell
    await page.locator('#matrix thead th[data-worker="w2"] a').focus()
    await page.keyboard.press("Tab")
    focused = await page.evaluate("() => [document.activeElement.tagName, document.activeElement.cellIndex]")
    assert focused == ["TD", 1]
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("ArrowRight")
    where = await page.evaluate(
        "() => [document.activeElement.parentNode.cells[0].dataset.model, document.activeElement.cellIndex,"
        " document.activeElement.title === document.getElementById('cell-info').textContent]"
    )
    assert where == ["b:latest", 2, True]
    await page.evaluate(
        "() => { window.__toggled = new Promise(r => document.getElementById('matrix')"
        ".addEventListener('turnout:toggled', e => r(e.detail), {once: true})); }"
    )
    await page.keyboard.press("Enter")
    assert await page.evaluate("() => window.__toggled") == {"worker": "w2", "model": "b:latest"}
    assert not resolve_placement(gw.app[FLEET].rules("w2")[0], "b:latest").allowed


async def test_one_cell_is_the_matrix_cell(gateway, emulator) -> None:
    w1 = await emulator("w1", models=["a:latest", "b:latest", "c:1b"], loaded=["a:latest"])
    gw = await gateway(
        [
            worker("w1", w1.url, model_placement={"mode": "whitelist", "allowed_models": ["a", "c:*"]}),
            worker("down", f"http://127.0.0.1:{free_port()}"),
        ]
    )
    fleet = gw.app[FLEET]
    fleet.placement.put("down", fleet.rules("down")[0].parse("allow_all", [], ["b:latest", "x*"]))
    matrix = placement_matrix(fleet)
    for row in matrix["workers"]:
        for model, expected in row["cells"].items():
            assert cell_state(fleet, fleet.workers[row["name"]], model) == expected, (row["name"], model)


async def test_ruleset_editor_shortcuts(page, gateway, emulator) -> None:
    w1 = await emulator("w1", models=["llama3.2:latest", "qwen3:8b"])
    baseline = {"mode": "allow_all", "denied_models": ["phi*"]}
    gw = await gateway([worker("w1", w1.url, model_placement=baseline)])
    fleet = gw.app[FLEET]
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement")
    await page.click('#matrix thead th[data-worker="w1"] a')
    await page.wait_for_url(f"{gw.url}/admin/placement/workers/w1")
    assert await page.is_disabled("#reset")  # nothing to reset yet

    async def after(action: Any) -> None:
        await page.evaluate(
            "() => { window.__saved = new Promise(r => document.addEventListener('turnout:rules-saved', r,"
            " {once: true})); }"
        )
        await action()
        await page.evaluate("() => window.__saved")

    await after(lambda: page.click("#only-installed"))
    rules, source = fleet.rules("w1")
    assert source == "override"
    assert rules.to_json() == {
        "mode": "whitelist",
        "allowed_models": ["llama3.2:latest", "qwen3:8b"],
        "denied_models": [],
    }
    assert await page.input_value("#allowed_models") == "llama3.2:latest\nqwen3:8b"
    assert await page.is_checked("input[name=mode][value=whitelist]")

    await after(lambda: page.click("#block-all"))
    assert fleet.rules("w1")[0].to_json() == {"mode": "whitelist", "allowed_models": [], "denied_models": []}
    await page.goto(f"{gw.url}/admin/placement")
    assert await mark_of(await cell_at(page, "qwen3:8b", "w1")) == "⛔"
    await page.go_back()

    await page.click("#reset")
    dialog = page.locator("#reset-dialog")
    assert await dialog.is_visible()
    assert "phi*" in await dialog.inner_text()  # the baseline is shown before you confirm
    await after(lambda: page.click("#reset-confirm"))
    assert fleet.rules("w1")[1] == "config"
    assert fleet.placement.get("w1") is None
    assert "config default" in await page.inner_text("#rules-source")
    actions = [e.action for e in gw.app[AUDIT].entries(limit=20)]
    assert {"placement.only_installed", "placement.put", "placement.delete"} <= set(actions)


async def test_only_installed_refused_while_inventory_unknown(page, gateway) -> None:
    gw = await gateway([worker("gone", f"http://127.0.0.1:{free_port()}")])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement/workers/gone")
    assert "not known" in await page.inner_text("#only-installed-help")
    await page.click("#only-installed")
    error = page.locator("#only-installed-error")
    await error.wait_for()
    assert "not known yet" in await error.inner_text()
    assert gw.app[FLEET].placement.get("gone") is None


async def test_patterns_are_checked_inline_and_on_save(page, gateway, emulator) -> None:
    w1 = await emulator("w1", models=["llama3.2:latest"])
    gw = await gateway([worker("w1", w1.url)])
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement/workers/w1")
    await page.fill("#denied_models", "qwen3:*\nqw*en")
    error = page.locator("#denied_models-error")
    await page.wait_for_function("() => document.getElementById('denied_models-error').textContent.includes('*')")
    assert "only allowed once, as the last character" in await error.inner_text()
    assert await page.get_attribute("#denied_models", "aria-invalid") == "true"
    await page.fill("#denied_models", "qwen3:*")
    await page.wait_for_function("() => document.getElementById('denied_models-error').textContent === ''")
    # the PUT's own 422 lands next to its field too (an inline check can be skipped by a fast Save)
    await page.fill("#allowed_models", "a*b")
    await page.click("#save")
    await page.wait_for_function("() => document.getElementById('allowed_models-error').textContent.includes('*')")
    assert gw.app[FLEET].placement.get("w1") is None


async def test_two_tabs_editing_one_worker(page, gateway, emulator) -> None:
    w1 = await emulator("w1", models=["llama3.2:latest", "qwen3:8b"])
    gw = await gateway([worker("w1", w1.url)])
    await sign_in(page, gw)
    other = await page.context.new_page()
    await page.goto(f"{gw.url}/admin/placement/workers/w1")
    await other.goto(f"{gw.url}/admin/placement/workers/w1")
    await page.click("#block-all")
    await page.wait_for_function("() => document.getElementById('rules-source').textContent.includes('UI')")
    await other.fill("#denied_models", "qwen3:8b")
    await other.click("#save")
    banner = other.locator("#stale")
    await banner.wait_for()
    assert "changed elsewhere" in await banner.inner_text()
    assert gw.app[FLEET].rules("w1")[0].to_json()["allowed_models"] == []  # the stale tab changed nothing
    assert gw.app[FLEET].rules("w1")[0].to_json()["denied_models"] == []
    # the matrix tab is told too
    await other.goto(f"{gw.url}/admin/placement")
    await page.click("#reset")
    await page.click("#reset-confirm")
    await page.wait_for_function("() => document.getElementById('rules-source').textContent.includes('config')")
    await toggled(other, await cell_at(other, "qwen3:8b", "w1"))
    await other.locator("#stale").wait_for()
    assert gw.app[FLEET].placement.get("w1") is None
    await other.close()


async def test_only_installed_with_a_stale_inventory_asks_first(page, gateway, emulator) -> None:
    w1 = await emulator("w1", models=["llama3.2:latest", "qwen3:8b"])
    gw = await gateway([worker("w1", w1.url)])
    w1.behaviour.tags_status = 500  # the listing breaks; inference would still work
    await gw.app[POLLER].poll_all()
    assert gw.app[FLEET].workers["w1"].inventory_stale
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement/workers/w1")
    assert "listing failed" in await page.inner_text("#inventory-stale")
    await page.click("#only-installed")
    await page.locator("#only-installed-error").wait_for()
    assert "stale" in await page.inner_text("#only-installed-error")
    assert gw.app[FLEET].placement.get("w1") is None
    await page.click("#only-installed-stale")
    await page.wait_for_function("() => document.getElementById('rules-source').textContent.includes('UI')")
    assert gw.app[FLEET].rules("w1")[0].to_json()["allowed_models"] == ["llama3.2:latest", "qwen3:8b"]


async def test_cells_the_router_never_asks_are_marked_and_inert(page, gateway, emulator) -> None:
    gpu = await emulator("gpu", models=["qwen3:8b"])
    mac = await emulator("mac", models=["llama3.2:latest"])
    gw = await gateway([worker("gpu", gpu.url)], env={"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"})
    async with aiohttp.ClientSession(headers=gw.admin_headers) as http:
        endpoint = {"name": "mac", "url": mac.url, "api": "ollama"}
        async with http.post(f"{gw.url}/admin/api/endpoints", json=endpoint) as r:
            assert r.status == 201, await r.text()
    await sign_in(page, gw)
    await page.goto(f"{gw.url}/admin/placement")
    assert "never routed to this column" in await page.inner_text(".legend")
    own = await cell_at(page, "mac/llama3.2:latest", "mac")
    assert await mark_of(own) in ("✓", "●")  # its own model: an ordinary cell
    elsewhere = await cell_at(page, "mac/llama3.2:latest", "gpu")
    assert await mark_of(elsewhere) == "·"
    assert "go to mac only" in await explanation(elsewhere)
    fleet_model = await cell_at(page, "qwen3:8b", "mac")
    assert await mark_of(fleet_model) == "·"
    assert "mac serves only its own models" in await explanation(fleet_model)
    await fleet_model.click()
    await page.keyboard.press("Enter")
    assert gw.app[FLEET].placement.get("mac") is None and gw.app[FLEET].placement.get("gpu") is None
    assert await mark_of(await cell_at(page, "qwen3:8b", "gpu")) == "✓"  # the fleet's own cells are as before
