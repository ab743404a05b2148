"""The Usage page: requests, tokens, errors and p50/p95 latency over time as charts (uPlot, drawn by
``static/usage.js`` from ``GET /admin/api/usage/series``), per key, endpoint, worker or model (the filters),
with the table of ``GET /admin/api/usage`` below and both as CSV downloads.

The page asks the API's own handlers with its query (:func:`turnout.admin.accounts.usage`: the same range,
bucket and filter checks); a filter the API refuses is shown next to its field. The series and CSV links
carry the same query, so the charts, the table and the downloads always agree.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from turnout.admin.accounts import list_keys, usage
from turnout.admin.ui.answers import answer, without_blanks
from turnout.admin.ui.display import iso, ms, number, when
from turnout.admin.ui.render import page, render
from turnout.errors import Unprocessable
from turnout.gateway.keys import ENDPOINTS, FLEET

__all__ = ["FILTERS", "MAX_LINES", "RANGES", "SPLITS", "TABLE_ROWS", "add_usage_routes", "split_values"]

FILTERS = ("since", "until", "bucket", "key", "endpoint", "worker", "model")
RANGES = ("1h", "6h", "24h", "7d", "30d")  # the range menu; any time the API reads works in the URL
TABLE_ROWS = 500  # rows shown below the charts (the CSV has them all)
SPLITS = ("key", "model", "worker", "endpoint")  # "one line per ...": each line is the series with that filter
MAX_LINES = 6  # the busiest values get a line


def split_values(rows: list[dict[str, Any]], split: str, endpoints: set[str]) -> list[str]:
    """The values of ``split`` in the usage rows, busiest first (at most MAX_LINES): each becomes a chart line,
    drawn from the series the API answers with that value as its filter. Endpoints and workers are both in
    the rows' worker column; ``endpoints`` tells them apart. This only picks and orders the lines: what a
    line counts (an endpoint's includes the requests that fell back from it) is the API's filter."""
    counts: dict[str, int] = {}
    for r in rows:
        name = r["worker" if split == "endpoint" else split]
        if not name:
            continue
        if (split == "worker" and name in endpoints) or (split == "endpoint" and name not in endpoints):
            continue
        counts[name] = counts.get(name, 0) + r["requests"]
    return sorted(counts, key=lambda n: (-counts[n], n))[:MAX_LINES]


@page
async def usage_page(request: web.Request) -> web.StreamResponse:
    clean = without_blanks(request)
    filters = {name: request.query.get(name, "") for name in FILTERS}
    query = {k: v for k, v in filters.items() if v}
    error: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = []
    try:
        body = await answer(usage, clean)
        rows = sorted(body["rows"], key=lambda r: (-r["bucket_start"], -r["requests"]))
    except Unprocessable as exc:
        error = {"field": (exc.field or "").split(".")[0].split("[")[0], "message": exc.message}
    keys = (await answer(list_keys, request.clone(rel_url=request.rel_url.with_query({}))))["keys"]
    fleet = request.app[FLEET]
    endpoint_names = sorted(e["name"] for e in request.app[ENDPOINTS].describe())
    split = request.query.get("split", "")
    split = split if split in SPLITS else ""
    encoded = urlencode(query)
    return render(
        request,
        "usage.html",
        active="ui.usage",
        filters=filters,
        filtered=any(v for k, v in filters.items() if k not in ("since", "bucket")),
        ranges=RANGES,
        keys=keys,
        endpoint_names=endpoint_names,
        splits=SPLITS,
        split=split,
        lines=split_values(rows, split, set(endpoint_names)) if split else [],
        worker_names=sorted(n for n, s in fleet.workers.items() if s.external is None),
        models=sorted({r["model"] for r in rows if r["model"]}),
        rows=rows[:TABLE_ROWS],
        more_rows=max(0, len(rows) - TABLE_ROWS),
        totals={
            "requests": sum(r["requests"] for r in rows),
            "errors": sum(r["errors"] for r in rows),
            "tokens": sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows),
        },
        error=error,
        series_url="/admin/api/usage/series" + (f"?{encoded}" if encoded else ""),
        csv_url="/admin/api/usage?" + urlencode({**query, "format": "csv"}),
        series_csv_url="/admin/api/usage/series?" + urlencode({**query, "format": "csv"}),
        when=when,
        iso=iso,
        ms=ms,
        number=number,
    )


def add_usage_routes(app: web.Application) -> None:
    app.router.add_get("/admin/usage", usage_page, name="ui.usage")
