"""Text from a trace (a workload's name, a phase's, a frame) written into markup: the
SVG pictures, the interactive page's HTML and the ``.pgf`` pictures' LaTeX.

A trace names things with any characters. The characters XML 1.0 forbids anywhere,
even escaped (control characters, lone surrogates, U+FFFE and U+FFFF), and DEL and the
C1 controls, which XML allows but a terminal runs, are shown as U+FFFD
(:func:`shown_text`): one of the first in an ``.svg`` file makes it unreadable, and an
escape sequence in an HTML page's title is run by a terminal showing the file (``cat``,
``less -r``; the 8-bit CSI, U+009B, starts one as ESC [ does). Markup characters are
escaped besides (:func:`markup_text`).
"""

from __future__ import annotations

import html
import re
from typing import Final

__all__ = ["markup_text", "shown_text"]

_UNSHOWN: Final = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""What XML 1.0 forbids anywhere, and DEL and the C1 controls (U+007F to U+009F)."""


def shown_text(text: str) -> str:
    """``text`` with every character of :data:`_UNSHOWN` shown as U+FFFD."""
    return _UNSHOWN.sub("\ufffd", text)


def markup_text(text: str) -> str:
    """``text`` as the text of an SVG or HTML element or attribute: markup escaped
    (quotes too), the characters :func:`shown_text` replaces as U+FFFD."""
    return html.escape(shown_text(text), quote=True)
