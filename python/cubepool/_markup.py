"""Text from a trace (a workload's name, a phase's, a frame) written into markup: the
SVG pictures and the interactive page's HTML.

A trace names things with any characters. Markup characters are escaped, and the
characters XML 1.0 forbids anywhere, even escaped (control characters, lone
surrogates, U+FFFE and U+FFFF), are shown as U+FFFD: one in an ``.svg`` file makes it
unreadable, and in an HTML page's title an escape sequence that a terminal showing the
file (``cat``, ``less -r``) would run.
"""

from __future__ import annotations

import html
import re
from typing import Final

__all__ = ["C1_CONTROLS", "NOT_XML", "markup_text"]

NOT_XML: Final = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""Characters XML 1.0 forbids anywhere, even escaped."""

C1_CONTROLS: Final = re.compile("[\x7f-\x9f]")
"""DEL and the C1 controls, which XML allows (and discourages) but a terminal runs (the
8-bit CSI, U+009B, starts an escape sequence as ESC [ does)."""


def markup_text(text: str) -> str:
    """``text`` as the text of an SVG or HTML element or attribute: markup escaped
    (quotes too), and the characters XML forbids (:data:`NOT_XML`) and DEL and the C1
    controls (:data:`C1_CONTROLS`) shown as U+FFFD."""
    return html.escape(C1_CONTROLS.sub("\ufffd", NOT_XML.sub("\ufffd", text)), quote=True)
