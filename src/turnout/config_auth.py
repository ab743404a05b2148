"""The config's ``auth`` section: who may call the gateway and sign in to the admin UI, and single sign-on with an
OpenID Connect provider (docs/sso.md)."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import AnyHttpUrl, Field, field_validator, model_validator

from turnout.config_base import MAX_GRACE_S, MAX_INT, MAX_TIMEOUT_S, MAX_WAIT_S, is_loopback
from turnout.config_base import Model as _Model
from turnout.core.roles import parse_role

__all__ = ["Auth", "Oidc"]


class Oidc(_Model):
    """Single sign-on with an OpenID Connect provider (docs/sso.md). The client secret comes from the
    environment (``TURNOUT_OIDC_CLIENT_SECRET``), never from this file; without one the client is public (PKCE)."""

    issuer: str = Field(
        min_length=1,
        max_length=2048,
        description="the provider's issuer URL, exactly as its /.well-known/openid-configuration names it "
        "(https, or http on a loopback address)",
    )
    client_id: str = Field(min_length=1, max_length=512, description="this gateway's client id at the provider")
    scopes: list[Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:/-]+$")]] = Field(
        default_factory=lambda: ["openid", "email", "profile"],
        description="scopes asked for; openid is added when missing",
    )
    groups_claim: str = Field(
        "groups", min_length=1, max_length=256, description="the ID token claim that lists the person's groups"
    )
    roles: dict[str, str] = Field(
        default_factory=dict,
        description="group -> role: viewer, operator, admin or team-admin:<tenant>; a person in several groups "
        "gets the highest role and every team",
    )
    email_roles: dict[str, str] = Field(
        default_factory=dict,
        description="verified e-mail address -> role, for providers whose tokens carry no groups (Google)",
    )
    redirect_url: AnyHttpUrl | None = Field(
        None,
        description="the callback URL registered at the provider; default: <the gateway's URL as the browser "
        "reached it>/admin/oidc/callback",
    )
    label: str = Field("single sign-on", min_length=1, max_length=64, description="the sign-in button's label")

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("https", "http") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError("must be an https URL without query or fragment, e.g. https://idp.example.com/realms/x")
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise ValueError("must use https (plain http only for a provider on this machine's loopback address)")
        return value

    @field_validator("roles", "email_roles")
    @classmethod
    def _roles(cls, value: dict[str, str]) -> dict[str, str]:
        for group, role in value.items():
            if not group:
                raise ValueError("a group (or e-mail) name may not be empty")
            try:
                parse_role(role)
            except ValueError as exc:
                raise ValueError(f"{group!r}: {exc}") from None
        return value


class Auth(_Model):
    open: bool = Field(
        False,
        strict=True,
        description="serve client APIs without keys; refused unless listen.host is a loopback address",
    )
    rotate_grace_s: float = Field(86_400, ge=0, le=MAX_GRACE_S, description="how long a rotated key keeps working")
    key_cache_s: float = Field(
        5,
        ge=0,
        le=MAX_WAIT_S,
        description="how long a key lookup is cached (changes made on the store with no gateway answering lag by this)",
    )
    default_completion_tokens: int = Field(
        256,
        ge=1,
        le=MAX_INT,
        description="tokens reserved for the answer when a request sets no max_tokens / num_predict",
    )
    break_glass: bool = Field(
        True,
        strict=True,
        description="the admin token signs in to the UI and the admin API as an admin (actor 'token'); set false "
        "once single sign-on works (needs auth.oidc)",
    )
    oidc: Oidc | None = Field(None, description="single sign-on for the admin UI (OpenID Connect)")
    session_idle_s: float = Field(
        1800, ge=60, le=MAX_TIMEOUT_S, description="a browser session unused this long is signed out"
    )
    session_max_s: float = Field(
        43_200, ge=60, le=30 * 86_400, description="no browser session lives longer than this, used or not"
    )
    token_max_days: int = Field(90, ge=1, le=3650, description="the longest expiry a personal admin token may be given")

    @model_validator(mode="after")
    def _some_sign_in(self) -> Self:
        if not self.break_glass and self.oidc is None:
            raise ValueError(
                "break_glass is false but auth.oidc is not set: nobody could sign in; configure single sign-on first"
            )
        return self
