"""Small server-rendered SVG charts for the admin overview (no JavaScript library).

Every text that comes from data (queue names) is escaped; the markup is built
here, so the template only places it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs.health.activity import MAX_LAG_QUEUES, activity

WIDTH, HEIGHT = 560, 170
LEFT, RIGHT, TOP, BOTTOM = 52, 8, 10, 22
#: Tops of the lag axis (seconds): round durations.
LAG_TOPS = (
    10,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    3 * 3600,
    6 * 3600,
    12 * 3600,
    86400,
    2 * 86400,
    7 * 86400,
)

#: Colours of the outcomes (the admin's status colours) and of the lag lines.
OUTCOME_COLOURS = {"completed": "#3c8a3e", "dead": "#ba2121", "cancelled": "#888888"}
LINE_COLOURS = ("#417690", "#e08a00", "#7b4fa0", "#c2185b", "#00897b", "#5d4037")


def _nice_max(value: float) -> float:
    """A round number >= value for the top of the y axis."""
    if value <= 0:
        return 1.0
    step = 10 ** (len(str(int(value))) - 1) if value >= 1 else 1.0
    for factor in (1, 2, 2.5, 5, 10):
        if value <= step * factor:
            return float(step * factor)
    return float(step * 10)


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min".replace(".0 ", " ")
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h".replace(".0 ", " ")
    return f"{seconds / 86400:.1f} d".replace(".0 ", " ")


def _frame(
    title: str, desc: str, y_top: str, minutes: Sequence[datetime], body: list[str], chart_id: str
) -> SafeString:
    plot_h = HEIGHT - TOP - BOTTOM
    x_end = WIDTH - RIGHT
    axis = [
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{x_end}" y2="{TOP + plot_h}" class="axis"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{x_end}" y2="{TOP}" class="grid"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end" class="tick">{escape(y_top)}</text>',
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end" class="tick">0</text>',
    ]
    if minutes:
        for label, x in (
            (f"{minutes[0]:%H:%M}", LEFT),
            (f"{minutes[len(minutes) // 2]:%H:%M}", (LEFT + x_end) / 2),
            ("now", x_end),
        ):
            anchor = "start" if x == LEFT else "end" if x == x_end else "middle"
            axis.append(
                f'<text x="{x:.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}" '
                f'class="tick">{label}</text>'
            )
    return mark_safe(  # noqa: S308 - built from numbers and escaped text only
        f'<svg id="{chart_id}" class="pgjobs-chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-labelledby="{chart_id}-title '
        f'{chart_id}-desc" xmlns="http://www.w3.org/2000/svg">'
        f'<title id="{chart_id}-title">{escape(title)}</title>'
        f'<desc id="{chart_id}-desc">{escape(desc)}</desc>'
        + "".join(axis)
        + "".join(body)
        + "</svg>"
    )


def finished_chart(minutes: Sequence[datetime], finished: dict[str, list[int]]) -> SafeString:
    """Stacked bars: jobs finished per minute by final status."""
    n = len(minutes)
    totals = [sum(finished[o][i] for o in finished) for i in range(n)]
    top = _nice_max(max(totals, default=0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(n, 1)
    bar_w = max(slot - 1.5, 1.0)
    body: list[str] = []
    for i, minute in enumerate(minutes):
        if not totals[i]:
            continue
        x = LEFT + i * slot + (slot - bar_w) / 2
        y = float(TOP + plot_h)
        parts: list[str] = []
        for outcome, counts in finished.items():
            count = counts[i]
            if not count:
                continue
            h = plot_h * count / top
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{OUTCOME_COLOURS.get(outcome, "#417690")}" '
                f'data-outcome="{escape(outcome)}"/>'
            )
        label = ", ".join(f"{o} {finished[o][i]}" for o in finished if finished[o][i])
        body.append(
            f'<g class="bar" data-minute="{minute:%H:%M}"><title>{minute:%H:%M}: '
            f"{escape(label)}</title>{''.join(parts)}</g>"
        )
    total = sum(totals)
    desc = f"{total} jobs finished in the last {n - 1} minutes; " + ", ".join(
        f"{o} {sum(c)}" for o, c in finished.items()
    )
    return _frame(
        "Jobs finished per minute", desc, f"{top:g}/min", minutes, body, "pgjobs-chart-finished"
    )


def lag_chart(minutes: Sequence[datetime], lag: dict[str, list[float]]) -> SafeString:
    """One line per queue: its lag (age of the oldest due job) at each minute."""
    n = len(minutes)
    longest = max((max(v) for v in lag.values()), default=0.0)
    top = float(next((t for t in LAG_TOPS if longest <= t), _nice_max(longest)))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(n - 1, 1)
    body: list[str] = []
    for k, (queue, values) in enumerate(lag.items()):
        colour = LINE_COLOURS[k % len(LINE_COLOURS)]
        points = " ".join(
            f"{LEFT + i * step:.1f},{TOP + plot_h - plot_h * v / top:.1f}"
            for i, v in enumerate(values)
        )
        body.append(
            f'<polyline class="lag" data-queue="{escape(queue)}" fill="none" '
            f'stroke="{colour}" stroke-width="1.8" points="{points}">'
            f"<title>{escape(queue)}: now {escape(format_seconds(values[-1]))}, "
            f"max {escape(format_seconds(max(values)))}</title></polyline>"
        )
    desc = (
        "; ".join(
            f"{q}: now {format_seconds(v[-1])}, max {format_seconds(max(v))}"
            for q, v in lag.items()
        )
        or "no queue lagged"
    )
    return _frame(
        "Queue lag (oldest due job)", desc, format_seconds(top), minutes, body, "pgjobs-chart-lag"
    )


def legend(items: Sequence[tuple[str, str, str]]) -> SafeString:
    """``(colour, label, value)`` swatches under a chart."""
    return mark_safe(  # noqa: S308 - labels and values escaped; colours are our constants
        "".join(
            f'<span class="pgjobs-legend-item"><span class="swatch" style="background:{c}"></span>'
            f"{escape(label)} <strong>{escape(value)}</strong></span>"
            for c, label, value in items
        )
    )


#: Seconds between two in-place refreshes of the overview (``?refresh=N`` overrides,
#: within ``REFRESH_BOUNDS``).
REFRESH_SECONDS = 10
REFRESH_BOUNDS = (1, 300)


def refresh_seconds(value: str | None) -> int:
    """The overview's refresh period from ``?refresh=N`` (default, and bounded)."""
    try:
        seconds = int(value) if value is not None else REFRESH_SECONDS
    except ValueError:
        return REFRESH_SECONDS
    return max(REFRESH_BOUNDS[0], min(REFRESH_BOUNDS[1], seconds))


def overview_charts(connection: Any, ov: Any) -> dict[str, Any]:
    """The overview's chart context from its ``Overview`` (two more bounded queries)."""
    oldest_due = {q.queue: ov.now - q.lag for q in ov.queues if q.lag is not None and q.due}
    data = activity(connection, now=ov.now, oldest_due=oldest_due)
    totals = data.finished_total
    lag_items = [
        (LINE_COLOURS[k % len(LINE_COLOURS)], queue, f"now {format_seconds(values[-1])}")
        for k, (queue, values) in enumerate(data.lag.items())
    ]
    return {
        "activity": data,
        "finished_chart": finished_chart(data.minutes, data.finished),
        "finished_legend": legend([(OUTCOME_COLOURS[o], o, str(totals[o])) for o in data.finished]),
        "lag_chart": lag_chart(data.minutes, data.lag),
        "lag_legend": legend(lag_items),
        "max_lag_queues": MAX_LAG_QUEUES,
    }
