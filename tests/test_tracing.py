"""Traces: one trace per item across stages, retries and workers, checked with the SDK's in-memory exporter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler, TraceIdRatioBased

from conveyor.blobs import FilesystemBlobs
from conveyor.errors import UserError
from conveyor.runtime import tracing
from conveyor.runtime.target import load_target
from conveyor.runtime.transitions import Transitions
from conveyor.runtime.worker import Worker, WorkerOptions
from conveyor.service import review
from conveyor.service.report import find_run
from conveyor.service.show import show_item
from conveyor.store import open_store
from tests.helpers import SRC, cli, make_docs, query, submit_run, work, write_pipeline

pytest.importorskip("openai")
from conveyor.providers.simulator import SimConfig, run_simulator

PIPE = """
    import os
    from conveyor import Pipeline, Retry, RetryLater
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=5, prices={"sim-1": [2.0, 8.0]})

    pipe = Pipeline("traced", provider=provider, retry=Retry(max_attempts=3, base=0.01, cap=0.02))

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> str:
        text = source.decode()
        if "FLAKY" in text and ctx.attempt == 1:  # the message quotes the document: it must stay out of spans
            raise RetryLater(after=3600, reason="busy with " + text)
        return text

    @pipe.stage(version="1", after="parse")
    async def extract(ctx, text: str) -> dict:
        answer = await ctx.chat([{"role": "user", "content": text}], model="sim-1", json_mode=True)
        return {"fields": answer.data, "text": text}

    @pipe.stage(version="1", after="extract")
    def summarise(ctx, record: dict) -> dict:
        return {"fields": len(record["fields"])}
"""

PLAIN = """
    from conveyor import Pipeline

    pipe = Pipeline("plain")

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> str:
        return source.decode().upper()

    @pipe.stage(version="1", after="parse")
    def count(ctx, text: str) -> int:
        return len(text)
"""

SECRET = "confidential-payload"
WAIT_S = 120.0


@pytest.fixture
def spans() -> Iterator[Any]:
    """Install tracing with an in-memory exporter (every item sampled unless a test installs its own)."""
    exporter = InMemorySpanExporter()
    installed: list[TracerProvider] = []

    def with_sampler(sampler: Sampler) -> InMemorySpanExporter:
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracing.install(provider)
        installed.append(provider)
        return exporter

    yield with_sampler
    tracing.uninstall()
    for provider in installed:
        provider.shutdown()


def _docs(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for i in range(3):
        flaky = " FLAKY" if i == 1 else ""
        (folder / f"doc{i}.txt").write_text(f"invoice {i} total 12 EUR {SECRET}-{i}{flaky}")
    return folder



def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def _first_worker_until_retry(target: str, store_url: str, blobs: Path, run_id: str) -> str:
    """Worker A, in a thread, until everything but the flaky item's retry is done; returns its id."""
    worker = Worker(load_target(target), target, store_url, FilesystemBlobs(blobs), WorkerOptions(run_id=run_id))
    thread = threading.Thread(target=worker.run)
    thread.start()

    def settled() -> bool:
        (row,) = query(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND (status = 'running' OR "
                                  "(status = 'queued' AND attempts = 0))", run_id)
        (retried,) = query(store_url, "SELECT COUNT(*) FROM attempts WHERE run_id = ? AND outcome = 'retry'", run_id)
        return row[0] == 0 and retried[0] == 1

    try:
        _until(settled, "worker A to finish all but the retry")
    finally:
        worker.request_stop()
        thread.join(WAIT_S)
    assert not thread.is_alive()
    return worker.id


def _attr(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(name)


def test_one_items_journey_is_one_trace_across_stages_retries_and_workers(
    tmp_path: Path, store_url: str, spans: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = spans(ALWAYS_ON)
    target, blobs = write_pipeline(tmp_path, PIPE), tmp_path / "blobs"
    with run_simulator(SimConfig(seed=1)) as url:
        monkeypatch.setenv("SIM_URL", url)
        run_id = submit_run(target, _docs(tmp_path / "docs"), store_url, blobs)
        first = _first_worker_until_retry(target, store_url, blobs, run_id)
        store = open_store(store_url)
        try:
            with store.transaction():  # the retry is due now, for worker B
                store.db.execute("UPDATE tasks SET available_at = 0 WHERE run_id = ? AND status = 'queued'", (run_id,))
            store.recount_open_task_seconds()  # the rows were changed around the engine
        finally:
            store.close()
        work(target, store_url, blobs, run_id=run_id)

    finished = exporter.get_finished_spans()
    (parent,) = query(store_url, "SELECT traceparent FROM items WHERE run_id = ? AND item_key = 'doc1.txt'", run_id)
    _, trace_hex, root_hex, flags = parent[0].split("-")
    assert int(flags, 16) & 1, "sampled"
    store = open_store(store_url)
    try:  # `conveyor show` names the item's trace
        assert show_item(store, FilesystemBlobs(blobs), run_id, "doc1.txt")["trace_id"] == trace_hex
    finally:
        store.close()
    journey = [s for s in finished if s.context is not None and s.context.trace_id == int(trace_hex, 16)]
    assert all(_attr(s, "conveyor.item_key") == "doc1.txt" for s in journey), "one trace per item"
    (root,) = [s for s in journey if s.name == "conveyor.item"]
    assert root.context is not None and root.context.span_id == int(root_hex, 16) and root.parent is None
    attempts = sorted((s for s in journey if s.name != "conveyor.item"), key=lambda s: s.start_time or 0)
    assert [(s.name, _attr(s, "conveyor.attempt"), _attr(s, "conveyor.outcome")) for s in attempts] == [
        ("conveyor.attempt parse", 1, "retry"), ("conveyor.attempt parse", 2, "succeeded"),
        ("conveyor.attempt extract", 1, "succeeded"), ("conveyor.attempt summarise", 1, "succeeded")]
    assert all(s.parent is not None and s.parent.span_id == int(root_hex, 16) for s in attempts)

    failed, *rest = attempts
    assert _attr(failed, "conveyor.error_class") == "retry_later" and not failed.status.is_ok
    assert failed.status.description == "retry_later"
    assert all(s.status.is_unset and _attr(s, "conveyor.error_class") is None for s in rest)
    assert _attr(failed, "conveyor.worker") == first and {_attr(s, "conveyor.worker") for s in rest} != {first}
    assert {_attr(s, "conveyor.stage") for s in attempts} == {"parse", "extract", "summarise"}
    assert all(_attr(s, "conveyor.pipeline") == "traced" and _attr(s, "conveyor.run_id") == run_id
               for s in attempts)
    extract = attempts[2]
    assert _attr(extract, "gen_ai.usage.input_tokens") > 0 and _attr(extract, "gen_ai.usage.output_tokens") > 0
    assert _attr(extract, "conveyor.cost_usd") > 0 and _attr(extract, "gen_ai.request.model").startswith("sim-1")

    # Real times: each span is its attempt, as the attempts table has it.
    rows = query(store_url, "SELECT t.stage, a.attempt, a.started_at, a.duration, a.worker FROM attempts a JOIN "
                            "tasks t ON t.id = a.task_id WHERE t.run_id = ? AND t.root_key = 'doc1.txt'", run_id)
    assert len(rows) == len(attempts)
    times = {(f"conveyor.attempt {stage}", n): (started, duration, by) for stage, n, started, duration, by in rows}
    for span in attempts:
        started, duration, by = times[span.name, _attr(span, "conveyor.attempt")]
        assert span.start_time == pytest.approx(started * 1e9, abs=1e3)
        assert span.end_time == pytest.approx((started + duration) * 1e9, abs=1e3)
        assert _attr(span, "conveyor.worker") == by

    # Every item is its own trace; nothing of a document's content is in any span.
    roots = [s for s in finished if s.name == "conveyor.item"]
    assert len({s.context.trace_id for s in roots if s.context is not None}) == len(roots) == 3
    assert len(finished) == 3 + 3 * 3 + 1
    for span in finished:
        recorded = [*(span.attributes or {}).values(), span.status.description or "", span.name]
        recorded += [v for e in span.events for v in (e.attributes or {}).values()]
        assert not any(SECRET in str(v) or "invoice" in str(v) for v in recorded), span.name


def test_memo_answers_are_short_spans_in_the_items_trace(tmp_path: Path, store_url: str, spans: Any) -> None:
    exporter = spans(ALWAYS_ON)
    target, blobs = write_pipeline(tmp_path, PLAIN), tmp_path / "blobs"
    docs = make_docs(tmp_path / "docs", 2, "same text")  # same input twice: the second is answered by the memo
    run_id = submit_run(target, docs, store_url, blobs)
    work(target, store_url, blobs, run_id=run_id)
    attempts = [s for s in exporter.get_finished_spans() if s.name != "conveyor.item"]
    assert len(attempts) == 4
    cached = [s for s in attempts if _attr(s, "conveyor.cached")]
    assert cached and all(_attr(s, "conveyor.outcome") == "cached" and s.status.is_unset for s in cached)
    by_item = {(_attr(s, "conveyor.item_key"), s.context.trace_id) for s in attempts if s.context is not None}
    assert len(by_item) == 2 and len({key for key, _ in by_item}) == 2


FANOUT = """
    from conveyor import Pipeline

    pipe = Pipeline("fanned")

    @pipe.stage(version="1", kind="fanout")
    def split(ctx, source: bytes) -> list[str]:
        return source.decode().split()

    @pipe.stage(version="1", after=split)
    def shout(ctx, word: str) -> str:
        return word.upper()
"""


def test_fan_out_children_join_their_roots_trace(tmp_path: Path, store_url: str, spans: Any) -> None:
    exporter = spans(ALWAYS_ON)
    target, blobs = write_pipeline(tmp_path, FANOUT), tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", 2, "alpha beta gamma {i}"), store_url, blobs)
    work(target, store_url, blobs, run_id=run_id)
    parents = dict(query(store_url, "SELECT item_key, traceparent FROM items WHERE run_id = ?", run_id))
    children = [key for key in parents if key not in ("doc0000.txt", "doc0001.txt")]
    assert len(children) == 8 and all(parents[key] is None for key in children), "children store no context"
    shouts = [s for s in exporter.get_finished_spans() if s.name == "conveyor.attempt shout"]
    assert sorted(_attr(s, "conveyor.item_key") for s in shouts) == sorted(children)
    for span in shouts:
        root = _attr(span, "conveyor.root_key")
        assert span.context is not None and root in ("doc0000.txt", "doc0001.txt")
        assert f"{span.context.trace_id:032x}" == parents[root].split("-")[1]


REVIEWED = """
    from conveyor import Pipeline
    from conveyor.acceptance import Accept, Review

    pipe = Pipeline("reviewed")

    @pipe.stage(version="1", accept=Accept(confidence="confidence", threshold=0.8, review=Review(deadline="1h")))
    def extract(ctx, source: bytes) -> dict:
        return {"answer": source.decode(), "confidence": 0.5}

    @pipe.stage(version="1", after=extract)
    def keep(ctx, record: dict) -> int:
        return len(record)
"""


def test_a_review_decision_is_a_span_of_the_items_trace(tmp_path: Path, store_url: str, spans: Any) -> None:
    exporter = spans(ALWAYS_ON)
    target, blobs = write_pipeline(tmp_path, REVIEWED), tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", 1), store_url, blobs)
    work(target, store_url, blobs, run_id=run_id)
    store = open_store(store_url)
    try:
        (entry,) = review.review_list(store)["reviews"]
        review.approve(store, FilesystemBlobs(blobs), [entry["id"]], by="bob", why="fine as it is")
    finally:
        store.close()
    work(target, store_url, blobs, run_id=run_id)
    (parent,) = query(store_url, "SELECT traceparent FROM items WHERE run_id = ?", run_id)
    attempts = sorted((s for s in exporter.get_finished_spans() if s.name != "conveyor.item"),
                      key=lambda s: s.start_time or 0)
    assert [(s.name, _attr(s, "conveyor.outcome"), _attr(s, "conveyor.error_class")) for s in attempts] == [
        ("conveyor.attempt extract", "awaiting_review", "low_confidence"),
        ("conveyor.attempt extract", "approved", None), ("conveyor.attempt keep", "succeeded", None)]
    assert {f"{s.context.trace_id:032x}" for s in attempts if s.context is not None} == {parent[0].split("-")[1]}
    assert _attr(attempts[1], "conveyor.worker") == "review:bob" and attempts[1].status.is_unset
    assert not any("fine as it is" in str(v) for s in attempts for v in (s.attributes or {}).values())


def test_an_attempt_whose_worker_died_is_a_span_of_the_items_trace(
    tmp_path: Path, store_url: str, spans: Any,
) -> None:
    exporter = spans(ALWAYS_ON)
    target, blobs = write_pipeline(tmp_path, PLAIN), tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", 1), store_url, blobs)
    pipeline = load_target(target)
    store = open_store(store_url)
    try:
        now = store.clock()
        (task,) = Transitions(pipeline, store, "host:1:dead").claim(["parse"], 10, now, 30.0, run_id)
        assert Transitions(pipeline, store, "host:2:alive").reclaim_expired(now + 40)["requeued"] == 1
        with store.transaction():  # requeued as of the reclaim, 40 s ahead: due now
            store.db.execute("UPDATE tasks SET available_at = 0 WHERE run_id = ? AND status = 'queued'", (run_id,))
            store.recount_open_task_seconds()  # the rows were changed around the engine
    finally:
        store.close()
    work(target, store_url, blobs, run_id=run_id)

    (parent,) = query(store_url, "SELECT traceparent FROM items WHERE item_key = ?", task.item_key)
    attempts = sorted((s for s in exporter.get_finished_spans() if s.name != "conveyor.item"),
                      key=lambda s: (s.name != "conveyor.attempt parse", _attr(s, "conveyor.attempt")))
    assert {f"{s.context.trace_id:032x}" for s in attempts if s.context is not None} == {parent[0].split("-")[1]}
    assert [(s.name, _attr(s, "conveyor.attempt"), _attr(s, "conveyor.outcome")) for s in attempts] == [
        ("conveyor.attempt parse", 1, "lease_expired"), ("conveyor.attempt parse", 2, "succeeded"),
        ("conveyor.attempt count", 1, "succeeded")]
    died = attempts[0]
    assert _attr(died, "conveyor.worker") == "host:1:dead" and _attr(died, "conveyor.error_class") == "lease_expired"
    assert died.status.description == "lease_expired" and not died.status.is_ok
    assert died.start_time == pytest.approx(now * 1e9, abs=1e3)
    assert died.end_time == pytest.approx((now + 40) * 1e9, abs=1e3)


def test_sampled_out_items_make_no_span_and_store_no_context(tmp_path: Path, store_url: str, spans: Any) -> None:
    exporter = spans(ALWAYS_OFF)
    target, blobs = write_pipeline(tmp_path, PLAIN), tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", 5), store_url, blobs)
    work(target, store_url, blobs, run_id=run_id)
    assert exporter.get_finished_spans() == ()
    assert query(store_url, "SELECT COUNT(*) FROM items WHERE traceparent IS NOT NULL") == [(0,)]


def test_a_ratio_traces_whole_items_or_nothing_of_them(tmp_path: Path, store_url: str, spans: Any) -> None:
    exporter = spans(TraceIdRatioBased(0.5))
    target, blobs = write_pipeline(tmp_path, PLAIN), tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", 40, "document {i}"), store_url, blobs)
    work(target, store_url, blobs, run_id=run_id)
    traced = dict(query(store_url, "SELECT item_key, traceparent FROM items WHERE run_id = ?", run_id))
    kept = {key for key, parent in traced.items() if parent is not None}
    assert 0 < len(kept) < 40, "a ratio of 0.5 keeps some of 40 items (all or none: 2**-39)"
    attempts = [s for s in exporter.get_finished_spans() if s.name != "conveyor.item"]
    assert {_attr(s, "conveyor.item_key") for s in attempts} == kept
    assert len(attempts) == 2 * len(kept)
    for span in attempts:
        assert span.context is not None
        assert f"{span.context.trace_id:032x}" == traced[_attr(span, "conveyor.item_key")].split("-")[1]


def test_tracing_off_stores_nothing_and_never_loads_opentelemetry(tmp_path: Path, store_url: str) -> None:
    assert tracing.active() is None
    target = write_pipeline(tmp_path, PLAIN)
    probe = textwrap.dedent(f"""
        import sys
        from conveyor.runtime import tracing
        import conveyor.cli.main, conveyor.runtime.worker, conveyor.service.submit
        from tests.helpers import make_docs, submit_and_work
        from pathlib import Path
        assert not tracing.configure(), "tracing is off"
        submit_and_work({target!r}, make_docs(Path({str(tmp_path / 'docs')!r}), 3), {store_url!r},
                        Path({str(tmp_path / 'blobs')!r}))
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """)
    env = {"PYTHONPATH": f"{SRC}:{Path(SRC).parent}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=WAIT_S,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert query(store_url, "SELECT COUNT(*), COUNT(traceparent) FROM items") == [(3, 0)]
    store = open_store(store_url)
    try:
        run_id = find_run(store, None).run_id  # the latest
        assert show_item(store, FilesystemBlobs(tmp_path / "blobs"), run_id, "doc0000.txt")["trace_id"] is None
    finally:
        store.close()


class _Receiver(BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, bytes]]] = []  # each test's subclass has its own

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.bodies.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """A tiny OTLP/HTTP receiver on a free port: what it is sent, as (path, body)."""
    handler = type("Receiver", (_Receiver,), {"bodies": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.bodies
    server.shutdown()
    server.server_close()


def test_spans_leave_the_process_over_otlp_when_an_endpoint_is_set(
    tmp_path: Path, store_url: str, collector: tuple[str, list[tuple[str, bytes]]],
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    endpoint, received = collector
    target = write_pipeline(tmp_path, PLAIN)
    docs = make_docs(tmp_path / "docs", 3)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on",
           "OTEL_SERVICE_NAME": "conveyor-test"}
    proc = cli("run", target, "--input", str(docs), "--db", store_url, "--blobs", str(tmp_path / "blobs"),
               "--workers", "1", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert received and {path for path, _ in received} == {"/v1/traces"}
    spans = [(span, resource) for _, body in received
             for resource in ExportTraceServiceRequest.FromString(body).resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    names = sorted(span.name for span, _ in spans)
    assert names == ["conveyor.attempt count"] * 3 + ["conveyor.attempt parse"] * 3 + ["conveyor.item"] * 3
    services = {a.value.string_value for _, r in spans for a in r.resource.attributes if a.key == "service.name"}
    assert services == {"conveyor-test"}
    stored = {row[0].split("-")[1] for row in query(store_url, "SELECT traceparent FROM items")}
    assert {span.trace_id.hex() for span, _ in spans} == stored
    ((run_id, trace_id),) = query(store_url, "SELECT run_id, traceparent FROM items WHERE item_key = 'doc0000.txt'")
    shown = cli("show", run_id, "doc0000.txt", "--db", store_url, cwd=tmp_path, check=True)
    assert f"trace: {trace_id.split('-')[1]}" in shown.stdout


def test_configuration_is_read_from_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"}) and tracing.wanted({"CONVEYOR_TRACING": "1"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not tracing.wanted({"CONVEYOR_TRACING": "0", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not tracing.wanted({"OTEL_SDK_DISABLED": "true", "CONVEYOR_TRACING": "1"})
    assert "parentbased" in tracing.sampler({}).get_description().lower()
    assert str(tracing.DEFAULT_RATIO) in tracing.sampler({}).get_description()
    assert tracing.sampler({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}) \
        .get_description() == "TraceIdRatioBased{0.25}"
    for bad, says in [({"CONVEYOR_TRACING": "maybe"}, "set it to 1 or 0"),
                      ({"CONVEYOR_TRACING": "1", "OTEL_TRACES_SAMPLER": "sometimes"}, "use one of"),
                      ({"CONVEYOR_TRACING": "1", "OTEL_TRACES_SAMPLER_ARG": "2"}, "from 0 to 1"),
                      ({"CONVEYOR_TRACING": "1", "OTEL_TRACES_EXPORTER": "zipkin"}, "otlp or console"),
                      ({"CONVEYOR_TRACING": "1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http/protobuf")]:
        with pytest.raises(UserError, match=says):
            tracing.configure(bad)
    assert tracing.active() is None
    monkeypatch.setattr(tracing, "_installed", lambda module: False)
    with pytest.raises(UserError, match=r"pip install 'conveyor\[tracing\]'"):
        tracing.configure({"CONVEYOR_TRACING": "1"})


def test_the_cli_says_in_one_line_what_is_wrong_with_the_tracing_variables(tmp_path: Path) -> None:
    proc = cli("status", cwd=tmp_path, env={"CONVEYOR_TRACING": "1", "OTEL_TRACES_SAMPLER_ARG": "lots"})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "OTEL_TRACES_SAMPLER_ARG='lots' is not a ratio" in proc.stderr


def test_console_spans_go_to_stderr_and_leave_the_json_on_stdout_whole(tmp_path: Path) -> None:
    import json

    target = write_pipeline(tmp_path, """
        from conveyor import Pipeline

        pipe = Pipeline("console")

        @pipe.stage
        def parse(ctx, source: bytes) -> dict:
            return {"n": len(source)}
    """)
    docs = make_docs(tmp_path / "docs", 3)
    proc = cli("run", target, "--input", str(docs), "--json", "--db", f"sqlite:///{tmp_path}/c.db", "--blobs",
               str(tmp_path / "blobs"), cwd=tmp_path,
               env={"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "always_on"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outcomes"] == {"completed": 3}
    assert proc.stderr.count('"name": "conveyor.item"') == 3
    assert proc.stderr.count('"name": "conveyor.attempt parse"') == 3
