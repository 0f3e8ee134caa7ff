"""What traces cost: a run of N items through the no-op pipeline with tracing off, on for every item, and on at
the default sampling ratio; spans exported over OTLP/HTTP to a local receiver that discards them.

    PYTHONPATH=src .venv/bin/python bench/tracing.py [--items 5000] [--repeat 3] [--no-write]

In this process: submit a JSONL manifest of N items (bench/noop_pipeline.py: a → b → c), then one worker until
idle; per mode, the median wall time of the submission and of the processing over the repeats, on SQLite (and on
PostgreSQL when CONVEYOR_TEST_PG is set). Off, it also counts what tracing adds to the hot path (calls of
``tracing.active()``, once per admitted batch and once per commit) and checks that OpenTelemetry was never
imported. Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from results import markers, write_section  # noqa: E402

from conveyor.blobs import FilesystemBlobs  # noqa: E402
from conveyor.runtime import tracing  # noqa: E402
from conveyor.runtime.target import load_target  # noqa: E402
from conveyor.runtime.worker import Worker, WorkerOptions  # noqa: E402
from conveyor.service.submit import submit  # noqa: E402
from conveyor.store import open_store  # noqa: E402

SCRIPT = "tracing"
BEGIN, END = markers(f"{SCRIPT}.py")
TARGET = f"{ROOT / 'bench' / 'noop_pipeline.py'}:pipe"
STAGES = 3


RECEIVER = """
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

class Receiver(BaseHTTPRequestHandler):
    spans = 0

    def do_POST(self):
        request = ExportTraceServiceRequest.FromString(self.rfile.read(int(self.headers["Content-Length"])))
        Receiver.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        body = str(Receiver.spans).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@contextmanager
def receiver() -> Iterator[str]:
    """An OTLP/HTTP receiver in a process of its own, which counts the spans it is sent (GET: the count)."""
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.terminate()
        proc.wait(10)


def arrived(endpoint: str) -> int:
    with urllib.request.urlopen(endpoint, timeout=10) as answer:
        return int(answer.read())


def write_manifest(path: Path, count: int) -> Path:
    with path.open("w") as out:
        for i in range(count):
            out.write(json.dumps({"key": f"item-{i:08d}", "text": f"document {i}"}) + "\n")
    return path


def fresh_store(backend: str, folder: Path) -> tuple[str, Callable[[], None]]:
    if backend == "sqlite":
        return f"sqlite:///{folder}/bench.db", lambda: None
    from tests.conftest import _drop, fresh_pg_url

    url = fresh_pg_url()
    return url, lambda: _drop(url)


def one_run(backend: str, manifest: Path, folder: Path) -> tuple[float, float]:
    """(submit seconds, process seconds) of one run in a fresh store."""
    url, drop = fresh_store(backend, folder)
    blobs, pipeline = FilesystemBlobs(folder / "blobs"), load_target(TARGET)
    try:
        store = open_store(url)
        started = time.perf_counter()
        try:
            run_id = submit(pipeline, TARGET, str(manifest), store, blobs).run_id
        finally:
            store.close()
        submitted = time.perf_counter()
        Worker(pipeline, TARGET, url, blobs, WorkerOptions(run_id=run_id, until_idle=True)).run()
        return submitted - started, time.perf_counter() - submitted
    finally:
        drop()


class Counted:
    spans = 0  # spans the provider ended (and so handed to the exporter)


def traced(ratio: float | None, endpoint: str) -> Counted:
    """Tracing configured as `conveyor worker` configures it from the environment, plus a span counter."""
    from opentelemetry.sdk.trace import SpanProcessor

    counted = Counted()

    class Counting(SpanProcessor):
        def on_end(self, span: Any) -> None:
            counted.spans += 1

    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{endpoint}/v1/traces"  # read by the OTLP exporter itself
    environ = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{endpoint}/v1/traces"}
    tracing.configure(environ if ratio is None else {**environ, "OTEL_TRACES_SAMPLER_ARG": str(ratio)})
    tracer = tracing.active()
    assert tracer is not None
    tracer.provider.add_span_processor(Counting())
    return counted


def measure(backend: str, manifest: Path, items: int, repeat: int, mode: str, endpoint: str) -> dict[str, Any]:
    calls, spans, before, load = 0, 0, arrived(endpoint), os.getloadavg()[0]
    real_active = tracing.active

    def counting() -> Any:
        nonlocal calls
        calls += 1
        return real_active()

    times = []
    for _ in range(repeat):
        counted = None
        if mode == "off":
            tracing.active = counting  # type: ignore[assignment]
        else:
            counted = traced(1.0 if mode == "every item" else None, endpoint)
        with tempfile.TemporaryDirectory() as folder:
            try:
                times.append(one_run(backend, manifest, Path(folder)))
            finally:
                tracing.active = real_active  # type: ignore[assignment]
                if counted is not None:
                    tracing.flush(60)
                    spans += counted.spans
                    tracing.uninstall()
    submit_s = statistics.median(t[0] for t in times)
    process_s = statistics.median(t[1] for t in times)
    return {"backend": backend, "mode": mode, "load": load, "submit_s": submit_s, "process_s": process_s,
            "items_per_s": items / submit_s, "stages_per_s": items * STAGES / process_s,
            "spans": spans // repeat, "spans_per_s": spans / repeat / (submit_s + process_s),
            "arrived": (arrived(endpoint) - before) // repeat,
            "active_calls": calls // repeat if mode == "off" else None}


def table(rows: list[dict[str, Any]], items: int, repeat: int, loaded: list[str]) -> str:
    lines = [BEGIN, "## Traces (bench/tracing.py)", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "",
             "    PYTHONPATH=src .venv/bin/python bench/tracing.py", "",
             f"N = {items:,} items through bench/noop_pipeline.py (a → b → c) in one process: submit, then one "
             f"worker until idle; median of {repeat} runs. On: spans go through the SDK's BatchSpanProcessor and "
             "OTLP/HTTP exporter to a receiver in another process that counts and discards them (*arrived*).", "",
             "| backend | tracing | load | submit s | items/s | process s | item-stages/s | spans | spans/s | arrived |"
             " `tracing.active()` calls |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['mode']} | {r['load']:.1f} | {r['submit_s']:.2f} | "
                     f"{r['items_per_s']:,.0f} | "
                     f"{r['process_s']:.2f} | {r['stages_per_s']:,.0f} | {r['spans']:,} | {r['spans_per_s']:,.0f} | "
                     f"{r['arrived']:,} | "
                     f"{'' if r['active_calls'] is None else r['active_calls']} |")
    lines += ["", "*load*: the 1-minute load average as the mode's runs started (on 2 cores, other work shows there); "
              "*spans*: made per run (root and attempt spans); *arrived*: received by the collector per run; "
              "`tracing.active()` calls: what tracing adds to the submit and commit paths when off, per run.",
              "", f"- Off, OpenTelemetry modules imported by the runs: {loaded or 'none'}.", END]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    backends = ["sqlite"] + (["postgres"] if os.environ.get("CONVEYOR_TEST_PG") else [])
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder, receiver() as endpoint:
        manifest = write_manifest(Path(folder) / "items.jsonl", args.items)
        for backend in backends:
            rows.append(measure(backend, manifest, args.items, args.repeat, "off", endpoint))
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        for backend in backends:
            for mode in (f"on, ratio {tracing.DEFAULT_RATIO:g} (default)", "every item"):
                rows.append(measure(backend, manifest, args.items, args.repeat, mode, endpoint))
                print(rows[-1], flush=True)
    section = table(rows, args.items, args.repeat, loaded)
    print(section)
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
