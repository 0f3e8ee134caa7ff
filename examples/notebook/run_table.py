"""Run the products pipeline over a Parquet table from Python and end with a DataFrame of accepted records.

    python examples/notebook/run_table.py [--workers N] [--store DIR]

It starts the provider simulator (no network, no key), runs ``products.pipe`` over ``products.parquet`` (keys from
its ``sku`` column, the text from ``description``, ``category`` as each item's meta) and prints the accepted
records with their model and cost, then what a second run of the same table costs: nothing, every answer comes
from the memo. The notebook beside it (``notebook.ipynb``) does the same, cell by cell.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from products import pipe, write_table  # noqa: E402

import conveyor  # noqa: E402
from conveyor.providers.simulator import SimConfig, run_simulator  # noqa: E402

COLUMNS = ["item_key", "value.summary", "value.names", "model", "tokens", "cost"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--store", help="a folder for the store and blobs (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-notebook-") as scratch, \
            run_simulator(SimConfig(seed=1, latency_ms=5)) as url:
        where = Path(args.store or scratch)
        where.mkdir(parents=True, exist_ok=True)
        # The workers' provider: the simulator, priced as a small hosted model is (USD per million tokens).
        os.environ.update(OPENAI_BASE_URL=url, OPENAI_API_KEY="sim", CONVEYOR_PRICES=str(HERE / "prices.json"))
        table = write_table(where / "products.parquet")
        ws = conveyor.open(f"sqlite:///{where / 'conveyor.db'}", where / "blobs")
        run = pipe.run(table, store=ws, workers=args.workers, key="sku", text="description", meta=["category"],
                       progress=False)
        outcomes = run.reconcile()["outcomes"]
        accepted = run.to_pandas(stage="describe")[COLUMNS]
        print(f"run {run.id}: {outcomes}")
        print(accepted.head(10).to_string(index=False))
        print(f"{len(accepted)} accepted records, ${accepted['cost'].sum():.6f} in all")
        again = pipe.run(table, store=ws, workers=args.workers, key="sku", text="description", meta=["category"],
                         progress=False)
        print(f"the same table again: {again.status()['stage_calls']} stage calls, "
              f"{again.reconcile()['usage']['provider_calls']} model calls")


if __name__ == "__main__":
    main()
