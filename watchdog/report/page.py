"""The HTML page every report and web view shares: one self-contained document (inline CSS, no
script, no external asset), the escaping every worker-supplied string goes through, and the
colours of the rank states.

A Content-Security-Policy in the page itself forbids scripts and every network fetch, so even a
string that escaped escaping could neither run nor phone home.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable

# No script, no fetch, no form posting elsewhere; inline styles and data: images only.
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

STATE_COLORS = {
    "RUNNING": "#2e7d32", "FINISHED": "#78909c", "BUSY": "#1565c0", "WAITING": "#f9a825",
    "STALLED": "#c62828", "STOPPED": "#6a1b9a", "WEDGED": "#8e0000", "EXITED": "#37474f",
    "HUNG": "#c62828", "FAILED": "#37474f",
}
_UNKNOWN_COLOR = "#9e9e9e"

_CSS = """
:root { --ink:#1d232a; --muted:#5f6b76; --line:#d8dee4; --culprit:#fdecea; --bg:#f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       margin: 0; background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 24px 48px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 8px; }
h3 { font-size: 14px; margin: 16px 0 6px; }
a { color: #0b5cad; }
code, .mono, pre { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace;
                   font-size: 12.5px; }
pre { background: var(--bg); border: 1px solid var(--line); padding: 8px 10px; overflow-x: auto;
      white-space: pre-wrap; word-break: break-all; margin: 4px 0; }
.muted { color: var(--muted); } .nowrap { white-space: nowrap; }
.verdict { border-left: 6px solid #c62828; background: #fff5f5; padding: 12px 16px;
           margin: 12px 0; }
.verdict.notice { border-color: #1565c0; background: #f1f6fd; }
.verdict.warning { border-color: #f9a825; background: #fffbea; }
.sentence { font-size: 17px; font-weight: 600; margin: 6px 0; word-break: break-word; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
         font-weight: 600; color: #fff; background: #607d8b; vertical-align: 1px;
         white-space: nowrap; }
.facts { display: flex; flex-wrap: wrap; gap: 4px 24px; margin: 6px 0 0; color: var(--muted); }
.facts b { color: var(--ink); font-weight: 600; }
table { border-collapse: collapse; width: 100%; margin: 4px 0; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; word-break: break-word; }
th { font-size: 12px; color: var(--muted); font-weight: 600; background: var(--bg);
     white-space: nowrap; }
tr.culprit td { background: var(--culprit); }
tr.culprit td:first-child { box-shadow: inset 4px 0 #c62828; font-weight: 700; }
.state { font-weight: 600; }
details { margin: 4px 0; } summary { cursor: pointer; color: var(--muted); }
.tree { font-size: 13px; }
.tree .frames { border-left: 2px solid var(--line); margin: 0 0 0 6px; padding: 2px 0 2px 10px; }
.tree .frame { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.tree .frame .fn { font-weight: 600; }
.tree .leaf .fn { color: #8e0000; }
.tree .split { display: flex; flex-direction: column; gap: 6px; margin: 6px 0 0 6px; }
.tree .branch { border: 1px solid var(--line); border-radius: 6px; padding: 4px 8px; }
.tree .branch.culprit { border-color: #c62828; background: var(--culprit); }
.tree .who { font-weight: 600; margin-bottom: 2px; }
.finding { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; margin: 8px 0; }
.grid { display: flex; flex-wrap: wrap; gap: 2px; margin: 8px 0; }
.cell { width: 14px; height: 14px; border-radius: 2px; }
.grid.numbered .cell { width: 34px; height: 22px; font-size: 11px; color: #fff;
                       text-align: center; line-height: 22px; }
.cell.culprit { outline: 3px solid #000; outline-offset: -1px; }
.legend { display: flex; flex-wrap: wrap; gap: 12px; color: var(--muted); font-size: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
            margin-right: 4px; vertical-align: -1px; }
svg text { font-family: system-ui, sans-serif; }
form.login { max-width: 360px; margin: 60px auto; display: flex; flex-direction: column; gap: 8px; }
form.login input { font-size: 14px; padding: 6px 8px; }
"""


def esc(value: object) -> str:
    """Text safe anywhere in HTML, attribute values included. Worker-supplied strings (frame
    and file names, hosts, job ids, log lines) all pass here; control characters become visible
    escapes instead of reaching the page."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    return html.escape(text, quote=True)


def state_color(state: object) -> str:
    return STATE_COLORS.get(str(state), _UNKNOWN_COLOR)


def state_badge(state: object) -> str:
    return f'<span class="badge" style="background:{state_color(state)}">{esc(state)}</span>'


def document(title: str, body: Iterable[str], refresh_s: int | None = None) -> str:
    """A whole HTML document around `body` (already escaped parts)."""
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s else ""
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="referrer" content="no-referrer">', refresh,
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body><main>\n",
        *body,
        "\n</main></body></html>\n",
    ])
