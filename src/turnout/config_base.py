"""What every part of the config shares: its error, its bounds and its model base (:mod:`turnout.config`)."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict

__all__ = [
    "MAX_CONCURRENT",
    "MAX_CONNECT_S",
    "MAX_GRACE_S",
    "MAX_INT",
    "MAX_TIMEOUT_S",
    "MAX_WAIT_S",
    "ConfigError",
    "Model",
    "is_loopback",
]


class ConfigError(Exception):
    """The configuration cannot be used; the message says where and why."""


MAX_INT = 2**31 - 1  # counts that reach the database (rpm, daily_tokens) fit a 32-bit column
MAX_CONCURRENT = 1_000_000  # in-flight and queue limits
MAX_WAIT_S = 3600.0  # poll intervals, queue waits, cache lifetimes
MAX_TIMEOUT_S = 86_400.0  # one upstream request, stream included
MAX_CONNECT_S = 300.0  # connect and poll timeouts
MAX_GRACE_S = 10 * 365 * 86_400.0  # a rotated key's grace period (10 years, as in the admin API)


class Model(BaseModel):
    # NaN and infinities are never valid (JSON files may spell them NaN / Infinity, strings "nan" / "inf").
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
