"""``conveyor alerts``: each declared alert of the store's pipelines, firing or ok (see conveyor.Alerts)."""

from typing import Annotated

import typer

from conveyor.cli.common import Db, Json, app, emit, store_for
from conveyor.errors import StoreMissing
from conveyor.store import DEFAULT_DB


@app.command()
def alerts(
    pipeline: Annotated[str | None, typer.Option("--pipeline", help="only this pipeline's alerts")] = None,
    secret: Annotated[bool, typer.Option("--webhook-secret", help="add the secret that signs alert webhooks "
                                         "(whsec_...), for the receiver to verify them")] = False,
    db: Db = DEFAULT_DB, as_json: Json = False,
) -> None:
    """Alerts: firing or ok, latest value, threshold, since when, times fired."""
    from conveyor.cli import render
    from conveyor.service.alerts import alerts_secret, list_alerts

    try:
        with store_for(db, create=False) as store:
            data = list_alerts(store, pipeline)
            if secret:
                data["webhook_secret"] = alerts_secret(store)
    except StoreMissing:
        data = {"alerts": []}
    emit(data, as_json, render.alerts)
