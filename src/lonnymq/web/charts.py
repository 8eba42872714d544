"""Inline SVG charts of the last hour, minute by minute, drawn on the server (no JavaScript)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup, escape

#: Series drawn, with their CSS class (colours in static/dashboard.css).
SERIES = (("sent", "s-sent"), ("acked", "s-acked"), ("failed", "s-failed"), ("cancelled", "s-cancelled"))
MINUTES = 60


def per_minute(minutes: Sequence[Mapping[str, Any]], now_ms: int) -> dict[str, list[int]]:
    """The last MINUTES minutes (the current one last), each series' count per minute, 0 for
    minutes without a row; failed = nacked + dead."""
    last = now_ms // 60_000
    first = last - MINUTES + 1
    out = {name: [0] * MINUTES for name, _ in SERIES}
    for m in minutes:
        i = int(m["minute_at"]) // 60_000 - first
        if 0 <= i < MINUTES:
            out["sent"][i] += int(m["sent"])
            out["acked"][i] += int(m["acked"])
            out["failed"][i] += int(m["nacked"]) + int(m["dead"])
            out["cancelled"][i] += int(m["cancelled"])
    return out


def chart(
    minutes: Sequence[Mapping[str, Any]],
    now_ms: int,
    *,
    width: int = 160,
    height: int = 32,
    axes: bool = False,
) -> Markup:
    """An SVG line chart of sent, acked, failed and cancelled per minute over the last hour."""
    data = per_minute(minutes, now_ms)
    top = max(1, *(max(v) for v in data.values()))
    pad = 24 if axes else 1
    w, h = width - pad - 1, height - (14 if axes else 2)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        f' role="img" aria-label="messages per minute, last hour">'
    ]
    for name, css in SERIES:
        values = data[name]
        if not any(values):
            continue
        points = " ".join(
            f"{pad + i * w / (MINUTES - 1):.1f},{1 + h - v * h / top:.1f}" for i, v in enumerate(values)
        )
        total = sum(values)
        parts.append(
            f'<polyline class="{css}" points="{points}"><title>{escape(name)}: {total} in the last hour'
            f"</title></polyline>"
        )
    if axes:
        parts.append(f'<text x="0" y="10" class="axis">{top}</text>')
        parts.append(f'<text x="0" y="{1 + h}" class="axis">0</text>')
        parts.append(f'<text x="{pad}" y="{height - 2}" class="axis">-60 min</text>')
        parts.append(f'<text x="{width - 30}" y="{height - 2}" class="axis">now</text>')
        parts.append(f'<line class="axis" x1="{pad}" y1="{1 + h}" x2="{width - 1}" y2="{1 + h}"></line>')
    parts.append("</svg>")
    return Markup("".join(parts))
