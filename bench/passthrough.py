"""The reference floor: the barest useful aiohttp pass-through proxy (no parsing, routing or metrics).

Run: python bench/passthrough.py PORT UPSTREAM_URL
"""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web


def make_app(upstream: str) -> web.Application:
    app = web.Application()
    holder: dict[str, aiohttp.ClientSession] = {}

    async def lifecycle(_: web.Application):  # type: ignore[no-untyped-def]
        holder["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        yield
        await holder["s"].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with holder["s"].post(
            upstream + request.path, data=body, headers={"Content-Type": "application/json"}
        ) as up:
            if up.content_type != "text/event-stream":
                return web.Response(status=up.status, body=await up.read(), content_type=up.content_type)
            resp = web.StreamResponse(status=up.status)
            resp.content_type = up.content_type
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/{tail:.*}", proxy)
    return app


if __name__ == "__main__":
    web.run_app(make_app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
