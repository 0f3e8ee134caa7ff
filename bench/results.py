"""bench/RESULTS.md: each bench script owns a section between two markers and rewrites only that one."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def markers(script: str) -> tuple[str, str]:
    return f"<!-- bench/{script}:begin -->", f"<!-- bench/{script}:end -->"


def write_section(script: str, section: str, path: Path = RESULTS) -> None:
    """Replace ``script``'s section (``section`` holds its markers), or add it at the end; the rest stays."""
    begin, end = markers(script)
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
    print(f"wrote {path}")
