"""A private PostgreSQL server that has pgvector, for tests and bench/search.py: the PostgreSQL 16 and pgvector
binaries of the ``pgserver`` wheel (the dev extra), started with their own initdb and pg_ctl as
scripts/ensure-postgres.sh starts the machine's (as user postgres when run as root: initdb refuses root)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def binaries() -> Path | None:
    """pgserver's bin folder, without importing the package (its import writes to the user's folders)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return None
    bindir = Path(spec.origin).parent / "pginstall" / "bin"
    return bindir if (bindir / "pg_ctl").exists() else None


@contextmanager
def running_pgvector() -> Iterator[str]:
    """Start the server on a free port; yield its admin URL; stop it and remove its files."""
    bindir = binaries()
    if bindir is None:
        raise RuntimeError("pgserver is not installed: `pip install -e '.[dev]'` installs it")
    data = Path(tempfile.mkdtemp(prefix="conveyor-pgvector-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        if subprocess.run(["id", "postgres"], capture_output=True).returncode:
            subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
        shutil.chown(data, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cluster = data / "cluster"
    try:
        subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(cluster), "-U", "postgres", "-A", "trust",
                        "--no-sync"], check=True, capture_output=True)
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(cluster), "-l", str(data / "server.log"), "-w",
                        "-t", "60", "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off",
                        "start"], check=True, capture_output=True)
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (cluster / "postmaster.pid").exists():
            subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(cluster), "-m", "immediate", "stop"],
                           capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
