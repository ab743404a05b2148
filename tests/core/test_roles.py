"""The role table's decision, table-driven (turnout.core.roles)."""

from __future__ import annotations

import pytest

from turnout.core.roles import (
    ADMINISTER,
    OPERATE,
    OPERATE_OR_TEAM,
    PUBLIC,
    SIGNED_IN,
    VIEW,
    VIEW_OR_TEAM,
    Principal,
    Role,
    grantable,
    parse_role,
    rule_for,
    strongest,
    team_allows,
    within_ceiling,
)

V, OP, A, T = Role.VIEWER, Role.OPERATOR, Role.ADMIN, Role.TEAM_ADMIN


def who(role: Role | None, *teams: str) -> Principal:
    return Principal("oidc:x", role, frozenset(teams), "x@example.com", 1)


@pytest.mark.parametrize(
    ("principal", "rule", "allowed", "tenants"),
    [
        (None, PUBLIC, True, None),
        (None, SIGNED_IN, False, None),
        (None, VIEW, False, None),
        (who(None, "a"), SIGNED_IN, True, None),
        (who(V), VIEW, True, None),
        (who(V), OPERATE, False, None),
        (who(V), VIEW_OR_TEAM, True, None),
        (who(V), OPERATE_OR_TEAM, False, None),
        (who(OP), OPERATE, True, None),
        (who(OP), ADMINISTER, False, None),
        (who(OP), OPERATE_OR_TEAM, True, None),
        (who(A), ADMINISTER, True, None),
        (who(A), VIEW, True, None),
        (who(None, "a"), VIEW, False, None),
        (who(None, "a"), VIEW_OR_TEAM, True, frozenset({"a"})),
        (who(None, "a", "b"), OPERATE_OR_TEAM, True, frozenset({"a", "b"})),
        (who(None, "a"), ADMINISTER, False, None),
        (who(V, "a"), OPERATE_OR_TEAM, True, frozenset({"a"})),  # a viewer who is team-admin of a: kept to a
        (who(V, "a"), VIEW_OR_TEAM, True, None),  # reading as a viewer: every tenant
        (who(None), VIEW, False, None),
        (who(A), None, False, None),  # a route without a rule: refused for everyone
    ],
)
def test_decide(principal, rule, allowed, tenants) -> None:
    from turnout.core.roles import decide

    decision = decide(principal, rule)
    assert (decision.allowed, decision.tenants) == (allowed, tenants)
    if not allowed and rule is not None and principal is not None:
        assert f"the {rule.role} role" in decision.message or rule.role is Role.ADMIN


def test_a_refusal_names_the_role_it_needs_and_who_you_are() -> None:
    from turnout.core.roles import decide

    message = decide(who(V, "a"), OPERATE, what="POST /admin/api/placement/workers/{name}/toggle").message
    assert message == (
        "POST /admin/api/placement/workers/{name}/toggle needs the operator role; you are viewer, team-admin of a"
    )


@pytest.mark.parametrize(
    ("method", "path", "role"),
    [
        ("GET", "/admin/api/keys", V),
        ("HEAD", "/admin/api/keys", V),
        ("POST", "/admin/api/placement/workers/{name}/toggle", OP),
        ("GET", "/admin/api/backup", A),
        ("POST", "/admin/api/backup/restore", A),
        ("POST", "/admin/api/people/{id}/disable", A),
        ("DELETE", "/admin/api/endpoints/{name}", OP),
    ],
)
def test_rule_for(method, path, role) -> None:
    rule = rule_for(method, path)
    assert rule is not None and rule.role is role


def test_rule_for_an_unknown_route_is_none() -> None:
    assert rule_for("GET", "/admin/api/nothing") is None


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("viewer", (V, None)), ("admin", (A, None)), ("team-admin:a", (T, "a"))],
)
def test_parse_role(text, parsed) -> None:
    assert parse_role(text) == parsed


@pytest.mark.parametrize("text", ["root", "team-admin", "team-admin:", "viewer:a", "", "Admin"])
def test_parse_role_refuses(text) -> None:
    with pytest.raises(ValueError):
        parse_role(text)


@pytest.mark.parametrize(
    ("granted", "result"),
    [
        ([], (None, frozenset())),
        (["viewer", "admin", "operator"], (A, frozenset())),
        (["team-admin:a", "viewer", "team-admin:b"], (V, frozenset({"a", "b"}))),
    ],
)
def test_strongest(granted, result) -> None:
    assert strongest(granted) == result


@pytest.mark.parametrize(
    ("mine", "teams", "role", "token_teams", "ok"),
    [
        (A, set(), OP, set(), True),
        (A, set(), A, set(), True),
        (OP, set(), A, set(), False),
        (V, set(), OP, set(), False),
        (V, set(), V, set(), True),
        (None, {"a"}, None, {"a"}, True),
        (None, {"a"}, None, {"b"}, False),
        (None, {"a"}, V, set(), False),
        (OP, {"a"}, None, {"a"}, True),
        (OP, set(), None, set(), False),  # a token with no role at all
    ],
)
def test_grantable(mine, teams, role, token_teams, ok) -> None:
    assert grantable(mine, frozenset(teams), role, frozenset(token_teams)) is ok


@pytest.mark.parametrize(
    ("scope", "tenant", "ok"),
    [
        (None, "a", True),
        (None, None, True),
        (frozenset({"a"}), "a", True),
        (frozenset({"a"}), "b", False),
        (frozenset({"a"}), None, False),
    ],
)
def test_team_allows(scope, tenant, ok) -> None:
    assert team_allows(scope, tenant) is ok


@pytest.mark.parametrize(
    ("value", "ceiling", "ok"), [(5, 10, True), (10, 10, True), (11, 10, False), (None, 10, False), (None, None, True)]
)
def test_within_ceiling(value, ceiling, ok) -> None:
    assert within_ceiling(value, ceiling) is ok
