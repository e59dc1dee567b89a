"""cubepool: GPU-style memory pools, driven from Python."""

from cubepool._cubepool import __version__

__all__ = ["__version__"]
