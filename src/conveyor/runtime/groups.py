"""Group stages at work: a group's members as a stage input, and large groups called on batches folded up a tree.

A group task's input is a ``members`` value: its group key and its members' (item key, output reference) in
item-key order. Its digest hashes those pairs, so an unchanged group is a memo lookup on a re-run.

With ``batch=N`` and ``fold=``, a group of more than N members is called on batches and its partial outputs are
folded. Batch boundaries are chosen by content (after a member whose key hashes to 0 mod N, or after 4N members
without one), so adding a member changes its own batch and the folds above it, about log(members / N) calls, not
every batch. Every batch and fold step is memoised by its own content (``StepMemo``: the outputs table, under a
key of the stage's declaration and the step's inputs).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import orjson

from conveyor.blobs import Blobs
from conveyor.pipeline import Stage
from conveyor.runtime.values import Ref, _inline, _ref_json, load_value

MEMBERS = "members"
REDUCE_KEY = "*"  # the one group of a reduce stage
MAX_BATCH_FACTOR = 4  # a batch ends after this many times N members even without a boundary


def members_value(group_key: str, members: Sequence[tuple[str, Ref]]) -> tuple[str, bytes]:
    """(kind, bytes) of a group's input: its key and its members (item key, output) in item-key order."""
    return MEMBERS, orjson.dumps({"g": group_key, "m": [[key, _ref_json(ref)] for key, ref in members]})


class Members:
    """A group's members as its stage function sees them: ``len``, iteration over (item key, output value) in
    item-key order (each value read when it is reached: a large group is never held whole), ``keys()``."""

    def __init__(self, refs: Sequence[tuple[str, Ref]], blobs: Blobs) -> None:
        self.refs = list(refs)
        self._blobs = blobs

    def __len__(self) -> int:
        return len(self.refs)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for key, ref in self.refs:
            yield key, load_value(ref, self._blobs)

    def keys(self) -> list[str]:
        return [key for key, _ in self.refs]

    def __getstate__(self) -> dict[str, Any]:  # handed to a guarded child process: values travel, not blobs
        return {"values": list(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.refs = []
        self._blobs = None  # type: ignore[assignment]
        self._values = state["values"]
        self.__class__ = _LoadedMembers


class _LoadedMembers(Members):
    _values: list[tuple[str, Any]]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self._values)

    def keys(self) -> list[str]:
        return [key for key, _ in self._values]


class Group(NamedTuple):
    """A group task's loaded input."""

    key: str
    members: Members


def load_group(data: bytes, blobs: Blobs) -> Group:
    body = orjson.loads(data)
    refs = [(key, Ref(r["k"], r["d"], r["n"], _inline(r))) for key, r in body["m"]]
    return Group(body["g"], Members(refs, blobs))


def cut(names: Sequence[str], size: int) -> list[tuple[int, int]]:
    """Content-defined pieces of ``names`` (start, end): a piece ends after a name whose hash is 0 mod ``size``,
    or after ``MAX_BATCH_FACTOR * size`` names; an insertion moves the boundaries of its own piece only."""
    pieces, start = [], 0
    for index, name in enumerate(names):
        boundary = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % size == 0
        if boundary or index + 1 - start >= MAX_BATCH_FACTOR * size:
            pieces.append((start, index + 1))
            start = index + 1
    if start < len(names):
        pieces.append((start, len(names)))
    return pieces


def step_key(stage: Stage, params: Any, kind: str, group_key: str, digests: Sequence[str]) -> str:
    """The memo key of one batch or fold step: the stage's declaration, the run parameters it reads, the group's
    key and the digests of what the step takes, in order."""
    values = orjson.dumps({n: params[n] for n in stage.params} if stage.params else {}, option=orjson.OPT_SORT_KEYS)
    head = f"{stage.name}\0{stage.version}\0{stage.config_hash}\0{kind}\0{group_key}\0".encode()
    return hashlib.sha256(head + values + b"\0" + "\0".join(digests).encode()).hexdigest()


class StepMemo:
    """The memo of batch and fold steps: read from the outputs table (through a connection of each calling
    thread's own); the steps made here are ``kept`` and written with the group task's commit (transitions)."""

    def __init__(self, store_url: str | None, run_id: str, stage: str) -> None:
        self.store_url, self.run_id, self.stage = store_url, run_id, stage
        self.made = 0  # steps called here (the rest were answered from the memo)
        self.kept: list[Any] = []  # NewOutput rows of the steps made here

    def lookup(self, key: str) -> Ref | None:
        store = _thread_store(self.store_url)
        if store is None:
            return None
        hit = store.memo_rows([key]).get(key)
        if hit is None or hit[1] == "failed":
            return None
        return Ref(hit[1], hit[2], hit[4], hit[3])

    def keep(self, key: str, ref: Ref, now: float) -> None:
        from conveyor.store import NewOutput

        self.kept.append(NewOutput(key, self.stage, ref.kind, ref.digest, ref.inline, ref.size, self.run_id, now))


_local = threading.local()


def _thread_store(url: str | None) -> Any:
    if url is None:
        return None
    stores = getattr(_local, "stores", None)
    if stores is None:
        stores = _local.stores = {}
    if url not in stores:
        from conveyor.store import open_store

        stores[url] = open_store(url, migrate=False)
    return stores[url]


class Tree:
    """The steps of a large group: its batches, then folds of their outputs, level by level, until one is left.
    ``next_step`` says what to call (a batch of members or a fold of parts) and ``done_step`` takes its output;
    steps answered by the memo are skipped (``Tree`` asks it first)."""

    def __init__(self, stage: Stage, params: Any, group: Group, memo: StepMemo,
                 store_value: Callable[[Any], Ref], load: Callable[[Ref], Any], now: Callable[[], float]) -> None:
        assert stage.members_per_call is not None
        self.stage, self.params, self.group, self.memo = stage, params, group, memo
        self.size = stage.members_per_call
        self._store, self._load, self._now = store_value, load, now
        refs = group.members.refs
        self._level: list[tuple[str, Sequence[Any]]] = [
            ("batch", refs[a:b]) for a, b in cut([k for k, _ in refs], self.size)]
        self._outputs: list[Ref] = []

    def steps(self) -> Iterator[tuple[str, str, Any]]:
        """(kind, memo key, argument) of each step to call, in order; send nothing back: call ``made``."""
        while True:
            for kind, part in self._level:
                if kind == "fold" and len(part) == 1:  # nothing to fold: the part goes up as it is
                    self._outputs.append(part[0])
                    continue
                digests = ([f"{k}\0{r.digest}" for k, r in part] if kind == "batch" else [r.digest for r in part])
                key = step_key(self.stage, self.params, kind, self.group.key, digests)
                hit = self.memo.lookup(key)
                if hit is not None:
                    self._outputs.append(hit)
                    continue
                argument = (Members(part, self.group.members._blobs) if kind == "batch"
                            else [self._load(r) for r in part])
                self._pending = key
                yield kind, key, argument
            if len(self._outputs) == 1:
                return
            outputs, self._outputs = self._outputs, []
            pieces = cut([r.digest for r in outputs], self.size)
            if len(pieces) == len(outputs):  # no boundary left anything to fold: fold them all at once
                pieces = [(0, len(outputs))]
            self._level = [("fold", outputs[a:b]) for a, b in pieces]

    def made(self, value: Any) -> None:
        ref = self._store(value)
        self.memo.keep(self._pending, ref, self._now())
        self.memo.made += 1
        self._outputs.append(ref)

    @property
    def result(self) -> Ref:
        assert len(self._outputs) == 1
        return self._outputs[0]
