"""API tokens: each belongs to a tenant, is shown once at creation and kept only as its sha256 digest.

A token reads ``cvy_<id>_<secret>``: the id names it in ``conveyor token list|revoke``; the whole token is
what a client sends (``Authorization: Bearer ...``). An operator token sees every tenant's jobs and the
store's runs, reviews and dead letters (for operators and the dashboard); a tenant's own token sees its jobs.
Each tenant has a webhook secret (Standard Webhooks ``whsec_...``) that signs the webhooks of its jobs.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

from conveyor.errors import Forbidden, NotFound, Unauthorized, UserError
from conveyor.store import SqlStore
from conveyor.store.jobs import TokenRow

_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_TOKEN = re.compile(r"^cvy_([0-9a-f]{12})_[A-Za-z0-9_-]{20,}$")


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: its tenant, and whether it may see every tenant's work (``operator``)."""

    tenant: str
    operator: bool = False
    token_id: str | None = None

    @property
    def scope(self) -> str | None:
        """The tenant a query is narrowed to (None: every tenant's)."""
        return None if self.operator else self.tenant


LOCAL = Caller("local", operator=True)  # `conveyor serve --no-auth`: one local user


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_tenant(tenant: str) -> str:
    if not _TENANT.match(tenant):
        raise UserError(f"tenant {tenant!r} is not a tenant name; use 1 to 64 letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit")
    return tenant


def create_token(store: SqlStore, tenant: str, operator: bool = False, label: str | None = None) -> dict[str, Any]:
    """A new token for ``tenant`` (made with its webhook secret when the tenant is new); the token is in the
    answer only: the store keeps its digest."""
    check_tenant(tenant)
    now = store.clock()
    secret = store.ensure_tenant(tenant, "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode(), now)
    token_id = secrets.token_hex(6)
    token = f"cvy_{token_id}_{secrets.token_urlsafe(32)}"
    store.insert_token(token_id, digest(token), tenant, operator, label, now)
    return {"token": token, "tenant": tenant, "token_id": token_id, "operator": operator,
            "webhook_secret": secret}


def revoke_token(store: SqlStore, token_or_id: str) -> dict[str, Any]:
    """Revoke a token, named by its id or given whole; NotFound for one that does not exist."""
    match = _TOKEN.match(token_or_id)
    token_id = match.group(1) if match else token_or_id
    row = store.token_by_id(token_id)
    if row is None:
        raise NotFound(f"no token {token_id!r}; `conveyor token list` shows the tokens")
    revoked = store.revoke_token(token_id, store.clock())
    return {"token_id": token_id, "tenant": row.tenant, "revoked": True, "already_revoked": not revoked}


def list_tokens(store: SqlStore, tenant: str | None = None) -> dict[str, Any]:
    return {"tokens": [token_view(t) for t in store.list_tokens(tenant)]}


def token_view(t: TokenRow) -> dict[str, Any]:
    return {"token_id": t.token_id, "tenant": t.tenant, "operator": t.operator, "label": t.label,
            "created_at": t.created_at, "revoked_at": t.revoked_at}


def authenticate(store: SqlStore, authorization: str | None) -> Caller:
    """The caller an ``Authorization`` header names: Unauthorized without a valid bearer token, Forbidden
    for a revoked one."""
    if not authorization:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer TOKEN' "
                           "(`conveyor token create --tenant NAME` makes one)")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("the Authorization header must be 'Bearer TOKEN'")
    row = store.token_by_hash(digest(token))
    if row is None:
        raise Unauthorized("this API token is not known; check it, or make one with `conveyor token create`")
    if row.revoked_at is not None:
        raise Forbidden(f"API token {row.token_id} was revoked; ask for a new one")
    return Caller(row.tenant, row.operator, row.token_id)


def still_valid(store: SqlStore, caller: Caller) -> bool:
    """Whether the token ``caller`` authenticated with still holds (a long request, such as an event stream,
    asks now and then); always for a caller without one (``--no-auth``)."""
    if caller.token_id is None:
        return True
    row = store.token_by_id(caller.token_id)
    return row is not None and row.revoked_at is None


def webhook_secret(store: SqlStore, tenant: str) -> str:
    """The tenant's webhook secret, made when the tenant has none yet (``--no-auth``'s local tenant)."""
    found = store.tenant_secret(tenant)
    if found is not None:
        return found
    return store.ensure_tenant(tenant, "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode(), store.clock())
