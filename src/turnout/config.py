"""Typed configuration: the `config.json` model, its loader and its JSON Schema.

Loaded once at start and frozen. Relative paths in it resolve against the config file's directory.
The environment is read here and nowhere else (``TURNOUT_ADMIN_TOKEN``,
``TURNOUT_OIDC_CLIENT_SECRET``...). A bad file raises
:class:`ConfigError` whose message names every bad field path and what is wrong with it.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AnyHttpUrl,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from turnout.config_auth import Auth, Oidc
from turnout.config_base import (  # re-exported: the package imports them from here
    MAX_CONCURRENT,
    MAX_CONNECT_S,
    MAX_INT,
    MAX_TIMEOUT_S,
    MAX_WAIT_S,
    ConfigError,
    is_loopback,
)
from turnout.config_base import Model as _Model
from turnout.config_env import AgentEnv, EndpointEnv, agent_env, endpoint_env
from turnout.config_pools import Pools
from turnout.core.admission import Priority
from turnout.core.aliases import table_problems
from turnout.core.patterns import Pattern, parse_pattern
from turnout.core.placement import PlacementMode, PlacementRules
from turnout.core.roles import parse_role
from turnout.core.ssrf import parse_nat64_prefix
from turnout.defaults import CONFIG_FILE_NAME

__all__ = [
    "CONFIG_FILE_NAME",
    "AgentEnv",
    "Auth",
    "ConfigError",
    "DemoWorker",
    "EndpointEnv",
    "LogFormat",
    "Oidc",
    "Settings",
    "Telemetry",
    "WorkerType",
    "agent_env",
    "config_schema",
    "endpoint_env",
    "is_loopback",
    "load_settings",
    "read_config_document",
    "settings_from_document",
    "starter_config",
]

ADMIN_TOKEN_ENV = "TURNOUT_ADMIN_TOKEN"
OIDC_SECRET_ENV = "TURNOUT_OIDC_CLIENT_SECRET"  # the single sign-on client's secret: never in the file
STARTER_WORKER = "local"  # the starter config's worker: Ollama's default address on this machine
STARTER_OLLAMA_URL = "http://127.0.0.1:11434"
DEMO_WORKER = "demo"  # the starter config's demo entry, when it has one


def _check_pattern(value: str) -> str:
    parse_pattern(value)  # PatternError is a ValueError: pydantic reports it at the field path
    return value


PatternText = Annotated[str, Field(description="exact name, prefix with one trailing '*', or '*'")]


class Listen(_Model):
    host: str = Field(
        "127.0.0.1", min_length=1, max_length=253, description="address to bind; the default accepts only local clients"
    )
    port: int = Field(8080, ge=1, le=65535)


class Storage(_Model):
    data_dir: str = Field("./turnout-data", description="state directory, relative to the config file")
    model_placement_file: str = Field(
        "model-placement.json", description="UI placement overrides, relative to data_dir unless absolute"
    )
    database_url: str | None = Field(
        None, description="SQLAlchemy URL (postgresql://user:pass@host/db); default: SQLite turnout.db in data_dir"
    )
    redis_url: str | None = Field(
        None,
        description="redis://host:port/db; when set, every replica shares through it the rate and token limits, the "
        "requests in flight and the wait queue (every cap exact across replicas), the prefix index, and the one wake "
        "per sleeping model (docs/scaling.md)",
    )
    redis_timeout_ms: float = Field(
        250,
        gt=0,
        le=10_000,
        description="a Redis reply later than this counts as Redis away: each replica serves on its own state (every "
        "cap cut to its share) until Redis answers again. The time is the gateway's own: a busy gateway reads a "
        "reply late even from a quick Redis, so a figure much below 100 ms takes load for an outage",
    )


class Routing(_Model):
    max_concurrent: int = Field(256, ge=1, le=MAX_CONCURRENT, description="requests in flight across the whole gateway")
    model_max_concurrent: dict[str, Annotated[int, Field(ge=1, le=MAX_CONCURRENT)]] = Field(
        default_factory=dict,
        description="in-flight limit per model; keys are patterns, the most specific match applies",
    )
    queue_timeout_s: float = Field(30, ge=0, le=MAX_WAIT_S, description="how long a request waits for a free slot")
    max_queue: int = Field(
        1024, ge=0, le=MAX_CONCURRENT, description="requests allowed to wait at once; more get 503 at once"
    )
    max_attempts: int = Field(3, ge=1, le=10, description="workers tried when one cannot be reached")
    prefix_affinity: bool = Field(
        True,
        description="send a request where the beginning of its prompt is likely still in the engine's KV cache (a "
        "prefix index per worker, weighed against the wait by expected time); false: expected time without it",
    )
    prefix_block_bytes: int = Field(
        256, ge=16, le=65536, description="the prefix index hashes prompts in blocks of this many bytes"
    )
    prefix_max_blocks: int = Field(
        16384,
        ge=1,
        le=10_000_000,
        description="blocks the prefix index keeps per worker at most, the least recently sent forgotten first "
        "(at most 320 bytes each: about 5 MB per worker by default)",
    )
    prefix_ttl_s: float = Field(
        600, gt=0, le=MAX_WAIT_S * 24, description="a prompt sent longer ago than this no longer counts as cached"
    )
    session_header: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$",
        description="a request header that names the client's session (e.g. X-Session-Id); requests naming one "
        "go where that session went last, as the body fields clients send for it do (prompt_cache_key, user)",
    )
    load_guard_absolute: int | None = Field(
        None,
        ge=0,
        le=MAX_CONCURRENT,
        description="the load guard: when the worker ranked first has more than this many requests in flight "
        "above the least loaded candidate, and load_guard_relative times as many, rank by load instead; unset: "
        "what that worker runs at once (a whole engine's worth waiting), 32 for a batching engine of unknown capacity",
    )
    load_guard_relative: float = Field(1.5, ge=1, le=1000, description="the load guard's relative threshold")
    speed_ttl_s: float = Field(
        300,
        gt=0,
        le=MAX_WAIT_S * 24,
        description="a learned prefill or decode rate older than this is forgotten: the worker counts as average "
        "again and gets requests, so that one slow answer never starves it",
    )
    hold_s: float = Field(
        60,
        ge=0,
        le=MAX_WAIT_S,
        description="a request for a model that is waking, activating or starting (a claim), or whose only workers "
        "are down but were healthy within the last minute (a restart), waits this long for it in the queue before "
        "it is answered 503 with Retry-After: a wake takes about a second and a small model's start a few, while "
        "clients wait minutes for an answer (the OpenAI and Anthropic SDKs 10); 0: answer at once. A request can "
        "ask for less with the X-Turnout-Hold header",
    )
    batch_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="batch requests (the Batch API's lines, keys of class batch) may hold at most this share of a "
        "worker's slots (what its engine runs at once; at least one), so an interactive request finds a free slot "
        "instead of waiting behind a long batch generation; 1: no headroom",
    )
    preempt_batch: bool = Field(
        True,
        description="an interactive or standard request that finds every slot it could use taken stops a batch "
        "request running there (the one that started last; each Batch API line at most three times, sent again at "
        "once), instead of waiting for it to end; false: batch requests always run to their end",
    )
    explain_header: bool = Field(
        False,
        description="answer every routed request with an X-Turnout-Route header: the worker and why it was chosen "
        "(off by default: it tells clients the workers' names)",
    )

    @field_validator("model_max_concurrent")
    @classmethod
    def _patterns(cls, value: dict[str, int]) -> dict[str, int]:
        for key in value:
            _check_pattern(key)
        return value

    def model_limits(self) -> dict[Pattern, int]:
        return {parse_pattern(k): v for k, v in self.model_max_concurrent.items()}


class Health(_Model):
    interval_s: float = Field(10, gt=0, le=MAX_WAIT_S, description="seconds between polls of each worker")
    timeout_s: float = Field(3, gt=0, le=MAX_CONNECT_S, description="timeout of one health/inventory poll")
    failures_to_down: int = Field(1, ge=1, le=100, description="consecutive failed polls before a worker is down")
    request_failures_to_down: int = Field(
        5,
        ge=1,
        le=100,
        description="consecutive failed proxied requests for one model on a worker (HTTP 5xx, invalid answers, "
        "streams broken after they started) before that model is taken out on that worker (its other models "
        "keep being served); and consecutive requests whose connection broke before any answer before the whole "
        "worker is taken out (the next successful poll brings it back)",
    )
    model_retry_s: float = Field(
        30,
        gt=0,
        le=MAX_WAIT_S,
        description="seconds a model taken out on a worker stays out before requests try it again (doubled after "
        "each further failure, up to 16x; one success brings it back)",
    )


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class Logging(_Model):
    access_log: bool = Field(
        True,
        description="one line per request (key prefix, app, api, model, worker, status, latency, tokens); "
        "turnout serve --access-log / --no-access-log overrides it",
    )
    format: LogFormat = Field(
        LogFormat.TEXT,
        description="text, or json: one JSON object per line for every record; turnout serve --log-format overrides it",
    )


class Telemetry(_Model):
    otlp_endpoint: AnyHttpUrl | None = Field(
        None,
        description="OpenTelemetry traces: the OTLP/HTTP traces URL of a collector (http://127.0.0.1:4318/v1/traces "
        "for one on this machine), sent a span per proxied call with its phases (docs/configuration.md#telemetry); "
        "unset: no traces",
    )
    service_name: str = Field("turnout", min_length=1, max_length=256, description="the spans' service.name")
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="the share of the traces begun here that are recorded; a request that carries a traceparent "
        "follows its sampled flag",
    )
    queue_spans: int = Field(
        2048,
        ge=1,
        le=1_000_000,
        description="ended spans waiting to be sent at most: past it, while the collector is slow or away, a span "
        "is dropped and counted (turnout_trace_spans_dropped_total), never waited for",
    )
    export_every_s: float = Field(5, gt=0, le=MAX_WAIT_S, description="how often queued spans are sent")
    export_timeout_s: float = Field(
        10, gt=0, le=MAX_CONNECT_S, description="time allowed to one export to the collector, retries included"
    )
    headers: dict[str, str] = Field(
        default_factory=dict, description="headers sent with each export (a collector's credential)"
    )

    @field_validator("headers")
    @classmethod
    def _header_safe(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not name or any(ch <= " " or ch in '()<>@,;:\\"/[]?={}' or ch > "~" for ch in name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if any(ch < " " or ch == "\x7f" for ch in text):
                raise ValueError(f"{name}: must not contain control characters (it is sent as an HTTP header)")
        return value


class Limits(_Model):
    max_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, le=1024**3, description="largest accepted request body (at most 1 GiB)"
    )
    upstream_timeout_s: float = Field(
        600, gt=0, le=MAX_TIMEOUT_S, description="total time allowed for one upstream request"
    )
    connect_timeout_s: float = Field(5, gt=0, le=MAX_CONNECT_S, description="time allowed to connect to a worker")
    stream_keepalive_s: float = Field(
        10,
        gt=0,
        le=MAX_CONNECT_S,
        description="a streamed Anthropic Messages answer gets a ping event each time the worker has sent nothing "
        "(or nothing the client is sent) for this long; a held stream (routing.hold_s) gets its headers after 1 s "
        "held (or this, if less) and a keep-alive (a ping event, an SSE comment) every this long while it waits",
    )


class Network(_Model):
    nat64_prefixes: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="the NAT64 prefixes (RFC 6052) this machine's DNS64 puts IPv4 destinations in, each with its "
        "length (/32, /40, /48, /56, /64 or /96), e.g. 64:ff9b:1:2a::/96 inside the local-use 64:ff9b:1::/48: an "
        "endpoint address in one is judged by the IPv4 address it carries at that length's place; a local-use "
        "NAT64 address in none is refused (where its IPv4 address sits cannot be read)",
    )

    @field_validator("nat64_prefixes")
    @classmethod
    def _nat64(cls, value: list[str]) -> list[str]:
        return [str(parse_nat64_prefix(text)) for text in value]  # its ValueError names the bad prefix

    @property
    def nat64(self) -> tuple[ipaddress.IPv6Network, ...]:
        """The declared prefixes as networks (the SSRF guard's :func:`~turnout.core.ssrf.check_address` form)."""
        return tuple(ipaddress.IPv6Network(text) for text in self.nat64_prefixes)


class Responses(_Model):
    store_days: float = Field(
        30,
        gt=0,
        le=3650,
        description="how long a stored OpenAI Responses answer (store: true, the default) is kept for "
        "previous_response_id and GET /v1/responses/{id}",
    )


class Batches(_Model):
    """The OpenAI Batch API (docs/api.md#the-batch-api): its files live in the SQL store, so that every replica
    can run or resume any batch."""

    max_file_bytes: int = Field(
        100 * 2**20,
        ge=1024,
        le=2**30,
        description="largest input file POST /v1/files takes, in bytes (kept in the SQL store until deleted)",
    )
    max_lines: int = Field(50_000, ge=1, le=1_000_000, description="most requests in one batch input file")
    retention_days: float = Field(
        30,
        gt=0,
        le=3650,
        description="days a batch is kept after it ended, with its output and error files (then deleted), and "
        "an uploaded file after its upload unless it asked for less (expires_after)",
    )
    lines_in_flight: int = Field(
        8,
        ge=1,
        le=10_000,
        description="requests of one batch in flight at once (each asks the dispatcher for a slot at batch priority)",
    )
    max_attempts: int = Field(
        3, ge=1, le=10, description="times a line is sent when its worker fails (5xx) before that failure is its answer"
    )
    lease_s: float = Field(
        30,
        ge=1,
        le=MAX_WAIT_S,
        description="a batch has one runner at a time, which renews its lease every third of this; another gateway "
        "(or this one restarted) resumes a batch whose runner stopped renewing for this long",
    )
    poll_s: float = Field(
        2, gt=0, le=MAX_WAIT_S, description="how often each gateway looks for batches to run or resume"
    )


class TeamCeiling(_Model):
    rpm: int | None = Field(None, ge=1, le=MAX_INT, description="requests per minute of one key at most")
    daily_tokens: int | None = Field(None, ge=1, le=MAX_INT, description="tokens per UTC day of one key at most")
    priority: Priority | None = Field(
        None,
        description="the highest priority class a team-admin may give one key (unset: the tenant's default class, "
        "so a team-admin may lower a key's class and never raise it above the tenant's)",
    )


class Tenant(_Model):
    max_concurrent: int | None = Field(
        None, ge=1, le=MAX_CONCURRENT, description="requests in flight for all of this tenant's keys"
    )
    weight: int = Field(1, ge=1, le=100, description="share of the routing queue relative to other tenants")
    rpm: int | None = Field(
        None, ge=1, le=MAX_INT, description="requests per minute for all of this tenant's keys together"
    )
    daily_tokens: int | None = Field(
        None, ge=1, le=MAX_INT, description="tokens per UTC day for all of this tenant's keys"
    )
    team_ceiling: TeamCeiling = Field(
        default_factory=lambda: TeamCeiling(),
        description="the largest limits a team-admin of this tenant may give one key (admins set it here)",
    )
    priority: Priority | None = Field(
        None,
        description="the priority class of this tenant's keys that set none themselves: interactive, standard or "
        "batch (unset: the default set through the admin API, else standard); a request may lower its class "
        "with the X-Turnout-Priority header, never raise it",
    )


class ModelPlacement(_Model):
    mode: PlacementMode = PlacementMode.ALLOW_ALL
    allowed_models: list[PatternText] = Field(default_factory=list)
    denied_models: list[PatternText] = Field(default_factory=list)

    @field_validator("allowed_models", "denied_models")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for item in value:
            _check_pattern(item)
        return value

    def rules(self) -> PlacementRules:
        return PlacementRules.parse(self.mode.value, self.allowed_models, self.denied_models)


class WorkerType(StrEnum):
    OLLAMA = "ollama"
    OPENAI = "openai"


NativeApi = Literal["anthropic", "responses"]  # turnout.dialects.base.NATIVE_APIS (a test checks they agree)


class Worker(_Model):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    url: AnyHttpUrl
    type: WorkerType = WorkerType.OLLAMA
    max_concurrent: int | None = Field(None, ge=1, le=MAX_CONCURRENT, description="requests in flight on this worker")
    api_key: str | None = Field(
        None, max_length=8192, description="sent upstream as a Bearer token (OpenAI-style workers)"
    )
    metrics_url: AnyHttpUrl | None = Field(
        None, description="optional Prometheus endpoint exposing GPU utilisation / memory (DCGM, nvidia_smi)"
    )
    native_apis: list[NativeApi] = Field(
        default_factory=list,
        description="client APIs this worker serves itself, passed through to it unchanged instead of translated: "
        '"anthropic" (Messages: recent llama.cpp llama-server, Ollama), "responses" (vLLM, Ollama, LM Studio)',
    )
    slots: int | None = Field(
        None,
        ge=1,
        le=MAX_CONCURRENT,
        description="requests its engine runs at once, each slot keeping the KV cache of the last prompt it ran "
        "(llama.cpp's --parallel, Ollama's OLLAMA_NUM_PARALLEL; 1 for llama-cpp-python's server): more wait in its "
        "queue, and only its last `slots` prompts count as cached; unset: read from the engine where it says "
        "(llama.cpp's /props; vLLM and SGLang batch), else learned from its answers, one at a time until then",
    )
    cache_tokens: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        description="tokens its engine's prefix cache holds (a paged KV cache's capacity): the prefix index "
        "counts no more than this as cached here; unset: routing.prefix_max_blocks alone bounds it",
    )
    model_placement: ModelPlacement = Field(default_factory=ModelPlacement)
    priority_scheduling: bool = Field(
        False,
        description="its engine schedules by each request's priority (vLLM started with --scheduling-policy "
        "priority; SGLang with --enable-priority-scheduling): each request carries its class as the engine's "
        "per-request priority (interactive -1, standard 0, batch 1, lower served first: vLLM's order, and "
        "SGLang's with --schedule-low-priority-values-first; see priority_high_first). Only for an engine started "
        "so: another may refuse the field",
    )
    priority_high_first: bool = Field(
        False,
        description="with priority_scheduling: its engine serves higher priority values first (SGLang started with "
        "--enable-priority-scheduling and without --schedule-low-priority-values-first), so the classes are sent "
        "with their signs turned (interactive 1, batch -1)",
    )

    @field_validator("native_apis")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    @field_validator("url", "metrics_url")
    @classmethod
    def _no_userinfo(cls, value: AnyHttpUrl | None) -> AnyHttpUrl | None:
        if value is not None and (value.username is not None or value.password is not None):
            raise ValueError(
                'must not carry a user or password (user:password@host): put an API key in "api_key" (sent as a '
                "Bearer token), not in the URL (shown in listings and logs)"
            )
        return value

    @field_validator("api_key")
    @classmethod
    def _header_safe(cls, value: str | None) -> str | None:
        if value is not None and any(ch < " " or ch == "\x7f" for ch in value):
            raise ValueError("must not contain control characters (it is sent as an HTTP header)")
        return value

    @model_validator(mode="after")
    def _priority_on_openai(self) -> Self:
        if self.priority_high_first and not self.priority_scheduling:
            raise ValueError(
                "priority_high_first says in which order an engine that schedules by priority serves the values: "
                'set "priority_scheduling": true as well (SGLang started with --enable-priority-scheduling), or '
                "remove it"
            )
        if self.priority_scheduling and self.type is not WorkerType.OPENAI:
            raise ValueError(
                "priority_scheduling is for an OpenAI-style worker whose engine schedules by priority (vLLM with "
                '--scheduling-policy priority): set "type": "openai", or remove it'
            )
        return self

    @property
    def base_url(self) -> str:
        return str(self.url).rstrip("/")


class DemoWorker(_Model):
    """The demo entry of workers[]: the demo model (SmolLM2-135M) on a llama.cpp engine on this machine, which the
    gateway runs itself as a ModelClaim on a pool of its own; not a worker it polls (the loader moves it to
    Settings.demo; turnout.core.demo says what runs)."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    type: Literal["demo"]
    threads: int = Field(1, ge=1, le=256, description="CPU threads of the engine (prompt and generation)")
    sleep_after_s: float = Field(
        900,
        ge=0,
        le=MAX_TIMEOUT_S,
        description="idle seconds before the engine sleeps (stopped, its memory freed; the next request wakes it); "
        "0: never",
    )


class Settings(_Model):
    """The whole `config.json`."""

    listen: Listen = Field(default_factory=Listen)
    storage: Storage = Field(default_factory=Storage)
    routing: Routing = Field(default_factory=Routing)
    health: Health = Field(default_factory=Health)
    limits: Limits = Field(default_factory=Limits)
    logging: Logging = Field(default_factory=Logging)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    auth: Auth = Field(default_factory=Auth)
    responses: Responses = Field(default_factory=Responses)
    network: Network = Field(default_factory=Network)
    batches: Batches = Field(default_factory=Batches)
    tenants: dict[str, Tenant] = Field(default_factory=dict)
    pools: Pools | None = Field(None, description="run the local ModelClaim controller inside the gateway")
    workers: list[Worker] = Field(default_factory=list)
    aliases: dict[str, str] = Field(
        default_factory=dict,
        description="model aliases: a name clients ask for -> the model it stands for (docs/aliases.md); "
        "aliases set through the admin API replace these by name",
    )

    # Filled by the loader, not by the file.
    demo: SkipJsonSchema[DemoWorker | None] = Field(None, exclude=True)  # the workers[] entry of type demo
    config_path: Path | None = Field(None, exclude=True)
    admin_token: str | None = Field(None, exclude=True)
    oidc_client_secret: str | None = Field(None, exclude=True, repr=False)
    endpoint_env: EndpointEnv = Field(default_factory=EndpointEnv, exclude=True)

    @model_validator(mode="after")
    def _unique_workers(self) -> Self:
        seen: set[str] = set()
        for index, worker in enumerate(self.workers):
            if worker.name in seen:
                raise ValueError(f"workers[{index}].name: duplicate worker name {worker.name!r}")
            seen.add(worker.name)
        if self.demo is not None and self.demo.name in seen:
            raise ValueError(f"workers: duplicate worker name {self.demo.name!r} (the demo entry has it too)")
        return self

    @model_validator(mode="after")
    def _demo_on_local_pools(self) -> Self:
        if self.demo is None or self.pools is None:
            return self
        if self.pools.kubernetes is not None:
            raise ValueError(
                "workers: the demo entry runs on the gateway's own local controller, and pools.kubernetes leaves "
                "claims to the operator: remove one of them"
            )
        if any(a.name == self.demo.name for a in self.pools.agents):
            raise ValueError(
                f"workers: the demo entry's name {self.demo.name!r} is its pool's name, and pools.agents has a pool "
                "of that name: rename one of them"
            )
        return self

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, value: dict[str, str]) -> dict[str, str]:
        problems = table_problems(value, field="")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @model_validator(mode="after")
    def _team_tenants(self) -> Self:
        oidc = self.auth.oidc
        if oidc is None:
            return self
        for section, mapping in (("roles", oidc.roles), ("email_roles", oidc.email_roles)):
            for group, text in mapping.items():
                _, tenant = parse_role(text)
                if tenant is not None and tenant not in self.tenants:
                    known = ", ".join(sorted(self.tenants)) or "none"
                    raise ValueError(
                        f"auth.oidc.{section}.{group}: tenant {tenant!r} is not in tenants (known: {known}); "
                        "add it under tenants first"
                    )
        return self

    @model_validator(mode="after")
    def _open_only_on_loopback(self) -> Self:
        if self.auth.open and not is_loopback(self.listen.host):
            raise ValueError(
                f"auth.open: open access (no API keys) is only allowed on a loopback bind, "
                f"but listen.host is {self.listen.host!r}; use keys or bind 127.0.0.1"
            )
        return self

    @property
    def base_dir(self) -> Path:
        return self.config_path.parent if self.config_path else Path.cwd()

    @property
    def data_dir(self) -> Path:
        return (self.base_dir / self.storage.data_dir).resolve()

    @property
    def placement_file(self) -> Path:
        return (self.data_dir / self.storage.model_placement_file).resolve()

    def tenant_class(self, tenant: str) -> Priority | None:
        """The default priority class this file gives ``tenant``'s keys (``tenants.<t>.priority``), or None."""
        configured = self.tenants.get(tenant)
        return None if configured is None else configured.priority

    def worker(self, name: str) -> Worker | None:
        return next((w for w in self.workers if w.name == name), None)


def load_settings(path: Path, env: Mapping[str, str] | None = None) -> Settings:
    """Read, parse and validate ``path``; never writes anything."""
    return settings_from_document(path, read_config_document(path), env)


def read_config_document(path: Path) -> dict[str, Any]:
    """The config file as parsed JSON, not yet validated (``turnout worker add`` edits this and writes it back)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    return data


def settings_from_document(path: Path, data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Settings:
    """Validate a config document that is (or is about to be) the file at ``path``."""
    env = os.environ if env is None else env
    token = env.get(ADMIN_TOKEN_ENV) or None
    from_env = endpoint_env(env)  # its errors name the environment variable, not the file
    data, demo, problems = _split_demo(data)
    try:
        settings = Settings.model_validate(
            {
                **data,
                "demo": demo,
                "config_path": path.resolve(),
                "admin_token": token,
                "oidc_client_secret": env.get(OIDC_SECRET_ENV) or None,
                "endpoint_env": from_env,
            }
        )
    except ValidationError as exc:
        problems.append(format_validation_error(exc))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if problems:
        raise ConfigError(f"{path}: invalid configuration:\n" + "\n".join(problems)) from None
    return settings


def _split_demo(data: Mapping[str, Any]) -> tuple[dict[str, Any], DemoWorker | None, list[str]]:
    """The document without its ``workers[]`` entry of type ``demo``, that entry, and the problems with it (field
    paths as in the file)."""
    workers = data.get("workers")
    if not isinstance(workers, list):
        return dict(data), None, []
    entries = [(i, w) for i, w in enumerate(workers) if isinstance(w, dict) and w.get("type") == "demo"]
    if not entries:
        return dict(data), None, []
    rest = {**data, "workers": [w for w in workers if not (isinstance(w, dict) and w.get("type") == "demo")]}
    problems = [f"  workers[{i}]: a second demo entry (there is one demo model)" for i, _ in entries[1:]]
    index, entry = entries[0]
    try:
        demo = DemoWorker.model_validate(entry)
    except ValidationError as exc:
        return rest, None, [*problems, format_validation_error(exc, ("workers", index))]
    return rest, demo, problems


def format_validation_error(exc: ValidationError, prefix: tuple[int | str, ...] = ()) -> str:
    lines = []
    for err in exc.errors():
        where = _field_path((*prefix, *err["loc"])) or "(top level)"
        message = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def config_schema() -> dict[str, Any]:
    schema = Settings.model_json_schema(mode="validation")
    for hidden in ("config_path", "admin_token", "oidc_client_secret", "endpoint_env"):
        schema.get("properties", {}).pop(hidden, None)
    # workers[] also takes the demo entry (the loader moves it to Settings.demo)
    demo = DemoWorker.model_json_schema(mode="validation")
    schema.setdefault("$defs", {})["DemoWorker"] = demo
    workers = schema["properties"]["workers"]
    workers["items"] = {"anyOf": [workers["items"], {"$ref": "#/$defs/DemoWorker"}]}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Turnout config.json"
    return schema


def starter_config(*, demo: bool = False) -> dict[str, Any]:
    """What `turnout serve` writes on first start: embedded defaults and one worker, the Ollama on this machine
    (down until one runs there; `turnout worker add|remove` changes the list), and with ``demo`` the demo entry
    (when this start runs the demo model: nothing answered where the Ollama worker points)."""
    workers: list[dict[str, Any]] = [{"name": STARTER_WORKER, "url": STARTER_OLLAMA_URL, "type": "ollama"}]
    if demo:
        workers.append({"name": DEMO_WORKER, "type": "demo"})
    return {
        "listen": {"host": "127.0.0.1", "port": 8080},
        "storage": {"data_dir": ".", "model_placement_file": "model-placement.json"},
        "routing": {"max_concurrent": 256, "model_max_concurrent": {}, "queue_timeout_s": 30},
        "health": {"interval_s": 10, "timeout_s": 3},
        "workers": workers,
    }
