"""Webhook URL policy (pure): which targets the platform may POST webhooks to (SSRF guard).

Contract:
- Production (``allow_private=False``): the scheme is ``https``; the host is a DNS name or an IP
  literal, and every address it stands for must be public unicast. Refused: the networks of
  :data:`BLOCKED_V4` / :data:`BLOCKED_V6` (loopback, RFC 1918, link-local incl. 169.254.0.0/16 and
  so the instance metadata service, CGNAT 100.64.0.0/10, multicast, unspecified, benchmarking,
  documentation and reserved ranges, IPv6 ULA / link-local / site-local / discard / Teredo / 6to4),
  any IPv6 address outside global unicast ``2000::/3``, and IPv4-mapped (``::ffff:a.b.c.d``) or
  NAT64 (``64:ff9b::a.b.c.d``) forms whose embedded IPv4 address is refused.
- Development (``allow_private=True``, a deployment setting: env
  ``GPUFLEET_WEBHOOK_ALLOW_PRIVATE``): ``http`` and ``https``, any address.
- :func:`check_url` is the syntactic check (scheme, host present, port valid, IP literals in any
  form ``inet_aton`` accepts); it resolves nothing. The sender runs it before resolving; the API
  runs :func:`check_submission` (the same plus ``localhost`` names) at submission.
- :func:`check_addresses` is the check of resolved addresses: every one must pass. The sender
  then connects only to those checked addresses (see :mod:`gpufleet.webhooks.delivery`).
- A refusal raises :class:`gpufleet.errors.ValidationFailed` whose message says why.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpufleet.errors import ValidationFailed

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ENV_ALLOW_PRIVATE = "GPUFLEET_WEBHOOK_ALLOW_PRIVATE"

_N4 = ipaddress.IPv4Network
_N6 = ipaddress.IPv6Network

#: Refused IPv4 networks with the reason given (IANA special-purpose registry, RFC 6890).
BLOCKED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_N4("0.0.0.0/8"), "unspecified / 'this network'"),
    (_N4("10.0.0.0/8"), "private (RFC 1918)"),
    (_N4("100.64.0.0/10"), "carrier-grade NAT (RFC 6598)"),
    (_N4("127.0.0.0/8"), "loopback"),
    (_N4("169.254.0.0/16"), "link-local (incl. instance metadata)"),
    (_N4("172.16.0.0/12"), "private (RFC 1918)"),
    (_N4("192.0.0.0/24"), "IETF protocol assignments"),
    (_N4("192.0.2.0/24"), "documentation"),
    (_N4("192.88.99.0/24"), "6to4 relay anycast"),
    (_N4("192.168.0.0/16"), "private (RFC 1918)"),
    (_N4("198.18.0.0/15"), "benchmarking"),
    (_N4("198.51.100.0/24"), "documentation"),
    (_N4("203.0.113.0/24"), "documentation"),
    (_N4("224.0.0.0/4"), "multicast"),
    (_N4("240.0.0.0/4"), "reserved / broadcast"),
)

#: Refused IPv6 networks inside global unicast 2000::/3 (everything outside it is refused too).
BLOCKED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_N6("2001::/23"), "IETF protocol assignments (incl. Teredo)"),
    (_N6("2001:db8::/32"), "documentation"),
    (_N6("2002::/16"), "6to4"),
    (_N6("3fff::/20"), "documentation"),
)

_GLOBAL_V6 = _N6("2000::/3")
_NAT64 = _N6("64:ff9b::/96")
#: Named ranges outside 2000::/3, only for a precise message.
_NAMED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_N6("::/128"), "unspecified"),
    (_N6("::1/128"), "loopback"),
    (_N6("fc00::/7"), "unique local (ULA)"),
    (_N6("fe80::/10"), "link-local"),
    (_N6("fec0::/10"), "site-local"),
    (_N6("ff00::/8"), "multicast"),
)


@dataclass(frozen=True)
class Target:
    """A webhook URL that passed :func:`check_url`: where to connect and what to ask for."""

    scheme: str
    host: str  # lower-case hostname or IP literal (no brackets)
    port: int
    path: str  # request target: path (at least "/") plus "?query"; no fragment
    literal: IPAddress | None  # the host as an address when it is an IP literal


def blocked_reason(addr: IPAddress) -> str | None:
    """Why ``addr`` is not a public unicast address, or None when it is."""
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = addr.ipv4_mapped
        if embedded is None and addr in _NAT64:
            embedded = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
        if embedded is not None:
            inner = blocked_reason(embedded)
            return f"{inner} (IPv4 embedded in IPv6)" if inner else None
        if addr not in _GLOBAL_V6:
            for net, why in _NAMED_V6:
                if addr in net:
                    return why
            return "not IPv6 global unicast"
        table: Iterable[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = BLOCKED_V6
    else:
        table = BLOCKED_V4
    for net, why in table:
        if addr in net:
            return why
    return None


def parse_address(text: str) -> IPAddress:
    """An address as ``getaddrinfo`` reports it (an IPv6 zone suffix ``%eth0`` is dropped)."""
    return ipaddress.ip_address(text.split("%", 1)[0])


def _literal(host: str) -> IPAddress | None:
    try:
        return parse_address(host)
    except ValueError:
        pass
    if ":" in host:
        return None
    try:  # the numeric forms resolvers accept: 2130706433, 0x7f.1, 127.1, 0177.0.0.1
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _refuse(why: str) -> ValidationFailed:
    """The refusal, shaped like a request validation error of field ``webhook.url``."""
    return ValidationFailed(f"webhook.url: {why}", errors=[{"field": "webhook.url", "message": why}])


def check_address(host: str, addr: IPAddress, *, allow_private: bool) -> None:
    """Raise ValidationFailed unless ``addr`` (what ``host`` stands for) may be a webhook target."""
    if allow_private:
        return
    why = blocked_reason(addr)
    if why:
        shown = host if _literal(host) is not None else f"{host} resolves to {addr}"
        raise _refuse(f"{shown}: {why} address refused; webhook targets must be public unicast addresses")


def check_addresses(host: str, addrs: Iterable[str], *, allow_private: bool) -> list[IPAddress]:
    """Every resolved address of ``host`` checked (all must pass); returns them parsed, in order."""
    parsed = [parse_address(a) for a in addrs]
    if not parsed:
        raise _refuse(f"{host} has no address")
    for addr in parsed:
        check_address(host, addr, allow_private=allow_private)
    return parsed


def check_url(url: str, *, allow_private: bool) -> Target:
    """The syntactic check (no DNS): scheme, host, port, IP literals; returns the parsed target."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise _refuse(f"malformed url ({err})") from err
    scheme = parts.scheme.lower()
    allowed = ("http", "https") if allow_private else ("https",)
    if scheme not in allowed:
        raise _refuse(f"the scheme must be {' or '.join(allowed)}, not {scheme or 'missing'!r}")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise _refuse("no host")
    literal = _literal(host)
    if literal is not None:
        check_address(host, literal, allow_private=allow_private)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port or (443 if scheme == "https" else 80), path, literal)


def check_submission(url: str, *, allow_private: bool) -> Target:
    """What the API runs at submission: :func:`check_url` plus the loopback names of RFC 6761
    (``localhost``, ``*.localhost``), refused by name since nothing is resolved at submit."""
    target = check_url(url, allow_private=allow_private)
    if not allow_private and (target.host == "localhost" or target.host.endswith(".localhost")):
        raise _refuse(f"{target.host} is a loopback name (RFC 6761); webhook targets must be public hosts")
    return target


def allow_private_from_env(env: Mapping[str, str]) -> bool:
    """The deployment setting ``GPUFLEET_WEBHOOK_ALLOW_PRIVATE`` in ``env`` (true/1/yes/on; default false)."""
    return env.get(ENV_ALLOW_PRIVATE, "").strip().lower() in ("1", "true", "yes", "on")
