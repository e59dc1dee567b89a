"""Regenerate the README's command transcripts from what the commands print now.

A transcript is a command indented as a shell line and the ```text block right after it
(the same rule as ``tests/python/test_readme.py``, which checks them). Each command is
run in a fresh temporary folder with this Python's ``cubepool.cli``, and its block is
replaced by what it printed. Run it after a change to what a command prints, then read
the diff::

    python scripts/readme_transcripts.py [README.md]
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

TRANSCRIPT = re.compile(r"^(    (cubepool [^\n]+)\n\n```text\n)(.*?)^```", re.M | re.S)


def run(command: str) -> str:
    """What ``command`` (a ``cubepool ...`` line) prints, run in a fresh folder."""
    env = {k: v for k, v in os.environ.items() if k != "CUBEPOOL_MEMORY_POOLS"}
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-m", "cubepool.cli", *shlex.split(command)[1:]],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise SystemExit(f"{command!r} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def main(argv: list[str]) -> int:
    """Rewrites the README (``argv[0]``, else the repository's) in place."""
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(argv) > 1:
        print("usage: python scripts/readme_transcripts.py [README.md]", file=sys.stderr)
        return 2
    readme = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text(encoding="utf-8")

    def fresh(match: re.Match[str]) -> str:
        print(f"running: {match.group(2)}", file=sys.stderr)
        return match.group(1) + run(match.group(2)) + "```"

    readme.write_text(TRANSCRIPT.sub(fresh, text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
