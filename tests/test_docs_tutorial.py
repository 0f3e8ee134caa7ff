"""docs/tutorial.md, run as a reader would: every ```bash block in order, in one shell, in an empty folder,
with the files it says to save (a code block with ``title="FILE"``) written where the page shows them.

A command whose line ends in ``# exits N`` must exit N; every other command must exit 0 (the script runs
under ``set -e``). The simulator's port is swapped for a free one, so runs in parallel do not collide.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r'^```(?P<lang>[\w-]*)(?:[ \t]+title="(?P<title>[^"]+)")?[ \t]*\n(?P<body>.*?)^```[ \t]*$',
                   re.M | re.S)
EXITS = re.compile(r"^(?P<command>.*?)\s+# exits (?P<code>\d+)\s*$")
PORT = "8765"


def steps(text: str) -> list[tuple[str, str]]:
    """The page's runnable blocks in order: ("file", name + body) for a file to save, ("bash", body)."""
    found = []
    for block in BLOCK.finditer(text):
        if block["title"]:
            found.append(("file", f"{block['title']}\n{block['body']}"))
        elif block["lang"] == "bash":
            found.append(("bash", block["body"]))
    return found


def script(text: str, port: str) -> str:
    """One bash script: the files written, each bash block's lines with ``# exits N`` checked."""
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for n, (kind, body) in enumerate(steps(text.replace(PORT, port))):
        if kind == "file":
            name, content = body.split("\n", 1)
            lines.append(f"cat > {name} <<'TUTORIAL_FILE_{n}'\n{content}TUTORIAL_FILE_{n}")
            continue
        lines.append(f"echo '::: block {n}' >&2")
        for line in body.splitlines():
            expected = EXITS.match(line)
            if expected is None:
                lines.append(line)
                continue
            command, code = expected["command"], expected["code"]
            lines.append(f"rc=0; {command} || rc=$?")
            lines.append(f'[ "$rc" = {code} ] || {{ echo "tutorial: {command!r} exited $rc, the page says {code}" >&2;'
                         " exit 99; }")
    return "\n".join(lines) + "\n"


def test_the_tutorial_has_what_the_suite_runs() -> None:
    found = steps(TUTORIAL.read_text(encoding="utf-8"))
    assert [body.split("\n", 1)[0] for kind, body in found if kind == "file"] == ["notes.py"]
    commands = "\n".join(body for kind, body in found if kind == "bash")
    for needed in ("provider-sim", "review approve", "--set prompt=notes@2", "export", "--format csv", "search"):
        assert needed in commands, needed


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


@pytest.mark.skipif(shutil.which("curl") is None, reason="the tutorial waits for the simulator with curl")
def test_every_command_of_the_tutorial_runs_as_it_says(tmp_path: Path) -> None:
    text = TUTORIAL.read_text(encoding="utf-8")
    (tmp_path / "tutorial.sh").write_text(script(text, _free_port()), encoding="utf-8")
    bin_dir = Path(sys.executable).parent
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("CONVEYOR_", "OPENAI_", "ANTHROPIC_", "OTEL_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])))
    assert shutil.which("conveyor", path=env["PATH"]), "the conveyor command is not installed beside this Python"
    done = subprocess.run(["bash", "tutorial.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    out = done.stdout
    # What the page says the reader sees.
    assert "awaiting_review" in out and "gzip.txt" in out
    assert "0 stage calls, 24 from the memo, 0 model calls" in out
    assert "version 2 is live" in out or '"live_version": 2' in out
    assert "item_key,outcome" in out
    assert (tmp_path / "notes.csv").read_text().count("\n") == 9  # a header and eight notes
