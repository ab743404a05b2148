"""SSRF policy for outbound dials to external endpoints: which resolved addresses may be connected to.

Applied to the address actually dialed (after DNS), so spellings (decimal, octal, hex IPv4, trailing dots)
and DNS answers that change between a check and the dial cannot slip past it. Used by the upstream dialer
(:mod:`turnout.upstream.http1`) and by the endpoint checks (:mod:`turnout.fleet.endpoints`).

- always refused: link-local (169.254/16, fe80::/10), cloud metadata addresses, unspecified and "this
  network" (0.0.0.0/8, ::), multicast, and metadata host names;
- refused unless private networks are allowed: loopback, RFC 1918, CGNAT 100.64/10, ULA fc00::/7, NAT64
  local-use 64:ff9b:1::/48 and other non-global ranges;
- an IPv6 address that carries an IPv4 address is judged by what it carries, because a translator or
  tunnel on the path delivers it there: IPv4-mapped (::ffff:0:0/96), IPv4-compatible (::/96) and
  IPv4-translated (::ffff:0:0:0/96) as that IPv4 address alone; NAT64 (64:ff9b::/96, RFC 6052), 6to4
  (2002::/16, RFC 3056), Teredo (2001::/32, RFC 4380: its server and its client) and ISATAP interface ids
  (RFC 5214) as the worst of the IPv6 address itself and each IPv4 address it may carry;
- NAT64 prefixes the operator declares (``network.nat64_prefixes``: a network-specific prefix, RFC 6052, such
  as one inside the local-use 64:ff9b:1::/48 of RFC 8215, with its length) are read in their own layout: an
  address in one is the IPv4 address at that length's place, judged alone (the translator delivers it there),
  and one whose "u" octet or suffix is not zero is not an RFC 6052 address and is always refused. A local-use
  NAT64 address in no declared prefix cannot be read (the /48 says nothing of the prefix length, so nothing of
  where the IPv4 address sits) and is always refused, the reason saying so.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = [
    "METADATA_HOSTS",
    "NAT64_LENGTHS",
    "DialVerdict",
    "check_address",
    "check_hostname",
    "embedded_ipv4",
    "parse_nat64_prefix",
]

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
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # RFC 1122: Linux dials 0.0.0.0 as this host
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_ULA = ipaddress.ip_network("fc00::/7")
# Spellings of one IPv4 address: the IPv6 address is only its wrapper, so the IPv4 address alone is judged.
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765 (SIIT)
_COMPATIBLE = ipaddress.ip_network("::/96")  # RFC 4291, deprecated
# Prefixes a translator or tunnel turns into an IPv4 destination.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052 well-known prefix
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215 local-use: non-global, any RFC 6052 length
_SIXTOFOUR = ipaddress.ip_network("2002::/16")
_TEREDO = ipaddress.ip_network("2001::/32")
# RFC 6052 section 2.2, per prefix length: where the 32 bits of the IPv4 address sit (byte offsets, skipping byte 8,
# the "u" octet, which must be zero) and where the suffix, which must be zero too, begins.
_RFC6052_LAYOUTS = {
    32: ((4, 5, 6, 7), 9),
    40: ((5, 6, 7, 9), 10),
    48: ((6, 7, 9, 10), 11),
    56: ((7, 9, 10, 11), 12),
    64: ((9, 10, 11, 12), 13),
    96: ((12, 13, 14, 15), 16),
}
NAT64_LENGTHS = tuple(_RFC6052_LAYOUTS)
# Where no NAT64 prefix can be: a declared one there would hide what those addresses are.
_NOT_NAT64 = {
    "::/64": "::, ::1 and the IPv4-mapped, -compatible and -translated forms",
    "fe80::/10": "link-local",
    "ff00::/8": "multicast",
}


@dataclass(frozen=True, slots=True)
class DialVerdict:
    allowed: bool
    reason: str = ""
    always: bool = False  # refused whatever the opt-in says

    @property
    def severity(self) -> int:
        """0 allowed, 1 refused without the opt-in, 2 always refused: the worst of several verdicts wins."""
        return 0 if self.allowed else 2 if self.always else 1


def check_hostname(host: str) -> DialVerdict:
    name = host.rstrip(".").lower()
    if name in METADATA_HOSTS:
        return DialVerdict(False, f"{host} is a cloud metadata host", always=True)
    return DialVerdict(True)


def parse_nat64_prefix(text: str) -> ipaddress.IPv6Network:
    """A NAT64 prefix as the operator declares it (``"64:ff9b:1:2a::/96"``); ValueError says what is wrong: not an
    IPv6 prefix, host bits set, a length RFC 6052 has no layout for, a /96 whose "u" octet is not zero, or a block
    no NAT64 prefix can be in."""
    try:
        net = ipaddress.IPv6Network(text.strip(), strict=True)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an IPv6 prefix with its length, like 64:ff9b:1:2a::/96 ({exc})") from None
    if "/" not in text:
        raise ValueError(f"{text!r} has no length: give it as prefix/length, like 64:ff9b:1:2a::/96")
    if net.prefixlen not in _RFC6052_LAYOUTS:
        lengths = ", ".join(f"/{n}" for n in NAT64_LENGTHS[:-1]) + f" or /{NAT64_LENGTHS[-1]}"
        raise ValueError(f"{text!r}: a NAT64 prefix is {lengths} long (RFC 6052), not /{net.prefixlen}")
    if net.prefixlen == 96 and net.network_address.packed[8]:
        raise ValueError(f"{text!r}: bits 64 to 71 of a /96 NAT64 prefix must be zero (RFC 6052, section 2.2)")
    for block, what in _NOT_NAT64.items():
        if net.overlaps(ipaddress.IPv6Network(block)):
            raise ValueError(f"{text!r} overlaps {block} ({what}): no NAT64 prefix can be there")
    return net


def check_address(address: str, *, allow_private: bool, nat64: tuple[ipaddress.IPv6Network, ...] = ()) -> DialVerdict:
    """The verdict on one resolved address. ``nat64``: the NAT64 prefixes the operator declared
    (:func:`parse_nat64_prefix`); an address in one is judged by the IPv4 address it carries there."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return DialVerdict(False, f"{address!r} is not an IP address", always=True)
    if isinstance(ip, ipaddress.IPv4Address):
        return _judge(ip, allow_private)
    if ip != ipaddress.IPv6Address(0) and ip != ipaddress.IPv6Address(1):
        for wrapper in (_MAPPED, _TRANSLATED, _COMPATIBLE):
            if ip in wrapper:
                inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
                return _carried(ip, inner, "", _judge(inner, allow_private))
    declared = next((net for net in nat64 if ip in net), None)
    if declared is not None:
        return _declared_nat64(ip, declared, allow_private)
    if ip in _NAT64_LOCAL:
        return DialVerdict(
            False,
            f"{ip} is a local-use NAT64 address (64:ff9b:1::/48, RFC 8215) in no declared NAT64 prefix, so the "
            "IPv4 address it carries cannot be read (where it sits depends on the prefix length): declare this "
            'network\'s NAT64 prefix with its length in config.json, network.nat64_prefixes (e.g. "64:ff9b:1:2a::/96")',
            always=True,
        )
    verdicts = [_judge(ip, allow_private)]
    for form, inner in embedded_ipv4(ip):
        verdicts.append(_carried(ip, inner, form, _judge(inner, allow_private)))
    return max(verdicts, key=lambda verdict: verdict.severity)


def _declared_nat64(ip: ipaddress.IPv6Address, prefix: ipaddress.IPv6Network, allow_private: bool) -> DialVerdict:
    """An address in a declared NAT64 prefix: the IPv4 address at its length's place (RFC 6052), judged alone."""
    offsets, suffix = _RFC6052_LAYOUTS[prefix.prefixlen]
    packed = ip.packed
    if prefix.prefixlen < 96 and packed[8]:
        return DialVerdict(
            False, f'{ip} is in the NAT64 prefix {prefix} but not an RFC 6052 address: its "u" octet is not zero', True
        )
    if any(packed[suffix:]):
        return DialVerdict(
            False, f"{ip} is in the NAT64 prefix {prefix} but not an RFC 6052 address: its suffix is not zero", True
        )
    inner = ipaddress.IPv4Address(bytes(packed[i] for i in offsets))
    return _carried(ip, inner, f"NAT64 {prefix}", _judge(inner, allow_private))


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """Every (form, IPv4 address) that ``ip`` may deliver to through a translator or tunnel of a well-known
    kind (empty: none). The plain spellings of an IPv4 address (mapped, compatible, translated) are not listed
    here: :func:`check_address` judges them as that address, and an address in a declared NAT64 prefix by what
    it carries there."""
    found: list[tuple[str, ipaddress.IPv4Address]] = []
    packed = ip.packed
    if ip in _NAT64:
        found.append(("NAT64", ipaddress.IPv4Address(packed[12:16])))
    if ip.sixtofour is not None:
        found.append(("6to4", ip.sixtofour))
    if ip in _TEREDO and ip.teredo is not None:
        server, client = ip.teredo
        found += [("Teredo server", server), ("Teredo client", client)]
    # ISATAP: the interface id is 0000:5efe or 0200:5efe (the u and g bits may be set) and then the IPv4 address.
    if (int.from_bytes(packed[8:12], "big") & 0xFCFFFFFF) == 0x00005EFE:
        found.append(("ISATAP", ipaddress.IPv4Address(packed[12:16])))
    return found


def _carried(ip: ipaddress.IPv6Address, inner: ipaddress.IPv4Address, form: str, verdict: DialVerdict) -> DialVerdict:
    if verdict.allowed:
        return verdict
    how = f" ({form})" if form else ""
    return DialVerdict(False, f"{ip} carries {inner}{how}: {verdict.reason}", verdict.always)


def _judge(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_private: bool) -> DialVerdict:
    """The verdict on one address as it is (what it may carry is :func:`check_address`'s part)."""
    if ip in METADATA_ADDRESSES:
        return DialVerdict(False, f"{ip} is a cloud metadata address", always=True)
    if ip.is_unspecified:
        return DialVerdict(False, f"{ip} is the unspecified address", always=True)
    if isinstance(ip, ipaddress.IPv4Address) and ip in _THIS_NETWORK:
        return DialVerdict(False, f"{ip} is in 0.0.0.0/8 ('this network')", always=True)
    if ip.is_link_local:
        return DialVerdict(False, f"{ip} is link-local", always=True)
    if ip.is_multicast:
        return DialVerdict(False, f"{ip} is multicast", always=True)
    private = ip.is_loopback or ip.is_private or ip in _CGNAT or ip in _ULA or ip in _NAT64_LOCAL or not ip.is_global
    if private and not allow_private:
        kind = "loopback" if ip.is_loopback else "CGNAT" if ip in _CGNAT else "private"
        return DialVerdict(
            False,
            f"{ip} is a {kind} address; set APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true to allow private networks",
        )
    return DialVerdict(True)
