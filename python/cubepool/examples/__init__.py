"""Real allocation traces bundled with cubepool.

Recorded with ``torch.profiler`` from HuggingFace GPT-2 training and generation and
``torch.nn.Transformer`` training on a CPU; see ``data/README.md`` for their details.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_SUFFIX = ".jsonl.gz"


def _data() -> Path:
    return Path(str(resources.files(__package__) / "data"))


def names() -> list[str]:
    """The names of the bundled traces, sorted."""
    return sorted(p.name[: -len(_SUFFIX)] for p in _data().glob(f"*{_SUFFIX}"))


def path(name: str) -> Path:
    """The path of the bundled trace ``name``; raises ``LookupError`` naming the choices."""
    candidate = _data() / f"{name}{_SUFFIX}"
    if not candidate.is_file():
        raise LookupError(f"no bundled trace {name!r}; choose one of {', '.join(names())}")
    return candidate


__all__ = ["names", "path"]
