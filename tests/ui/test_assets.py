"""The UI's static assets: every one a page names is served, versioned and cacheable, from memory, so a browser
that leaves mid-request can leave no file open behind it (aiohttp's own static route did, under
``handler_cancellation``: the suite's SSO test failed on an unclosed ``htmx.min.js``)."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import worker
from turnout.admin.ui.assets import IMMUTABLE, REVALIDATE, Assets
from turnout.admin.ui.render import STATIC

ON_DISK = sorted(p.relative_to(STATIC).as_posix() for p in STATIC.rglob("*") if p.is_file())


def test_every_file_in_the_folder_is_an_asset_with_its_bytes_and_type() -> None:
    assets = Assets.load(STATIC)
    assert sorted(assets.files) == ON_DISK
    for name, asset in assets.files.items():
        assert asset.body == (STATIC / name).read_bytes()
    assert assets.files["vendor/htmx.min.js"].content_type == "text/javascript"
    assert assets.files["ui.css"].content_type == "text/css"
    assert assets.files["favicon.svg"].content_type == "image/svg+xml"
    with pytest.raises(KeyError):
        assets.url("no-such.js")  # a template naming a missing file fails where it renders


async def test_what_the_sign_in_page_links_is_served_and_cacheable(gateway, emulator, monkeypatch) -> None:
    emu = await emulator("w1")
    gw = await gateway([worker("w1", emu.url)])
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/admin") as r:
            html = await r.text()
        links = re.findall(r'(?:href|src)="(/admin/static/[^"]+)"', html)
        assert any("vendor/htmx.min.js?v=" in link for link in links), links
        expected = {name: (STATIC / name).read_bytes() for name in ON_DISK}
        # No file is opened to answer: each is sent from memory, whatever happens on disk now.
        monkeypatch.setattr(Path, "open", _no_open)
        for link in links:
            async with http.get(gw.url + link) as r:
                body = await r.read()
                name = link.split("?")[0].removeprefix("/admin/static/")
                assert r.status == 200 and body == expected[name], link
                assert r.headers["Cache-Control"] == IMMUTABLE
                assert r.headers["X-Content-Type-Options"] == "nosniff"
                etag = r.headers["ETag"]
            async with http.get(gw.url + link, headers={"If-None-Match": f'W/{etag}, "other"'}) as r:
                assert (r.status, await r.read()) == (304, b"")
        stale = "/admin/static/ui.css?v=0123456789abcdef"
        async with http.get(gw.url + stale) as r:  # an old page's URL: the current bytes, revalidated next time
            assert r.status == 200 and r.headers["Cache-Control"] == REVALIDATE
        for missing in ("/admin/static/nope.js", "/admin/static/%2e%2e/render.py", "/admin/static/vendor/../../x.py"):
            async with http.get(gw.url + missing, allow_redirects=False) as r:  # "../" is resolved by the client
                assert r.status in (303, 404) and b"import" not in await r.read(), missing
        async with http.head(gw.url + "/admin/static/ui.css") as r:
            assert r.status == 200 and int(r.headers["Content-Length"]) == len(expected["ui.css"])


def _no_open(*args: object, **kwargs: object) -> object:
    raise AssertionError("a static asset was read from disk per request")
