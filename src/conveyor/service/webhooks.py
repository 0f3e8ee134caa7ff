"""Where webhooks may go: a URL is checked when a job names it and again, on the address it resolves to,
each time a delivery is sent (redirects are not followed), so that a job cannot make the server reach
loopback, private, link-local or cloud-metadata addresses unless the operator allowed them.

``WebhookPolicy.allow`` lists what the operator allows beyond public addresses: networks in CIDR form
(``10.0.0.0/8``, ``127.0.0.1/32``) and host names (``hooks.internal``); ``conveyor serve --allow-webhook``.

Delivery (the relay, api/relay.py, calls these): ``send`` POSTs one event signed per the Standard Webhooks
specification (``webhook-id`` is ``evt_<event id>``, the same on every retry, so a receiver deduplicates by it)
to the address it just checked, pinned, so that a name that resolves elsewhere a moment later (DNS rebinding)
cannot reach a private address; ``record`` stores the result: delivered on a 2xx, otherwise tried again after
an exponential backoff with full jitter until a day after the event, then failed (and listed as such by
``list_deliveries``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import random
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import httpx
from standardwebhooks import Webhook

from conveyor import __version__
from conveyor.errors import UserError
from conveyor.service.tenancy import TenantView
from conveyor.store import SqlStore
from conveyor.store.jobs import Delivery

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Sequence[str]]
MAX_URL = 2048
# Metadata services answer on link-local addresses (blocked as such) and on a few others.
_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
             ipaddress.ip_address("100.100.100.200")}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known prefix: a gateway forwards to the IPv4 address in it


@dataclass(frozen=True)
class WebhookPolicy:
    allow: tuple[str, ...] = ()

    def networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(a, strict=False) for a in self.allow if _is_network(a)]

    def hosts(self) -> set[str]:
        return {a.lower().rstrip(".") for a in self.allow if not _is_network(a)}


class WebhookRefused(UserError):
    """A webhook URL the policy does not allow (at submission: 422; at delivery: that attempt fails)."""

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
    try:
        found = [ipaddress.ip_address(host)]
    except ValueError:
        found = _resolved(host, port, resolver)
    if host.lower().rstrip(".") in policy.hosts():  # the operator vouches for this name, wherever it points
        return found
    for address in found:
        problem = _blocked(address, policy)
        if problem is not None:
            raise WebhookRefused(f"webhook URL host {host!r} is {problem} ({address}); webhooks go to public "
                                 "addresses unless the server allows more (conveyor serve --allow-webhook NETWORK)")
    return found


def _resolved(host: str, port: int, resolver: Resolver | None) -> list[IpAddress]:
    try:
        return [ipaddress.ip_address(a) for a in (resolver or _resolve)(host, port)]
    except (OSError, UnicodeError, ValueError) as exc:
        raise WebhookRefused(f"webhook host {host!r} does not resolve ({exc}); give a reachable URL") from None


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
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        return _blocked(embedded, policy)
    if address in _METADATA:
        return "a cloud metadata address"
    for test, what in ((address.is_loopback, "a loopback address"), (address.is_link_local, "a link-local address"),
                       (address.is_private, "a private address"), (address.is_multicast, "a multicast address"),
                       (address.is_unspecified, "an unspecified address"), (address.is_reserved, "a reserved address"),
                       (not address.is_global, "not a public address")):  # e.g. 100.64.0.0/10, carrier NAT
        if test:
            return what
    return None


def _embedded_ipv4(address: IpAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches when it carries one (mapped, 6to4, NAT64): judged as that."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None or address.sixtofour is not None:
        return address.ipv4_mapped or address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
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


def _is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _host_like(value: str) -> bool:
    return all(part and all(c.isalnum() or c == "-" for c in part) for part in value.rstrip(".").split("."))


# --- delivery -----------------------------------------------------------------------------------------------

DELIVERY_STATES = ("pending", "delivered", "failed")
MAX_ERROR = 500  # characters kept of why an attempt failed


@dataclass(frozen=True)
class RelaySettings:
    """How deliveries are tried. An attempt takes at most ``timeout_s`` in all (resolving, connecting, the
    answer's headers); after a failed one the next comes at a random time within min(``cap_s``, ``base_s`` *
    2**attempts) (full jitter: a receiver that comes back is not met by every delivery at once), until
    ``deadline_s`` after the event was made; then the delivery is failed. ``resolver``: host name and port to
    addresses (the system's by default; tests give their own)."""

    base_s: float = 5.0
    cap_s: float = 3600.0
    deadline_s: float = 24 * 3600.0
    timeout_s: float = 15.0
    resolver: Resolver | None = None


class Target(NamedTuple):
    """Where one attempt connects: the URL with its host replaced by a checked address, the Host header, and
    the name TLS verifies (None for a URL that names an address)."""

    url: httpx.URL
    host: str
    sni: str | None


def webhook_client(settings: RelaySettings, concurrency: int = 8) -> httpx.AsyncClient:
    """The relay's HTTP client. Redirects are not followed (each would need checking again); proxies in the
    environment are ignored (a proxy would resolve the name itself, past the check); no connection is kept
    alive, because pooled connections are keyed by address and one verified for a host name must never carry
    another host's request."""
    return httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=settings.timeout_s,
                             limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=0))


def payload(delivery: Delivery) -> str:
    """The body POSTed for an event, the same on every attempt: ``{"type", "timestamp", "data"}``."""
    data = {**json.loads(delivery.data), "event_id": delivery.id}
    if delivery.job:  # an alert's event tells of no job
        data["job_id"] = delivery.job_id
    when = datetime.fromtimestamp(delivery.created_at, UTC).isoformat().replace("+00:00", "Z")
    return json.dumps({"type": delivery.type, "timestamp": when, "data": data}, sort_keys=True)


def signed_headers(delivery: Delivery, body: str, now: float) -> dict[str, str]:
    """The Standard Webhooks headers for one attempt: its id stays, its timestamp and signature are new."""
    msg_id = f"evt_{delivery.id}"
    signature = Webhook(delivery.secret).sign(msg_id, datetime.fromtimestamp(int(now), UTC), body)
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(now)), "webhook-signature": signature,
            "content-type": "application/json", "user-agent": f"conveyor-webhooks/{__version__}"}


def targets(url: str, policy: WebhookPolicy, resolver: Resolver | None = None) -> list[Target]:
    """Where to connect for ``url`` now: every address its host resolves to, each allowed by ``policy``
    (WebhookRefused otherwise)."""
    host, port = _parts(url)
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise WebhookRefused(f"webhook URL {url[:200]!r} is not a URL ({exc})") from None
    if parsed.host != host:  # two parsers that disagree: the checked host must be the one connected to
        raise WebhookRefused(f"webhook URL {url[:200]!r} names its host ambiguously")
    sni = None if _is_address(host) else parsed.raw_host.decode("ascii").rstrip(".")  # as certificates name it
    return [Target(parsed.copy_with(host=str(a)), parsed.netloc.decode("ascii"), sni)
            for a in addresses(host, port, policy, resolver)]


async def send(client: httpx.AsyncClient, delivery: Delivery, policy: WebhookPolicy, settings: RelaySettings,
               now: float | None = None) -> str | None:
    """POST ``delivery`` once: None when the receiver took it (a 2xx), else why not, in one line."""
    try:
        return await asyncio.wait_for(_attempt(client, delivery, policy, settings, now), settings.timeout_s)
    except TimeoutError:
        return f"no answer within {settings.timeout_s:g} s"
    except WebhookRefused as exc:
        return str(exc)
    except OSError as exc:  # a host name the operator allowed that does not resolve
        return f"the webhook host does not resolve ({exc})"


async def _attempt(client: httpx.AsyncClient, delivery: Delivery, policy: WebhookPolicy, settings: RelaySettings,
                   now: float | None) -> str | None:
    found = await asyncio.to_thread(targets, delivery.url, policy, settings.resolver)
    body = payload(delivery)
    headers = signed_headers(delivery, body, datetime.now(UTC).timestamp() if now is None else now)
    problem = "the webhook host has no address"
    for target in found:  # the next address only when this one cannot be reached at all
        try:
            return await _post(client, target, body, headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            problem = f"could not connect to {target.url.host}: {exc or type(exc).__name__}"
    return problem


async def _post(client: httpx.AsyncClient, target: Target, body: str, headers: dict[str, str]) -> str | None:
    extensions = {"sni_hostname": target.sni} if target.sni and target.url.scheme == "https" else None
    try:
        async with client.stream("POST", target.url, content=body.encode(), headers={**headers, "host": target.host},
                                 extensions=extensions) as response:
            status, location = response.status_code, response.headers.get("location")
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise
    except httpx.TimeoutException:
        return "the receiver did not answer in time"
    except httpx.HTTPError as exc:
        return f"the request failed ({type(exc).__name__}: {exc})"
    if 200 <= status < 300:
        return None
    if 300 <= status < 400:
        to = f" to {location[:200]}" if location else ""
        return f"the receiver answered {status} (a redirect{to}); redirects are not followed: give the final URL"
    return f"the receiver answered HTTP {status}"


def retry_at(delivery: Delivery, now: float, settings: RelaySettings,
             draw: Callable[[], float] = random.random) -> float | None:
    """When to try a delivery again after its attempt number ``delivery.attempts + 1`` failed at ``now``;
    None once the deadline has passed."""
    deadline = delivery.created_at + settings.deadline_s
    if now >= deadline:
        return None
    ceiling = min(settings.cap_s, settings.base_s * 2.0 ** min(delivery.attempts, 48))
    return min(deadline, now + draw() * ceiling)


def record(store: SqlStore, delivery: Delivery, error: str | None, settings: RelaySettings,
           now: float | None = None) -> str:
    """Store how an attempt went; the delivery's state after it: delivered, pending (tried again) or failed;
    ``lost`` when the relay's lease on it had passed to another relay (which records its own attempt)."""
    now = store.clock() if now is None else now
    if error is None:
        return "delivered" if store.delivery_done(delivery.id, delivery.lease_until, now) else "lost"
    at = retry_at(delivery, now, settings)
    if not store.delivery_missed(delivery.id, delivery.lease_until, " ".join(error.split())[:MAX_ERROR], at):
        return "lost"
    return "failed" if at is None else "pending"


async def deliver(store: SqlStore, client: httpx.AsyncClient, delivery: Delivery, policy: WebhookPolicy,
                  settings: RelaySettings) -> str:
    """One attempt at a leased delivery, recorded; its state after it."""
    return record(store, delivery, await send(client, delivery, policy, settings), settings)


def list_deliveries(view: TenantView, state: str | None = None, limit: int = 50) -> dict[str, Any]:
    """Webhook deliveries of the caller's jobs (an operator's: every tenant's), newest first, in ``state`` if
    given."""
    if state is not None and state not in DELIVERY_STATES:
        raise UserError(f"state {state!r} is not a delivery state; use {', '.join(DELIVERY_STATES)}")
    return {"deliveries": [
        {"event_id": e.id, "job_id": e.job_id, "type": e.type, "url": url, "state": e.delivery,
         "attempts": e.delivery_attempts, "error": e.delivery_error, "created_at": e.created_at,
         "delivered_at": e.delivered_at} for e, url in view.deliveries(state, limit)]}
