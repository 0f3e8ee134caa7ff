"""conveyor from Python: run a pipeline over Python objects or files, and read what it made as data.

The command line's twin, for notebooks and scripts: ``conveyor.open()`` is a handle on a store (the same
defaults and environment variables as ``--db`` and ``--blobs``), ``Pipeline.run``/``Pipeline.submit`` make a
``Run``, and a run or a collection gives its rows as tuples, Arrow, Parquet, pandas or polars. Every call goes
through the service functions the commands use (service/runs.py, report.py, export.py, datasets.py), so a run
made here is the same run ``conveyor status``, ``reconcile``, ``resume`` and ``export`` see::

    import conveyor

    run = pipe.run([("a", "first text"), ("b", "second text")])
    print(run.reconcile()["outcomes"])
    frame = run.to_pandas()
"""

from __future__ import annotations

from conveyor.client.datasets import Collection, Result
from conveyor.client.run import Run
from conveyor.client.workspace import Workspace, open

__all__ = ["Collection", "Result", "Run", "Workspace", "open"]
