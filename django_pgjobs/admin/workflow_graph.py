"""The graph of a workflow run, drawn server-side as SVG (no JavaScript library), for
its admin page.

Layered: a node's column is its depth (the longest path from a root), computed in
one pass in id order, since a parent always has a lower id than its children. Stays
bounded whatever the size of the run: at most ``HEAD`` + ``TAIL`` nodes are read
(the first and the last by id, ``workflows.graph_sample``), at most ``PER_LAYER``
are drawn per column and the rest of a column is one box that counts them by
status, and the nodes between the head and the tail of a larger run are one box
too. Every text from data (node names, tasks) is escaped here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from django_pgjobs.admin.charts import OUTCOME_COLOURS
from django_pgjobs.workflows.runs import STATUS_ORDER, Progress, Sample

#: Nodes read from each end of a run, edges read into them, nodes drawn per column.
HEAD, TAIL, EDGE_LIMIT, PER_LAYER = 1000, 500, 20_000, 20

#: Fill colour of each status (the finished ones as on the overview's chart).
STATUS_COLOURS = {
    "blocked": "#d9d9d9",
    "waiting": "#b9cde5",
    "pending": "#79aec8",
    "running": "#e08a00",
    **OUTCOME_COLOURS,
}
DARK_TEXT = {"blocked", "waiting", "pending"}

NODE_W, NODE_H, COL_W, ROW_H, PAD = 132, 24, 176, 32, 12
LABEL_CHARS = 18


@dataclass
class Box:
    """One drawn box: a node (``node`` set), or several nodes counted by status."""

    col: int
    row: int = 0
    node: tuple[int, str, str, str] | None = None
    counts: Counter[str] = field(default_factory=Counter)
    kind: str = "node"  # "node", "more" (the rest of a column) or "gap" (not read)


def layout(
    sample: Sample, progress: Progress, head_size: int = HEAD
) -> tuple[list[Box], set[tuple[int, int]]]:
    """The boxes (column and row each) and the edges between boxes (by index);
    ``head_size``: how many nodes the head of an incomplete sample holds."""
    loaded = {n[0]: n for n in sample.nodes}
    parents: dict[int, list[int]] = {}
    for parent, child in sample.edges:
        parents.setdefault(child, []).append(parent)
    order = sorted(loaded)
    # A run read whole, or its head (a prefix in id order: it holds every ancestor of
    # its nodes) then its tail, whose nodes with a parent not read come after the gap.
    head = order if sample.complete else order[:head_size]
    depth: dict[int, int] = {}
    for node_id in head:
        depth[node_id] = max(
            (depth[p] + 1 for p in parents.get(node_id, ()) if p in depth), default=0
        )
    gap_col = max(depth.values(), default=-1) + 1
    for node_id in order[len(head) :]:
        known = [depth[p] + 1 for p in parents.get(node_id, ()) if p in depth]
        hidden = len(known) < len(parents.get(node_id, ()))
        depth[node_id] = max(known + ([gap_col + 1] if hidden else []), default=0)
    boxes: list[Box] = []
    box_of: dict[int, int] = {}
    columns: dict[int, list[int]] = {}
    for node_id in sorted(loaded):
        columns.setdefault(depth[node_id], []).append(node_id)
    for col, ids in sorted(columns.items()):
        for row, node_id in enumerate(ids[:PER_LAYER]):
            box_of[node_id] = len(boxes)
            boxes.append(Box(col, row, loaded[node_id]))
        if len(ids) > PER_LAYER:
            more = Box(col, PER_LAYER, kind="more")
            for node_id in ids[PER_LAYER:]:
                more.counts[loaded[node_id][3]] += 1
                box_of[node_id] = len(boxes)
            boxes.append(more)
    gap = -1

    def rows_in(col: int) -> int:
        return sum(1 for b in boxes if b.col == col)

    if not sample.complete:
        # the nodes not read, by status: the run's counts minus the ones read
        unread = Counter(progress.counts)
        unread.subtract(Counter(n[3] for n in sample.nodes))
        gap = len(boxes)
        boxes.append(Box(gap_col, rows_in(gap_col), counts=+unread, kind="gap"))
    edges = set()
    for parent, child in sample.edges:
        to = box_of[child]
        frm = box_of.get(parent, gap)
        if frm >= 0 and frm != to:
            edges.add((frm, to))
    return boxes, edges


def _counts_text(counts: Counter[str]) -> str:
    return ", ".join(f"{counts[s]} {s}" for s in STATUS_ORDER if counts.get(s))


def _stack(x: float, y: float, counts: Counter[str]) -> str:
    """A bar of the box's width split by status."""
    total = sum(counts.values()) or 1
    parts = []
    for status in STATUS_ORDER:
        n = counts.get(status, 0)
        if n:
            w = (NODE_W - 8) * n / total
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="5" '
                f'fill="{STATUS_COLOURS[status]}"/>'
            )
            x += w
    return "".join(parts)


def graph_svg(
    run_id: int,
    sample: Sample,
    progress: Progress,
    job_url: Callable[[int], str],
    list_url: str,
) -> SafeString:
    """The run's graph as an ``<svg>``: each node a link to its job's page, coloured by
    status; a box of several nodes links to the job list of the run."""
    boxes, edges = layout(sample, progress)
    rows_per_col = Counter(b.col for b in boxes)
    tallest = max(rows_per_col.values(), default=1)
    cols = max((b.col for b in boxes), default=0) + 1
    width, height = PAD * 2 + (cols - 1) * COL_W + NODE_W, PAD * 2 + tallest * ROW_H - 8
    xy: list[tuple[float, float]] = []
    for b in boxes:
        offset = (tallest - rows_per_col[b.col]) * ROW_H / 2
        xy.append((PAD + b.col * COL_W, PAD + offset + b.row * ROW_H))
    body: list[str] = ['<g class="pgjobs-edges" fill="none" stroke="#999" stroke-width="1">']
    for frm, to in sorted(edges):
        (x1, y1), (x2, y2) = xy[frm], xy[to]
        x1, y1, y2 = x1 + NODE_W, y1 + NODE_H / 2, y2 + NODE_H / 2
        dx = (x2 - x1) / 2
        body.append(
            f'<path d="M{x1:.0f},{y1:.0f} C{x1 + dx:.0f},{y1:.0f} {x2 - dx:.0f},{y2:.0f} '
            f'{x2:.0f},{y2:.0f}"/>'
        )
    body.append("</g>")
    for b, (x, y) in zip(boxes, xy, strict=True):
        if b.node is not None:
            node_id, name, task, status = b.node
            label = name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"
            colour = STATUS_COLOURS.get(status, "#ffffff")
            ink = "#222" if status in DARK_TEXT else "#fff"
            body.append(
                f'<a class="pgjobs-node" href="{escape(job_url(node_id))}" '
                f'data-id="{node_id}" data-status="{escape(status)}">'
                f"<title>#{node_id} {escape(name)}: {escape(task)}, {escape(status)}</title>"
                f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="4" '
                f'fill="{colour}" stroke="#555" stroke-width="0.6"/>'
                f'<text x="{x + 6}" y="{y + 16}" fill="{ink}">{escape(label)}</text></a>'
            )
        else:
            n = sum(b.counts.values())
            what = f"+{n} more" if b.kind == "more" else f"{n} not drawn"
            body.append(
                f'<a class="pgjobs-{b.kind}" href="{escape(list_url)}" data-nodes="{n}">'
                f"<title>{escape(what)}: {escape(_counts_text(b.counts))}</title>"
                f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="4" '
                f'fill="#fff" stroke="#555" stroke-dasharray="3 2"/>'
                f'<text x="{x + 6}" y="{y + 13}" fill="#222">{escape(what)}</text>'
                f"{_stack(x + 4, y + 17, b.counts)}</a>"
            )
    drawn = sum(1 for b in boxes if b.node is not None)
    desc = f"{drawn} of {progress.total} nodes drawn; " + _counts_text(Counter(progress.counts))
    return mark_safe(  # noqa: S308 - numbers, our colours and escaped text only
        f'<div class="pgjobs-graph-scroll" style="overflow:auto;max-width:100%;max-height:80vh">'
        f'<svg id="pgjobs-graph" class="pgjobs-graph" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-labelledby="pgjobs-graph-title '
        f'pgjobs-graph-desc" xmlns="http://www.w3.org/2000/svg" font-size="12" '
        f'font-family="sans-serif" data-run="{run_id}">'
        f'<title id="pgjobs-graph-title">Workflow run #{run_id}</title>'
        f'<desc id="pgjobs-graph-desc">{escape(desc)}</desc>' + "".join(body) + "</svg></div>"
    )
