"""The OpenID Connect client of the admin UI's single sign-on: discovery, the authorization request (code flow
with PKCE S256, ``state`` and ``nonce``), the code exchange, and the ID token's checks.

JOSE (signatures, keys, claims) is joserfc's, never hand-written here. The provider's metadata comes from
``<issuer>/.well-known/openid-configuration`` (its ``issuer`` must be the configured one) and is kept for an
hour; its keys from the metadata's ``jwks_uri``, fetched again when an ID token names a key id not among them
(the provider rotated its keys), at most once per :data:`JWKS_REFRESH_S`.

An ID token is taken only when its signature verifies with one of the provider's keys under an algorithm the
provider announces (asymmetric only: never ``none`` or a shared-secret HMAC), ``iss`` is the issuer, ``aud``
holds this client (and ``azp`` is this client when there are several audiences), ``exp`` has not passed and
``iat`` is present (:data:`LEEWAY_S` of clock skew), and ``nonce`` is the one this sign-in sent. Anything else
raises :class:`SignInRefused` with a ``reason`` for the audit log and the gateway log; the browser is told only
that the sign-in failed.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson
from joserfc import jwt
from joserfc.errors import (
    BadSignatureError,
    ExpiredTokenError,
    InvalidClaimError,
    InvalidKeyIdError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import KeySet

from turnout.config import Oidc

__all__ = ["JWKS_REFRESH_S", "LEEWAY_S", "Claims", "OidcClient", "Pending", "SignInRefused"]

LEEWAY_S = 60  # clock skew allowed on exp and iat
METADATA_TTL_S = 3600.0
JWKS_REFRESH_S = 1.0  # a token naming an unknown key fetches the keys again at most this often
MAX_ANSWER = 1024 * 1024  # the most a provider's answer (metadata, keys, token) may be
HTTP_TIMEOUT_S = 10.0
SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class SignInRefused(Exception):
    """A sign-in that cannot be completed. ``reason`` names what failed (for the audit and the log);
    ``subject`` is the provider's ``sub`` once a valid ID token named one."""

    def __init__(self, reason: str, detail: str = "", subject: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.subject = subject


@dataclass(frozen=True, slots=True)
class Pending:
    """What a sign-in sent to the provider, kept in the browser's short-lived cookie until the callback."""

    state: str
    nonce: str
    verifier: str
    next: str
    started: float

    def encode(self) -> str:
        raw = orjson.dumps({"s": self.state, "n": self.nonce, "v": self.verifier, "x": self.next, "t": self.started})
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str | None) -> Pending | None:
        if not text or len(text) > 2048:
            return None
        try:
            data = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            return cls(str(data["s"]), str(data["n"]), str(data["v"]), str(data["x"]), float(data["t"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class Claims:
    """The checked ID token's claims this gateway uses."""

    subject: str
    email: str | None
    email_verified: bool
    name: str | None
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Metadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    algorithms: tuple[str, ...]
    auth_methods: tuple[str, ...]
    iss_parameter: bool


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


class OidcClient:
    """One per gateway (``app[OIDC]``); its caches are per process."""

    def __init__(self, config: Oidc, client_secret: str | None) -> None:
        self.config = config
        self._secret = client_secret
        self._metadata: tuple[float, _Metadata] | None = None
        self._keys: tuple[float, KeySet] | None = None

    # -- the provider's metadata and keys -----------------------------------------------------------------------
    async def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as http,
                http.get(url, headers={"Accept": "application/json"}) as response,
            ):
                body = await response.content.read(MAX_ANSWER + 1)
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SignInRefused("provider_unreachable", f"{what} at {url}: {exc or type(exc).__name__}") from None
        if status != 200 or len(body) > MAX_ANSWER:
            raise SignInRefused("provider_error", f"{what} at {url} answered HTTP {status}")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise SignInRefused("provider_error", f"{what} at {url} is not JSON") from None
        if not isinstance(data, dict):
            raise SignInRefused("provider_error", f"{what} at {url} is not a JSON object")
        return data

    async def metadata(self, now: float | None = None) -> _Metadata:
        now = time.monotonic() if now is None else now
        if self._metadata is not None and now - self._metadata[0] < METADATA_TTL_S:
            return self._metadata[1]
        issuer = self.config.issuer
        url = issuer.rstrip("/") + "/.well-known/openid-configuration"
        doc = await self._get_json(url, "the provider's discovery document")
        if not isinstance(doc.get("issuer"), str) or doc["issuer"].rstrip("/") != issuer.rstrip("/"):
            raise SignInRefused(
                "issuer", f"the discovery document at {url} names issuer {doc.get('issuer')!r}, not {issuer!r}"
            )
        for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(doc.get(field), str):
                raise SignInRefused("provider_error", f"the discovery document at {url} has no {field}")
        announced = doc.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = tuple(a for a in SIGNING_ALGORITHMS if a in announced) or ("RS256",)
        methods = doc.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        meta = _Metadata(
            issuer=doc["issuer"],
            authorization_endpoint=doc["authorization_endpoint"],
            token_endpoint=doc["token_endpoint"],
            jwks_uri=doc["jwks_uri"],
            algorithms=algorithms,
            auth_methods=tuple(str(m) for m in methods),
            iss_parameter=doc.get("authorization_response_iss_parameter_supported") is True,
        )
        self._metadata = (now, meta)
        return meta

    async def _key_set(self, meta: _Metadata, *, refresh: bool) -> KeySet:
        now = time.monotonic()
        if self._keys is not None and not (refresh and now - self._keys[0] >= JWKS_REFRESH_S):
            return self._keys[1]
        doc = await self._get_json(meta.jwks_uri, "the provider's keys (JWKS)")
        try:
            keys = KeySet.import_key_set(doc)  # type: ignore[arg-type]  # checked by joserfc itself
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            raise SignInRefused("provider_error", f"the keys at {meta.jwks_uri} cannot be read: {exc}") from None
        self._keys = (now, keys)
        return keys

    # -- the flow -------------------------------------------------------------------------------------------------
    async def begin(self, redirect_uri: str, nxt: str, now: float) -> tuple[str, Pending]:
        """The provider's authorization URL to send the browser to, and what to keep until the callback."""
        meta = await self.metadata()
        pending = Pending(
            state=secrets.token_urlsafe(24),
            nonce=secrets.token_urlsafe(24),
            verifier=secrets.token_urlsafe(48),
            next=nxt,
            started=now,
        )
        scopes = list(self.config.scopes)
        if "openid" not in scopes:
            scopes.insert(0, "openid")
        query = {
            "response_type": "code",
            "client_id": self.config.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(scopes),
            "state": pending.state,
            "nonce": pending.nonce,
            "code_challenge": _s256(pending.verifier),
            "code_challenge_method": "S256",
        }
        separator = "&" if "?" in meta.authorization_endpoint else "?"
        return meta.authorization_endpoint + separator + urlencode(query), pending

    async def finish(self, params: dict[str, str], pending: Pending | None, redirect_uri: str, now: float) -> Claims:
        """Check the provider's answer to the browser (``params``: the callback's query) against what was sent,
        exchange the code, and check the ID token. Raises :class:`SignInRefused`."""
        if pending is None:
            raise SignInRefused("state", "no sign-in was started in this browser (or it took over 10 minutes)")
        if not secrets.compare_digest(params.get("state", ""), pending.state):
            raise SignInRefused("state", "the answer's state is not the one this browser's sign-in sent")
        meta = await self.metadata()
        iss = params.get("iss")
        if iss is not None and iss != meta.issuer:
            raise SignInRefused("issuer", f"the answer came from issuer {iss!r}, not {meta.issuer!r}")
        if iss is None and meta.iss_parameter:
            raise SignInRefused("issuer", "the provider announces an iss parameter, and the answer has none")
        if "error" in params:
            raise SignInRefused(
                "provider_refused", f"{params['error']}: {params.get('error_description', '')}".strip(": ")
            )
        code = params.get("code")
        if not code:
            raise SignInRefused("no_code", "the answer carries no authorization code")
        id_token = await self._exchange(meta, code, pending, redirect_uri)
        return await self._check(meta, id_token, pending, now)

    async def _exchange(self, meta: _Metadata, code: str, pending: Pending, redirect_uri: str) -> str:
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": pending.verifier,
        }
        headers = {"Accept": "application/json"}
        if self._secret is None:
            form["client_id"] = self.config.client_id
        elif "client_secret_basic" in meta.auth_methods or "client_secret_post" not in meta.auth_methods:
            pair = f"{_form_encode(self.config.client_id)}:{_form_encode(self._secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            form |= {"client_id": self.config.client_id, "client_secret": self._secret}
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as http,
                http.post(meta.token_endpoint, data=form, headers=headers) as answer,
            ):
                body = await answer.content.read(MAX_ANSWER + 1)
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SignInRefused("provider_unreachable", f"token endpoint: {exc or type(exc).__name__}") from None
        try:
            data = orjson.loads(body) if len(body) <= MAX_ANSWER else None
        except orjson.JSONDecodeError:
            data = None
        if status != 200 or not isinstance(data, dict):
            error = data.get("error") if isinstance(data, dict) else None
            # invalid_grant: a code used before (replayed), expired, or issued for another client or redirect
            raise SignInRefused("code_refused", f"the token endpoint answered HTTP {status} {error or ''}".strip())
        token = data.get("id_token")
        if not isinstance(token, str):
            raise SignInRefused("no_id_token", "the token endpoint's answer has no id_token (is 'openid' a scope?)")
        return token

    async def _check(self, meta: _Metadata, id_token: str, pending: Pending, now: float) -> Claims:
        keys = await self._key_set(meta, refresh=False)
        try:
            try:
                token = jwt.decode(id_token, keys, algorithms=list(meta.algorithms))
            except InvalidKeyIdError:  # a key not among those we have: the provider may have rotated its keys
                keys = await self._key_set(meta, refresh=True)
                token = jwt.decode(id_token, keys, algorithms=list(meta.algorithms))
        except InvalidKeyIdError:
            raise SignInRefused("signature", "the ID token is signed with a key the provider does not list") from None
        except BadSignatureError:
            raise SignInRefused("signature", "the ID token's signature does not verify") from None
        except (JoseError, ValueError) as exc:
            raise SignInRefused("malformed", f"the ID token cannot be read: {exc}") from None
        claims = token.claims
        subject = claims.get("sub") if isinstance(claims.get("sub"), str) else None
        registry = jwt.JWTClaimsRegistry(
            now=int(now),
            leeway=LEEWAY_S,
            iss={"essential": True, "value": meta.issuer},
            aud={"essential": True, "value": self.config.client_id},
            sub={"essential": True},
            exp={"essential": True},
            iat={"essential": True},
            nonce={"essential": True, "value": pending.nonce},
        )
        try:
            registry.validate(claims)
        except ExpiredTokenError:
            raise SignInRefused("expired", "the ID token has expired", subject) from None
        except MissingClaimError as exc:
            raise SignInRefused("missing_claim", f"the ID token lacks {exc.claim}", subject) from None
        except InvalidClaimError as exc:
            reason = {"iss": "issuer", "aud": "audience", "nonce": "nonce"}.get(exc.claim, "invalid_claim")
            raise SignInRefused(reason, f"the ID token's {exc.claim} is not acceptable", subject) from None
        except JoseError as exc:
            raise SignInRefused("invalid_claim", str(exc), subject) from None
        audience = claims["aud"]
        if isinstance(audience, list) and len(audience) > 1 and claims.get("azp") != self.config.client_id:
            raise SignInRefused("audience", "the ID token has several audiences and azp is not this client", subject)
        assert subject is not None  # sub is essential and validated
        groups = _claim(claims, self.config.groups_claim)
        if groups is None:
            groups = []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise SignInRefused(
                "groups_claim",
                f"the ID token's {self.config.groups_claim!r} claim is a {type(groups).__name__}, "
                "not a list of strings",
                subject,
            )
        email = claims.get("email") if isinstance(claims.get("email"), str) else None
        name = claims.get("name") if isinstance(claims.get("name"), str) else None
        return Claims(subject, email, claims.get("email_verified") is True, name, tuple(groups))


def _claim(claims: dict[str, Any], path: str) -> Any:
    """A claim by name, or by a dotted path into nested objects (Keycloak's ``realm_access.roles``)."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _form_encode(text: str) -> str:
    """RFC 6749 2.3.1: the client id and secret are form-encoded before they go into Basic auth."""
    from urllib.parse import quote_plus

    return quote_plus(text)
