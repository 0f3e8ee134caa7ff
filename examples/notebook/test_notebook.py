"""The notebook example (issue 29 point 5): the script and the notebook each run the products pipeline over a
Parquet table and end with a DataFrame of accepted records and their cost; the notebook is executed by a real
Jupyter kernel (nbclient, ipykernel), as a user's would be."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def test_the_script_ends_with_the_accepted_records_and_costs_nothing_the_second_time(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(HERE / "run_table.py"), "--workers", "1", "--store", str(tmp_path)],
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    outcomes = eval(lines[0].split(": ", 1)[1])  # {'completed': N, 'failed': M}: the reconciliation's counts
    assert sum(outcomes.values()) == 40 and outcomes["completed"] >= 30
    total = next(line for line in lines if "accepted records" in line)
    assert total.startswith(f"{outcomes['completed']} accepted records, $0.00")
    assert lines[-1] == "the same table again: 0 stage calls, 0 model calls"


def test_the_notebook_runs_in_a_kernel_and_ends_with_a_dataframe() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(HERE / "notebook.ipynb", as_version=4)
    nbclient.NotebookClient(notebook, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(HERE)}}).execute()
    shown = notebook.cells[5].outputs
    printed = "".join(o.get("text", "") for o in shown if o.output_type == "stream")
    assert " accepted records, $0.00" in printed
    table = next(o for o in shown if o.output_type == "execute_result")["data"]["text/html"]
    assert "SKU-0" in table and "sim-1" in table
    refused = notebook.cells[7].outputs[0]["data"]["text/plain"]
    assert "failed" in refused or "rejected" in refused
