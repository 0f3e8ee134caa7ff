"""What past attempts of a pipeline's stages cost: the history a dry run forecasts from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect


class StageCosts(NamedTuple):
    """Sums over the invoked attempts of one stage (squares too, for the spread)."""

    stage: str
    attempts: int
    tasks: int
    tokens: float
    tokens_sq: float
    cost: float
    cost_sq: float
    seconds: float
    seconds_sq: float
    calls: int
    unpriced: int


class ModelUse(NamedTuple):
    """Sums over the invoked attempts of one stage at one escalation tier with one reported model."""

    stage: str
    tier: int
    model: str  # as the provider reported it ("sim-1@2026-11-01"), "" for attempts that called none
    attempts: int
    prompt: float
    completion: float
    cost: float
    calls: int
    unpriced: int


class StageSpan(NamedTuple):
    """How one stage's invoked attempts lay in time in one run."""

    run_id: str
    stage: str
    start: float  # the first one's start
    end: float  # the last one's end
    seconds: float  # their seconds, added
    attempts: int
    workers: int  # the workers that ran them
    longest: float = 0.0  # the longest of them


class FirstAttempt(NamedTuple):
    """One of a worker's first invoked attempts of a stage in a run, ranked by start: its first wave, which may
    carry a one-time warm-up (a model it loads on its first call)."""

    run_id: str
    stage: str
    worker: str
    rank: int  # 1 for the worker's first attempt of the stage in the run
    seconds: float


class ForecastQueries:
    db: Dialect

    def recent_runs(self, pipeline: str, limit: int = 5) -> list[str]:
        """The latest runs of a pipeline, newest first."""
        return [str(r[0]) for r in self.db.execute(
            "SELECT run_id FROM runs WHERE pipeline = ? ORDER BY created_at DESC LIMIT ?", (pipeline, limit))]

    def stage_costs(self, run_ids: Sequence[str]) -> list[StageCosts]:
        """Per stage, the sums over these runs' invoked attempts (a stage call each)."""
        if not run_ids:
            return []
        marks = ",".join("?" * len(run_ids))
        rows = self.db.execute(
            f"""SELECT t.stage, COUNT(*), COUNT(DISTINCT a.task_id),
                SUM(a.prompt_tokens + a.completion_tokens),
                SUM((a.prompt_tokens + a.completion_tokens) * (a.prompt_tokens + a.completion_tokens)),
                SUM(a.cost), SUM(a.cost * a.cost), SUM(COALESCE(a.duration, 0)),
                SUM(COALESCE(a.duration, 0) * COALESCE(a.duration, 0)), SUM(a.provider_calls), SUM(a.unpriced_calls)
            FROM attempts a JOIN tasks t ON t.id = a.task_id
            WHERE a.run_id IN ({marks}) AND a.invoked = 1 GROUP BY t.stage""", list(run_ids))
        return [StageCosts(str(r[0]), int(r[1]), int(r[2]), float(r[3] or 0), float(r[4] or 0), float(r[5] or 0),
                           float(r[6] or 0), float(r[7] or 0), float(r[8] or 0), int(r[9] or 0), int(r[10] or 0))
                for r in rows]

    def model_use(self, run_ids: Sequence[str]) -> list[ModelUse]:
        """Per stage, escalation tier and reported model, the sums over these runs' invoked attempts."""
        if not run_ids:
            return []
        marks = ",".join("?" * len(run_ids))
        rows = self.db.execute(
            f"""SELECT t.stage, COALESCE(a.tier, 0), COALESCE(a.model, ''), COUNT(*), SUM(a.prompt_tokens),
                SUM(a.completion_tokens), SUM(a.cost), SUM(a.provider_calls), SUM(a.unpriced_calls)
            FROM attempts a JOIN tasks t ON t.id = a.task_id
            WHERE a.run_id IN ({marks}) AND a.invoked = 1
            GROUP BY t.stage, COALESCE(a.tier, 0), COALESCE(a.model, '')""",
            list(run_ids))
        return [ModelUse(str(r[0]), int(r[1]), str(r[2]), int(r[3]), float(r[4] or 0), float(r[5] or 0),
                         float(r[6] or 0), int(r[7] or 0), int(r[8] or 0)) for r in rows]

    def declared_models(self, run_ids: Sequence[str]) -> dict[tuple[str, str, str], dict[str, int]]:
        """(stage, stage version, config hash) -> the models its tasks asked for under that declaration."""
        found: dict[tuple[str, str, str], dict[str, int]] = {}
        for run_id in run_ids:
            for stage, version, config, model, count in self.db.execute(
                    "SELECT p.stage, t.stage_version, t.config_hash, p.value, COUNT(*) FROM provenance p "
                    "JOIN tasks t ON t.run_id = p.run_id AND t.root_key = p.root_key AND t.item_key = p.item_key "
                    "AND t.stage = p.stage WHERE p.run_id = ? AND p.name = 'model' "
                    "GROUP BY p.stage, t.stage_version, t.config_hash, p.value", (run_id,)):
                by_model = found.setdefault((str(stage), str(version), str(config)), {})
                by_model[str(model)] = by_model.get(str(model), 0) + int(count)
        return found

    def stage_spans(self, run_ids: Sequence[str]) -> list[StageSpan]:
        """Per run and stage, when its invoked attempts started and ended, their seconds, their workers and the
        longest of them."""
        if not run_ids:
            return []
        marks = ",".join("?" * len(run_ids))
        rows = self.db.execute(
            f"""SELECT a.run_id, t.stage, MIN(a.started_at), MAX(a.started_at + COALESCE(a.duration, 0)),
                SUM(COALESCE(a.duration, 0)), COUNT(*), COUNT(DISTINCT a.worker), MAX(COALESCE(a.duration, 0))
            FROM attempts a JOIN tasks t ON t.id = a.task_id
            WHERE a.run_id IN ({marks}) AND a.invoked = 1 AND a.started_at IS NOT NULL
            GROUP BY a.run_id, t.stage""", list(run_ids))
        return [StageSpan(str(r[0]), str(r[1]), float(r[2]), float(r[3]), float(r[4] or 0.0), int(r[5]),
                          max(1, int(r[6] or 0)), float(r[7] or 0.0)) for r in rows]

    def first_attempts(self, run_ids: Sequence[str], per_worker: int) -> list[FirstAttempt]:
        """Per run, stage and worker, its first ``per_worker`` invoked attempts by start (its first wave)."""
        if not run_ids or per_worker < 1:
            return []
        marks = ",".join("?" * len(run_ids))
        rows = self.db.execute(
            f"""SELECT run_id, stage, worker, n, seconds FROM (
                SELECT a.run_id AS run_id, t.stage AS stage, COALESCE(a.worker, '') AS worker,
                    ROW_NUMBER() OVER (PARTITION BY a.run_id, t.stage, a.worker ORDER BY a.started_at, a.id) AS n,
                    COALESCE(a.duration, 0) AS seconds
                FROM attempts a JOIN tasks t ON t.id = a.task_id
                WHERE a.run_id IN ({marks}) AND a.invoked = 1 AND a.started_at IS NOT NULL) ranked
            WHERE n <= ?""", [*run_ids, per_worker])
        return [FirstAttempt(str(r[0]), str(r[1]), str(r[2]), int(r[3]), float(r[4] or 0.0)) for r in rows]

    def run_model_use(self, run_ids: Sequence[str]) -> list[tuple[str, str, str, float, int]]:
        """Per run, stage and reported model, (run, stage, model, tokens, provider calls) of its invoked attempts."""
        if not run_ids:
            return []
        marks = ",".join("?" * len(run_ids))
        rows = self.db.execute(
            f"""SELECT a.run_id, t.stage, COALESCE(a.model, ''), SUM(a.prompt_tokens + a.completion_tokens),
                SUM(a.provider_calls)
            FROM attempts a JOIN tasks t ON t.id = a.task_id
            WHERE a.run_id IN ({marks}) AND a.invoked = 1 GROUP BY a.run_id, t.stage, COALESCE(a.model, '')""",
            list(run_ids))
        return [(str(r[0]), str(r[1]), str(r[2]), float(r[3] or 0), int(r[4] or 0)) for r in rows if r[4]]

    def run_startups(self, run_ids: Sequence[str]) -> list[float]:
        """Per run, the seconds from its creation to its first attempt (submission, workers starting)."""
        if not run_ids:
            return []
        marks = ",".join("?" * len(run_ids))
        rows = self.db.execute(
            f"""SELECT MIN(a.started_at) - r.created_at FROM runs r JOIN attempts a ON a.run_id = r.run_id
            WHERE r.run_id IN ({marks}) AND a.started_at IS NOT NULL GROUP BY r.run_id, r.created_at""",
            list(run_ids))
        return [max(0.0, float(r[0])) for r in rows if r[0] is not None]

    def stage_models(self, run_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """stage -> the models its tasks asked for, with how many tasks asked each."""
        found: dict[str, dict[str, int]] = {}
        for run_id in run_ids:
            for stage, model, count in self.db.execute(
                    "SELECT stage, value, COUNT(*) FROM provenance WHERE run_id = ? AND name = 'model' "
                    "GROUP BY stage, value", (run_id,)):
                by_model = found.setdefault(str(stage), {})
                by_model[str(model)] = by_model.get(str(model), 0) + int(count)
        return found

    def stage_task_counts(self, run_ids: Sequence[str]) -> dict[str, int]:
        """stage -> tasks over these runs (how many children a fan-out made, per parent task)."""
        counts: dict[str, int] = {}
        for run_id in run_ids:
            for stage, count in self.db.execute("SELECT stage, COUNT(*) FROM tasks WHERE run_id = ? AND status <> "
                                                "'superseded' GROUP BY stage", (run_id,)):
                counts[str(stage)] = counts.get(str(stage), 0) + int(count)
        return counts
