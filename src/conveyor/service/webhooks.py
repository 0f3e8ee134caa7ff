"""Where webhooks may go: a URL is checked when a job names it and again, on the address it resolves to,
each time a delivery is sent (redirects are not followed), so that a job cannot make the server reach
loopback, private, link-local or cloud-metadata addresses unless the operator allowed them.

``WebhookPolicy.allow`` lists what the operator allows beyond public addresses: networks in CIDR form
(``10.0.0.0/8``, ``127.0.0.1/32``) and host names (``hooks.internal``); ``conveyor serve --allow-webhook``.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from conveyor.errors import UserError

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[str]]
MAX_URL = 2048
# Metadata services answer on link-local addresses (blocked as such) and on a few others.
_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
             ipaddress.ip_address("100.100.100.200")}


@dataclass(frozen=True)
class WebhookPolicy:
    allow: tuple[str, ...] = ()

    def networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(a, strict=False) for a in self.allow if _is_network(a)]

    def hosts(self) -> set[str]:
        return {a.lower().rstrip(".") for a in self.allow if not _is_network(a)}


class WebhookRefused(UserError):
    """A webhook URL the policy does not allow (at submission: 422; at delivery: the delivery fails)."""

    code = "webhook_refused"


def parse_policy(allow: Sequence[str]) -> WebhookPolicy:
    """A policy from ``--allow-webhook`` values; a one-line UserError for one that is neither a network nor a host."""
    for value in allow:
        if not value or (not _is_network(value) and not _host_like(value)):
            raise UserError(f"--allow-webhook {value!r} is neither a network (10.0.0.0/8, 127.0.0.1) nor a host name")
    return WebhookPolicy(tuple(allow))


def check_webhook_url(url: str, policy: WebhookPolicy, resolver: Resolver | None = None) -> str:
    """``url`` when a job may name it; WebhookRefused (one line: why, and what to do) otherwise. A host name
    is resolved and every address it has must be allowed."""
    host, port = _parts(url)
    addresses(host, port, policy, resolver)
    return url


def addresses(host: str, port: int, policy: WebhookPolicy, resolver: Resolver | None = None) -> list[IpAddress]:
    """The addresses ``host`` resolves to, each allowed by ``policy``; WebhookRefused otherwise."""
    if host.lower().rstrip(".") in policy.hosts():
        return [ipaddress.ip_address(a) for a in (resolver or _resolve)(host, port)]
    try:
        found = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            found = [ipaddress.ip_address(a) for a in (resolver or _resolve)(host, port)]
        except OSError as exc:
            raise WebhookRefused(f"webhook host {host!r} does not resolve ({exc}); give a reachable URL") from None
    for address in found:
        problem = _blocked(address, policy)
        if problem is not None:
            raise WebhookRefused(f"webhook URL host {host!r} is {problem} ({address}); webhooks go to public "
                                 "addresses unless the server allows more (conveyor serve --allow-webhook NETWORK)")
    return found


def _parts(url: str) -> tuple[str, int]:
    if len(url) > MAX_URL:
        raise WebhookRefused(f"webhook URL is longer than {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused(f"webhook URL {url[:200]!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRefused(f"webhook URL {url[:200]!r} must be http:// or https:// with a host")
    if parts.username or parts.password:
        raise WebhookRefused("webhook URL must not carry a user name or password; webhooks are signed instead")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _blocked(address: IpAddress, policy: WebhookPolicy) -> str | None:
    if any(address in network for network in policy.networks()):
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return _blocked(address.ipv4_mapped, policy)
    if address in _METADATA:
        return "a cloud metadata address"
    for test, what in ((address.is_loopback, "a loopback address"), (address.is_link_local, "a link-local address"),
                       (address.is_private, "a private address"), (address.is_multicast, "a multicast address"),
                       (address.is_unspecified, "an unspecified address"), (address.is_reserved, "a reserved address")):
        if test:
            return what
    return None


def _resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def _is_network(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def _host_like(value: str) -> bool:
    return all(part and all(c.isalnum() or c == "-" for c in part) for part in value.rstrip(".").split("."))
