"""The Disco example of README.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_disco_example_runs() -> None:
    text = README.read_text()
    section = text[text.index("## Disco: sessions") :]
    example = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert example is not None and "ProcessSession(4, num_groups=2)" in example.group(1)
    exec(compile(example.group(1), "README.md (Disco example)", "exec"), {})


def test_readme_has_a_two_node_socket_session_example() -> None:
    """The SocketSession example (run as a script by ``test_readme.py``, like every
    Python block) starts its second node with ``cubepool.disco.remote``."""
    text = README.read_text()
    section = text[text.index("### Nodes: `SocketSession`") :]
    example = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert example is not None
    assert "disco.SocketSession(2, 2, 1" in example.group(1)
    assert '"cubepool.disco.remote"' in example.group(1)
    assert "node1.wait(30) == 0" in example.group(1)
