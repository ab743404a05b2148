"""Settings that come from the environment, not the config file: the endpoints' (private networks, health
interval, the credentials' key) and the runtime agent's (AIBrix's variable names). Read here, nowhere else."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from turnout.config_base import MAX_TIMEOUT_S, ConfigError
from turnout.config_base import Model as _Model

__all__ = ["AgentEnv", "EndpointEnv", "agent_env", "endpoint_env"]


class EndpointEnv(_Model):
    """Endpoint settings that come from the environment (read here, nowhere else)."""

    allow_private: bool = False
    health_interval_s: float = 20.0
    secret_key: str | None = None
    hints: tuple[str, ...] = ()  # advice to log at start (e.g. a legacy variable in use)
    # The gateway's environment as it started, for endpoint credentials named by variable ("credential_env"):
    # a registration made in the UI reads the control plane's environment, not the browser's machine.
    variables: SkipJsonSchema[dict[str, str]] = Field(default_factory=dict, repr=False)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_PRIVATE_NETWORK_VARIABLES = (
    "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS",
    "TURNOUT_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS",
)
_LEGACY_PRIVATE_NETWORK_VARIABLE = "APP_NOTIFY_ALLOW_PRIVATE_NETWORKS"


def _env_flag(env: Mapping[str, str], name: str) -> bool | None:
    """A true/false variable: None when unset or empty; anything but a yes or no word is an error."""
    raw = env.get(name, "").strip().lower()
    if not raw:
        return None
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"{name}={env[name]!r}: must be true or false (also 1/0, yes/no, on/off)")


def _allow_private(env: Mapping[str, str], hints: list[str]) -> bool:
    """The private-network opt-in: an explicit specific variable (true or false) decides; the legacy
    APP_NOTIFY_ALLOW_PRIVATE_NETWORKS counts only when neither specific name is set."""
    explicit = {name: flag for name in _PRIVATE_NETWORK_VARIABLES if (flag := _env_flag(env, name)) is not None}
    if len(set(explicit.values())) > 1:
        first, second = _PRIVATE_NETWORK_VARIABLES
        raise ConfigError(f"{first} and {second} disagree: set one of them (they are the same setting)")
    legacy = _env_flag(env, _LEGACY_PRIVATE_NETWORK_VARIABLE)
    if explicit:
        allow = next(iter(explicit.values()))
        if legacy is not None and legacy != allow:
            hints.append(
                f"{_LEGACY_PRIVATE_NETWORK_VARIABLE} is ignored: {next(iter(explicit))} is set and decides "
                f"(private endpoint networks {'allowed' if allow else 'refused'})"
            )
        return allow
    if legacy:
        hints.append(
            f"{_LEGACY_PRIVATE_NETWORK_VARIABLE} enables private endpoint networks; prefer the specific "
            "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true"
        )
    return bool(legacy)


def endpoint_env(env: Mapping[str, str]) -> EndpointEnv:
    hints: list[str] = []
    allow = _allow_private(env, hints)
    interval = 20.0
    for name in ("APP_MODEL_ENDPOINT_HEALTH_INTERVAL", "TURNOUT_MODEL_ENDPOINT_HEALTH_INTERVAL"):
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            interval = float(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: must be a number of seconds (0 turns endpoint checks off)") from None
        if not 0 <= interval <= MAX_TIMEOUT_S:  # also refuses nan and inf, which float() reads
            raise ConfigError(
                f"{name}={raw!r}: must be a number of seconds from 0 to {MAX_TIMEOUT_S:g} (0 turns endpoint checks off)"
            )
        break
    secret_key = env.get("TURNOUT_SECRET_KEY") or None
    if secret_key is not None and not _is_fernet_key(secret_key):
        raise ConfigError(
            "TURNOUT_SECRET_KEY is not a Fernet key (32 url-safe base64-encoded bytes, 44 characters): set it to "
            "the key your endpoint credentials were stored with, or unset it to use secret.key in the data dir"
        )
    return EndpointEnv(
        allow_private=allow,
        health_interval_s=interval,
        secret_key=secret_key,
        hints=tuple(hints),
        variables=dict(env),
    )


def _is_fernet_key(value: str) -> bool:
    """What ``cryptography.fernet.Fernet(key)`` accepts, checked without importing it."""
    try:
        return len(base64.urlsafe_b64decode(value.encode())) == 32
    except (binascii.Error, ValueError):
        return False


class AgentEnv(_Model):
    """Runtime agent settings from the environment, under AIBrix's runtime variable names so an AIBrix runtime
    pod spec carries over: ``AIBRIX_MODEL_RUNTIME_MOCK=1`` is ``turnout agent --mock``,
    ``AIBRIX_WEIGHT_CACHE_DIR`` is ``--cache-dir`` (a flag given on the command line wins)."""

    mock: bool = False
    weight_cache_dir: Path | None = None


def agent_env(env: Mapping[str, str] | None = None) -> AgentEnv:
    env = os.environ if env is None else env
    mock = env.get("AIBRIX_MODEL_RUNTIME_MOCK", "").strip().lower()
    if mock and mock not in _TRUE | _FALSE:
        raise ConfigError(f"AIBRIX_MODEL_RUNTIME_MOCK={mock!r}: use 1 for the mock runtime, 0 (or unset) for engines")
    cache = env.get("AIBRIX_WEIGHT_CACHE_DIR", "").strip()
    return AgentEnv(mock=mock in _TRUE, weight_cache_dir=Path(cache).expanduser() if cache else None)
