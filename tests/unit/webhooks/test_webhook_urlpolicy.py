"""The webhook URL policy (pure): blocked networks, IPv4 embedded in IPv6, URL syntax, the dev setting."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpufleet.errors import ValidationFailed
from gpufleet.webhooks import urlpolicy as up

BLOCKED_NETS = [net for net, _ in up.BLOCKED_V4] + [net for net, _ in up.BLOCKED_V6] + [
    ipaddress.ip_network(n) for n in ("::1/128", "::/128", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8")
]


@st.composite
def in_network(draw, nets=BLOCKED_NETS):
    net = draw(st.sampled_from(nets))
    n = draw(st.integers(int(net.network_address), int(net.broadcast_address)))
    return ipaddress.IPv6Address(n) if net.version == 6 else ipaddress.IPv4Address(n)


def _v4(n: int) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(n)


def _blocked_v4(a: ipaddress.IPv4Address) -> bool:
    return any(a in net for net, _ in up.BLOCKED_V4)


@given(in_network())
def test_every_address_of_a_blocked_network_is_refused(addr):
    assert up.blocked_reason(addr)
    with pytest.raises(ValidationFailed):
        up.check_address(str(addr), addr, allow_private=False)
    up.check_address(str(addr), addr, allow_private=True)  # the local-development setting


@given(st.integers(0, 2**32 - 1))
def test_ipv4_mapped_and_nat64_forms_follow_the_embedded_address(n):
    v4 = _v4(n)
    mapped = ipaddress.IPv6Address(f"::ffff:{v4}")
    nat64 = ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) + n)
    assert bool(up.blocked_reason(mapped)) == bool(up.blocked_reason(v4)) == bool(up.blocked_reason(nat64))


@settings(suppress_health_check=[HealthCheck.filter_too_much])
@given(st.integers(int(ipaddress.IPv4Address("1.0.0.0")), int(ipaddress.IPv4Address("223.255.255.255"))))
def test_ipv4_outside_the_blocked_networks_is_allowed_and_globally_routable(n):
    addr = _v4(n)
    assume(not _blocked_v4(addr))
    assert up.blocked_reason(addr) is None
    # An independent oracle: whatever we allow, the standard library calls global and not multicast.
    assert addr.is_global and not addr.is_multicast


@settings(suppress_health_check=[HealthCheck.filter_too_much])
@given(st.integers(int(ipaddress.IPv6Address("2000::")), int(ipaddress.IPv6Address("3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))))
def test_ipv6_global_unicast_outside_the_blocked_networks_is_allowed(n):
    addr = ipaddress.IPv6Address(n)
    assume(not any(addr in net for net, _ in up.BLOCKED_V6))
    assert up.blocked_reason(addr) is None


@given(st.integers(0, 2**128 - 1))
def test_ipv6_allowed_only_inside_2000_slash_3_or_as_an_allowed_embedded_ipv4(n):
    addr = ipaddress.IPv6Address(n)
    if up.blocked_reason(addr) is None:
        assert addr in ipaddress.ip_network("2000::/3") or addr.ipv4_mapped or addr in ipaddress.ip_network("64:ff9b::/96")
        assert not addr.is_multicast and not addr.is_loopback and not addr.is_link_local


@pytest.mark.parametrize("addr", ["169.254.169.254", "10.0.0.1", "172.31.255.255", "192.168.1.1", "127.0.0.1",
                                  "100.64.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "::", "fd00::1",
                                  "fe80::1", "ff02::1", "::ffff:169.254.169.254", "::ffff:10.0.0.1", "64:ff9b::7f00:1",
                                  "fd00:ec2::254"])
def test_well_known_internal_targets_are_refused(addr):
    assert up.blocked_reason(ipaddress.ip_address(addr))


@pytest.mark.parametrize("addr", ["8.8.8.8", "1.1.1.1", "52.94.236.248", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(addr):
    assert up.blocked_reason(ipaddress.ip_address(addr)) is None


@pytest.mark.parametrize("url", [
    "http://hooks.example.com/x",  # not https
    "ftp://hooks.example.com/x",
    "https://169.254.169.254/latest/meta-data/",
    "https://10.1.2.3/h", "https://[::1]:8443/h", "https://[::ffff:127.0.0.1]/", "https://[fd00::1]/",
    "https://2130706433/", "https://0x7f.1/", "https://127.1/", "https://0177.0.0.1/",  # numeric IPv4 forms
    "https:///nohost", "https://h.example.com:99999/",
])
def test_submit_time_check_refuses(url):
    with pytest.raises(ValidationFailed) as err:
        up.check_url(url, allow_private=False)
    assert err.value.extra["errors"][0]["field"] == "webhook.url"
    assert str(err.value).startswith("webhook.url: ")


@pytest.mark.parametrize("url", ["https://localhost/h", "https://LOCALHOST./h", "https://api.localhost/h"])
def test_localhost_names_are_refused_at_submission_by_name(url):
    up.check_url(url, allow_private=False)  # syntactically fine: the sender refuses it after resolving
    with pytest.raises(ValidationFailed, match="loopback name"):
        up.check_submission(url, allow_private=False)
    assert up.check_submission(url, allow_private=True).host.endswith("localhost")


def test_submit_time_check_names_the_reason():
    with pytest.raises(ValidationFailed, match=r"169\.254\.169\.254: link-local .*public"):
        up.check_url("https://169.254.169.254/", allow_private=False)
    with pytest.raises(ValidationFailed, match="scheme must be https, not 'http'"):
        up.check_url("http://8.8.8.8/", allow_private=False)


def test_hostnames_are_not_resolved_at_submit_and_the_target_is_parsed():
    t = up.check_url("https://Hooks.Example.com:8443/a/b?x=1#frag", allow_private=False)
    assert (t.scheme, t.host, t.port, t.path, t.literal) == ("https", "hooks.example.com", 8443, "/a/b?x=1", None)
    assert up.check_url("https://internal.corp.invalid", allow_private=False).path == "/"  # DNS is the sender's job
    assert up.check_url("https://[2606:4700::1]/", allow_private=False).literal == ipaddress.ip_address("2606:4700::1")


def test_allow_private_admits_http_and_loopback():
    t = up.check_url("http://127.0.0.1:9/h", allow_private=True)
    assert (t.scheme, t.port, str(t.literal)) == ("http", 9, "127.0.0.1")
    assert up.check_url("http://localhost/h", allow_private=True).port == 80
    with pytest.raises(ValidationFailed):
        up.check_url("ftp://127.0.0.1/", allow_private=True)


def test_every_resolved_address_must_pass():
    assert up.check_addresses("h.example.com", ["8.8.8.8", "2606:4700::1"], allow_private=False)
    with pytest.raises(ValidationFailed, match=r"h\.example\.com resolves to 10\.0\.0\.5: private"):
        up.check_addresses("h.example.com", ["8.8.8.8", "10.0.0.5"], allow_private=False)
    with pytest.raises(ValidationFailed, match="no address"):
        up.check_addresses("h.example.com", [], allow_private=False)
    assert up.check_addresses("h", ["fe80::1%eth0"], allow_private=True) == [ipaddress.ip_address("fe80::1")]


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("1", True), ("TRUE", True), ("yes", True),
                                                 ("false", False), ("", False), ("0", False), (None, False)])
def test_allow_private_from_env(value, expected):
    env = {} if value is None else {up.ENV_ALLOW_PRIVATE: value}
    assert up.allow_private_from_env(env) is expected
