"""Fleet-wide provider quotas, against the simulator's own request log, on both backends.

The limits' window is shortened (the simulator's and conveyor's alike) so that a
test covers several windows in seconds; the logic is the same at 60 s
(`make soak` runs it at the real window).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import cli_json, write_pipeline

pytest.importorskip("openai")
from conveyor.providers.simulator import SimConfig, run_simulator

WINDOW = 3.0
LIMIT = 9_000  # tokens per window for the fleet
# Requests granted before a 429 was recorded may still be on their way (a busy 2-core CI machine
# can hold a coroutine that long); what must never happen is a new grant while the fleet is paused.
GRACE = 0.75
PROMPT = "Summarise part {i}: " + "the quick brown fox jumps over the lazy dog " * 18

PIPE = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=10)

    # No breaker: two of these tests declare a limit above the provider's on purpose, and on a busy machine
    # nine in ten of one worker's calls can meet a 429, which would (rightly) pause the run.
    pipe = Pipeline("quota", provider=provider, retry=Retry(max_attempts=8, base=0.05, cap=0.5), breaker=None)

    @pipe.stage(version="1", concurrency=8)
    async def ask(ctx, source: bytes) -> dict:
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1",
                                max_tokens=int(os.environ.get("MAX_TOKENS", "64")),
                                json_mode=os.environ.get("JSON_MODE") == "1")
        if answer.data is not None and not isinstance(answer.data.get("summary", ""), str):
            raise ValueError("summary must be text")
        return {"text": answer.text[:40], "data": answer.data}
"""


def _docs(folder: Path, count: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"doc{i:04d}.txt").write_text(PROMPT.format(i=i))
    return folder


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _max_window(entries: list[dict[str, Any]], window: float) -> tuple[int, int]:
    """The most charged tokens and requests that arrived within any ``window`` seconds."""
    answered = sorted((e["time"], e["charged_tokens"]) for e in entries if e["status"] != 429)
    most_tokens = most_requests = 0
    for i, (start, _) in enumerate(answered):
        inside = [tokens for t, tokens in answered[i:] if t < start + window]
        most_tokens, most_requests = max(most_tokens, sum(inside)), max(most_requests, len(inside))
    return most_tokens, most_requests


def _run(tmp_path: Path, store_url: str, sim: SimConfig, limits: dict[str, Any] | None, docs: int,
         workers: int = 4, window: float = WINDOW, **env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    target = write_pipeline(tmp_path, PIPE)
    log = tmp_path / "sim.jsonl"
    with run_simulator(SimConfig(**{**sim.__dict__, "log_path": log, "window_s": window})) as url:
        run_env = {"SIM_URL": url, "CONVEYOR_QUOTA_WINDOW_S": str(window), **env}
        if limits is not None:
            run_env["CONVEYOR_LIMITS"] = json.dumps(limits)
        summary = cli_json("run", target, "--input", str(_docs(tmp_path / "docs", docs)), "--workers",
                           str(workers), "--db", store_url, "--blobs", str(tmp_path / "blobs"), cwd=tmp_path,
                           env=run_env, timeout=max(240, 6 * window))
    return summary, _log(log)


def test_four_workers_share_one_limit_and_never_exceed_it(tmp_path: Path, store_url: str) -> None:
    # The simulator would admit twice the fleet's limit: only conveyor's own accounting holds it.
    summary, entries = _run(tmp_path, store_url, SimConfig(seed=3, tpm=2 * LIMIT, latency_ms=40, latency_tail=0.5),
                            {"sim-1": {"tpm": LIMIT}}, docs=100)
    assert summary["outcomes"] == {"completed": 100} and summary["unaccounted"] == 0
    most_tokens, _ = _max_window(entries, WINDOW)
    assert most_tokens <= LIMIT, f"{most_tokens} tokens arrived within one {WINDOW}s window (limit {LIMIT})"
    assert not [e for e in entries if e["status"] == 429]
    # ... and it is used, not left idle: the busiest window holds most of the limit.
    assert most_tokens >= 0.7 * LIMIT


@pytest.mark.soak
def test_four_workers_at_the_real_one_minute_window(tmp_path: Path, store_url: str) -> None:
    """The same check at the providers' real 60-s window, over about three minutes (`make soak`)."""
    limit = 60_000
    summary, entries = _run(tmp_path, store_url, SimConfig(seed=13, tpm=2 * limit, latency_ms=200, latency_tail=0.5),
                            {"sim-1": {"tpm": limit}}, docs=600, window=60.0)
    assert summary["unaccounted"] == 0
    most_tokens, _ = _max_window(entries, 60.0)
    assert 0.9 * limit <= most_tokens <= limit
    assert not [e for e in entries if e["status"] == 429]


def test_fleet_keeps_the_request_limit_too(tmp_path: Path, store_url: str) -> None:
    summary, entries = _run(tmp_path, store_url, SimConfig(seed=4, latency_ms=20), {"sim-1": {"rpm": 15}}, docs=30,
                            workers=2)
    assert summary["outcomes"] == {"completed": 30}
    _, most_requests = _max_window(entries, WINDOW)
    assert most_requests <= 15


def test_retry_after_pauses_the_whole_fleet(tmp_path: Path, store_url: str) -> None:
    # Declared three times higher than the provider's real limit: 429s happen, and each one's
    # Retry-After holds for every worker, not just the task that met it.
    summary, entries = _run(tmp_path, store_url, SimConfig(seed=5, tpm=LIMIT // 3, latency_ms=20),
                            {"sim-1": {"tpm": LIMIT}}, docs=24)
    assert summary["outcomes"] == {"completed": 24}
    refusals = [e for e in entries if e["status"] == 429]
    assert refusals, "the test needs 429s to check Retry-After"
    arrivals = sorted(e["time"] for e in entries)
    for refusal in refusals:
        start, until = refusal["time"] + GRACE, refusal["time"] + refusal["retry_after"]
        early = [t for t in arrivals if start < t < until - 0.01]
        assert not early, f"{len(early)} requests within the Retry-After of the 429 at {refusal['time']:.3f}"


def test_unlimited_model_backs_off_and_honours_retry_after(tmp_path: Path, store_url: str) -> None:
    summary, entries = _run(tmp_path, store_url, SimConfig(seed=6, tpm=LIMIT // 2, latency_ms=20), None, docs=24)
    assert summary["outcomes"] == {"completed": 24}
    refusals = [e for e in entries if e["status"] == 429]
    answered = [e for e in entries if e["status"] == 200]
    assert len(answered) == 24
    # AIMD plus the fleet-wide pause: after a 429, nobody knocks again before Retry-After.
    arrivals = sorted(e["time"] for e in entries)
    for refusal in refusals:
        early = [t for t in arrivals if refusal["time"] + GRACE < t < refusal["time"] + refusal["retry_after"] - 0.01]
        assert not early


def test_terminal_error_is_never_retried(tmp_path: Path, store_url: str) -> None:
    summary, entries = _run(tmp_path, store_url, SimConfig(seed=7, api_key="the-right-key"),
                            {"sim-1": {"tpm": LIMIT}}, docs=6, workers=1)
    assert summary["outcomes"] == {"failed": 6} and summary["retries"] == 0
    assert len(entries) == 6 and {e["status"] for e in entries} == {401}
    assert all(item["error_classes"] == ["auth"] for item in summary["not_done"])


def test_malformed_completion_is_classified_not_published(tmp_path: Path, store_url: str) -> None:
    summary, entries = _run(tmp_path, store_url, SimConfig(seed=8, malformed_rate=0.4, truncated_rate=0.2),
                            {"sim-1": {"tpm": 10 * LIMIT}}, docs=30, workers=2, JSON_MODE="1", MAX_TOKENS="400")
    faults = [e for e in entries if e["fault"] in ("malformed", "truncated")]
    assert faults, "the test needs malformed answers"
    assert summary["unaccounted"] == 0
    from conveyor.store import open_store

    store = open_store(store_url)
    try:
        rows = store.db.execute("SELECT error_class, COUNT(*) FROM attempts WHERE outcome != 'succeeded' "
                                "GROUP BY error_class")
        published = store.db.execute("SELECT inline FROM outputs WHERE stage = 'ask' AND kind = 'json'")
    finally:
        store.close()
    assert dict(rows).get("malformed_output", 0) >= len(faults) * 0.9
    for (inline,) in published:
        value = json.loads(inline)
        assert isinstance(value["data"], dict), "only parsed JSON objects are stored as outputs"


def test_limits_parse_and_bad_limits_are_one_line_errors(tmp_path: Path) -> None:
    from conveyor.errors import PipelineError
    from conveyor.pipeline import RateLimit, find_limit, parse_limits
    from tests.helpers import cli

    limits = parse_limits('{"gpt-4o-mini": {"tpm": 1000}, "openai/*": {"rpm": 5}, "*": {"tpm": 7}}')
    assert find_limit(limits, "openai", "gpt-4o-mini") == RateLimit(tpm=1000)
    assert find_limit(limits, "openai", "gpt-4o") == RateLimit(rpm=5)
    assert find_limit(limits, "anthropic", "claude") == RateLimit(tpm=7)
    assert parse_limits(None) == {}
    for bad in ('{"m": {"tpm": -5}}', "nope", '{"m": {"tpmm": 5}}', '{"m": {}}', '{"m": {"interactive_share": 1}}'):
        with pytest.raises(PipelineError):
            parse_limits(bad)
    target = write_pipeline(tmp_path, PIPE)
    proc = cli("run", target, "--input", str(_docs(tmp_path / "docs", 1)), "--db", f"sqlite:///{tmp_path}/x.db",
               cwd=tmp_path, env={"CONVEYOR_LIMITS": '{"sim-1": {"tpm": 0}}', "SIM_URL": "http://127.0.0.1:9/v1"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: CONVEYOR_LIMITS['sim-1']: RateLimit(tpm=0): give a positive whole "
                                   "number, or None for no limit")


def test_ledger_window_lanes_and_spread(store_url: str) -> None:
    """The ledger itself, with an injected clock: the window, the interactive share, spreading."""
    from conveyor.store import open_store

    store = open_store(store_url)
    try:
        def ask(requests: list[tuple[str, int]], now: float, key: str = "openai/m", **kw: Any) -> Any:
            opts = {"tpm": 1000, "rpm": None, "interactive_share": 0.2, "window": 60.0, "worker": "w"} | kw
            return store.reserve_quota(key, requests, now=now, **opts)

        first = ask([("bulk", 600), ("bulk", 300), ("bulk", 200)], now=1000.0)
        assert [g is not None for g in first.grants] == [True, True, False]  # 1,100 > 1,000
        assert 59.0 < first.wait <= 60.0  # until the first grant ages out
        assert ask([("bulk", 2000)], now=1001.0).grants == [0]  # can never fit
        assert ask([("bulk", 100)], now=1001.0).grants[0] is not None  # 1,000 exactly
        assert ask([("interactive", 50)], now=1002.0).grants == [None]  # full: but demand is recorded
        store.settle_quota([(400, 0.0, first.grants[0])])  # the 600-token call really used 400
        # Interactive work is about: bulk now gets 800, interactive the whole 1,000.
        assert ask([("bulk", 150)], now=1003.0).grants == [None]
        assert ask([("interactive", 50)], now=1003.0).grants[0] is not None
        assert ask([("bulk", 10)], now=1200.0).grants[0] is not None  # everything aged out
        # spread: a sixtieth per second (one request always fits an empty second)
        spread = {"key": "openai/s", "spread": True}
        assert ask([("bulk", 10), ("bulk", 10)], now=2000.0, **spread).grants[1] is None  # 20 > 1,000/60
        assert ask([("bulk", 100)], now=2000.5, **spread).grants == [None]
        assert ask([("bulk", 100)], now=2001.1, **spread).grants[0] is not None  # a new second
        paused_until = store.pause_quota("openai/p", 30.0, "429")
        assert ask([("bulk", 1)], now=paused_until - 1, key="openai/p").paused
    finally:
        store.close()


def test_quota_command_shows_the_window_and_pauses(tmp_path: Path, store_url: str) -> None:
    from conveyor.store import open_store
    from tests.helpers import cli

    store = open_store(store_url)
    try:
        granted = store.reserve_quota("openai/q", [("bulk", 300), ("interactive", 200)], tpm=1000, rpm=None,
                                      interactive_share=0.1, window=60.0, worker="w")
        store.settle_quota([(250, 0.0, granted.grants[0])])
        store.pause_quota("openai/p", 30.0, "openai rate_limited (HTTP 429)")
    finally:
        store.close()
    data = cli_json("quota", "--db", store_url, cwd=tmp_path)
    models = {m["key"]: m for m in data["models"]}
    assert data["window_s"] == 60.0
    q = models["openai/q"]
    assert (q["tokens"], q["requests"], q["in_flight"], q["interactive_active"]) == (450, 2, 1, True)
    # About 30 s less the time the command took to start (seconds on a loaded machine): the pause counts down.
    assert 15 < models["openai/p"]["paused_for_s"] <= 30 and "429" in models["openai/p"]["pause_reason"]
    assert "openai/q" in cli("quota", "--db", store_url, cwd=tmp_path, check=True).stdout
