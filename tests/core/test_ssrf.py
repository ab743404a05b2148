import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.core.ssrf import NAT64_LENGTHS, check_address, check_hostname, embedded_ipv4, parse_nat64_prefix


@pytest.mark.parametrize(
    ("address", "private_ok", "allowed", "always", "fragment"),
    [
        ("8.8.8.8", False, True, False, ""),
        ("2606:4700:4700::1111", False, True, False, ""),
        # private: refused until opted in
        ("127.0.0.1", False, False, False, "loopback"),
        ("127.0.0.1", True, True, False, ""),
        ("10.1.2.3", False, False, False, "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS"),
        ("172.16.0.1", False, False, False, "private"),
        ("192.168.1.10", False, False, False, "private"),
        ("192.168.1.10", True, True, False, ""),
        ("100.64.0.1", False, False, False, "CGNAT"),
        ("100.127.255.254", True, True, False, ""),
        ("::1", False, False, False, "loopback"),
        ("fd12:3456::1", False, False, False, "private"),
        ("fc00::1", True, True, False, ""),
        # always refused
        ("169.254.169.254", True, False, True, "metadata"),
        ("169.254.1.1", True, False, True, "link-local"),
        ("fe80::1", True, False, True, "link-local"),
        ("fe80::1%eth0", True, False, True, "link-local"),
        ("fd00:ec2::254", True, False, True, "metadata"),
        ("100.100.100.200", True, False, True, "metadata"),
        ("0.0.0.0", True, False, True, "unspecified"),
        ("::", True, False, True, "unspecified"),
        ("224.0.0.1", True, False, True, "multicast"),
        # IPv4-mapped / -compatible IPv6 are judged as the IPv4 inside
        ("::ffff:127.0.0.1", False, False, False, "carries 127.0.0.1"),
        ("::ffff:169.254.169.254", True, False, True, "metadata"),
        ("::ffff:8.8.8.8", False, True, False, ""),
        ("::10.0.0.1", False, False, False, "carries 10.0.0.1"),
        ("::ffff:0:a9fe:a9fe", False, False, True, "carries 169.254.169.254"),  # IPv4-translated (SIIT)
        ("::ffff:0:808:808", False, True, False, ""),
        # NAT64, 6to4, Teredo and ISATAP deliver to the IPv4 address they carry
        ("64:ff9b::a9fe:a9fe", False, False, True, "carries 169.254.169.254 (NAT64)"),
        ("64:ff9b::169.254.169.254", True, False, True, "metadata"),
        ("64:ff9b::7f00:1", False, False, False, "carries 127.0.0.1 (NAT64)"),
        ("64:ff9b::7f00:1", True, True, False, ""),
        ("64:ff9b::808:808", False, True, False, ""),
        # a local-use NAT64 address in no declared prefix: what it carries cannot be read (test_declared_nat64)
        ("64:ff9b:1:a9fe:a9:fe00::", True, False, True, "in no declared NAT64 prefix"),
        ("64:ff9b:1::a9fe:a9fe", True, False, True, "cannot be read"),
        ("64:ff9b:1::808:808", False, False, True, "local-use NAT64 address (64:ff9b:1::/48, RFC 8215)"),
        ("64:ff9b:1::808:808", True, False, True, "network.nat64_prefixes"),
        ("64:ff9b:1:0:ff00::808:808", True, False, True, "cannot be read"),
        ("2002:a9fe:a9fe::1", False, False, True, "carries 169.254.169.254 (6to4)"),
        ("2002:0a00:0001::1", False, False, False, "carries 10.0.0.1 (6to4)"),
        ("2002:808:808::1", False, True, False, ""),
        ("2001:0:a9fe:a9fe::1", True, False, True, "Teredo server"),
        ("2001:0:808:808:0:0:5601:5601", True, False, True, "Teredo client"),  # client ~ = 169.254.169.254
        ("2001:db8::5efe:a9fe:a9fe", True, False, True, "ISATAP"),
        ("2606:4700::200:5efe:a9fe:a9fe", True, False, True, "ISATAP"),
        ("0.1.2.3", True, False, True, "this network"),
        ("not-an-ip", True, False, True, "not an IP"),
    ],
)
def test_check_address(address: str, private_ok: bool, allowed: bool, always: bool, fragment: str) -> None:
    verdict = check_address(address, allow_private=private_ok)
    assert (verdict.allowed, verdict.always) == (allowed, always)
    assert fragment in verdict.reason


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("metadata.google.internal", False),
        ("METADATA.GOOGLE.INTERNAL.", False),
        ("metadata", False),
        ("example.com", True),
        ("mac-studio.local", True),
    ],
)
def test_check_hostname(host: str, allowed: bool) -> None:
    assert check_hostname(host).allowed is allowed


_ALWAYS = [
    st.ip_addresses(network="169.254.0.0/16"),
    st.ip_addresses(network="0.0.0.0/8"),
    st.sampled_from([ipaddress.IPv4Address(a) for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200")]),
]
_RFC6052_LAYOUTS = {  # RFC 6052 section 2.2, written out again here from the RFC's figure
    32: ((4, 5, 6, 7), 9),
    40: ((5, 6, 7, 9), 10),
    48: ((6, 7, 9, 10), 11),
    56: ((7, 9, 10, 11), 12),
    64: ((9, 10, 11, 12), 13),
    96: ((12, 13, 14, 15), 16),
}


def _spellings(v4: ipaddress.IPv4Address, noise: int) -> list[ipaddress.IPv6Address]:
    """Every IPv6 form that carries ``v4``, the other bits taken from ``noise`` where the form leaves them free."""
    n = int(v4)
    local = []
    for length, (offsets, suffix) in _RFC6052_LAYOUTS.items():
        if length < 48:  # a local-use prefix is inside the /48
            continue
        packed = bytearray((0x0064FF9B0001 << 80 | (noise & ((1 << 80) - 1))).to_bytes(16, "big"))
        packed[8] = 0  # RFC 6052: the "u" octet is zero
        packed[suffix:] = bytes(16 - suffix)  # and so is the suffix
        for index, byte in zip(offsets, v4.packed, strict=True):
            packed[index] = byte
        local.append(ipaddress.IPv6Address(bytes(packed)))
    isatap_prefix = noise >> 64 & ((1 << 64) - 1)
    return [
        ipaddress.IPv6Address(0xFFFF << 32 | n),  # IPv4-mapped
        ipaddress.IPv6Address(0xFFFF << 48 | n),  # IPv4-translated
        *([ipaddress.IPv6Address(n)] if n > 1 else []),  # IPv4-compatible
        ipaddress.IPv6Address(0x64FF9B << 96 | n),  # NAT64 well-known prefix
        *local,  # NAT64 local-use prefix, each RFC 6052 length
        ipaddress.IPv6Address(0x2002 << 112 | n << 80 | (noise & ((1 << 80) - 1))),  # 6to4
        ipaddress.IPv6Address(0x20010000 << 96 | n << 64 | (noise & ((1 << 64) - 1))),  # Teredo server
        ipaddress.IPv6Address(
            0x20010000 << 96 | (noise & 0xFFFFFFFF) << 64 | (noise >> 32 & 0xFFFFFFFF) << 32 | n ^ 0xFFFFFFFF
        ),  # Teredo client
        ipaddress.IPv6Address(isatap_prefix << 64 | 0x5EFE << 32 | n),  # ISATAP
        ipaddress.IPv6Address(isatap_prefix << 64 | 0x02005EFE << 32 | n),
    ]


@settings(max_examples=300, deadline=None)
@given(st.one_of(*_ALWAYS), st.integers(min_value=0, max_value=(1 << 128) - 1), st.booleans())
def test_every_form_carrying_a_never_dialed_ipv4_is_always_refused(
    v4: ipaddress.IPv4Address, noise: int, private_ok: bool
) -> None:
    for spelled in _spellings(v4, noise):
        for text in (str(spelled), spelled.exploded, spelled.exploded.upper()):
            verdict = check_address(text, allow_private=private_ok)
            assert not verdict.allowed and verdict.always, (text, v4, verdict)


@settings(max_examples=200, deadline=None)
@given(st.ip_addresses(network="10.0.0.0/8") | st.ip_addresses(network="127.0.0.0/8"), st.integers(0, (1 << 128) - 1))
def test_every_form_carrying_a_private_ipv4_needs_the_opt_in(v4: ipaddress.IPv4Address, noise: int) -> None:
    for spelled in _spellings(v4, noise):
        assert not check_address(str(spelled), allow_private=False).allowed, (spelled, v4)


def test_embedded_ipv4_lists_what_each_form_carries() -> None:
    assert embedded_ipv4(ipaddress.IPv6Address("64:ff9b::a9fe:a9fe")) == [
        ("NAT64", ipaddress.IPv4Address("169.254.169.254"))
    ]
    assert embedded_ipv4(ipaddress.IPv6Address("2606:4700:4700::1111")) == []


# Declared NAT64 prefixes (network.nat64_prefixes): (prefix, address, private opt-in, allowed, always, fragment)
@pytest.mark.parametrize(
    ("prefix", "address", "private_ok", "allowed", "always", "fragment"),
    [
        # the local-use /48 itself as a /48 network-specific prefix: the IPv4 address sits in bytes 6, 7, 9, 10
        ("64:ff9b:1::/48", "64:ff9b:1:808:8:800::", False, True, False, ""),
        ("64:ff9b:1::/48", "64:ff9b:1:a9fe:a9:fe00::", True, False, True, "carries 169.254.169.254 (NAT64"),
        ("64:ff9b:1::/48", "64:ff9b:1:a00:0:100::", False, False, False, "carries 10.0.0.1"),
        ("64:ff9b:1::/48", "64:ff9b:1:a00:0:100::", True, True, False, ""),
        ("64:ff9b:1::/48", "64:ff9b:1:0:0::", True, False, True, "carries 0.0.0.0"),
        ("64:ff9b:1::/48", "64:ff9b:1:808:ff08:800::", True, False, True, '"u" octet is not zero'),
        ("64:ff9b:1::/48", "64:ff9b:1:808:8:800::1", True, False, True, "suffix is not zero"),
        # a /96 inside the local-use block: the last 32 bits; the case, a public IPv4 address
        ("64:ff9b:1:2a::/96", "64:ff9b:1:2a::808:808", False, True, False, ""),
        ("64:ff9b:1:2a::/96", "64:ff9b:1:2a::8.8.4.4", False, True, False, ""),
        ("64:ff9b:1:2a::/96", "64:ff9b:1:2a::a9fe:a9fe", True, False, True, "(NAT64 64:ff9b:1:2a::/96)"),
        ("64:ff9b:1:2a::/96", "64:ff9b:1:2a::7f00:1", False, False, False, "loopback"),
        ("64:ff9b:1:2a::/96", "64:ff9b:1:2a::c0a8:101", True, True, False, ""),
        ("64:ff9b:1:2a::/96", "64:ff9b:1:2b::808:808", True, False, True, "in no declared NAT64 prefix"),
        # other lengths, and prefixes outside the local-use block (a network-specific prefix of one's own)
        ("64:ff9b:1:2a00::/56", "64:ff9b:1:2a08:8:808::", False, True, False, ""),
        ("64:ff9b:1:2a:0::/64", "64:ff9b:1:2a:8:808:800:0", False, True, False, ""),
        ("2001:db8::/32", "2001:db8:808:808::", False, True, False, ""),
        ("2001:db8:100::/40", "2001:db8:108:808:8::", False, True, False, ""),
        ("2001:db8:100::/40", "2001:db8:1a9:fea9:fe::", True, False, True, "metadata"),
        ("2001:db8:64::/96", "2001:db8:64::a9fe:a9fe", True, False, True, "metadata"),
        # outside any declared prefix, nothing changes
        ("2001:db8:64::/96", "2606:4700:4700::1111", False, True, False, ""),
        ("2001:db8:64::/96", "64:ff9b::a9fe:a9fe", False, False, True, "carries 169.254.169.254 (NAT64)"),
    ],
)
def test_declared_nat64(
    prefix: str, address: str, private_ok: bool, allowed: bool, always: bool, fragment: str
) -> None:
    verdict = check_address(address, allow_private=private_ok, nat64=(parse_nat64_prefix(prefix),))
    assert (verdict.allowed, verdict.always) == (allowed, always), verdict
    assert fragment in verdict.reason


def _in_prefix(prefix: ipaddress.IPv6Network, v4: ipaddress.IPv4Address, noise: int) -> ipaddress.IPv6Address:
    """``v4`` at the place RFC 6052 gives it for ``prefix``'s length (u octet and suffix zero)."""
    offsets, suffix = _RFC6052_LAYOUTS[prefix.prefixlen]
    host = noise & ((1 << (128 - prefix.prefixlen)) - 1)
    packed = bytearray((int(prefix.network_address) | host).to_bytes(16, "big"))
    packed[8] = 0 if prefix.prefixlen < 96 else packed[8]
    packed[suffix:] = bytes(16 - suffix)
    for index, byte in zip(offsets, v4.packed, strict=True):
        packed[index] = byte
    return ipaddress.IPv6Address(bytes(packed))


_PREFIXES = [
    "64:ff9b:1::/48",
    "64:ff9b:1:ab00::/56",
    "64:ff9b:1:2a::/64",
    "64:ff9b:1:2a::/96",
    "2001:db8::/32",
    "2001:db8:100::/40",
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_PREFIXES), st.ip_addresses(v=4), st.integers(0, (1 << 128) - 1), st.booleans())
def test_an_address_in_a_declared_prefix_is_judged_as_the_ipv4_address_it_carries(
    prefix: str, v4: ipaddress.IPv4Address, noise: int, private_ok: bool
) -> None:
    net = parse_nat64_prefix(prefix)
    spelled = _in_prefix(net, v4, noise)
    assert spelled in net
    alone = check_address(str(v4), allow_private=private_ok)
    for text in (str(spelled), spelled.exploded.upper()):
        verdict = check_address(text, allow_private=private_ok, nat64=(net,))
        assert (verdict.allowed, verdict.always) == (alone.allowed, alone.always), (text, v4, verdict)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("64:ff9b:1:2a::", "has no length"),
        ("64:ff9b:1:2a::/80", "/32, /40, /48, /56, /64 or /96"),
        ("64:ff9b:1:2a::1/96", "host bits set"),
        ("64:ff9b:1:2a:ff00::/96", "bits 64 to 71"),
        ("10.0.0.0/8", "not an IPv6 prefix"),
        ("::ffff:0:0/96", "::/64"),
        ("::/96", "IPv4-mapped, -compatible"),
        ("fe80::/64", "link-local"),
        ("ff02::/32", "multicast"),
        ("nonsense", "not an IPv6 prefix"),
    ],
)
def test_nat64_prefixes_that_cannot_be_read_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_nat64_prefix(text)
    assert fragment in str(info.value)


def test_every_rfc6052_length_is_accepted() -> None:
    assert NAT64_LENGTHS == (32, 40, 48, 56, 64, 96)
    for length in NAT64_LENGTHS:
        assert parse_nat64_prefix(f"2001:db8::/{length}").prefixlen == length
