"""The interactive HTML picture: one self-contained page (no network, no library) that
draws memory over time from a JSON payload with a small script.

Each panel is one layout: its pools' reserved bytes stacked, all bytes reserved, the bytes
in use (a band from the least to the most of each sample), the trace's peak live bytes
and its phases. Hovering shows, at the nearest sample, the time (or event), the bytes in
use and the bytes each pool reserves; the wheel zooms and dragging pans the time axis of
every panel at once (double-click or the button resets); the width follows the window;
the legend is HTML that wraps. Under the panels, the address space at each replay's peak
(:mod:`cubepool._interactive_peak`, from the payload's ``at_peak``). The static picture
(SVG) stays in the page for readers without scripts.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any, Final

from cubepool._interactive_peak import script as peak_script
from cubepool._markup import markup_text

__all__ = ["page"]

_STYLE: Final = """
body{font-family:sans-serif;margin:16px;color:#222}
h1{font-size:17px;margin:0 0 4px}
.hint{font-size:12px;color:#666;margin:0 0 10px}
.hint button{font-size:12px;margin-left:8px}
.panel{margin:0 0 18px}
.title{font-size:12px;margin:0 0 2px 64px}
.title.incomplete{color:#b00020;font-weight:bold}
.panel svg{display:block;width:100%;height:240px;cursor:crosshair;user-select:none}
.legend{display:flex;flex-wrap:wrap;gap:2px 14px;margin:2px 0 0 64px;font-size:11px}
.legend span{display:inline-flex;align-items:center;gap:5px;white-space:nowrap}
.sw{display:inline-block;width:12px;height:9px}
.ln{display:inline-block;width:14px;height:0;border-top:2px solid}
.tip{position:fixed;pointer-events:none;background:rgba(255,255,255,.96);border:1px solid #999;
border-radius:3px;padding:5px 7px;font-size:11px;line-height:1.45;display:none;z-index:9;
box-shadow:0 1px 4px rgba(0,0,0,.2);max-width:420px}
.tip b{font-weight:600}
p.about{max-width:980px;font-size:13px}
h2.peak-heading{font-size:15px;margin:18px 0 4px}
.peak{margin:0 0 14px}
.peak-title{margin:0 0 3px 8px;max-width:1100px}
.peak-legend{margin:0 0 8px 8px}
svg.peak-map{display:block;width:100%}
"""


def _script() -> str:
    """The page's script (``_interactive.js``, shipped with the package): it reads the
    payload, draws every panel as SVG sized to the window, and handles hover, zoom
    (wheel), pan (drag) and reset (double-click, button)."""
    return (resources.files(__package__) / "_interactive.js").read_text(encoding="utf-8")


def _script_json(payload: dict[str, Any]) -> str:
    """The payload as JSON that the HTML parser reads as plain text whatever its strings
    hold: ``<``, ``>`` and ``&`` written as ``\\u`` escapes (JSON has them only inside
    strings), so that neither ``</script>`` nor ``<!--`` followed by ``<script>`` (which
    sends the parser into a state where the element's own end tag no longer ends it,
    swallowing the page's scripts) can appear; U+2028 and U+2029 are escaped as every
    non-ASCII character is (``ensure_ascii``)."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(payload: dict[str, Any], static_svg: str, about: str) -> str:
    """The self-contained interactive page of ``payload`` (see
    :func:`cubepool.plot.plot`), with ``static_svg`` shown where scripts do not run and
    ``about`` (plain text) under the picture."""
    # Control characters shown as U+FFFD, as in the SVG: raw, an escape sequence in the
    # workload's name went into the title and the heading (helper-137's find).
    heading = markup_text(payload["heading"])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{heading}</title><style>{_STYLE}</style></head><body>\n"
        f"<h1>{heading}</h1>\n"
        '<p class="hint">Hover for the bytes at a point; scroll to zoom the time axis, drag '
        "to pan, double-click to reset."
        '<button id="cubepool-reset" type="button">reset zoom</button></p>\n'
        f'<div id="cubepool-static">{static_svg}</div>\n'
        '<div id="cubepool-figure" style="display:none"></div>\n'
        '<div id="cubepool-peak"></div>\n'
        f'<p class="about">{html.escape(about)}</p>\n'
        f'<script type="application/json" id="cubepool-data">{_script_json(payload)}</script>\n'
        f"<script>{_script()}</script>\n"
        f"<script>{peak_script()}</script>\n"
        "</body></html>\n"
    )
