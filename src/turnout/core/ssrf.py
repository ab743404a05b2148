"""SSRF policy for outbound dials to external endpoints: which resolved addresses may be connected to.

Applied to the address actually dialed (after DNS), so spellings (decimal, octal, hex IPv4, trailing dots)
and DNS answers that change between a check and the dial cannot slip past it.

- always refused: link-local (169.254/16, fe80::/10), cloud metadata addresses, unspecified (0.0.0.0, ::),
  multicast, and metadata host names;
- refused unless private networks are allowed: loopback, RFC 1918, CGNAT 100.64/10, ULA fc00::/7, and other
  non-global ranges;
- IPv4-mapped and -compatible IPv6 addresses are judged as the IPv4 address they carry.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = ["METADATA_HOSTS", "DialVerdict", "check_address", "check_hostname"]

METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
METADATA_HOSTS = frozenset(
    {
        "metadata.google.internal",
        "metadata.goog",
        "metadata",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.azure.com",
        "metadata.platformequinix.com",
    }
)
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_ULA = ipaddress.ip_network("fc00::/7")


@dataclass(frozen=True, slots=True)
class DialVerdict:
    allowed: bool
    reason: str = ""
    always: bool = False  # refused whatever the opt-in says


def check_hostname(host: str) -> DialVerdict:
    name = host.rstrip(".").lower()
    if name in METADATA_HOSTS:
        return DialVerdict(False, f"{host} is a cloud metadata host", always=True)
    return DialVerdict(True)


def check_address(address: str, *, allow_private: bool) -> DialVerdict:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return DialVerdict(False, f"{address!r} is not an IP address", always=True)
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or _ipv4_compatible(ip)
        if mapped is not None:
            inner = check_address(str(mapped), allow_private=allow_private)
            return DialVerdict(inner.allowed, inner.reason and f"{ip} carries {mapped}: {inner.reason}", inner.always)
    if ip in METADATA_ADDRESSES:
        return DialVerdict(False, f"{ip} is a cloud metadata address", always=True)
    if ip.is_unspecified:
        return DialVerdict(False, f"{ip} is the unspecified address", always=True)
    if ip.is_link_local:
        return DialVerdict(False, f"{ip} is link-local", always=True)
    if ip.is_multicast:
        return DialVerdict(False, f"{ip} is multicast", always=True)
    private = ip.is_loopback or ip.is_private or ip in _CGNAT or ip in _ULA or not ip.is_global
    if private and not allow_private:
        kind = "loopback" if ip.is_loopback else "CGNAT" if ip in _CGNAT else "private"
        return DialVerdict(
            False,
            f"{ip} is a {kind} address; set APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true to allow private networks",
        )
    return DialVerdict(True)


def _ipv4_compatible(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """::a.b.c.d (deprecated IPv4-compatible form), excluding :: and ::1."""
    value = int(ip)
    if value >> 32 == 0 and value > 1:
        return ipaddress.IPv4Address(value)
    return None
