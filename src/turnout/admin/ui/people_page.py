"""The Account page (who you are, your role, your personal admin tokens: make one, shown once; revoke) and the
People page (everyone who signed in with single sign-on, their role and tokens; an admin disables or enables a
person and revokes their tokens).

Both render what the JSON API answers (:mod:`turnout.admin.people_api`); changes are calls from
``static/people.js`` to that API. What a role may not do is not shown; the admin gate decides either way.
"""

from __future__ import annotations

from aiohttp import web

from turnout.admin.people_api import list_people, me, my_tokens
from turnout.admin.ui.answers import answer
from turnout.admin.ui.display import iso, when
from turnout.admin.ui.render import page, render
from turnout.core.roles import Role
from turnout.gateway.keys import SETTINGS

__all__ = ["add_people_pages"]


@page
async def account_page(request: web.Request) -> web.StreamResponse:
    who = await answer(me, request)
    tokens = (await answer(my_tokens, request))["tokens"] if who["person"] is not None else []
    settings = request.app[SETTINGS]
    roles = [r.value for r in (Role.VIEWER, Role.OPERATOR, Role.ADMIN)]
    offered = roles[: roles.index(who["role"]) + 1] if who["role"] in roles else []
    offered += [f"team-admin:{t}" for t in who["teams"]]
    return render(
        request,
        "account.html",
        active="ui.account",
        who=who,
        tokens=tokens,
        offered=offered,
        max_days=settings.auth.token_max_days,
        when=when,
        iso=iso,
    )


@page
async def people_page(request: web.Request) -> web.StreamResponse:
    people = (await answer(list_people, request))["people"]
    return render(request, "people.html", active="ui.people", people=people, when=when, iso=iso)


def add_people_pages(app: web.Application) -> None:
    app.router.add_get("/admin/account", account_page, name="ui.account")
    app.router.add_get("/admin/people", people_page, name="ui.people")
