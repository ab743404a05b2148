"""The UI's static assets (``static/``: scripts, styles, the vendored htmx and uPlot), served from memory.

They are read once, when the UI is mounted (about 200 KiB), and each is answered from bytes in memory:
no file is opened per request. aiohttp's own static route opens the file in a worker thread; with
``handler_cancellation`` on (the gateway cancels a handler whose client went away, so a cancelled stream
stops costing the engine), a browser that navigates away during that open leaves the opened file behind,
unclosed. Bytes in memory cannot leak, and cost nothing to send.

A page names an asset by :meth:`Assets.url`: ``/admin/static/<file>?v=<content hash>``. A request whose ``v``
is the current hash may be cached for a year (the URL changes with the content); any other gets the ETag
and ``no-cache``, and ``If-None-Match`` with the current ETag gets 304.
"""

from __future__ import annotations

import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

__all__ = ["ASSETS", "Asset", "Assets", "add_asset_route"]

IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".md": "text/markdown"}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    version: str  # the first 16 hex digits of the content's SHA-256

    @property
    def etag(self) -> str:
        return f'"{self.version}"'


@dataclass(frozen=True, slots=True)
class Assets:
    files: dict[str, Asset]  # path relative to the static folder, with "/" -> asset

    @classmethod
    def load(cls, folder: Path) -> Assets:
        files: dict[str, Asset] = {}
        for path in sorted(folder.rglob("*")):
            if not path.is_file():
                continue
            body = path.read_bytes()
            kind = _TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            name = path.relative_to(folder).as_posix()
            files[name] = Asset(body, kind, hashlib.sha256(body).hexdigest()[:16])
        return cls(files)

    def url(self, filename: str) -> str:
        """``/admin/static/<file>?v=<hash>``; a name that is not an asset is a template's mistake: KeyError."""
        return f"/admin/static/{filename}?v={self.files[filename].version}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        asset = self.files.get(request.match_info["filename"])
        if asset is None:
            raise web.HTTPNotFound(text="no such file in the UI's static assets")
        fresh = request.query.get("v") == asset.version
        headers = {"ETag": asset.etag, "Cache-Control": IMMUTABLE if fresh else REVALIDATE}
        if _matches(asset.etag, request.headers.get("If-None-Match", "")):
            return web.Response(status=304, headers=headers)
        charset = "utf-8" if asset.content_type.startswith("text/") or asset.content_type.endswith("+xml") else None
        return web.Response(body=asset.body, content_type=asset.content_type, charset=charset, headers=headers)


def _matches(etag: str, if_none_match: str) -> bool:
    """Whether ``If-None-Match`` names this entity tag or ``*`` (weak tags compare as strong: RFC 9110 13.1.2)."""
    tags = {part.strip().removeprefix("W/") for part in if_none_match.split(",")}
    return etag in tags or "*" in tags


ASSETS: web.AppKey[Assets] = web.AppKey("ui_assets")


def add_asset_route(app: web.Application, folder: Path) -> None:
    assets = Assets.load(folder)
    app[ASSETS] = assets
    app.router.add_get(r"/admin/static/{filename:[A-Za-z0-9_./-]+}", assets.handle, name="ui.static")
