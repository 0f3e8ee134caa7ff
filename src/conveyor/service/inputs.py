"""Stream the items of ``--input``: a folder, one file, a JSONL manifest, a table or an S3 prefix.

Every entry becomes an item with an outcome. A source that cannot be read (a
missing, unreadable or vanished file, a folder, a FIFO, a dangling symlink) is
an item with a ``problem``: it ends ``failed`` with error class ``bad_input``,
so a batch of millions is never refused because a few files are broken
(``strict`` keeps the old all-or-nothing refusal). A manifest line that is not
a JSON object with a usable ``key`` is the user's to fix: ``check_input`` finds
it, and any duplicate key, before a run is created; with ``skip_bad_lines``
such a line becomes a ``bad_input`` item keyed ``<manifest>:<line>``.

Keys: a folder's items are keyed by their path relative to it, made printable
and unambiguous (``printable_name``); manifest keys are taken as written, but
may not hold control characters or the fan-out mark (``store.CHILD_MARK``),
which names child items, and may not be longer than ``MAX_KEY_CHARS``.

Tables (``--key COL --text|--path|--value COL``: service/tables.py) and S3 prefixes (``s3://bucket/prefix/``:
service/buckets.py) follow the same rules; their readers are imported only when an input names them, since
they need pyarrow and boto3.
"""

from __future__ import annotations

import array
import hashlib
import logging
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import orjson

from conveyor.errors import InputError
from conveyor.pipeline.graph import GROUP_PREFIX
from conveyor.store import CHILD_MARK

log = logging.getLogger("conveyor.submit")

MANIFEST_SUFFIXES = (".jsonl", ".ndjson")
TABLE_INPUT = "table:"  # a run's input label for a table read by columns (service/tables.py table_input)
S3_INPUT = "s3://"  # an S3 prefix listed as items (service/buckets.py)
BOM = b"\xef\xbb\xbf"
MAX_KEY_CHARS = 1000  # an index entry holds the key twice; PostgreSQL caps an entry near 2,700 bytes
_HINT = 'each line must be {"key": "...", "path": "..."} or {"key": "...", "text": "..."} (optionally "meta": {...})'
_TEXT_HINT = 'each line must be {"key": "...", "text": "..."} (optionally "meta": {...})'
_NO_SOURCE = 'needs "path" or "text" (a string)'
_CONTROL = {c for c in range(0x20)} | {0x7F} | set(range(0x80, 0xA0))
_BAD_KEY_CHAR = re.compile(f"^{GROUP_PREFIX}|[\x00-\x1f\x7f-\x9f{CHILD_MARK}]")
_NEEDS_ESCAPE = re.compile(f"[\\\\\x00-\x1f\x7f-\x9f{CHILD_MARK}\udc80-\udcff]")


class RemoteSource(Protocol):
    """An item's bytes kept elsewhere (an S3 object), read when the item is submitted."""

    @property
    def url(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def version(self) -> str:
        """What changes when the bytes change (an ETag): names a source too large to read."""
        ...

    def chunks(self) -> Iterator[bytes]:
        """The bytes, streamed; OSError when they cannot be read (gone, refused)."""
        ...


class SourceItem(NamedTuple):
    """One input item: its key and either a file path, its text, a remote source, or why it has no readable
    source."""

    key: str
    path: Path | None = None
    text: bytes | None = None
    problem: str | None = None  # set: the item ends failed with error class bad_input
    meta: dict[str, Any] | None = None  # a manifest line's "meta" object: for checks of meaning and reports
    remote: RemoteSource | None = None  # an object in S3 (--input s3://...)

    @property
    def where(self) -> str:
        """Where the item's bytes are read from, for messages."""
        return self.remote.url if self.remote is not None else str(self.path)


class BadLine(NamedTuple):
    """A manifest line that is not a JSON object with a usable key and source, and why."""

    message: str


def check_input(input_path: str | os.PathLike[str], skip_bad_lines: bool = False) -> None:
    """Refuse, before anything is created, an input that does not exist or a manifest with a bad line
    (unless ``skip_bad_lines``) or a key given twice. Streams the manifest; holds 8 bytes per key."""
    named = str(input_path)
    if named.startswith(TABLE_INPUT):
        from conveyor.service.tables import check_table_input

        check_table_input(named, skip_bad_lines)
        return
    if named.startswith(S3_INPUT):
        from conveyor.service.buckets import check_prefix

        check_prefix(named)
        return
    path = Path(input_path)
    if not path.exists() and not path.is_symlink():
        raise InputError(f"--input {str(path)!r} does not exist; give a folder, a file or a manifest.jsonl")
    if path.is_dir() or path.suffix not in MANIFEST_SUFFIXES:
        return
    _check_readable(path, f"manifest {str(path)!r}")
    twice = _repeated_hashes(_manifest_keys(path, skip_bad_lines))
    if twice:
        _report_duplicate(path, twice, skip_bad_lines)


def check_manifest(path: str | os.PathLike[str], label: str = "manifest") -> int:
    """Refuse a manifest of texts before anything is created, and return how many items it holds.

    The file is read whatever its name (an upload kept in the blob store has no suffix). Each line must
    be ``{"key": ..., "text": ...}`` with an optional ``"meta"`` object; a line that names a ``"path"`` is
    refused, since its reader (a server) never opens a file a client names. A bad line, a key given twice
    or no line at all is an InputError that names the line as ``{label} line N``. Streams the file and
    holds 8 bytes per key.
    """
    count = 0

    def keys() -> Iterator[str]:
        nonlocal count
        for _, key, _ in _text_entries(Path(path), label):
            count += 1
            yield key

    twice = _repeated_hashes(keys())
    if twice:
        repeat = _first_repeat(((n, k) for n, k, _ in _text_entries(Path(path), label)), twice)
        if repeat is not None:
            number, key, earlier = repeat
            raise InputError(f"{label} line {number}: key {key!r} is also on line {earlier}; "
                             "keys must be unique within a manifest")
    if not count:
        raise InputError(f"{label} has no items; {_TEXT_HINT}, one per line")
    return count


def manifest_items(path: str | os.PathLike[str]) -> Iterator[SourceItem]:
    """The items of a manifest of texts that passed ``check_manifest``, streamed."""
    for _, key, entry in _text_entries(Path(path), "manifest"):
        meta = entry.get("meta")
        yield SourceItem(key, text=entry["text"].encode(), meta=meta)


def _text_entries(path: Path, label: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, key, entry) of each line of a manifest of texts; InputError at the first bad line."""
    for number, raw in _lines(path):
        parsed = _parse(raw)
        if isinstance(parsed, BadLine):
            raise InputError(f"{label} line {number}: {_text_message(parsed)}; {_TEXT_HINT}")
        key, entry = parsed
        if "path" in entry:
            raise InputError(f'{label} line {number}: "path" is not taken here (no file a client names is read); '
                             'send the document as "text"')
        if type(entry.get("text")) is not str:
            raise InputError(f"{label} line {number}: {_text_message(BadLine(_NO_SOURCE))}; {_TEXT_HINT}")
        yield number, key, entry


def _text_message(bad: BadLine) -> str:
    return 'needs "text" (a string)' if bad.message == _NO_SOURCE else bad.message


def manifest_signature(input_path: str | os.PathLike[str], skip_bad_lines: bool) -> tuple[str, str] | None:
    """(path, signature) of a manifest as it is now (host, device, inode, size, modification time, and
    the option the check depends on), or None for other inputs: a manifest with the signature of one that
    passed ``check_input`` passes again, so it need not be read twice. A table's signature also holds its
    columns (service/tables.py); an S3 prefix has none (its check is one listing call)."""
    if str(input_path).startswith(TABLE_INPUT):
        from conveyor.service.tables import table_signature

        return table_signature(str(input_path), skip_bad_lines)
    path = Path(input_path)
    if path.suffix not in MANIFEST_SUFFIXES or not path.is_file():
        return None
    return str(path.resolve()), file_signature(path, skip_bad_lines)


def file_signature(path: Path, *options: object) -> str:
    """What identifies a file as it is now (host, device, inode, size, modification time), and ``options``."""
    info = path.stat()
    return ":".join([os.uname().nodename, str(info.st_dev), str(info.st_ino), str(info.st_size),
                     str(info.st_mtime_ns), *map(str, options)])


def iter_items(input_path: str | os.PathLike[str], *, skip_bad_lines: bool = False,
               strict: bool = False, own: Iterable[str] = ()) -> Iterator[SourceItem]:
    """Yield items lazily; never holds a folder listing or a manifest whole. ``own``: conveyor's own
    files and folders (the store, its blobs), which a folder walk passes over, saying so."""
    named = str(input_path)
    if named.startswith(TABLE_INPUT):
        from conveyor.service.tables import table_input_items

        yield from table_input_items(named, skip_bad_lines=skip_bad_lines, strict=strict)
        return
    if named.startswith(S3_INPUT):
        from conveyor.service.buckets import prefix_items

        yield from prefix_items(named, strict=strict)
        return
    path = Path(input_path)
    if path.is_dir():
        yield from _walk(path, strict, skip=_inside(path, own))
    elif path.suffix in MANIFEST_SUFFIXES:
        yield from _manifest(path, skip_bad_lines, strict)
    else:
        _check_readable(path, f"--input {str(path)!r}")
        yield SourceItem(printable_name(os.fsencode(path.name)), path=path)


def line_key(manifest: Path, number: int) -> str:
    """The key of a manifest line that had none usable (``--skip-bad-lines``)."""
    return f"{printable_name(os.fsencode(manifest.name))}:{number}"


def printable_name(raw: bytes) -> str:
    """A file name as a key: UTF-8 names as they are, except that bytes that are not UTF-8 become
    ``\\xNN``, control characters ``\\xNN``, the fan-out mark ``\\u00b6``, and a backslash ``\\\\``, so
    every name has its own key (no two names can meet) and the key prints readably."""
    text = raw.decode("utf-8", "surrogateescape")
    if text.startswith(GROUP_PREFIX):  # group items' keys are the group stages' (``group:KEY``)
        return "group\\x3a" + printable_name(text[len(GROUP_PREFIX):].encode("utf-8", "surrogateescape"))
    if _NEEDS_ESCAPE.search(text) is None:
        return text
    out = []
    for char in text:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code in _CONTROL:  # \xNN below 0x80 is a control character, from 0x80 a byte that is not UTF-8
            out.append(f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}")
        elif char == CHILD_MARK:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


# --- folders ----------------------------------------------------------------------------------------

def _inside(root: Path, own: Iterable[str]) -> frozenset[str]:
    """The paths in ``own`` that lie below ``root``, relative to it."""
    base = os.path.realpath(root)
    return frozenset(os.path.relpath(path, base) for path in map(os.path.realpath, own)
                     if path.startswith(base + os.sep))


def _walk(root: Path, strict: bool, prefix: str = "", skip: frozenset[str] = frozenset(),
          relative: str = "") -> Iterator[SourceItem]:
    """Each entry below ``root``, keyed by its relative path, in a stable order; nothing skipped but
    conveyor's own files (``skip``, relative paths)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: os.fsencode(e.name))
    except OSError as exc:
        if strict or not prefix:
            raise InputError(f"cannot read folder {str(root)!r}: {exc.strerror}; fix its permissions") from None
        yield SourceItem(prefix, problem=f"cannot list folder {str(root)!r}: {exc.strerror}")
        return
    for entry in entries:
        if skip and relative + entry.name in skip:
            log.warning("--input holds conveyor's own %s; it is not an item", entry.path,
                        extra={"event": "own_file_skipped"})
            continue
        key = _fit(prefix + printable_name(os.fsencode(entry.name)))
        full = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(full, strict, key + "/", skip, relative + entry.name + os.sep)
            continue
        problem = source_problem(full)
        if problem is not None and strict:
            raise InputError(f"{str(full)!r} {problem}; fix or remove it (or leave out --strict-inputs)")
        yield SourceItem(key, path=full if problem is None else None, problem=problem)


def _fit(key: str) -> str:
    """A folder key of at most MAX_KEY_CHARS: a deeper path keeps its start and ends in a hash of the whole."""
    if len(key) <= MAX_KEY_CHARS:
        return key
    return f"{key[:MAX_KEY_CHARS - 20]}…{hashlib.sha256(key.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def source_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an item's source, or None when it is a readable regular file."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return "is a symlink to a missing file" if path.is_symlink() else "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISDIR(info.st_mode):
        return ("is a symlink to a folder (folder links are not followed; list its files in a manifest)"
                if path.is_symlink() else "is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        return f"is a {_file_type(info.st_mode)}, not a regular file"
    if not os.access(path, os.R_OK):
        return "is not readable (permission denied)"
    return None


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


# --- Python objects (the Python API's inputs) ---------------------------------------------------------------

MEMORY_INPUT = "python:"
"""A run submitted from Python objects records as its input this and the objects' type (``python:list``): a label,
never a path to read again, so a resume of its submission needs the objects again."""
_PAIR_HINT = ('give (key, value) pairs, the value bytes, str or a JSON-able dict, or dicts like manifest lines: '
              '{"key": ..., "text": ...} or {"key": ..., "path": ...} (optionally "meta": {...})')


def memory_input(label: str) -> bool:
    """Whether a run's recorded input names Python objects (``MEMORY_INPUT``) rather than a path."""
    return label.startswith(MEMORY_INPUT)


def memory_items(entries: Iterable[Any], strict: bool = False) -> list[SourceItem]:
    """The items of Python objects, each a ``(key, value)`` pair or a dict shaped like a manifest line, checked as a
    manifest is before anything is created: a bad entry or a key given twice is an InputError naming the entry by
    its index (``inputs[3]``). A value that is ``bytes`` is the item's source as it is, a ``str`` its UTF-8 bytes,
    a ``dict`` its JSON text with sorted keys, compact (``orjson.dumps(value, option=orjson.OPT_SORT_KEYS)``, as a
    table's ``--value`` column).
    A dict's ``"path"`` is read relative to the current folder. Read whole (to check the keys before the run
    exists): for millions of items, write a manifest."""
    items: list[SourceItem] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(entries):
        item = _memory_item(entry, f"inputs[{index}]", strict)
        earlier = seen.setdefault(item.key, index)
        if earlier != index:
            raise InputError(f"inputs[{index}]: key {item.key!r} is also inputs[{earlier}]; keys must be unique "
                             "within a run's inputs")
        items.append(item)
    return items


def _memory_item(entry: Any, where: str, strict: bool) -> SourceItem:
    if isinstance(entry, dict):
        parsed = _checked(entry)
        if isinstance(parsed, BadLine):
            raise InputError(f"{where}: {parsed.message}; {_PAIR_HINT}")
        key, checked = parsed
        text, meta = checked.get("text"), checked.get("meta")
        item = SourceItem(key, text=text.encode()) if type(text) is str else _given_path(key, checked["path"], where,
                                                                                         strict)
        return item if meta is None else item._replace(meta=meta)
    if not isinstance(entry, tuple | list) or len(entry) != 2:
        raise InputError(f"{where}: a {type(entry).__name__} is not an input; {_PAIR_HINT}")
    key, value = entry
    if not isinstance(key, str) or not key:
        raise InputError(f"{where}: the key must be a non-empty str, not {key!r}; {_PAIR_HINT}")
    problem = key_problem(key)
    if problem is not None:
        raise InputError(f"{where}: {problem}")
    return SourceItem(key, text=_source_bytes(value, where))


def _source_bytes(value: Any, where: str) -> bytes:
    """An item's source from its Python value: bytes as they are, str as UTF-8, a dict as sorted JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict):
        try:  # the rule of a table's --value column (service/tables.py): equal dicts, equal bytes, either way in
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: the value is a dict that is not JSON ({exc}); give JSON-able values") from None
    raise InputError(f"{where}: a value must be bytes, str or a dict, not {type(value).__name__}")


def _given_path(key: str, given: str, where: str, strict: bool) -> SourceItem:
    full = Path(given)
    problem = source_problem(full)
    if problem is None:
        return SourceItem(key, path=full.absolute())
    if strict:
        raise InputError(f"{where}: path {given!r} {problem}; fix it")
    return SourceItem(key, problem=f"path {given!r} ({where}) {problem}")


# --- manifests --------------------------------------------------------------------------------------

def _manifest(path: Path, skip_bad_lines: bool, strict: bool) -> Iterator[SourceItem]:
    _check_readable(path, f"manifest {str(path)!r}")
    base = path.parent
    for number, raw in _lines(path):
        usual = _usual(raw)
        if usual is not None:
            yield SourceItem(usual[0], None, usual[1].encode())
        else:
            yield _entry(path, base, number, raw, skip_bad_lines, strict)


def _usual(raw: bytes) -> tuple[str, str] | None:
    """(key, text) of the usual line, ``{"key": ..., "text": ...}`` with a good key and no "meta"; None for any
    other line (``_parse`` then says what it is). Runs twice per item of every submission: keep it lean."""
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(entry) is not dict or "meta" in entry:
        return None
    key, text = entry.get("key"), entry.get("text")
    if type(key) is str and type(text) is str and key and len(key) <= MAX_KEY_CHARS and _BAD_KEY_CHAR.search(key) \
            is None:
        return key, text
    return None


def _entry(path: Path, base: Path, number: int, raw: bytes, skip_bad_lines: bool, strict: bool) -> SourceItem:
    """The item of any manifest line (``_manifest``'s fast path takes the usual ones)."""
    key, entry, problem = _line(path, number, raw, skip_bad_lines)
    if entry is None:
        return SourceItem(key, problem=problem)
    text, meta = entry.get("text"), entry.get("meta")
    if type(text) is str:
        item = SourceItem(key, None, text.encode())
    else:
        item = _path_item(key, entry["path"], base, number, path, strict)
    return item if meta is None else item._replace(meta=meta)


def _manifest_keys(path: Path, skip_bad_lines: bool) -> Iterator[str]:
    """The key of each line, as ``_entries`` would give it (a bad line: an InputError, or its line key)."""
    for number, raw in _lines(path):
        usual = _usual(raw)
        yield usual[0] if usual is not None else _line(path, number, raw, skip_bad_lines)[0]


def _entries(path: Path, skip_bad_lines: bool) -> Iterator[tuple[int, str, dict[str, Any] | None, str | None]]:
    """(line number, key, entry, None) for each usable line. A bad line is an InputError, or with
    ``skip_bad_lines`` (line number, its line key, None, why)."""
    for number, raw in _lines(path):
        yield number, *_line(path, number, raw, skip_bad_lines)


def _line(path: Path, number: int, raw: bytes, skip_bad_lines: bool) -> tuple[str, dict[str, Any] | None, str | None]:
    """(key, entry, None) of a usable line; a bad one is an InputError, or (its line key, None, why)."""
    parsed = _parse(raw)
    if not isinstance(parsed, BadLine):
        return parsed[0], parsed[1], None
    if skip_bad_lines:
        return line_key(path, number), None, f"{path.name}:{number}: {parsed.message}"
    raise InputError(f"{path}:{number}: {parsed.message}; {_HINT} (or pass --skip-bad-lines)")


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each line that is not blank."""
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if raw.isspace():
                continue
            if number == 1 and raw.startswith(BOM):  # an editor's UTF-8 signature is not part of the line
                raw = raw[len(BOM):]
            yield number, raw


def _path_item(key: str, given: str, base: Path, number: int, manifest: Path, strict: bool) -> SourceItem:
    full = Path(given) if os.path.isabs(given) else base / given
    problem = source_problem(full)
    if problem is None:
        return SourceItem(key, path=full)
    if strict:
        raise InputError(f"{manifest}:{number}: path {given!r} {problem}; fix it (or leave out --strict-inputs)")
    return SourceItem(key, problem=f"path {given!r} (line {number}) {problem}")


def _parse(raw: bytes) -> tuple[str, dict[str, Any]] | BadLine:
    """(key, entry) of a usable manifest line, else why not."""
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return BadLine(f"not valid JSON ({exc})")
    return _checked(entry)


def _checked(entry: Any) -> tuple[str, dict[str, Any]] | BadLine:
    """(key, entry) of a usable manifest entry (a line, parsed; a dict given from Python), else why not."""
    if type(entry) is not dict:
        return BadLine("not a JSON object")
    key = entry.get("key")
    if type(key) is not str or not key:
        return BadLine('missing or empty "key"')
    if len(key) > MAX_KEY_CHARS or _BAD_KEY_CHAR.search(key) is not None:
        return BadLine(key_problem(key) or "bad key")
    if type(entry.get("text")) is not str and type(entry.get("path")) is not str:
        return BadLine(_NO_SOURCE)
    if "meta" in entry and type(entry["meta"]) is not dict:
        return BadLine('"meta" must be a JSON object, e.g. {"language": "en"}')
    return key, entry


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an item key, or None."""
    if len(key) > MAX_KEY_CHARS:
        return f"key of {len(key):,} characters; keys may have at most {MAX_KEY_CHARS:,}"
    bad = _BAD_KEY_CHAR.search(key)
    if bad is None:
        return None
    if bad.group() == CHILD_MARK:
        return f"key {key!r} holds {CHILD_MARK!r}, which names fan-out child items; use another character"
    if bad.group() == GROUP_PREFIX:
        return f"key {key!r} starts with {GROUP_PREFIX!r}, which names the items of group stages; rename it"
    return f"key {key!r} holds the control character {bad.group()!r}; keys must be printable"


def _repeated_hashes(keys: Iterable[str]) -> set[int]:
    """The hashes that more than one of ``keys`` has (held as 8 bytes per key, in 256 buckets)."""
    hashes = [array.array("q") for _ in range(256)]
    for key in keys:
        value = hash(key)
        hashes[value & 255].append(value)
    return {value for bucket in hashes if len(set(bucket)) != len(bucket) for value in _repeated(bucket)}


def _repeated(bucket: array.array[int]) -> set[int]:
    seen: set[int] = set()
    twice: set[int] = set()
    for value in bucket:
        (twice if value in seen else seen).add(value)
    return twice


def _report_duplicate(path: Path, hashes: set[int], skip_bad_lines: bool) -> None:
    """Find the first key given twice (a second streamed pass) and refuse it, naming both lines."""
    repeat = _first_repeat(((number, key) for number, key, _, _ in _entries(path, skip_bad_lines)), hashes)
    if repeat is not None:
        number, key, earlier = repeat
        raise InputError(f"{path}:{number}: key {key!r} is also on line {earlier}; "
                         "keys must be unique within a manifest")


def _first_repeat(entries: Iterable[tuple[int, str]], hashes: set[int]) -> tuple[int, str, int] | None:
    """(line, key, earlier line) of the first key given twice, looking only at keys with these hashes."""
    first: dict[str, int] = {}
    for number, key in entries:
        if hash(key) not in hashes:
            continue
        if key in first:
            return number, key, first[key]
        first[key] = number
    return None


def _check_readable(path: Path, what: str) -> None:
    problem = source_problem(path)
    if problem is not None:
        raise InputError(f"{what} {problem}")
