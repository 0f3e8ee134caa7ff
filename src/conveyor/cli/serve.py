"""``conveyor serve`` (the HTTP API, with workers beside it) and ``conveyor token`` (API tokens)."""

import os
import time
from typing import Annotated, Any

import typer

from conveyor.cli.common import (
    DEFAULT_BLOBS,
    Blobs,
    Db,
    Json,
    app,
    emit,
    store_for,
    tell_new_store,
    writable_blobs,
)
from conveyor.errors import UserError
from conveyor.store import DEFAULT_DB, new_store_note, open_store

token_app = typer.Typer(no_args_is_help=True, help="API tokens: each scoped to a tenant, shown once, kept hashed.")
app.add_typer(token_app, name="token")


@app.command()
def serve(
    pipelines: Annotated[list[str] | None, typer.Option(
        "--pipeline", "-p", metavar="TARGET", help="a pipeline to serve (file.py:pipe); repeat for more")] = None,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port to listen on")] = 8000,
    no_auth: Annotated[bool, typer.Option(
        "--no-auth", help="no API tokens: for one local user, who sees everything (never on a shared network)",
    )] = False,
    workers: Annotated[int, typer.Option(
        "--workers", "-w", min=0, help="worker processes per pipeline started beside the server (0: a fleet "
        "elsewhere runs `conveyor worker`)")] = 1,
    allow_webhook: Annotated[list[str] | None, typer.Option(
        "--allow-webhook", metavar="NETWORK|HOST", help="also allow webhooks to this network (10.0.0.0/8, "
        "127.0.0.1) or host; by default only public addresses")] = None,
    max_upload_bytes: Annotated[int, typer.Option(
        "--max-upload-bytes", min=1, help="the largest document or manifest accepted (413 beyond)")] = 1 << 30,
    public_url: Annotated[str | None, typer.Option(
        "--public-url", help="the base URL clients reach this server at (for status_url and events_url)")] = None,
    no_relay: Annotated[bool, typer.Option("--no-relay", help="deliver no webhooks from this process")] = False,
    db: Db = DEFAULT_DB, blobs: Blobs = DEFAULT_BLOBS,
) -> None:
    """Serve the HTTP API (docs/how-to/http-api.md): submit jobs, follow them, review, replay; and the
    dashboard's pages at / (docs/how-to/observability.md, "Dashboard")."""
    try:
        import uvicorn

        from conveyor.api import ApiSettings, create_app
    except ImportError as exc:
        raise UserError(f"the HTTP API needs the 'api' extra ({exc.name} is missing): pip install 'conveyor[api]'"
                        ) from None
    from conveyor.service.fleet import ServingFleet
    from conveyor.service.webhooks import parse_policy

    writable_blobs(blobs)
    _check_port(host, port)
    settings = ApiSettings(db=db, blobs=blobs, pipelines=tuple(pipelines or ()), auth=not no_auth,
                           max_upload_bytes=max_upload_bytes, webhook_policy=parse_policy(allow_webhook or []),
                           relay=not no_relay, public_url=public_url)
    # The workers start and stop with the app (its lifespan), so a SIGTERM to the server stops them too.
    fleet = ServingFleet(list(pipelines or ()), workers, db, blobs)
    store = open_store(db)
    note = new_store_note(store)  # told once the app is made: a server that cannot start says one line, its error
    store.close()
    api = create_app(settings, background=[fleet])
    tell_new_store(note)
    if no_auth:
        typer.echo("warning: --no-auth: every request is served as the one local user, with no token; "
                   "do not expose this server to other people", err=True)
    typer.echo(f"conveyor serving {', '.join(sorted(api.state.services.pipelines)) or 'no pipeline'} on "
               f"http://{host}:{port} ({workers} worker(s) per pipeline); the dashboard is at http://{host}:{port}/",
               err=True)
    uvicorn.run(api, host=host, port=port, log_level=os.environ.get("CONVEYOR_LOG", "warning").lower(),
                timeout_graceful_shutdown=5)


def _check_port(host: str, port: int) -> None:
    """A one-line error, before anything starts, for an address that cannot be listened on."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"--host {host!r} is not an address this machine has ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port (or stop what "
                            "holds it)") from None


@token_app.command("create")
def token_create(
    tenant: Annotated[str, typer.Option("--tenant", help="the tenant the token acts for")],
    operator: Annotated[bool, typer.Option("--operator", help="may see every tenant's work (operators, the "
                                           "dashboard)")] = False,
    label: Annotated[str | None, typer.Option("--label", help="a note on what the token is for")] = None,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Make an API token for TENANT; it is printed once and kept only as a digest."""
    from conveyor.service.tokens import create_token

    with store_for(db) as store:
        made = create_token(store, tenant, operator, label)
    emit(made, as_json, _token_created)


@token_app.command("revoke")
def token_revoke(
    token: Annotated[str, typer.Argument(help="the token's id (from `conveyor token list`) or the token")],
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Revoke a token: requests that carry it are answered 403 from now on."""
    from conveyor.service.tokens import revoke_token

    with store_for(db, create=False) as store:
        done = revoke_token(store, token)
    emit(done, as_json, lambda d: typer.echo(f"revoked token {d['token_id']} of tenant {d['tenant']}"
                                             + (" (it was revoked already)" if d["already_revoked"] else "")))


@token_app.command("list")
def token_list(
    tenant: Annotated[str | None, typer.Option("--tenant", help="only this tenant's tokens")] = None,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """The tokens (ids, tenants, when made and revoked); never the tokens themselves."""
    from conveyor.service.tokens import list_tokens

    with store_for(db, create=False) as store:
        found = list_tokens(store, tenant)
    emit(found, as_json, _tokens)


def _token_created(data: dict[str, Any]) -> None:
    typer.echo(data["token"])
    typer.echo(f"tenant {data['tenant']}, token id {data['token_id']}{' (operator)' if data['operator'] else ''}: "
               "keep the token now, it is not shown again; webhooks to this tenant are signed with "
               f"{data['webhook_secret']}", err=True)


def _tokens(data: dict[str, Any]) -> None:
    from rich.table import Table

    from conveyor.cli import render

    table = Table(title=f"{len(data['tokens'])} token(s)")
    for column in ("id", "tenant", "operator", "label", "created", "revoked"):
        table.add_column(column)
    for t in data["tokens"]:
        table.add_row(t["token_id"], t["tenant"], "yes" if t["operator"] else "", t["label"] or "",
                      _when(t["created_at"]), _when(t["revoked_at"]))
    render.out.print(table)


def _when(at: float | None) -> str:
    return "" if at is None else time.strftime("%Y-%m-%d %H:%MZ", time.gmtime(at))
