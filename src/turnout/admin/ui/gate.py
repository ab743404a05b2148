"""The admin gate: the one place where the UI's pages, the admin JSON API and the CLI's calls (which are admin
API calls) are let in or refused, by the role table of :mod:`turnout.core.roles`.

The gateway's request frame calls :func:`check_admin` for every ``/admin...`` request before its handler
(:data:`turnout.gateway.keys.ADMIN_GATE`, set by :func:`turnout.wiring.create_app`). It finds who is asking
(:func:`turnout.admin.ui.security.principal_of`), the rule of the matched route, and decides:

- allowed: the principal is kept on the request (:data:`turnout.admin.keys.PRINCIPAL`, the audit log's actor),
  with the tenants a team-admin is kept to (:data:`~turnout.admin.keys.TEAM_SCOPE`), and the handler runs;
- refused on the JSON API: 401 when nobody is signed in, else 403 ``forbidden_role`` naming the role it needs;
- refused on a UI page: nobody signed in goes to the sign-in form (the page's ``@page`` does that); a signed-in
  person gets a 403 page naming the role it needs. The UI also hides or disables what a role cannot do, but this
  gate decides.

A route with no rule in the table is refused for everyone (a test enumerates every admin route against every
role). A path no route matches is left to the router's 404, for a signed-in caller.
"""

from __future__ import annotations

from aiohttp import web

from turnout.admin.changes import PRINCIPAL, TEAM_SCOPE
from turnout.admin.ui.render import htmx, render
from turnout.admin.ui.security import is_ui_path, principal_of
from turnout.core.roles import Access, decide, rule_for
from turnout.errors import Forbidden, Unauthorized

__all__ = ["check_admin", "route_template"]


def route_template(request: web.Request) -> str | None:
    """The matched route's path template (``/admin/api/keys/{ref}``), None when no route matched."""
    resource = request.match_info.route.resource
    return None if resource is None else resource.canonical


async def check_admin(request: web.Request) -> web.StreamResponse | None:
    """Let an admin request in (None) or refuse it: a raised error on the JSON API, a page on the UI."""
    template = route_template(request)
    ui = is_ui_path(request.path)
    principal = await principal_of(request)
    if template is None or request.match_info.http_exception is not None:  # the router answers 404 / 405
        if principal is None and not ui:
            raise Unauthorized("admin API needs 'Authorization: Bearer <token>' or a signed-in browser")
        return None
    rule = rule_for(request.method, template)
    if rule is not None and rule.access is Access.PUBLIC:
        return None
    if principal is None:
        if ui:
            return None  # the page's @page sends the browser to the sign-in form
        raise Unauthorized("admin API needs 'Authorization: Bearer <token>' or a signed-in browser")
    decision = decide(principal, rule, what=f"{request.method} {template}")
    if not decision.allowed:
        if ui:
            template_name = "_error.html" if htmx(request) else "error.html"
            return render(request, template_name, status=403, message_key=None, message=decision.message)
        raise Forbidden(decision.message, code="forbidden_role")
    request[PRINCIPAL] = principal
    request[TEAM_SCOPE] = decision.tenants
    return None
