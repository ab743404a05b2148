"""The admin web UI: server-rendered pages (Jinja2) at ``/admin``, a client of the admin JSON API.

Pages render from the same functions the JSON API answers with, and every change goes through the JSON API
itself (``/admin/api/...``, called by the page's script with the session cookie and the CSRF header), so no
rule is decided twice. See ``docs/ui.md`` for how a page is added.

- :mod:`.gate`: the admin gate (who asks, and whether their role may: :mod:`turnout.core.roles`)
- :mod:`.security`: cookies, CSRF, security headers, who is asking (Bearer token or session)
- :mod:`.sessions`: browser sessions in the SQL store
- :mod:`.sso`: single sign-on (OpenID Connect); :mod:`.people_page`: the Account and People pages
- :mod:`.i18n`: message catalogs (English, German)
- :mod:`.assets`: the static assets, served from memory
- :mod:`.render`: the Jinja2 environment, ``@page`` and ``render()``
- :mod:`.signin`, :mod:`.overview`, :mod:`.placement`: the pages
"""

from __future__ import annotations

from aiohttp import web

from turnout.admin.oidc import OidcClient
from turnout.admin.ui.assets import add_asset_route
from turnout.admin.ui.gate import check_admin
from turnout.admin.ui.operator_pages import add_operator_pages
from turnout.admin.ui.overview import add_overview_routes
from turnout.admin.ui.people_page import add_people_pages
from turnout.admin.ui.placement import add_placement_routes
from turnout.admin.ui.render import STATIC, UI, Ui, add_not_found_route
from turnout.admin.ui.security import SESSION_STORE, add_security_headers
from turnout.admin.ui.sessions import SessionStore
from turnout.admin.ui.signin import add_signin_routes
from turnout.admin.ui.sso import add_sso_routes
from turnout.gateway.keys import DATABASE, SETTINGS

__all__ = ["add_ui_routes", "check_admin"]


def add_ui_routes(app: web.Application) -> None:
    """Mount the UI (after ``app[DATABASE]`` and ``app[SETTINGS]`` are set)."""
    settings = app[SETTINGS]
    app[UI] = Ui()
    app[SESSION_STORE] = SessionStore(
        app[DATABASE], idle_s=settings.auth.session_idle_s, max_age_s=settings.auth.session_max_s
    )
    app.on_response_prepare.append(add_security_headers)
    add_asset_route(app, STATIC)
    add_signin_routes(app)
    if settings.auth.oidc is not None:
        add_sso_routes(app, OidcClient(settings.auth.oidc, settings.oidc_client_secret))
    add_people_pages(app)
    add_overview_routes(app)
    add_placement_routes(app)
    add_operator_pages(app)
    add_not_found_route(app)  # last
