"""Admin inputs: the bounded field types and request models of the admin JSON API, shared by the CLI.

Every admin write and query (keys, usage, audit, endpoints, placement toggles) and the matching
``turnout key|usage|audit|endpoint`` commands validate through the models here, so one rule decides each
field. A bad field raises :class:`turnout.errors.Unprocessable` (HTTP 422) whose message names the field;
handlers validate before they touch the store, so nothing is written. No aiohttp here (the CLI uses this
module too); the bounds are documented in docs/keys.md and docs/endpoints.md:

- numbers are finite: NaN and the infinities (also the strings ``"nan"``, ``"inf"`` that ``float()`` reads,
  and ``1e999``) are refused; booleans are never numbers, and numbers are never booleans;
- counts stored in the database (rpm, daily_tokens) are integers 1 .. 2^31-1 (:data:`MAX_INT`);
- durations (rotation grace, ``30d``-style times) are at most :data:`MAX_DURATION_S` (10 years);
  timestamps lie between the epoch and the end of year 9999; a latency budget is at most
  :data:`MAX_LATENCY_BUDGET_MS` (10 minutes);
- names and other texts have a bounded length and no control characters; model names follow
  :func:`turnout.core.names.model_name_problem`;
- an endpoint URL loses one trailing ``/v1`` or ``/api`` and trailing slashes
  (:func:`turnout.core.endpoint_rules.base_url`; callers say so with ``url_note``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from turnout.core.admission import Priority
from turnout.core.endpoint_rules import base_url
from turnout.core.names import model_name_problem
from turnout.core.patterns import PatternError, parse_pattern
from turnout.errors import Unprocessable
from turnout.store.bounds import MAX_AUDIT_ENTRIES, MAX_INT, MAX_LATENCY_BUDGET_MS, MAX_NAME, MAX_URL

if TYPE_CHECKING:  # the store's SQLAlchemy stack is not needed to check inputs (a CLI call to a gateway skips it)
    from turnout.store.keys import KeyRecord

__all__ = [
    "MAX_AUDIT_LIMIT",
    "MAX_CREDENTIAL",
    "MAX_DURATION_S",
    "MAX_INT",
    "MAX_LATENCY_BUDGET_MS",
    "MAX_NAME",
    "MAX_SCOPES",
    "MAX_TIMESTAMP",
    "MAX_URL",
    "AliasSet",
    "AuditQuery",
    "BatchListQuery",
    "EndpointChange",
    "EndpointCreate",
    "EndpointTest",
    "KeyChange",
    "KeyCreate",
    "KeyListQuery",
    "KeyRotate",
    "OnlyInstalled",
    "PlacementToggle",
    "TenantChange",
    "UsageQuery",
    "check_model_names",
    "parse_input",
    "parse_when",
    "text_problem",
]

MAX_ACTION = 64  # audit action names (column width)
MAX_SCOPES = 100  # model scopes on one key
MAX_CREDENTIAL = 8192  # an endpoint's API key or token
MAX_DURATION_S = 10 * 365 * 86_400  # 10 years: rotation grace, relative times such as 30d
MAX_TIMESTAMP = 253_402_300_799.0  # 9999-12-31T23:59:59Z, the last instant datetime can show
MAX_TIME_TEXT = 64  # characters of a time given as text
MAX_AUDIT_LIMIT = MAX_AUDIT_ENTRIES  # audit entries per query
DEFAULT_AUDIT_LIMIT = 100

_TIME_HELP = "use 2026-12-31, an ISO timestamp, epoch seconds, or a duration such as 30m, 24h or 7d"
_DURATION = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)([smhd])", re.ASCII)
_EPOCH = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?", re.ASCII)
_WHOLE = re.compile(r"[0-9]{1,10}", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_ENDPOINT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)

M = TypeVar("M", bound=BaseModel)


# -- checks -----------------------------------------------------------------------------------------
def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name or label (blank, or a control character), or None."""
    if not value.strip():
        return "must not be blank"
    for ch in value:
        if ch < " " or ch == "\x7f" or "\x80" <= ch <= "\x9f" or ch in "\u2028\u2029":
            return f"contains the control character U+{ord(ch):04X}"
    return None


def _printable(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _no_controls(value: str) -> str:
    """Like _printable, but an empty string is allowed (it means "remove")."""
    return _printable(value) if value else value


def _whole_number(value: object) -> object:
    """Query strings carry numbers as text: ASCII digits only (no signs, spaces, '_' or other scripts)."""
    if isinstance(value, str):
        if not _WHOLE.fullmatch(value):
            raise ValueError("must be a whole number written with the digits 0-9")
        return int(value)
    return value


def _time_value(value: object) -> str | float:
    if isinstance(value, str):
        if len(value) > MAX_TIME_TEXT:
            raise ValueError(f"is longer than {MAX_TIME_TEXT} characters; {_TIME_HELP}")
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0 <= value <= MAX_TIMESTAMP:  # also refuses NaN and the infinities
            raise ValueError(f"is not a time between 1970 and 9999; {_TIME_HELP}")
        return float(value)
    raise ValueError(f"must be a time: {_TIME_HELP}")


class _FieldProblem(ValueError):
    """Raised by a model validator about one field (pydantic would place it at the model)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def _url(value: str) -> str:
    for ch in value:
        if ch <= " " or ch == "\x7f" or "\x80" <= ch <= "\x9f" or ch in "\u2028\u2029":
            raise ValueError("must not contain spaces or control characters")
    if not re.match(r"https?://[^/\s]+", value):
        raise ValueError("must start with http:// or https:// and name a host")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port outside 0..65535
    except ValueError:
        raise ValueError("has an invalid host or a port outside 1..65535") from None
    if not parts.hostname or parts.port == 0:
        raise ValueError("has an invalid host or a port outside 1..65535")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "must not carry a user or password (user:password@host): give the credential as the endpoint's "
            "credential (stored encrypted, never shown), not in the URL (shown in listings and logs)"
        )
    return base_url(value).url  # http://host:1234/v1 -> http://host:1234 (callers say so: url_note)


def _endpoint_name(value: str) -> str:
    if not _ENDPOINT_NAME.fullmatch(value):
        raise ValueError("is not a valid endpoint name: use letters, digits, '.', '_', '-' (at most 64)")
    return value


def check_model_names(names: object, field: str, *, limit: int) -> None:
    """Raise Unprocessable when a list of model names or patterns (placement rules) is longer than ``limit``
    or has an entry that is no model name (too long, control characters)."""
    if not isinstance(names, list):
        return  # the rules parser says what the shape must be
    if len(names) > limit:
        raise Unprocessable(f'"{field}" has more than {limit} entries', field=field)
    for index, name in enumerate(names):
        problem = model_name_problem(name, f"{field}[{index}]")
        if problem is not None:
            raise Unprocessable(problem, field=f"{field}[{index}]")


# -- field types ------------------------------------------------------------------------------------
Name = Annotated[StrictStr, Field(min_length=1, max_length=MAX_NAME), AfterValidator(_printable)]
Action = Annotated[StrictStr, Field(min_length=1, max_length=MAX_ACTION), AfterValidator(_printable)]
Count = Annotated[StrictInt, Field(ge=1, le=MAX_INT)]
Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION_S)]
TimeValue = Annotated[str | float, PlainValidator(_time_value)]
Url = Annotated[StrictStr, Field(min_length=1, max_length=MAX_URL), AfterValidator(_url)]
Credential = Annotated[StrictStr, Field(max_length=MAX_CREDENTIAL), AfterValidator(_no_controls)]
LatencyBudget = Annotated[StrictInt, Field(ge=1, le=MAX_LATENCY_BUDGET_MS)]
EndpointName = Annotated[StrictStr, AfterValidator(_endpoint_name)]
EnvName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]  # an environment variable's name


def _one_credential(spec: Any) -> None:
    if getattr(spec, "credential", None) and getattr(spec, "credential_env", None):
        raise _FieldProblem(
            'give "credential" or "credential_env" (the name of a variable in the gateway\'s environment), not both',
            "credential_env",
        )


ClassName = Literal["interactive", "standard", "batch"]  # turnout.core.admission.Priority (a test checks they agree)
ApiType = Literal["openai", "ollama"]
NativeApi = Literal["anthropic", "responses"]  # turnout.dialects.base.NATIVE_APIS


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class _Query(BaseModel):
    """Query strings: unknown parameters are ignored (a browser may add cache busters)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, allow_inf_nan=False)


def _model_name(value: str | None, field: str, *, exact: bool = False) -> None:
    if value is None:
        return
    problem = model_name_problem(value, field)
    if problem is None and exact and "*" in value:
        problem = f'"{field}" must be an exact model name, not a pattern'
    if problem is not None:
        raise _FieldProblem(problem, field)


def _check_scopes(models: list[str] | None) -> None:
    for index, raw in enumerate(models or ()):
        field = f"models[{index}]"
        text = raw.strip().removeprefix("model:")
        problem = model_name_problem(text, field)
        if problem is not None:
            raise _FieldProblem(problem, field)
        try:
            parse_pattern(text)
        except PatternError as exc:
            raise _FieldProblem(f'"{field}": {exc}', field) from None


# -- request models ---------------------------------------------------------------------------------
class KeyCreate(_Input):
    """``POST /admin/api/keys`` and ``turnout key create``."""

    app: Name
    tenant: Name | None = None
    models: Annotated[list[StrictStr], Field(max_length=MAX_SCOPES)] | None = None
    rpm: Count | None = None
    daily_tokens: Count | None = None
    expires: TimeValue | None = None
    priority: ClassName | None = None

    @model_validator(mode="after")
    def _scopes(self) -> KeyCreate:
        _check_scopes(self.models)
        return self

    def expires_at(self, now: float) -> float | None:
        return parse_when(self.expires, now, future=True, field="expires")

    def priority_class(self) -> Priority | None:
        return None if self.priority is None else Priority(self.priority)


class KeyChange(_Input):
    """``PATCH /admin/api/keys/{ref}`` and ``turnout key edit``: only the fields given change; ``null``
    removes a limit (``rpm``, ``daily_tokens``), the expiry (``expires``) or the key's own class (``priority``:
    its tenant's default applies)."""

    models: Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_SCOPES)] | None = None
    rpm: Count | None = None
    daily_tokens: Count | None = None
    expires: TimeValue | None = None
    priority: ClassName | None = None

    @model_validator(mode="after")
    def _check(self) -> KeyChange:
        if not self.model_fields_set:
            raise _FieldProblem("nothing to change: give models, rpm, daily_tokens, expires or priority", "")
        if "models" in self.model_fields_set and self.models is None:
            raise _FieldProblem('"models" cannot be removed; give ["*"] for every model', "models")
        _check_scopes(self.models)
        return self

    def changes(self, now: float) -> dict[str, Any]:
        """Keyword arguments for ``KeyStore.update``: only what was given."""
        out: dict[str, Any] = {}
        if "models" in self.model_fields_set:
            out["scopes"] = self.models
        for name in ("rpm", "daily_tokens"):
            if name in self.model_fields_set:
                out[name] = getattr(self, name)
        if "priority" in self.model_fields_set:
            out["priority"] = None if self.priority is None else Priority(self.priority)
        if "expires" in self.model_fields_set:
            out["expires_at"] = parse_when(self.expires, now, future=True, field="expires")
        return out


class TenantChange(_Input):
    """``PATCH /admin/api/tenants/{name}``: the default class of the tenant's keys (``null``: none set here)."""

    priority: ClassName | None  # required: null removes the default set here

    def priority_class(self) -> Priority | None:
        return None if self.priority is None else Priority(self.priority)


class KeyListQuery(_Query):
    """``GET /admin/api/keys`` and ``turnout key list``: filters (all optional, combined with AND)."""

    tenant: Name | None = None
    app: Name | None = None
    endpoint: Annotated[StrictStr, Field(max_length=64)] | None = None
    state: Literal["active", "revoked", "expired", "in_grace"] | None = None

    def matches(self, record: KeyRecord, now: float) -> bool:
        """The one filter rule, for the admin API and the CLI alike."""
        return (
            (self.tenant is None or record.tenant == self.tenant)
            and (self.app is None or record.app == self.app)
            and (self.endpoint is None or record.reaches_endpoint(self.endpoint))
            and (self.state is None or record.state(now) == self.state)
        )


class KeyRotate(_Input):
    """``POST /admin/api/keys/{ref}/rotate`` and ``turnout key rotate``."""

    grace_s: Seconds | None = None


class UsageQuery(_Query):
    """``GET /admin/api/usage``, ``GET /admin/api/usage/series`` and ``turnout usage``: the time range,
    bucket width, filters (combined with AND) and the answer's format."""

    since: TimeValue | None = None
    until: TimeValue | None = None
    bucket: Literal["minute", "hour", "day"] = "hour"
    key: Name | None = None
    endpoint: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    worker: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None
    model: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None
    route: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None
    batch: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None  # a Batch API batch's lines
    format: Literal["json", "csv"] = "json"

    @model_validator(mode="after")
    def _texts(self) -> UsageQuery:
        for name in ("endpoint", "worker", "model", "route", "batch"):
            value = getattr(self, name)
            if value is not None and text_problem(value) is not None:
                raise _FieldProblem(f'"{name}" {text_problem(value)}', name)
        return self

    def since_ts(self, now: float) -> float:
        found = parse_when(self.since, now, field="since")
        return now - 86_400 if found is None else found

    def until_ts(self, now: float) -> float:
        found = parse_when(self.until, now, field="until")
        return now if found is None else found


class AuditQuery(_Query):
    """``GET /admin/api/audit`` and ``turnout audit``: ``actor`` is exact, or a prefix ending in ``*``
    (``cli:*``); ``target`` is a prefix (``key:tk_ab``, ``worker:a``)."""

    since: TimeValue | None = None
    until: TimeValue | None = None
    action: Action | None = None
    actor: Name | None = None
    target: Annotated[StrictStr, Field(min_length=1, max_length=256), AfterValidator(_printable)] | None = None
    limit: Annotated[int, BeforeValidator(_whole_number), Field(ge=1, le=MAX_AUDIT_LIMIT)] = DEFAULT_AUDIT_LIMIT

    def since_ts(self, now: float) -> float | None:
        return parse_when(self.since, now, field="since")

    def until_ts(self, now: float) -> float | None:
        return parse_when(self.until, now, field="until")


class BatchListQuery(_Query):
    """``GET /admin/api/batches`` and ``turnout batch list``: filters (combined with AND), the newest first."""

    app: Name | None = None
    status: (
        Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"]
        | None
    ) = None
    limit: Annotated[int, BeforeValidator(_whole_number), Field(ge=1, le=1000)] = 100


class EndpointCreate(_Input):
    """``POST /admin/api/endpoints`` and ``turnout endpoint add``."""

    name: EndpointName
    url: Url
    api: ApiType = "openai"
    credential: Credential | None = None
    credential_env: EnvName | None = None
    fallback_model: StrictStr | None = None
    latency_budget_ms: LatencyBudget | None = None
    native_apis: list[NativeApi] | None = None

    @model_validator(mode="after")
    def _fallback(self) -> EndpointCreate:
        _one_credential(self)
        _model_name(self.fallback_model, "fallback_model", exact=True)
        return self


class EndpointTest(_Input):
    """``POST /admin/api/endpoints/test``: a dry run of an unsaved endpoint ("Test connection" before
    saving). The form's other fields may come along; they are validated, never stored."""

    url: Url
    api: ApiType = "openai"
    credential: Credential | None = None
    credential_env: EnvName | None = None
    name: EndpointName | None = None
    fallback_model: StrictStr | None = None
    latency_budget_ms: LatencyBudget | None = None
    native_apis: list[NativeApi] | None = None

    @model_validator(mode="after")
    def _fallback(self) -> EndpointTest:
        _one_credential(self)
        _model_name(self.fallback_model or None, "fallback_model", exact=True)
        return self


class EndpointChange(_Input):
    """``PATCH /admin/api/endpoints/{name}`` and ``turnout endpoint set``: only the fields given change;
    ``null`` (or ``""``) removes the credential, the fallback model or the latency budget."""

    url: Url | None = None
    api: ApiType | None = None
    credential: Credential | None = None
    credential_env: EnvName | None = None
    fallback_model: StrictStr | None = None
    latency_budget_ms: LatencyBudget | None = None
    native_apis: list[NativeApi] | None = None  # null or [] : none

    @model_validator(mode="after")
    def _check(self) -> EndpointChange:
        _one_credential(self)
        for required in ("url", "api"):
            if required in self.model_fields_set and getattr(self, required) is None:
                raise _FieldProblem(f'"{required}" cannot be removed; give the new value', required)
        _model_name(self.fallback_model or None, "fallback_model", exact=True)
        return self

    def changes(self) -> dict[str, Any]:
        """The fields given, with "" for the credential and fallback model meaning none."""
        out = {name: getattr(self, name) for name in self.model_fields_set if name != "credential_env"}
        for optional in ("credential", "fallback_model"):
            if optional in out and not out[optional]:
                out[optional] = None
        return out


class AliasSet(_Input):
    """``PUT /admin/api/aliases/{name}`` (the name from the path) and ``turnout alias set NAME MODEL``: one exact
    model name each (whether the alias would chain is decided against the aliases in force when it is written)."""

    name: StrictStr
    model: StrictStr

    @model_validator(mode="after")
    def _names(self) -> AliasSet:
        _model_name(self.name, "name", exact=True)
        _model_name(self.model, "model", exact=True)
        return self


class PlacementToggle(_Input):
    """``POST /admin/api/placement/workers/{name}/toggle``."""

    model: StrictStr

    @model_validator(mode="after")
    def _exact(self) -> PlacementToggle:
        _model_name(self.model, "model", exact=True)
        return self


class OnlyInstalled(_Input):
    """``POST /admin/api/placement/workers/{name}/only-installed``: ``accept_stale`` allows a whitelist of
    the models a worker listed before its last (failed) inventory poll."""

    accept_stale: bool = False


# -- parsing ----------------------------------------------------------------------------------------
def parse_input(model: type[M], data: Mapping[str, Any]) -> M:
    """``model`` validated from ``data``, or Unprocessable naming the first bad field (all problems listed)."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        allowed = ", ".join(model.model_fields)
        messages = [_message(err, allowed) for err in errors]
        field = _field(errors[0]) if errors else None
        raise Unprocessable("; ".join(dict.fromkeys(messages)), field=field or None) from None


def _field(err: ErrorDetails) -> str:
    problem = (err.get("ctx") or {}).get("error")
    return problem.field if isinstance(problem, _FieldProblem) else _path(err["loc"])


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(err: ErrorDetails, allowed: str) -> str:
    """One problem in words, naming the field; never the value given (it may be a credential)."""
    field = _path(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "value_error":
        text = str(err["msg"]).removeprefix("Value error, ")
        return f'"{field}" {text}' if field else text
    if kind == "extra_forbidden":
        return f'unknown field "{field}"; allowed: {allowed}'
    words = {
        "missing": "is required",
        "int_type": "must be an integer",
        "int_parsing": "must be an integer",
        "int_from_float": "must be an integer",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "finite_number": "must be a finite number (not NaN or infinity)",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "bool_type": "must be true or false",
        "greater_than_equal": f"must be at least {_number(ctx.get('ge'))}",
        "greater_than": f"must be greater than {_number(ctx.get('gt'))}",
        "less_than_equal": f"must be at most {_number(ctx.get('le'))}",
        "less_than": f"must be less than {_number(ctx.get('lt'))}",
        "string_too_short": "must not be empty",
        "string_too_long": f"is longer than {ctx.get('max_length')} characters",
        "too_long": f"has more than {ctx.get('max_length')} entries",
        "literal_error": f"must be {ctx.get('expected')}",
    }
    text = words.get(kind) or str(err["msg"])[:1].lower() + str(err["msg"])[1:]
    return f'"{field}" {text}' if field else text


def _number(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def parse_when(value: str | float | None, now: float, *, future: bool = False, field: str = "since") -> float | None:
    """Epoch seconds for ``2026-12-31``, an ISO timestamp, epoch seconds, or a duration (``24h``, ``7d``,
    ``30m``) back from ``now`` (forward when ``future``, for expiry dates); None for no value.

    Raises Unprocessable naming ``field`` for text it cannot read, a duration over :data:`MAX_DURATION_S`,
    or a time outside the epoch .. 9999-12-31 (NaN and infinities included)."""
    if value is None or value == "":
        return None
    when = _read_time(value, now, future, field) if isinstance(value, str) else float(value)
    if not 0 <= when <= MAX_TIMESTAMP:  # also False for NaN
        raise Unprocessable(f'"{field}" is not a time between 1970 and 9999; {_TIME_HELP}', field=field)
    return when


def _read_time(value: str, now: float, future: bool, field: str) -> float:
    text = value.strip()
    if len(text) > MAX_TIME_TEXT:
        raise Unprocessable(f'"{field}" is longer than {MAX_TIME_TEXT} characters; {_TIME_HELP}', field=field)
    duration = _DURATION.fullmatch(text)
    if duration is not None:
        span = float(duration.group(1)) * _UNITS[duration.group(2)]
        if span > MAX_DURATION_S:
            raise Unprocessable(f'"{field}" is a duration over {MAX_DURATION_S // 86_400} days', field=field)
        return now + span if future else now - span
    if _EPOCH.fullmatch(text):
        return float(text)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    except (ValueError, OverflowError):
        raise Unprocessable(
            f'"{field}": cannot read time {text[:MAX_TIME_TEXT]!r}; {_TIME_HELP}', field=field
        ) from None
