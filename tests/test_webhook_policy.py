"""Where a webhook may go (service/webhooks.py's policy), without a store or a network: names resolve through
a resolver the test gives."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from conveyor.errors import UserError
from conveyor.service.webhooks import WebhookPolicy, WebhookRefused, check_webhook_url, parse_policy

PUBLIC = "93.184.216.34"


def dns(table: dict[str, Sequence[str]]) -> Callable[[str, int], Sequence[str]]:
    def resolve(host: str, port: int) -> Sequence[str]:
        name = host.lower().rstrip(".")
        if name not in table:
            raise OSError(f"unknown host {host}")
        return table[name]
    return resolve


def refused(url: str, policy: WebhookPolicy = WebhookPolicy(), resolver: Callable[[str, int], Sequence[str]] | None
            = None) -> str:
    with pytest.raises(WebhookRefused) as caught:
        check_webhook_url(url, policy, resolver or dns({}))
    return str(caught.value)


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1/", "loopback"), ("http://127.8.9.10:8080/x", "loopback"), ("http://[::1]:9/", "loopback"),
    ("http://10.0.0.1/", "private"), ("http://172.16.5.4/", "private"), ("http://192.168.1.1/", "private"),
    ("http://[fd00::1]/", "private"), ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://[fe80::1]/", "link-local"), ("http://100.100.100.200/", "metadata"),
    ("http://[fd00:ec2::254]/", "metadata"), ("http://0.0.0.0/", "private"),
    ("http://100.64.0.1/", "not a public address"), ("http://224.0.0.1/", "multicast"),
])
def test_addresses_that_are_not_public_are_refused(url: str, why: str) -> None:
    assert why in refused(url)


@pytest.mark.parametrize("url", ["http://[::ffff:127.0.0.1]/", "http://[::ffff:10.0.0.1]/",
                                 "http://[::ffff:169.254.169.254]/", "http://[2002:7f00:1::1]/",
                                 "http://[64:ff9b::a00:1]/"])
def test_an_ipv6_address_that_carries_an_ipv4_one_is_judged_as_that(url: str) -> None:
    refused(url)
    assert check_webhook_url(url, parse_policy(["127.0.0.0/8", "10.0.0.0/8", "169.254.169.254"]))
    assert check_webhook_url("http://[2002:5db8:d822::1]/", WebhookPolicy())  # 6to4 of a public address


def test_a_name_is_judged_by_every_address_it_resolves_to() -> None:
    resolver = dns({"hooks.example": [PUBLIC], "split.example": [PUBLIC, "10.1.2.3"], "inside.example": ["::1"]})
    assert check_webhook_url("https://hooks.example/in", WebhookPolicy(), resolver) == "https://hooks.example/in"
    assert "private" in refused("https://split.example/in", resolver=resolver)
    assert "loopback" in refused("https://inside.example/in", resolver=resolver)
    assert "does not resolve" in refused("https://nowhere.example/in", resolver=resolver)


def test_the_operator_may_allow_networks_and_host_names() -> None:
    resolver = dns({"hooks.internal": ["10.9.8.7"], "other.internal": ["10.9.8.7"]})
    networks = parse_policy(["10.0.0.0/8", "127.0.0.1"])
    assert check_webhook_url("http://10.1.1.1:8080/x", networks)
    assert check_webhook_url("http://127.0.0.1:9/x", networks)
    assert "loopback" in refused("http://127.0.0.2/", networks)  # 127.0.0.1 allows that address only
    assert "private" in refused("http://192.168.0.1/", networks)
    hosts = parse_policy(["hooks.internal"])
    assert check_webhook_url("http://HOOKS.internal./x", hosts, resolver)
    assert "private" in refused("http://other.internal/x", hosts, resolver)
    assert "private" in refused("http://10.9.8.7/x", hosts, resolver)  # the host's address is not allowed by it
    assert "does not resolve" in refused("http://hooks.internal/x", hosts, dns({}))


@pytest.mark.parametrize("value", ["", "10.0.0.0/33", "not a host", "http://x/"])
def test_an_allowance_that_is_neither_a_network_nor_a_host_is_a_user_error(value: str) -> None:
    with pytest.raises(UserError):
        parse_policy([value])


@pytest.mark.parametrize("url", ["http://user:secret@hooks.example/", "http://user@hooks.example/",
                                 "https://:pw@hooks.example/"])
def test_a_url_with_a_user_name_or_password_is_refused(url: str) -> None:
    assert "user name or password" in refused(url, resolver=dns({"hooks.example": [PUBLIC]}))


@pytest.mark.parametrize("url", ["ftp://hooks.example/", "file:///etc/passwd", "gopher://hooks.example/",
                                 "javascript:alert(1)", "hooks.example/in", "http:///nohost", "//hooks.example/"])
def test_only_http_and_https_urls_with_a_host_are_taken(url: str) -> None:
    assert "http:// or https://" in refused(url, resolver=dns({"hooks.example": [PUBLIC]}))


def test_a_url_that_is_too_long_or_malformed_is_refused() -> None:
    assert "longer than" in refused("https://hooks.example/" + "a" * 3000)
    assert "not a URL" in refused("http://hooks.example:99999/")
    assert "not a URL" in refused("http://[::1/")
