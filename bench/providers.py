"""Provider quota benchmark: how much of a TPM limit is used, and how many requests meet a 429.

    .venv/bin/python bench/providers.py [--duration 120] [--tpm 300000] [--quick] [--only conveyor]

One run measures two contenders on the same workload, each against a fresh
simulator (``conveyor provider-sim``: a sliding 60 s TPM window, the same seed,
lognormal latency, 300 ms median by default):

1. ``conveyor run bench/quota_pipeline.py:pipe --workers 4`` (one async stage,
   one ``ctx.chat`` per document) with the limit given as
   ``CONVEYOR_LIMITS='{"sim-1": {"tpm": TPM}}'``;
2. the naive baseline, bench/baseline_naive.py: asyncio, ``openai.AsyncOpenAI``
   with ``max_retries=0``, a semaphore (32) and exponential backoff with full
   jitter on 429/5xx, as written by hand.

The workload: seeded documents of lognormal length (median 1,500 characters,
so about 375 prompt tokens; 200 to 16,000 characters), each one request with the
same ``max_tokens``. There are enough of them for 1.5 times what the limit admits
in the measurement window, so the limit is the bottleneck the whole time: a
contender that runs out of documents before the window ends fails a check.

The figures come from the simulator's request log, the provider's view. The
window is ``--duration`` seconds (120) from the first request that reaches the
simulator; only requests that arrive inside it count:

- *share of limit used* = tokens charged for answered (200) requests /
  (TPM x duration / 60): the real prompt + completion tokens, not the
  reservation of prompt + max_tokens;
- *share 429* = requests answered 429 / all requests.

Why two minutes at least: the simulator admits a whole minute's tokens at once
into an empty window, so any contender that bursts fills the first minute in a
few seconds (both do, in about 10 s). What tells them apart is the second
minute: the first minute's requests leave the window one by one from 60 s on,
and a contender uses the limit only if it sends again as soon as room frees,
without knocking on the provider's door before. ``--duration`` is therefore a
whole number of minutes, at least two; ``--quick`` runs conveyor alone.

Each contender is stopped at the end of the window instead of being left to
finish: SIGTERM for ``conveyor run`` (it stops claiming, finishes what is in
flight and releases the rest) and SIGTERM for the baseline (it cancels its
tasks). Letting them finish would add minutes and nothing to the figures, which
count the window only; requests already in flight when the window ends arrived
inside it, so the simulator is kept up until they are answered.

The simulator runs as a subprocess, not in the bench's process: a measured
throughput check on this 2-core machine (32 concurrent clients in one process,
10 s) gave 217 requests/s from a subprocess against 146 in-process with no
latency, and 90 either way with 300 ms latency, while this workload needs about
8 requests/s on average at the default TPM. Keeping it in its own process also keeps the
baseline's client and the bench's polling off the simulator's event loop. The
simulator's CPU time over the window is reported as a check that it was never
the bottleneck, along with the baseline's client-side median latency (which
includes the simulator's own overhead) next to the configured median.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from conveyor.providers.estimate import prompt_tokens, text_tokens
from conveyor.providers.simcontent import completion_text, limit_tokens

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ROOT / "bench" / "quota_pipeline.py"
BASELINE = ROOT / "bench" / "baseline_naive.py"
RESULTS = ROOT / "bench" / "RESULTS.md"
BEGIN, END = "<!-- bench/providers.py:begin -->", "<!-- bench/providers.py:end -->"
HISTORY_BEGIN, HISTORY_END = "<!-- providers-history:begin -->", "<!-- providers-history:end -->"
MODEL = "sim-1"

USED_TARGET = 0.95  # share of the limit used, in real tokens
REJECTED_TARGET = 0.005  # share of requests answered 429
SIM_CPU_CEILING = 0.5  # the simulator may use at most half a core, or it may be the bottleneck
FIRST_REQUEST_TIMEOUT = 90.0  # seconds from start to the first request before the contender is given up
SETTLE_SECONDS = 3.0  # after a contender has exited, time for requests still in the simulator to be logged


# --- the workload ----------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    key: str
    text: str
    charged: int  # prompt + completion tokens the simulator charges when it answers this document


_SYLLABLES = ("ka", "lo", "mi", "re", "tu", "sa", "ne", "po", "di", "va", "er", "an", "ol", "is", "um", "ex")


def _vocabulary(rng: random.Random, size: int = 400) -> list[str]:
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(size)]


def make_documents(seed: int, tokens: int, max_tokens: int) -> list[Document]:
    """Seeded documents of lognormal length until their charged tokens add up to ``tokens``."""
    rng = random.Random(seed)
    words = _vocabulary(rng)
    docs: list[Document] = []
    total = 0
    while total < tokens:
        chars = int(min(16_000, max(200, 1_500 * math.exp(rng.gauss(0.0, 0.8)))))
        parts = [f"Document {len(docs) + 1}."]
        length = len(parts[0])
        while length < chars:
            word = rng.choice(words)
            parts.append(word)
            length += len(word) + 1
        text = " ".join(parts)
        messages = [{"role": "user", "content": text}]
        answer, _ = limit_tokens(completion_text(MODEL, messages), max_tokens)
        charged = prompt_tokens(messages) + text_tokens(answer)
        docs.append(Document(f"doc-{len(docs) + 1:06d}", text, charged))
        total += charged
    return docs


def write_manifest(path: Path, docs: Sequence[Document]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for doc in docs:
            out.write(json.dumps({"key": doc.key, "text": doc.text}) + "\n")
    return path


# --- the simulator --------------------------------------------------------------


@dataclass(frozen=True)
class SimSettings:
    seed: int
    tpm: int
    latency_ms: float
    latency_tail: float
    error_rate_5xx: float


@dataclass
class Simulator:
    url: str
    log: Path
    proc: subprocess.Popen[str]
    cpu_seconds: float = 0.0  # user + system time of the simulator process, filled in when it stops

    def cpu(self) -> float:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = psutil.Process(self.proc.pid).cpu_times()
            self.cpu_seconds = times.user + times.system
        return self.cpu_seconds


@contextlib.contextmanager
def simulator(settings: SimSettings, log: Path) -> Iterator[Simulator]:
    """A fresh ``conveyor provider-sim`` subprocess on a free port, logging to ``log``."""
    cmd = [sys.executable, "-m", "conveyor", "provider-sim", "--port", "0", "--seed", str(settings.seed),
           "--tpm", str(settings.tpm), "--latency-ms", str(settings.latency_ms),
           "--latency-tail", str(settings.latency_tail), "--error-rate-5xx", str(settings.error_rate_5xx),
           "--log", str(log)]
    log.touch()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        _stop(proc, 5)
        raise RuntimeError(f"the provider simulator did not start (it printed {url!r})")
    sim = Simulator(url, log, proc)
    try:
        yield sim
    finally:
        sim.cpu()
        _stop(proc, 10)


def _stop(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM, then SIGKILL to the process group this bench started, if it has not left in ``grace`` s."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def read_log(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def first_request_time(path: Path) -> float | None:
    """The earliest arrival time logged so far (lines are written when answered, not in arrival order)."""
    with path.open(encoding="utf-8") as fh:
        times = [json.loads(line)["time"] for line in fh if line.strip()]
    return min(times) if times else None


# --- a contender ------------------------------------------------------------------


@dataclass
class Contender:
    name: str
    command: list[str]
    env: dict[str, str]


@dataclass
class Outcome:
    name: str
    started: float  # wall clock when the contender was started
    first_request: float  # wall clock of the first request the simulator logged
    stopped: float  # wall clock when SIGTERM was sent (0.0 if it exited on its own)
    exited: float  # wall clock when it had exited
    returncode: int
    stdout: str
    stderr_tail: str
    records: list[dict[str, Any]] = field(default_factory=list)
    sim_cpu: float = 0.0  # CPU seconds the simulator spent from the first request until the contender exited
    extra: dict[str, Any] = field(default_factory=dict)


def run_contender(contender: Contender, settings: SimSettings, duration: float, work: Path) -> Outcome:
    """Start the contender against a fresh simulator; SIGTERM it ``duration`` s after its first request."""
    log = work / f"sim-{contender.name}.jsonl"
    errors = work / f"{contender.name}.stderr"
    with simulator(settings, log) as sim, errors.open("w") as err:
        env = {**os.environ, **contender.env, "OPENAI_BASE_URL": sim.url, "OPENAI_API_KEY": "sim"}
        command = [sim.url if part == "{url}" else part for part in contender.command]
        started = time.time()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err, text=True, start_new_session=True)
        try:
            first, stopped, cpu_at_first = _watch(proc, log, duration, started, sim)
            stdout, _ = proc.communicate(timeout=120)
        finally:
            _stop(proc, 30)
        exited = time.time()
        sim_cpu = sim.cpu() - cpu_at_first
        time.sleep(SETTLE_SECONDS)
    outcome = Outcome(contender.name, started, first, stopped, exited, proc.returncode, stdout or "",
                      _tail(errors), read_log(log), sim_cpu)
    outcome.first_request = min((r["time"] for r in outcome.records), default=first)
    return outcome


def _watch(proc: subprocess.Popen[str], log: Path, duration: float, started: float,
           sim: Simulator) -> tuple[float, float, float]:
    """Wait for the first logged request, then for the end of the window; SIGTERM the contender then.

    Returns the first request's time, when SIGTERM was sent (0.0 if the contender exited by itself)
    and the simulator's CPU seconds at the first request."""
    first = None
    while first is None:
        if proc.poll() is not None:
            raise RuntimeError(f"the contender exited ({proc.returncode}) before its first request reached "
                               "the simulator")
        if time.time() - started > FIRST_REQUEST_TIMEOUT:
            raise RuntimeError(f"no request reached the simulator within {FIRST_REQUEST_TIMEOUT:g} s")
        time.sleep(0.05)
        first = first_request_time(log)
    cpu_at_first = sim.cpu()
    print(f"    first request {first - started:.1f} s after start; measuring {duration:g} s", flush=True)
    while time.time() < first + duration:
        if proc.poll() is not None:
            return first, 0.0, cpu_at_first  # finished (or died) inside the window: a check reports it
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    return first, time.time(), cpu_at_first


def _tail(path: Path, chars: int = 3000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


def conveyor_contender(manifest: Path, work: Path, tpm: int, workers: int, max_tokens: int) -> Contender:
    script = Path(sys.executable).parent / "conveyor"
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "conveyor"]
    command = [*cli, "run", f"{PIPELINE}:pipe", "--input", str(manifest), "--workers", str(workers), "--json",
               "--db", f"sqlite:///{work / 'bench.db'}", "--blobs", str(work / "blobs")]
    env = {"CONVEYOR_LIMITS": json.dumps({MODEL: {"tpm": tpm}}), "QUOTA_BENCH_MODEL": MODEL,
           "QUOTA_BENCH_MAX_TOKENS": str(max_tokens)}
    return Contender("conveyor", command, env)


def baseline_contender(manifest: Path, concurrency: int, max_tokens: int, seed: int) -> Contender:
    command = [sys.executable, str(BASELINE), "--base-url", "{url}", "--manifest", str(manifest),
               "--model", MODEL, "--max-tokens", str(max_tokens), "--concurrency", str(concurrency),
               "--seed", str(seed)]
    return Contender("baseline", command, {})


def conveyor_status(work: Path) -> dict[str, Any]:
    """The run's status (stage counts, retries, usage) from the store the contender left."""
    script = Path(sys.executable).parent / "conveyor"
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "conveyor"]
    proc = subprocess.run([*cli, "status", "--json", "--db", f"sqlite:///{work / 'bench.db'}"], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"error": proc.stderr.strip()[-500:]}
    runs = json.loads(proc.stdout).get("runs", [])
    return runs[0] if runs else {}


# --- figures ----------------------------------------------------------------------


@dataclass
class Figures:
    name: str
    requests: int
    rejected: int  # 429
    server_errors: int  # 5xx
    answered: int
    tokens: int  # charged tokens of answered requests
    limit_tokens: float  # TPM x duration / 60
    per_slice: list[tuple[float, float]]  # (share of the slice's limit used, share 429) per slice of the window
    window_end_tokens: int  # charged tokens of requests that arrived after the window (not counted)

    @property
    def used(self) -> float:
        return self.tokens / self.limit_tokens if self.limit_tokens else 0.0

    @property
    def rejected_share(self) -> float:
        return self.rejected / self.requests if self.requests else 0.0

    @property
    def passed(self) -> bool:
        return self.used >= USED_TARGET and self.rejected_share <= REJECTED_TARGET


def figures(outcome: Outcome, tpm: int, duration: float, slice_s: float = 10.0) -> Figures:
    start, end = outcome.first_request, outcome.first_request + duration
    chats = [r for r in outcome.records if r.get("endpoint", "chat") == "chat"]
    inside = [r for r in chats if start <= r["time"] < end]
    slices = max(1, math.ceil(duration / slice_s))
    sliced: list[list[dict[str, Any]]] = [[] for _ in range(slices)]
    for r in inside:
        sliced[min(slices - 1, int((r["time"] - start) // slice_s))].append(r)
    per_slice = []
    for part in sliced:
        used = sum(r["charged_tokens"] for r in part if r["status"] == 200) / (tpm * slice_s / 60)
        per_slice.append((used, sum(r["status"] == 429 for r in part) / len(part) if part else 0.0))
    return Figures(
        name=outcome.name,
        requests=len(inside),
        rejected=sum(r["status"] == 429 for r in inside),
        server_errors=sum(500 <= r["status"] < 600 for r in inside),
        answered=sum(r["status"] == 200 for r in inside),
        tokens=sum(r["charged_tokens"] for r in inside if r["status"] == 200),
        limit_tokens=tpm * duration / 60,
        per_slice=per_slice,
        window_end_tokens=sum(r["charged_tokens"] for r in chats if r["time"] >= end and r["status"] == 200),
    )


def max_minute(outcome: Outcome) -> int:
    """The most charged tokens that any 60 s window of arrivals held (must not exceed the TPM)."""
    answered = sorted((r["time"], r["charged_tokens"]) for r in outcome.records if r["status"] == 200)
    best = total = lo = 0
    for at, tokens in answered:
        total += tokens
        while answered[lo][0] <= at - 60:
            total -= answered[lo][1]
            lo += 1
        best = max(best, total)
    return best


READING = (
    "How to read it: the simulator's sliding window admits a whole minute's tokens at once, so a contender "
    "that sends eagerly fills each minute within its first seconds (see the shares per 10 s below) and the "
    "next minute as soon as the first minute's requests leave the window. *Share used* therefore mainly "
    "tells whether a contender sends again as soon as room frees; *share 429* tells whether it knocks before.")


# --- report -----------------------------------------------------------------------


@dataclass
class Report:
    figures: list[Figures] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.problems.append(message)
            print(f"  CHECK FAILED: {message}", flush=True)

    def detail(self, message: str) -> None:
        self.details.append(message)
        print(f"  {message}", flush=True)


def examine(report: Report, outcome: Outcome, fig: Figures, args: argparse.Namespace, docs: int) -> None:
    """Checks and details of one contender's run."""
    name, window_end = outcome.name, outcome.first_request + args.duration
    report.check(outcome.stopped > 0, f"{name} exited ({outcome.returncode}) "
                 f"{window_end - outcome.exited:.1f} s before the window ended: the limit was not the bottleneck "
                 f"the whole time; stderr: {outcome.stderr_tail[-500:]!r}")
    cpu_share = outcome.sim_cpu / max(1e-9, outcome.exited - outcome.first_request)
    report.check(cpu_share <= SIM_CPU_CEILING, f"{name}: the simulator used {cpu_share:.0%} of a core; it may "
                 "have been the bottleneck")
    peak = max_minute(outcome)
    report.check(peak <= args.tpm, f"{name}: a 60 s window of arrivals holds {peak:,} charged tokens, above "
                 f"the TPM {args.tpm:,}: the simulator's limiter let too much through")
    shares = " ".join(f"{u:.0%}" for u, _ in fig.per_slice)
    rejections = " ".join(f"{r:.0%}" for _, r in fig.per_slice)
    report.detail(f"{name}: started → first request {outcome.first_request - outcome.started:.1f} s; "
                  f"SIGTERM → exited {outcome.exited - outcome.stopped:.1f} s"
                  if outcome.stopped else f"{name}: exited on its own")
    report.detail(f"{name}: share of the limit used per 10 s of the window: {shares}")
    report.detail(f"{name}: share 429 per 10 s of the window: {rejections}")
    report.detail(f"{name}: {fig.answered:,} of {docs:,} documents answered in the window; "
                  f"{fig.server_errors} 5xx; busiest 60 s of arrivals held {peak:,} tokens "
                  f"({peak / args.tpm:.1%} of the TPM); simulator CPU {outcome.sim_cpu:.1f} s "
                  f"({cpu_share:.0%} of a core)")
    if name == "baseline" and outcome.stdout.strip():
        out = json.loads(outcome.stdout.strip().splitlines()[-1])
        outcome.extra = out
        report.detail(f"baseline: client-side latency of answered requests p50 {out['latency_p50']} s, "
                      f"p99 {out['latency_p99']} s (simulator median {args.latency_ms / 1000:g} s); "
                      f"gave up on {out['gave_up']} documents after {args.baseline_attempts} attempts")
    if name == "conveyor":
        status = outcome.extra
        if "error" in status:
            report.detail(f"conveyor: status unavailable: {status['error']}")
        elif status:
            report.detail(f"conveyor: run status after SIGTERM: stages {json.dumps(status.get('stages'))}, "
                          f"retries {status.get('retries')}, stage calls {status.get('stage_calls')}, "
                          f"provider calls {status.get('usage', {}).get('provider_calls')}")


def print_table(rows: Sequence[Figures]) -> None:
    print(f"\n{'contender':<10} {'requests':>9} {'429s':>7} {'share 429':>10} {'real tokens':>12} "
          f"{'share used':>11}  result")
    for f in rows:
        print(f"{f.name:<10} {f.requests:>9,} {f.rejected:>7,} {f.rejected_share:>10.2%} {f.tokens:>12,} "
              f"{f.used:>11.1%}  {'PASS' if f.passed else 'FAIL'}")
    print(f"targets: share used ≥ {USED_TARGET:.0%}, share 429 ≤ {REJECTED_TARGET:.1%}")


def limiter_state() -> tuple[str, str]:
    """Whether the source has the fleet-wide limiter (reads CONVEYOR_LIMITS), at which commit: long and short."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    present = subprocess.run(["grep", "-rqs", "CONVEYOR_LIMITS", str(ROOT / "src")]).returncode == 0
    dirty = bool(git("status", "--porcelain", "--", "src"))
    head, subject = git("log", "-1", "--format=%h"), git("log", "-1", "--format=%s")
    long = (f"limiter {'present' if present else 'absent'} in src/ (CONVEYOR_LIMITS "
            f"{'read' if present else 'not read'}); HEAD {head} {subject}"
            f"{'; src/ has uncommitted changes' if dirty else ''}")
    short = f"limiter {'present' if present else 'absent'}, {head}{' + uncommitted src/' if dirty else ''}"
    return long, short


def markdown(report: Report, command: str, args: argparse.Namespace, docs: Sequence[Document],
             machine: str, state: str) -> str:
    mean = sum(d.charged for d in docs) / len(docs)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        "## Provider quota (bench/providers.py)",
        "",
        f"Measured {now} with:",
        "",
        f"    {command}",
        "",
        f"Machine: {machine}. Source: {state}.",
        "",
        f"Workload: {len(docs):,} seeded documents (mean {mean:,.0f} charged tokens each, max_tokens "
        f"{args.max_tokens}; 1.5x what the limit admits in the window), model `{MODEL}` on `conveyor provider-sim` "
        f"(TPM {args.tpm:,}, sliding 60 s window, latency median {args.latency_ms:g} ms, lognormal tail "
        f"{args.latency_tail:g}, 5xx rate {args.error_rate_5xx:g}, seed {args.seed}), a fresh simulator per "
        f"contender. Window: {args.duration:g} s from each contender's first request, then SIGTERM. "
        f"Contenders: `conveyor run --workers {args.workers}` with `CONVEYOR_LIMITS` = the TPM; the naive "
        f"baseline (bench/baseline_naive.py: asyncio, semaphore {args.baseline_concurrency}, exponential "
        f"backoff with full jitter, base 1 s, cap 60 s, {args.baseline_attempts} attempts, Retry-After "
        "ignored). *Share used* = charged tokens of 200 answers that arrived in the window / "
        f"(TPM x {args.duration:g} s / 60); *share 429* = 429 answers / requests arrived in the window.",
        "",
        "| contender | requests | 429s | share 429 | 5xx | answered | real tokens | share of limit used | result |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for f in report.figures:
        lines.append(f"| {f.name} | {f.requests:,} | {f.rejected:,} | {f.rejected_share:.2%} | "
                     f"{f.server_errors:,} | {f.answered:,} | {f.tokens:,} | {f.used:.1%} | "
                     f"{'PASS' if f.passed else 'FAIL'} |")
    lines += ["", f"Targets: share of limit used ≥ {USED_TARGET:.0%}, share 429 ≤ {REJECTED_TARGET:.1%}.", "",
              READING, ""]
    lines += [f"- {d}" for d in report.details]
    lines += [f"- **Check failed**: {p}" for p in report.problems]
    lines += ["", "### Provider quota: every run", "", HISTORY_BEGIN,
              "| measured | window | TPM | contender | share used | share 429 | result | source |",
              "| --- | ---: | ---: | --- | ---: | ---: | --- | --- |"]
    return "\n".join(lines) + "\n"


def history_rows(report: Report, args: argparse.Namespace, state: str) -> list[str]:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [f"| {now} | {args.duration:g} s | {args.tpm:,} | {f.name} | {f.used:.1%} | {f.rejected_share:.2%} | "
            f"{'PASS' if f.passed else 'FAIL'} | {state} |" for f in report.figures]


def write_results(section: str, new_rows: list[str], path: Path = RESULTS) -> None:
    """Replace this bench's section (kept at the end of the file), keeping the rows of earlier runs."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    old_rows: list[str] = []
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        old, tail = rest.split(END, 1)
        if HISTORY_BEGIN in old and HISTORY_END in old:
            history = old.split(HISTORY_BEGIN, 1)[1].split(HISTORY_END, 1)[0]
            old_rows = [line for line in history.splitlines()
                        if line.startswith("| ") and not line.startswith(("| measured", "| ---"))]
        text = head.rstrip("\n") + "\n\n" + tail.lstrip("\n")
    rows = "\n".join([*old_rows, *new_rows])
    text = text.rstrip("\n") + "\n\n" + section + rows + "\n" + HISTORY_END + "\n\n" + END + "\n"
    path.write_text(text)


def machine_text() -> str:
    mem = psutil.virtual_memory().total / 2**30
    return (f"nproc {os.cpu_count()}; RAM {mem:.1f} GiB; {platform.platform()}; Python "
            f"{platform.python_version()}; load {os.getloadavg()[0]:.1f} at start")


# --- main -------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds measured from the first request")
    parser.add_argument("--tpm", type=int, default=300_000, help="the simulator's and conveyor's TPM limit")
    parser.add_argument("--workers", type=int, default=4, help="conveyor worker processes")
    parser.add_argument("--baseline-concurrency", type=int, default=32, help="the baseline's semaphore")
    parser.add_argument("--baseline-attempts", type=int, default=8, help="the baseline's attempts per document")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens of every request")
    parser.add_argument("--latency-ms", type=float, default=300.0, help="the simulator's median latency")
    parser.add_argument("--latency-tail", type=float, default=0.5, help="lognormal sigma of the latency")
    parser.add_argument("--error-rate-5xx", type=float, default=0.0, help="the simulator's 5xx rate")
    parser.add_argument("--seed", type=int, default=7, help="seeds the documents, the simulator and the jitter")
    parser.add_argument("--only", choices=("conveyor", "baseline"), help="run one contender")
    parser.add_argument("--quick", action="store_true", help="conveyor only (same window): half the time")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the Markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, store, manifest)")
    args = parser.parse_args(argv)
    if args.quick:
        args.only = args.only or "conveyor"
    if args.duration < 120 or args.duration % 60:
        parser.error("--duration must be a whole number of minutes, at least 2 (120, 180, ...): the limit is "
                     "a sliding 60 s window, so only over whole minutes is TPM x minutes what it admits, and "
                     "the first minute alone measures nothing but the opening burst")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python bench/providers.py", *map(shlex.quote, sys.argv[1:])])
    (state, short_state), info = limiter_state(), machine_text()
    print(f"provider quota benchmark: {command}\n  {info}\n  {state}", flush=True)
    settings = SimSettings(args.seed, args.tpm, args.latency_ms, args.latency_tail, args.error_rate_5xx)
    work = Path(tempfile.mkdtemp(prefix="conveyor-quota-"))
    report = Report()
    try:
        # 1.5x what the sliding window can admit over the measured minutes
        docs = make_documents(args.seed, int(1.5 * args.tpm * args.duration / 60), args.max_tokens)
        manifest = write_manifest(work / "manifest.jsonl", docs)
        print(f"  {len(docs):,} documents, {sum(d.charged for d in docs):,} charged tokens in all; "
              f"work folder {work}", flush=True)
        contenders = [conveyor_contender(manifest, work, args.tpm, args.workers, args.max_tokens),
                      baseline_contender(manifest, args.baseline_concurrency, args.max_tokens, args.seed)]
        for contender in contenders:
            if args.only and contender.name != args.only:
                continue
            print(f"\n{contender.name}: {' '.join(map(shlex.quote, contender.command))}", flush=True)
            outcome = run_contender(contender, settings, args.duration, work)
            if contender.name == "conveyor":
                outcome.extra = conveyor_status(work)
            fig = figures(outcome, args.tpm, args.duration)
            report.figures.append(fig)
            print(f"  {fig.requests:,} requests, {fig.rejected:,} answered 429 ({fig.rejected_share:.2%}), "
                  f"{fig.tokens:,} real tokens ({fig.used:.1%} of the limit)", flush=True)
            examine(report, outcome, fig, args, len(docs))
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print_table(report.figures)
    if not args.no_write:
        write_results(markdown(report, command, args, docs, info, state), history_rows(report, args, short_state),
                      args.results)
        print(f"\nwrote {args.results}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
