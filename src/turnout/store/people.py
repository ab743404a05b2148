"""People who sign in with single sign-on, and their personal admin tokens (tables ``people``, ``personal_tokens``).

A person is keyed by the provider's ``sub``; each sign-in records what the provider said of them (e-mail, name)
and the role their groups map to, and answers what changed (a role change is audited by the caller). An admin
may disable a person: their personal tokens are revoked and their sessions end (:mod:`turnout.admin.ui.sessions`
deletes those), and they cannot sign in until enabled again.

A personal token is ``tpat_`` + 43 characters (a shape :mod:`turnout.masking` recognises), shown once; the store
keeps its SHA-256, its role and tenants (no higher than the person's when made), and its expiry. Blocking calls
(run them with ``asyncio.to_thread``); time is a parameter.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select, update

from turnout.store.db import Database, StoreError
from turnout.store.schema import people, personal_tokens

__all__ = ["TOKEN_PREFIX", "PeopleStore", "Person", "PersonalToken", "SignIn"]

TOKEN_PREFIX = "tpat_"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Person:
    id: int
    subject: str
    email: str | None
    name: str | None
    role: str | None
    teams: tuple[str, ...]
    created_at: float
    last_signin: float | None
    disabled_at: float | None

    @property
    def actor(self) -> str:
        return f"oidc:{self.subject}"

    @property
    def label(self) -> str:
        return self.email or self.name or self.subject

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "actor": self.actor,
            "subject": self.subject,
            "email": self.email,
            "name": self.name,
            "role": self.role,
            "teams": list(self.teams),
            "created_at": self.created_at,
            "last_signin": self.last_signin,
            "disabled_at": self.disabled_at,
        }


@dataclass(frozen=True, slots=True)
class PersonalToken:
    id: int
    person_id: int
    name: str
    prefix: str
    role: str | None
    teams: tuple[str, ...]
    created_at: float
    expires_at: float
    revoked_at: float | None

    def state(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if now >= self.expires_at else "active"

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "prefix": self.prefix,
            "role": self.role,
            "teams": list(self.teams),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "state": self.state(now),
        }


@dataclass(frozen=True, slots=True)
class SignIn:
    """What a sign-in did: the person as now stored, and as before (None: first sign-in)."""

    person: Person
    before: Person | None

    @property
    def role_changed(self) -> bool:
        before = self.before
        return before is not None and (before.role, before.teams) != (self.person.role, self.person.teams)


def _person(row: Any) -> Person:
    return Person(
        id=row.id,
        subject=row.subject,
        email=row.email,
        name=row.name,
        role=row.role,
        teams=tuple(row.teams or ()),
        created_at=row.created_at,
        last_signin=row.last_signin,
        disabled_at=row.disabled_at,
    )


def _token(row: Any) -> PersonalToken:
    return PersonalToken(
        id=row.id,
        person_id=row.person_id,
        name=row.name,
        prefix=row.prefix,
        role=row.role,
        teams=tuple(row.teams or ()),
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


class PeopleStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- people ------------------------------------------------------------------------------------------------
    def sign_in(
        self, *, subject: str, email: str | None, name: str | None, role: str | None, teams: list[str], now: float
    ) -> SignIn:
        """Record a sign-in (creating the person on their first). A disabled person is recorded too (the caller
        refuses them)."""
        values = {
            "email": (email or None) and email[:320],
            "name": (name or None) and name[:256],
            "role": role,
            "teams": sorted(set(teams)),
        }
        with self.db.begin() as conn:
            row = conn.execute(select(people).where(people.c.subject == subject)).first()
            if row is None:
                conn.execute(insert(people).values(subject=subject, created_at=now, last_signin=now, **values))
                before = None
            else:
                before = _person(row)
                conn.execute(update(people).where(people.c.id == row.id).values(last_signin=now, **values))
            after = conn.execute(select(people).where(people.c.subject == subject)).one()
        return SignIn(_person(after), before)

    def get(self, person_id: int) -> Person:
        with self.db.begin() as conn:
            row = conn.execute(select(people).where(people.c.id == person_id)).first()
        if row is None:
            raise KeyError(f"no person with id {person_id}")
        return _person(row)

    def all(self) -> list[Person]:
        with self.db.begin() as conn:
            rows = conn.execute(select(people).order_by(people.c.email, people.c.subject)).all()
        return [_person(r) for r in rows]

    def labels(self) -> dict[str, str]:
        """actor (``oidc:<sub>``) -> e-mail (or name), for showing audit entries."""
        return {p.actor: p.label for p in self.all()}

    def by_email(self, email: str) -> Person | None:
        with self.db.begin() as conn:
            row = conn.execute(select(people).where(people.c.email == email)).first()
        return None if row is None else _person(row)

    def set_disabled(self, person_id: int, *, disabled: bool, now: float) -> tuple[Person, Person]:
        """Disable (their tokens revoked too) or enable a person: (before, after)."""
        with self.db.begin() as conn:
            row = conn.execute(select(people).where(people.c.id == person_id)).first()
            if row is None:
                raise KeyError(f"no person with id {person_id}")
            conn.execute(update(people).where(people.c.id == person_id).values(disabled_at=now if disabled else None))
            if disabled:
                conn.execute(
                    update(personal_tokens)
                    .where(personal_tokens.c.person_id == person_id, personal_tokens.c.revoked_at.is_(None))
                    .values(revoked_at=now)
                )
            after = conn.execute(select(people).where(people.c.id == person_id)).one()
        return _person(row), _person(after)

    # -- personal tokens ---------------------------------------------------------------------------------------
    def create_token(
        self, person_id: int, *, name: str, role: str | None, teams: list[str], expires_at: float, now: float
    ) -> tuple[PersonalToken, str]:
        """A new token for ``person_id``: (record, plaintext shown once)."""
        plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.db.begin() as conn:
            person = conn.execute(select(people).where(people.c.id == person_id)).first()
            if person is None:
                raise KeyError(f"no person with id {person_id}")
            if person.disabled_at is not None:
                raise StoreError("this person is disabled: no token can be made for them")
            result = conn.execute(
                insert(personal_tokens).values(
                    person_id=person_id,
                    name=name,
                    prefix=plaintext[:12],
                    hash=_digest(plaintext),
                    role=role,
                    teams=sorted(set(teams)),
                    created_at=now,
                    expires_at=expires_at,
                )
            )
            new_id = result.inserted_primary_key[0] if result.inserted_primary_key else None
            row = conn.execute(select(personal_tokens).where(personal_tokens.c.id == new_id)).one()
        return _token(row), plaintext

    def tokens_of(self, person_id: int) -> list[PersonalToken]:
        with self.db.begin() as conn:
            rows = conn.execute(
                select(personal_tokens)
                .where(personal_tokens.c.person_id == person_id)
                .order_by(personal_tokens.c.id.desc())
            ).all()
        return [_token(r) for r in rows]

    def revoke_token(self, person_id: int, token_id: int, *, now: float) -> tuple[PersonalToken, PersonalToken]:
        """Revoke one of ``person_id``'s tokens: (before, after). A token of someone else is unknown (KeyError)."""
        with self.db.begin() as conn:
            where = (personal_tokens.c.id == token_id, personal_tokens.c.person_id == person_id)
            row = conn.execute(select(personal_tokens).where(*where)).first()
            if row is None:
                raise KeyError(f"no personal token {token_id} of this person")
            if row.revoked_at is None:
                conn.execute(update(personal_tokens).where(*where).values(revoked_at=now))
            after = conn.execute(select(personal_tokens).where(*where)).one()
        return _token(row), _token(after)

    def authenticate(self, plaintext: str, *, now: float) -> tuple[PersonalToken, Person] | None:
        """The live token and its enabled person for a presented token; None when unknown, revoked, expired,
        or its person is disabled."""
        if not plaintext.startswith(TOKEN_PREFIX) or len(plaintext) > 128:
            return None
        with self.db.begin() as conn:
            row = conn.execute(select(personal_tokens).where(personal_tokens.c.hash == _digest(plaintext))).first()
            if row is None or row.revoked_at is not None or now >= row.expires_at:
                return None
            person = conn.execute(select(people).where(people.c.id == row.person_id)).first()
        if person is None or person.disabled_at is not None:
            return None
        return _token(row), _person(person)
