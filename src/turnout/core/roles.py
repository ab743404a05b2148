"""Who may do what in the admin UI, the admin API and the CLI: the role table and the one decision.

Roles (``docs/sso.md`` has the table people read):

- ``viewer``: sees every page and listing, never a secret, changes nothing;
- ``operator``: also changes placement, workers, endpoints, claims, aliases, and manages every key;
- ``admin``: also backups, restores, settings and people;
- ``team-admin`` of a tenant: manages that tenant's apps and keys only (create within the tenant's ceiling,
  change, rotate, revoke) and sees that tenant's keys and usage only. Outside the viewer < operator < admin
  ladder: a person may be a viewer and the team-admin of two tenants at once.

:data:`RULES` names, for every admin route (method and aiohttp path template), what it needs; :func:`decide`
says whether a :class:`Principal` may, and, where only a team-admin role lets it, which tenants the handler
must keep it to. A route with no rule is refused (:func:`rule_for` answers None): a new route needs a line
here, and ``tests/core/test_roles.py`` fails until it has one. Pure: no I/O, no framework.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum, StrEnum

__all__ = [
    "RULES",
    "Access",
    "Decision",
    "Principal",
    "Role",
    "Rule",
    "decide",
    "grantable",
    "parse_role",
    "role_label",
    "rule_for",
    "strongest",
    "team_allows",
    "within_ceiling",
]


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    TEAM_ADMIN = "team-admin"


LADDER = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)  # each may do all that the ones before it may
_RANK = {role: rank for rank, role in enumerate(LADDER, start=1)}


class Access(Enum):
    PUBLIC = "public"  # no sign-in: the sign-in pages, static assets
    SIGNED_IN = "signed in"  # anyone signed in: sign-out, their own account and personal tokens
    ROLE = "role"  # the rule's role or higher (or team-admin, where the rule says so)


@dataclass(frozen=True, slots=True)
class Rule:
    access: Access
    role: Role | None = None  # for Access.ROLE: the lowest ladder role that may
    team: bool = False  # a team-admin may too, kept to their tenants

    def needs(self) -> str:
        """What the rule needs, as a 403 says it."""
        if self.access is Access.PUBLIC:
            return "nothing"
        if self.access is Access.SIGNED_IN:
            return "a signed-in person"
        named = f"the {self.role} role" if self.role is not Role.ADMIN else "the admin role"
        return named + (" (or team-admin, for their own tenant)" if self.team else "")


PUBLIC = Rule(Access.PUBLIC)
SIGNED_IN = Rule(Access.SIGNED_IN)
VIEW = Rule(Access.ROLE, Role.VIEWER)
VIEW_OR_TEAM = Rule(Access.ROLE, Role.VIEWER, team=True)
OPERATE = Rule(Access.ROLE, Role.OPERATOR)
OPERATE_OR_TEAM = Rule(Access.ROLE, Role.OPERATOR, team=True)
ADMINISTER = Rule(Access.ROLE, Role.ADMIN)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is asking: the audit log's ``actor``, a ladder ``role`` (or None) and the tenants they are the
    team-admin of; ``label`` is shown (an e-mail, ``admin token``); ``person`` is the people table's id."""

    actor: str
    role: Role | None
    teams: frozenset[str] = field(default_factory=frozenset)
    label: str = ""
    person: int | None = None

    def describe(self) -> str:
        return role_label(self.role, self.teams)


def role_label(role: Role | None, teams: Iterable[str]) -> str:
    """``operator``, ``viewer, team-admin of a, b``, ``no role``."""
    parts = [role.value] if role is not None else []
    names = sorted(teams)
    if names:
        parts.append("team-admin of " + ", ".join(names))
    return ", ".join(parts) or "no role"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    # where only a team-admin role allowed it: the tenants the handler keeps it to; None = every tenant
    tenants: frozenset[str] | None = None
    message: str = ""


def decide(principal: Principal | None, rule: Rule | None, *, what: str = "this") -> Decision:
    """May ``principal`` (None: nobody signed in) do what ``rule`` guards? ``rule`` None (a route without a
    rule) is refused."""
    if rule is None:
        return Decision(False, message=f"{what} has no rule in the role table: refused for everyone")
    if rule.access is Access.PUBLIC:
        return Decision(True)
    if principal is None:
        return Decision(False, message=f"{what} needs {rule.needs()}: sign in first")
    if rule.access is Access.SIGNED_IN:
        return Decision(True)
    assert rule.role is not None
    if principal.role is not None and _RANK[principal.role] >= _RANK[rule.role]:
        return Decision(True)
    if rule.team and principal.teams:
        return Decision(True, tenants=principal.teams)
    return Decision(False, message=f"{what} needs {rule.needs()}; you are {principal.describe()}")


def team_allows(tenants: frozenset[str] | None, tenant: str | None) -> bool:
    """Whether a request kept to ``tenants`` (None: not kept) may touch something of ``tenant``."""
    return tenants is None or (tenant is not None and tenant in tenants)


def within_ceiling(value: int | None, ceiling: int | None) -> bool:
    """A team-admin's limit (None: unlimited) fits the tenant's ceiling (None: no ceiling)."""
    return ceiling is None or (value is not None and value <= ceiling)


def parse_role(text: str) -> tuple[Role, str | None]:
    """``viewer`` / ``operator`` / ``admin`` / ``team-admin:<tenant>`` -> (role, tenant); ValueError otherwise."""
    name, _, tenant = text.partition(":")
    try:
        role = Role(name)
    except ValueError:
        raise ValueError(f"unknown role {text!r}: use viewer, operator, admin or team-admin:<tenant>") from None
    if role is Role.TEAM_ADMIN:
        if not tenant:
            raise ValueError(f"{text!r}: a team-admin role names its tenant, as team-admin:<tenant>")
        return role, tenant
    if tenant:
        raise ValueError(f"{text!r}: only team-admin takes a tenant")
    return role, None


def strongest(granted: Iterable[str]) -> tuple[Role | None, frozenset[str]]:
    """The ladder role and team tenants of several granted roles (one per group a person is in): the highest
    ladder role, and every team-admin tenant."""
    best: Role | None = None
    teams: set[str] = set()
    for text in granted:
        role, tenant = parse_role(text)
        if role is Role.TEAM_ADMIN:
            assert tenant is not None
            teams.add(tenant)
        elif best is None or _RANK[role] > _RANK[best]:
            best = role
    return best, frozenset(teams)


def grantable(
    principal_role: Role | None, teams: frozenset[str], role: Role | None, token_teams: frozenset[str]
) -> bool:
    """May a person with (``principal_role``, ``teams``) give a personal token (``role``, ``token_teams``)?
    No higher than their own: a ladder role at most theirs, team tenants among theirs."""
    if role is not None and (principal_role is None or _RANK[role] > _RANK[principal_role]):
        return False
    return token_teams <= teams and (role is not None or bool(token_teams))


def _rules() -> dict[tuple[str, str], Rule]:
    ui = {
        ("GET", "/admin"): PUBLIC,
        ("GET", "/admin/"): PUBLIC,
        ("POST", "/admin/signin"): PUBLIC,
        ("POST", "/admin/lang"): PUBLIC,
        ("GET", "/admin/static/{filename}"): PUBLIC,
        ("GET", "/admin/oidc/start"): PUBLIC,
        ("GET", "/admin/oidc/callback"): PUBLIC,
        ("POST", "/admin/signout"): SIGNED_IN,
        ("GET", "/admin/account"): SIGNED_IN,
        ("GET", "/admin/{tail}"): SIGNED_IN,  # the UI's own 404 page
        ("GET", "/admin/overview"): VIEW,
        ("GET", "/admin/overview/fragment"): VIEW,
        ("GET", "/admin/placement"): VIEW,
        ("GET", "/admin/placement/cell"): VIEW,
        ("GET", "/admin/placement/workers/{name}"): VIEW,
        ("POST", "/admin/placement/check"): VIEW,  # checks patterns, changes nothing
        ("GET", "/admin/endpoints"): VIEW,
        ("GET", "/admin/endpoints/fragment"): VIEW,
        ("GET", "/admin/models"): VIEW,
        ("GET", "/admin/models/fragment"): VIEW,
        ("GET", "/admin/keys"): VIEW_OR_TEAM,
        ("GET", "/admin/keys/fragment"): VIEW_OR_TEAM,
        ("GET", "/admin/usage"): VIEW_OR_TEAM,
        ("GET", "/admin/batches"): VIEW_OR_TEAM,
        ("GET", "/admin/batches/fragment"): VIEW_OR_TEAM,
        ("GET", "/admin/audit"): VIEW,
        ("GET", "/admin/pools"): VIEW,
        ("GET", "/admin/pools/fragment"): VIEW,
        ("GET", "/admin/persistence"): VIEW,
        ("GET", "/admin/people"): VIEW,
    }
    api = {
        ("GET", "/admin/api/placement"): VIEW,
        ("GET", "/admin/api/placement/workers/{name}"): VIEW,
        ("PUT", "/admin/api/placement/workers/{name}"): OPERATE,
        ("DELETE", "/admin/api/placement/workers/{name}"): OPERATE,
        ("POST", "/admin/api/placement/workers/{name}/only-installed"): OPERATE,
        ("POST", "/admin/api/placement/workers/{name}/toggle"): OPERATE,
        ("GET", "/admin/api/inventory"): VIEW,
        ("GET", "/admin/api/claims"): VIEW,
        ("GET", "/admin/api/keys"): VIEW_OR_TEAM,
        ("POST", "/admin/api/keys"): OPERATE_OR_TEAM,
        ("GET", "/admin/api/keys/{ref}"): VIEW_OR_TEAM,
        ("PATCH", "/admin/api/keys/{ref}"): OPERATE_OR_TEAM,
        ("POST", "/admin/api/keys/{ref}/revoke"): OPERATE_OR_TEAM,
        ("POST", "/admin/api/keys/{ref}/rotate"): OPERATE_OR_TEAM,
        ("GET", "/admin/api/tenants"): VIEW_OR_TEAM,
        ("PATCH", "/admin/api/tenants/{name}"): OPERATE,
        ("GET", "/admin/api/apps"): VIEW_OR_TEAM,
        ("GET", "/admin/api/usage"): VIEW_OR_TEAM,
        ("GET", "/admin/api/batches"): VIEW_OR_TEAM,
        ("GET", "/admin/api/batches/{batch_id}"): VIEW_OR_TEAM,
        ("POST", "/admin/api/batches/{batch_id}/cancel"): OPERATE_OR_TEAM,
        ("GET", "/admin/api/usage/series"): VIEW_OR_TEAM,
        ("GET", "/admin/api/audit"): VIEW,
        ("GET", "/admin/api/audit/facets"): VIEW,
        ("GET", "/admin/api/endpoints"): VIEW,
        ("POST", "/admin/api/endpoints"): OPERATE,
        ("POST", "/admin/api/endpoints/test"): OPERATE,
        ("GET", "/admin/api/endpoints/{name}"): VIEW,
        ("PATCH", "/admin/api/endpoints/{name}"): OPERATE,
        ("DELETE", "/admin/api/endpoints/{name}"): OPERATE,
        ("POST", "/admin/api/endpoints/{name}/test"): OPERATE,
        ("GET", "/admin/api/aliases"): VIEW,
        ("GET", "/admin/api/aliases/{name}"): VIEW,
        ("PUT", "/admin/api/aliases/{name}"): OPERATE,
        ("DELETE", "/admin/api/aliases/{name}"): OPERATE,
        ("GET", "/admin/api/models"): VIEW,
        ("GET", "/admin/api/persistence"): VIEW,
        ("GET", "/admin/api/backup"): ADMINISTER,
        ("POST", "/admin/api/backup/restore"): ADMINISTER,
        ("GET", "/admin/api/auth"): VIEW,
        ("GET", "/admin/api/me"): SIGNED_IN,
        ("GET", "/admin/api/me/tokens"): SIGNED_IN,
        ("POST", "/admin/api/me/tokens"): SIGNED_IN,
        ("POST", "/admin/api/me/tokens/{id}/revoke"): SIGNED_IN,
        ("GET", "/admin/api/people"): VIEW,
        ("POST", "/admin/api/people/{id}/disable"): ADMINISTER,
        ("POST", "/admin/api/people/{id}/enable"): ADMINISTER,
        ("POST", "/admin/api/people/{id}/tokens/{token}/revoke"): ADMINISTER,
    }
    return {**ui, **api}


RULES: dict[tuple[str, str], Rule] = _rules()


def rule_for(method: str, path_template: str) -> Rule | None:
    """The rule of a route (``HEAD`` is ``GET``'s); None: the route has none and is refused."""
    method = "GET" if method == "HEAD" else method
    return RULES.get((method, path_template))
