"""Mounts the operator pages: Endpoints, Model aliases, Keys, Usage, Batches, Audit, Runtime pools, Persistence (one
module each)."""

from __future__ import annotations

from aiohttp import web

from turnout.admin.ui.audit_page import add_audit_routes
from turnout.admin.ui.batches_page import add_batches_routes
from turnout.admin.ui.endpoints_page import add_endpoints_routes
from turnout.admin.ui.keys_page import add_keys_routes
from turnout.admin.ui.models_page import add_models_routes
from turnout.admin.ui.persistence_page import add_persistence_routes
from turnout.admin.ui.pools_page import add_pools_routes
from turnout.admin.ui.usage_page import add_usage_routes

__all__ = ["add_operator_pages"]


def add_operator_pages(app: web.Application) -> None:
    add_endpoints_routes(app)
    add_models_routes(app)
    add_keys_routes(app)
    add_usage_routes(app)
    add_batches_routes(app)
    add_persistence_routes(app)
    add_audit_routes(app)
    add_pools_routes(app)
