"""Stream the items of ``--input``: a folder, one file, or a JSONL manifest."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import orjson

from conveyor.errors import InputError

MANIFEST_SUFFIXES = (".jsonl", ".ndjson")
_HINT = 'each line must be {"key": "...", "path": "..."} or {"key": "...", "text": "..."}'


class SourceItem(NamedTuple):
    """One input item: its key and either a file path or its text (a NamedTuple: one per manifest line)."""

    key: str
    path: Path | None = None
    text: bytes | None = None


def iter_items(input_path: str | os.PathLike[str]) -> Iterator[SourceItem]:
    """Yield items lazily; never holds a folder listing or a manifest whole."""
    path = Path(input_path)
    if not path.exists():
        raise InputError(f"--input {str(path)!r} does not exist; give a folder, a file or a manifest.jsonl")
    if path.is_dir():
        yield from _walk(path)
    elif path.suffix in MANIFEST_SUFFIXES:
        yield from _manifest(path)
    else:
        _check_readable(path, f"--input {str(path)!r}")
        yield SourceItem(path.name, path=path)


def _walk(root: Path) -> Iterator[SourceItem]:
    """Each file below ``root`` is an item keyed by its relative path, in a stable order."""
    for folder, dirs, files in os.walk(root, onerror=_walk_error):
        dirs.sort()
        for name in sorted(files):
            full = Path(folder, name)
            if full.is_file():
                yield SourceItem(full.relative_to(root).as_posix(), path=full)


def _walk_error(exc: OSError) -> None:
    raise InputError(f"cannot read folder {exc.filename!r}: {exc.strerror}; fix its permissions") from None


def _manifest(path: Path) -> Iterator[SourceItem]:
    _check_readable(path, f"manifest {str(path)!r}")
    base = path.parent
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if raw.strip():
                yield _manifest_line(raw, base, path, number)


def _manifest_line(raw: bytes, base: Path, path: Path, number: int) -> SourceItem:
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{path}:{number}: not valid JSON ({exc}); {_HINT}") from None
    if not isinstance(entry, dict):
        raise InputError(f"{path}:{number}: not a JSON object; {_HINT}")
    key = entry.get("key")
    if not isinstance(key, str) or not key:
        raise InputError(f"{path}:{number}: missing or empty \"key\"; {_HINT}")
    text = entry.get("text")
    if isinstance(text, str):
        return SourceItem(key, None, text.encode())
    where = f"{path}:{number}"
    if isinstance(entry.get("path"), str):
        full = (base / entry["path"]) if not os.path.isabs(entry["path"]) else Path(entry["path"])
        _check_readable(full, f"{where}: path {entry['path']!r}")
        return SourceItem(key, path=full)
    raise InputError(f"{where}: needs \"path\" or \"text\"; {_HINT}")


def _check_readable(path: Path, what: str) -> None:
    if not path.is_file():
        raise InputError(f"{what} is not a readable file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{what} is not readable; fix its permissions")
