"""The declaration API: a Pipeline of stages, declared with a decorator.

Pure Python: nothing here touches a database, a file or the network; ``Pipeline.run`` and ``Pipeline.submit``
hand over to the Python API (conveyor/client/), imported when called.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from conveyor.acceptance.declare import Accept
from conveyor.acceptance.record import Target
from conveyor.errors import PipelineError
from conveyor.pipeline.alerts import Alerts, declared_alerts
from conveyor.pipeline.budget import Breaker, budget
from conveyor.pipeline.graph import GROUP_KINDS, Graph
from conveyor.pipeline.limits import RateLimit, parse_limits
from conveyor.pipeline.params import Param, declared_params, stage_params
from conveyor.pipeline.retry import Retry

if TYPE_CHECKING:
    from conveyor.client.inputs import Inputs
    from conveyor.client.run import Run
    from conveyor.client.workspace import Workspace

StageKind = Literal["map", "fanout", "publish", "gather", "group", "reduce"]
KINDS: tuple[str, ...] = ("map", "fanout", "publish", "gather", "group", "reduce")
ON_CHILD_FAILURE = ("fail", "skip")
DEFAULT_BATCH_DEADLINE_S = 24 * 3600.0


@dataclass(frozen=True, eq=False)
class Stage:
    """One declared step. Calling it calls the underlying function."""

    name: str
    fn: Callable[..., Any]
    after: str | None
    version: str
    kind: str
    retry: Retry
    timeout: float | None
    max_input_bytes: int | None
    max_memory_bytes: int | None
    concurrency: int
    config: Mapping[str, Any] = field(default_factory=dict)
    accept: Accept | None = None  # the acceptance boundary of its answers (conveyor.acceptance)
    # A publish stage's destination: a collection of the built-in target (its function returns a Record),
    # or an external Target (published once per idempotency key).
    into: str | Target | None = None
    # Versions of what makes its output that are not its code (a parser library, a schema): recorded as the
    # output's provenance and part of its identity, so a new value runs the stage again.
    provenance: Mapping[str, str] = field(default_factory=dict)
    # The provider batch lane (runtime/provider_batch.py): its model calls go through the provider's Batch API
    # at the batch price; a call not answered within ``batch_deadline`` seconds is made directly instead.
    batch: bool = False
    batch_deadline: float = DEFAULT_BATCH_DEADLINE_S
    # The run parameters it reads as ``ctx.params`` (conveyor.pipeline.params): their values are part of its
    # task key, not of its config hash (which says what code and declaration a worker must have to run it).
    params: tuple[str, ...] = ()
    # Every parent, in declared order (``after`` is the first): a stage with several is a join.
    parents: tuple[str, ...] = ()
    # A gather's rule for children that did not succeed: "fail" its item, or "skip" them (ctx.lost names them).
    on_child_failure: str = "fail"
    # A group stage's group key: a function of a member's output, or "meta.FIELD" of its item's manifest meta.
    by: Callable[[Any], Any] | str | None = None
    # A group stage's large groups: called on batches of ``members_per_call`` members, partial outputs folded.
    fold: Callable[..., Any] | None = None
    members_per_call: int | None = None

    @property
    def is_join(self) -> bool:
        return len(self.parents) > 1

    @property
    def guarded(self) -> bool:
        """Sync stages with a timeout or memory limit run in a child process."""
        return not self.is_async and (self.timeout is not None or self.max_memory_bytes is not None)

    config_hash: str = ""
    # The canonical JSON the config hash is taken of (the config, with the acceptance rules, target, provenance
    # and parameter names that are part of the stage's identity): recorded so a difference can be named.
    config_text: str = ""
    is_async: bool = False

    def __post_init__(self) -> None:
        if not self.parents and self.after is not None:
            object.__setattr__(self, "parents", (self.after,))
        identity = dict(self.config)
        identity.update(_shape_identity(self))
        if self.accept is not None:  # the rules an answer must pass are part of what makes it
            identity["\u00a7accept"] = self.accept.identity()
        if self.into is not None:
            identity["\u00a7into"] = self.into if isinstance(self.into, str) else type(self.into).__qualname__
        if self.provenance:
            identity["\u00a7provenance"] = dict(self.provenance)
        if self.params:  # which run parameters it reads (their values are in each task's key, per run)
            identity["\u00a7params"] = list(self.params)
        object.__setattr__(self, "config_text", config_text(self.name, identity))
        object.__setattr__(self, "config_hash", hashlib.sha256(self.config_text.encode()).hexdigest()[:16])
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class Pipeline:
    """A named graph of stages.

    Example::

        pipe = Pipeline("manuals")

        @pipe.stage(version="1", max_input_bytes=20_000_000, timeout=30)
        def parse(ctx, source: bytes) -> dict: ...

        @pipe.stage(after=parse, version="3", retry=Retry(max_attempts=5))
        async def extract(ctx, doc: dict) -> dict: ...

        @pipe.stage(after=extract, kind="publish")
        def publish(ctx, fields: dict) -> None: ...

    Stages without ``after`` receive the item's bytes; every other stage
    receives the output of the stage it comes after. A ``fanout`` stage
    returns a list, and each element becomes a child item that flows on to
    the stages after it.
    """

    def __init__(
        self, name: str, *, retry: Retry | None = None, lease_seconds: float = 30.0,
        provider: Callable[[], Any] | None = None, limits: Mapping[str, RateLimit] | None = None,
        max_backlog: int = 20_000, budget_usd: float | None = None, breaker: Breaker | None = Breaker(),
        alerts: Alerts | None = None, params: Mapping[str, Any | Param] | None = None,
    ) -> None:
        if not name or not isinstance(name, str):
            raise PipelineError("Pipeline(name) needs a non-empty name")
        if lease_seconds <= 0:
            raise PipelineError("Pipeline(lease_seconds=...) must be > 0")
        self.name = name
        self.default_retry = retry or Retry()
        self.lease_seconds = float(lease_seconds)
        # Called once per worker process to make the model provider ``ctx.chat`` and
        # ``ctx.embed`` use; by default conveyor.providers.provider_from_env().
        self.provider_factory = provider
        # Fleet-wide provider limits by model (see conveyor.pipeline.limits); CONVEYOR_LIMITS overrides.
        self.limits: dict[str, RateLimit] = parse_limits(limits or {}, f"Pipeline({name!r}, limits=...)")
        # Backpressure: a stage is not claimed while a stage after it has this many tasks queued.
        self.max_backlog = _positive_int("max_backlog", max_backlog) or 1
        # The default ceiling on a run's provider spending (`conveyor run --budget-usd` overrides it), and when a
        # run whose calls all fail one systemic way is paused instead of failing every item.
        self.budget_usd = budget(budget_usd, f"Pipeline({name!r}, budget_usd=...)")
        if breaker is not None and not isinstance(breaker, Breaker):
            raise PipelineError(f"Pipeline({name!r}, breaker={breaker!r}): pass conveyor.Breaker(...) or None")
        self.breaker = breaker
        # Alerts on rates (dead letters per hour, reviews past their deadline): see conveyor.pipeline.alerts.
        self.alerts = declared_alerts(alerts, name)
        # Run parameters (conveyor.pipeline.params): set at submission, recorded with the run, read as ctx.params.
        self.params: dict[str, Param] = declared_params(params, name)
        self._stages: dict[str, Stage] = {}
        self._graph: Graph | None = None

    def stage(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        after: Stage | Callable[..., Any] | str | Sequence[Stage | Callable[..., Any] | str] | None = None,
        version: str = "1",
        kind: str = "map",
        retry: Retry | None = None,
        timeout: float | None = None,
        max_input_bytes: int | None = None,
        max_memory_mb: float | None = None,
        concurrency: int = 16,
        config: Mapping[str, Any] | None = None,
        name: str | None = None,
        accept: Accept | None = None,
        into: str | Target | None = None,
        provenance: Mapping[str, Any] | None = None,
        batch: bool | int = False,
        batch_deadline: float = DEFAULT_BATCH_DEADLINE_S,
        params: Sequence[str] | None = None,
        on_child_failure: str = "fail",
        by: Callable[[Any], Any] | str | None = None,
        fold: Callable[..., Any] | None = None,
    ) -> Any:
        """Declare a stage; use as ``@pipe.stage`` or ``@pipe.stage(...)``.

        ``batch=True`` sends the stage's ``ctx.chat`` calls through the provider's Batch API (half price,
        answered within hours; the task waits without holding a worker); a call still unanswered
        ``batch_deadline`` seconds after it was asked is made directly. ``params`` names the run parameters
        (``Pipeline(params=...)``) the stage reads as ``ctx.params``; their values are part of its task key.

        The graph (conveyor.pipeline.graph): ``after=[a, b]`` makes a join, called as ``fn(ctx, a_output,
        b_output)`` once both succeeded for the item; ``kind="gather"`` after a stage below a fan-out is called
        once per fanned-out item as ``fn(ctx, outputs)`` with its children's outputs in child order
        (``on_child_failure="skip"``: the successes, and ``ctx.lost`` the children left out); ``kind="group"``
        with ``by=`` (a function of the parent's output, or ``"meta.FIELD"``) and ``kind="reduce"`` (one group)
        are called once per group of the run as ``fn(ctx, key, members)``; on those, ``batch=N`` with
        ``fold=`` calls it on batches of N members and folds the partial outputs with ``fold(ctx, key, parts)``.
        """
        parents = self._parent_names(after)
        lane, per_call = _batch(batch, kind, name or "")

        def register(func: Callable[..., Any]) -> Stage:
            stage = Stage(
                name=name or func.__name__,
                fn=func,
                after=parents[0] if parents else None,
                version=str(version),
                kind=kind,
                retry=retry or self.default_retry,
                timeout=_positive("timeout", timeout),
                max_input_bytes=_positive_int("max_input_bytes", max_input_bytes),
                max_memory_bytes=_megabytes(max_memory_mb),
                concurrency=_positive_int("concurrency", concurrency) or 1,
                config=dict(config or {}),
                accept=_accept(accept),
                into=_collection(into, kind),
                provenance=declared_provenance(name or func.__name__, provenance),
                batch=lane,
                batch_deadline=_positive("batch_deadline", batch_deadline) or DEFAULT_BATCH_DEADLINE_S,
                params=stage_params(params, self.params, name or func.__name__, self.name),
                parents=parents,
                on_child_failure=_on_child_failure(on_child_failure, kind, name or func.__name__),
                by=_by(by, kind, name or func.__name__),
                fold=_fold(fold, per_call, kind, name or func.__name__),
                members_per_call=per_call,
            )
            self._add(stage)
            return stage

        return register(fn) if fn is not None else register

    def _parent_names(self, after: Any) -> tuple[str, ...]:
        if after is None:
            return ()
        if isinstance(after, (list, tuple)):
            names = tuple(self._parent_name(a) for a in after)
            if not names:
                raise PipelineError("after=[] names no stage; leave after out for a first stage")
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise PipelineError(f"after=[...] names {', '.join(map(repr, twice))} twice; name each parent once")
            return names
        return (self._parent_name(after),)

    def _parent_name(self, after: Stage | Callable[..., Any] | str) -> str:
        if isinstance(after, Stage):
            return after.name
        if isinstance(after, str):
            return after
        name = getattr(after, "__name__", None)
        if name is None:
            raise PipelineError(f"after={after!r} is not a stage; pass the decorated stage or its name")
        return str(name)

    def _add(self, stage: Stage) -> None:
        if stage.kind not in KINDS:
            raise PipelineError(f"stage {stage.name!r}: kind={stage.kind!r}; use one of {', '.join(KINDS)}")
        if stage.name in self._stages:
            raise PipelineError(f"stage {stage.name!r} is declared twice in pipeline {self.name!r}")
        if stage.kind in ("gather", "group", "reduce") and len(stage.parents) > 1:
            raise PipelineError(f"stage {stage.name!r}: a {stage.kind} stage comes after one stage; join the "
                                "outputs first (a stage with after=[...]) and gather or group that")
        if stage.accept is not None and stage.kind != "map":
            raise PipelineError(f"stage {stage.name!r}: accept=... is for map stages (one answer per item), "
                                f"not {stage.kind} stages")
        if stage.batch and not stage.is_async:
            raise PipelineError(f"stage {stage.name!r}: batch=True is for async stages (their ctx.chat calls go "
                                "through the provider's Batch API); make it `async def` or drop batch=True")
        self._stages[stage.name] = stage
        self._graph = None
        try:
            _ = self.graph
        except PipelineError:
            if all(p in self._stages for p in stage.parents):  # a parent named ahead may still be declared
                del self._stages[stage.name]
                raise

    # --- the graph -------------------------------------------------------

    def __getitem__(self, name: str) -> Stage:
        try:
            return self._stages[name]
        except KeyError:
            raise PipelineError(f"pipeline {self.name!r} has no stage {name!r}") from None

    def __iter__(self) -> Iterator[Stage]:
        return iter(self._stages.values())

    def __len__(self) -> int:
        return len(self._stages)

    @property
    def graph(self) -> Graph:
        """The checked graph (conveyor.pipeline.graph); raises PipelineError when it cannot run."""
        if self._graph is None:
            self._graph = Graph.of(self._stages, self.name)
        return self._graph

    @property
    def roots(self) -> list[Stage]:
        return [s for s in self._stages.values() if not s.parents]

    def children(self, name: str) -> list[Stage]:
        return [self._stages[c] for c in self.graph.children[name]]

    def depth(self, name: str) -> int:
        """Stages on the longest way from a first stage to ``name``."""
        depth, frontier = 0, self[name].parents
        while frontier:
            depth, frontier = depth + 1, tuple(p for n in frontier for p in self[n].parents)
        return depth

    def without_publish(self) -> Pipeline:
        """This pipeline without its publish stages (same name, the other stages as they are): what may run
        where nothing must be published, such as a dry run's sample. Publish stages are leaves of the graph."""
        copy = object.__new__(Pipeline)
        copy.__dict__.update(self.__dict__)
        copy._stages = {name: s for name, s in self._stages.items() if s.kind != "publish"}
        copy._graph = None
        return copy

    def declared(self) -> dict[str, tuple[str, str]]:
        """Each stage's (version, config hash): the tasks a worker of this declaration may claim."""
        return {s.name: (s.version, s.config_hash) for s in self._stages.values()}

    @property
    def has_publish(self) -> bool:
        return any(s.kind == "publish" for s in self._stages.values())

    def validate(self) -> Pipeline:
        """Raise PipelineError unless this pipeline can run; return it."""
        if not self._stages:
            raise PipelineError(f"pipeline {self.name!r} declares no stages; add one with @pipe.stage")
        _ = self.graph  # every parent declared, no cycle, joins of one level, gathers below a fan-out
        return self

    def run(self, inputs: Inputs, *, store: Workspace | str | None = None, workers: int | None = None,
            budget_usd: float | None = None, params: Mapping[str, Any] | None = None, progress: bool = True,
            key: str | None = None, text: str | None = None, path: str | None = None, value: str | None = None,
            meta: Sequence[str] = ()) -> Run:
        """Submit ``inputs`` and process them to the end, as ``conveyor run`` does; return the finished Run.

        ``inputs``: a folder, a file or a JSONL manifest (what ``--input`` takes); ``(key, value)`` pairs, the
        value ``bytes``, ``str`` or a ``dict`` (its JSON text with sorted keys becomes the item's bytes); dicts
        shaped like manifest lines (``{"key": ..., "text": ...}`` or ``{"key": ..., "path": ...}``, optionally
        ``"meta"``); or a table: a pandas or polars DataFrame, a pyarrow Table, or a .parquet, .csv or .jsonl
        file, whose rows are items by the columns ``key=`` and one of ``text=``, ``path=`` or ``value=`` name
        (``meta=[...]``: columns that become the item's meta; as ``--key``, ``--text``... on the command line).
        A bad entry or a key given twice is a one-line InputError before any run exists.
        ``store``: ``conveyor.open(...)`` or a database URL (default: ``conveyor.open()``). ``workers``: worker
        processes, by default one per CPU core (0: this process; a pipeline declared in a notebook cell, which
        no other process can import, works in this process). ``budget_usd``: the run's ceiling on provider
        spending; ``params``: its run parameters. ``progress``: bars on a terminal or in a notebook.

        Works inside a running event loop (Jupyter). Ctrl-C stops the workers and raises ``Interrupted``
        (its ``run_id``): ``conveyor.open().run(run_id).resume()`` finishes the run.

        Example::

            run = pipe.run([("a", "first text"), ("b", "second text")], workers=0)
            print(run.reconcile()["outcomes"], run.to_pandas())
        """
        from conveyor.client.inputs import Columns
        from conveyor.client.running import run

        return run(self, inputs, store=store, workers=workers, budget_usd=budget_usd, params=params,
                   progress=progress, columns=Columns(key, text, path, value, tuple(meta)))

    def submit(self, inputs: Inputs, *, store: Workspace | str | None = None, workers: int | None = None,
               budget_usd: float | None = None, params: Mapping[str, Any] | None = None,
               progress: bool = False, key: str | None = None, text: str | None = None, path: str | None = None,
               value: str | None = None, meta: Sequence[str] = ()) -> Run:
        """Like ``run``, but return the Run as soon as it exists, processed by a thread of this process and its
        workers; ``run.wait()`` waits for its end (a bad input still raises here, before any run exists)."""
        from conveyor.client.inputs import Columns
        from conveyor.client.running import submit

        return submit(self, inputs, store=store, workers=workers, budget_usd=budget_usd, params=params,
                      progress=progress, columns=Columns(key, text, path, value, tuple(meta)))


def _shape_identity(stage: Stage) -> dict[str, Any]:
    """What a stage's place in the graph adds to its identity (nothing for a stage of one parent that is not a
    gather or a group, so such stages keep the config hash they always had)."""
    identity: dict[str, Any] = {}
    if len(stage.parents) > 1:
        identity["\u00a7after"] = list(stage.parents)
    if stage.kind == "gather":
        identity["\u00a7gather"] = {"on_child_failure": stage.on_child_failure}
    if stage.kind in GROUP_KINDS:
        identity["\u00a7group"] = {"by": _name_of(stage.by), "batch": stage.members_per_call,
                                    "fold": _name_of(stage.fold)}
    return identity


def _name_of(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', type(value).__qualname__)}"


def _batch(batch: bool | int, kind: str, name: str) -> tuple[bool, int | None]:
    """``batch=`` is the provider batch lane (True/False) on most stages, members per call (N) on group stages."""
    if kind in GROUP_KINDS:
        if batch is False:
            return False, None
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 2:
            raise PipelineError(f"stage {name!r}: batch={batch!r} on a {kind} stage is the number of members per "
                                "call (an integer >= 2, with fold=...); the provider batch lane is not for groups")
        return False, batch
    if not isinstance(batch, bool):
        raise PipelineError(f"stage {name!r}: batch={batch!r}; batch=True sends its model calls through the "
                            "provider batch lane (members per call, batch=N, is for group stages)")
    return batch, None


def _on_child_failure(value: str, kind: str, name: str) -> str:
    if value not in ON_CHILD_FAILURE:
        raise PipelineError(f"stage {name!r}: on_child_failure={value!r}; use \"fail\" or \"skip\"")
    if value != "fail" and kind != "gather":
        raise PipelineError(f"stage {name!r}: on_child_failure= is for gather stages (kind=\"gather\")")
    return value


def _by(by: Any, kind: str, name: str) -> Callable[[Any], Any] | str | None:
    if kind == "group":
        if by is None:
            raise PipelineError(f"stage {name!r}: a group stage needs by= (a function of its parent's output, or "
                                "\"meta.FIELD\"); kind=\"reduce\" is one group for the whole run")
        if isinstance(by, str):
            field_name = by.removeprefix("meta.")
            if not by.startswith("meta.") or not field_name:
                raise PipelineError(f"stage {name!r}: by={by!r}; give \"meta.FIELD\" (a field of the item's "
                                    "manifest meta) or a function of the parent's output")
            return by
        if not callable(by):
            raise PipelineError(f"stage {name!r}: by={by!r} is neither a function nor \"meta.FIELD\"")
        return cast(Callable[[Any], Any], by)
    if by is not None:
        raise PipelineError(f"stage {name!r}: by= is for group stages (kind=\"group\")")
    return None


def _fold(fold: Any, per_call: int | None, kind: str, name: str) -> Callable[..., Any] | None:
    if fold is not None and kind not in GROUP_KINDS:
        raise PipelineError(f"stage {name!r}: fold= is for group and reduce stages")
    if fold is not None and not callable(fold):
        raise PipelineError(f"stage {name!r}: fold={fold!r} is not a function")
    if (fold is None) != (per_call is None):
        raise PipelineError(f"stage {name!r}: batch=N and fold= go together: a group called on batches of N "
                            "members needs fold(ctx, key, partial_outputs) to combine them")
    return cast(Callable[..., Any] | None, fold)


def config_hash(stage: str, config: Mapping[str, Any]) -> str:
    """The hash of a stage's config from its canonical JSON (sorted keys, no spaces; a tuple is a list),
    the same in every process. A value JSON cannot hold as it is is a declaration error."""
    return hashlib.sha256(config_text(stage, config).encode()).hexdigest()[:16]


def config_text(stage: str, config: Mapping[str, Any]) -> str:
    """A stage's config as canonical JSON (what its hash is taken of)."""
    _check_json_like(stage, "config", config)
    return json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _check_json_like(stage: str, where: str, value: Any) -> None:
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PipelineError(f"stage {stage!r}: {where} is {value!r}; config numbers must be finite")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PipelineError(f"stage {stage!r}: {where} has the key {key!r} ({type(key).__name__}); "
                                    "config keys must be strings")
            _check_json_like(stage, f"{where}[{key!r}]", item)
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json_like(stage, f"{where}[{index}]", item)
        return
    raise PipelineError(f"stage {stage!r}: {where} is a {type(value).__name__}; config values must be JSON-like "
                        "(str, number, bool, None, lists and dicts with str keys) so that their hash is the same in "
                        "every process")


# Provenance names conveyor records itself (or reads from a task's columns): a stage cannot declare them.
BUILTIN_PROVENANCE = frozenset({"stage_version", "version", "config_hash", "code", "source", "model", "revision",
                                "prompt_version"})
PROVENANCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def provenance_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a provenance value, or None."""
    if not isinstance(name, str) or not PROVENANCE_NAME.fullmatch(name):
        return f"{name!r} is not a provenance name (a letter or _, then letters, digits, _ . -; at most 64)"
    if name in BUILTIN_PROVENANCE:
        return f"{name!r} is recorded by conveyor itself ({', '.join(sorted(BUILTIN_PROVENANCE))})"
    return None


def declared_provenance(stage: str, provenance: Mapping[str, Any] | None) -> dict[str, str]:
    """``provenance={"parser": "1.24.9"}`` checked: names as ``provenance_name_problem`` allows, values
    strings or numbers (kept as text; they compare as versions)."""
    checked: dict[str, str] = {}
    for name, value in (provenance or {}).items():
        problem = provenance_name_problem(name)
        if problem:
            raise PipelineError(f"stage {stage!r}: provenance {problem}")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or str(value) == "":
            raise PipelineError(f"stage {stage!r}: provenance[{name!r}] is {value!r}; give a version as a "
                                "non-empty string (\"1.24.9\") or a number")
        checked[name] = str(value)
    return checked


def _accept(accept: Accept | None) -> Accept | None:
    if accept is not None and not isinstance(accept, Accept):
        raise PipelineError(f"accept={accept!r}: pass conveyor.acceptance.Accept(...)")
    return accept


def _collection(into: str | Target | None, kind: str) -> str | Target | None:
    if into is None:
        return None
    if kind != "publish":
        raise PipelineError(f"into={into!r} is for publish stages (kind=\"publish\"): they publish into it")
    if isinstance(into, Target) and not isinstance(into, str):
        return into
    if not isinstance(into, str) or not into.strip() or len(into) > 200:
        raise PipelineError(f"into={into!r}: name a collection of the built-in target (a short non-empty string), "
                            "or pass an object with published(key) and publish(key, record)")
    return into


def _positive(what: str, value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise PipelineError(f"{what}={value!r} must be > 0")
    return None if value is None else float(value)


def _megabytes(value: float | None) -> int | None:
    checked = _positive("max_memory_mb", value)
    return None if checked is None else int(checked * 2**20)


def _positive_int(what: str, value: int | None) -> int | None:
    if value is not None and (not isinstance(value, int) or value <= 0):
        raise PipelineError(f"{what}={value!r} must be a positive integer")
    return value
