import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnout.core.ssrf import check_address, check_hostname, embedded_ipv4


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
        ("64:ff9b:1:a9fe:a9:fe00::", True, False, True, "local-use NAT64 /48"),
        ("64:ff9b:1::a9fe:a9fe", True, False, True, "local-use NAT64 /96"),
        ("64:ff9b:1::808:808", False, False, False, "private"),  # local-use prefixes are not global
        ("64:ff9b:1::808:808", True, True, False, ""),
        ("64:ff9b:1:0:ff00::808:808", True, False, True, "no valid RFC 6052 form"),  # the "u" octet is not 0
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
_RFC6052_LAYOUTS = {
    48: ((6, 7, 9, 10), 11),
    56: ((7, 9, 10, 11), 12),
    64: ((9, 10, 11, 12), 13),
    96: ((12, 13, 14, 15), 16),
}


def _spellings(v4: ipaddress.IPv4Address, noise: int) -> list[ipaddress.IPv6Address]:
    """Every IPv6 form that carries ``v4``, the other bits taken from ``noise`` where the form leaves them free."""
    n = int(v4)
    local = []
    for offsets, suffix in _RFC6052_LAYOUTS.values():
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
