import pytest

from turnout.core.ssrf import check_address, check_hostname


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
