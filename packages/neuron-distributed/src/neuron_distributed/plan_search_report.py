"""`neuron-plan --search`'s report: the configurations ranked by the objective (`rank`), the Pareto front of step
time against cost (`pareto_front`), as a text table (`format_table`) and a self-contained HTML page (`write_html`:
inline SVG, no script, no network)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan_search import Configuration

__all__ = ["format_table", "pareto_front", "rank", "write_html"]

_STATUS_ORDER = {"planned": 0, "failed": 1, "pruned": 2, "invalid": 3}


def _cost(report: dict[str, Any]) -> float | None:
    """The cost axis: US dollars a million tokens when tokens are known, else a step."""
    return report.get("cost_per_million_tokens_usd", report.get("cost_per_step_usd"))


def _objective(config: Configuration, objective: str) -> float:
    """The value sorted on (smaller is better); configurations without it sort after those with it."""
    report = config.report or {}
    if objective == "time":
        return report.get("step_seconds", float("inf"))
    if objective == "cost":
        cost = _cost(report)
        return float("inf") if cost is None else cost
    cost = report.get("cost_per_step_usd")
    tokens = config.tokens_per_step
    return -(tokens / cost) if cost and tokens else float("inf")


def rank(configs: list[Configuration], objective: str) -> list[Configuration]:
    """Planned configurations that fit first, best objective first; then those that do not fit, the failed, the
    pruned and the invalid, in the space's order."""
    def key(config: Configuration) -> tuple:
        fits = bool(config.report and config.report["fits"])
        return (_STATUS_ORDER[config.status], not fits, _objective(config, objective), config.index)
    return sorted(configs, key=key)


def pareto_front(configs: list[Configuration]) -> list[Configuration]:
    """The planned configurations that fit and that no other is both faster and cheaper than (or as fast and
    cheaper, or faster and as cheap), by step time; without a price, by step time and peak HBM."""
    points = [(c.report["step_seconds"], _second_axis(c.report), c) for c in configs
              if c.status == "planned" and c.report["fits"]]
    front, best = [], float("inf")
    for _, other, config in sorted(points, key=lambda p: (p[0], p[1])):
        if other < best:
            front.append(config)
            best = other
    return front


def _second_axis(report: dict[str, Any]) -> float:
    cost = _cost(report)
    return cost if cost is not None else report["peak_hbm_bytes"] / 2**30


def _second_label(configs: list[Configuration]) -> str:
    reports = [c.report for c in configs if c.report is not None]
    if reports and all("cost_per_million_tokens_usd" in r for r in reports):
        return "$ / M tokens"
    if reports and all("cost_per_step_usd" in r for r in reports):
        return "$ / step"
    return "peak HBM a core (GiB; no price: give --price-per-hour)"


_COLUMNS = ("fits", "step s", "tokens/s", "MFU", "peak HBM GiB", "bubble", "exposed comm s", "$/M tokens")


def _figures(config: Configuration) -> list[str]:
    """The table's figures of a planned configuration."""
    r = config.report
    bubble = r.get("pipeline", {}).get("bubble_fraction")
    price = r.get("cost_per_million_tokens_usd")
    return ["yes" if r["fits"] else "no", f"{r['step_seconds']:.4g}",
            f"{r['tokens_per_second']:,.0f}" if "tokens_per_second" in r else "-", f"{r['mfu']:.3f}",
            f"{r['peak_hbm_bytes'] / 2**30:.2f}", f"{bubble:.1%}" if bubble is not None else "-",
            f"{r['exposed_communication_seconds']:.4g}", f"{price:.3f}" if price is not None else "-"]


def _rows(configs: list[Configuration]) -> list[list[str]]:
    front = {c.index for c in pareto_front(configs)}
    rows = []
    for place, config in enumerate(configs, 1):
        row = [str(place), config.status + (" *" if config.index in front else ""), config.label()]
        row += _figures(config) if config.report is not None else [""] * (len(_COLUMNS) - 1) + [config.reason or ""]
        rows.append(row)
    return rows


def format_table(configs: list[Configuration], summary: dict[str, Any]) -> str:
    """The ranked table (`*`: on the Pareto front), then the counts: configurations by status, rank plans run
    against the ranks the planned configurations have, and what the search cost."""
    header = ["#", "status", "configuration", *_COLUMNS]
    rows = _rows(configs)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = [f"neuron-plan --search: {summary['configurations']} configurations, objective {summary['objective']} "
             "(* on the Pareto front of step time and cost)"]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        lines.append("  " + "  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines + _counts(summary))


def _counts(summary: dict[str, Any]) -> list[str]:
    lines = [f"  {summary['configurations']} configurations: " + ", ".join(
        f"{summary[s]} {s}" for s in ("planned", "failed", "pruned", "invalid"))]
    lines.append(f"  rank plans run: {summary['rank_plans_run']} for {summary['ranks_needed']} rank roles of the "
                 f"planned configurations ({summary['rank_plans_reused']} shared); {summary['configurations']} "
                 f"configurations / {summary['rank_plans_run']} rank plans = "
                 f"{summary['configurations'] / max(1, summary['rank_plans_run']):.2f}")
    lines.append(f"  search: {summary['wall_seconds']:.1f} s wall, {summary['cpu_seconds']:.1f} s CPU (all processes)")
    return lines


def _chart(configs: list[Configuration]) -> str:
    """The Pareto chart: every planned configuration that fits, step time against cost, the front joined."""
    points = [c for c in configs if c.status == "planned" and c.report["fits"]]
    if not points:
        return "<p>No planned configuration fits: no chart.</p>"
    front = pareto_front(configs)
    width, height, margin = 640, 400, 60
    xs = [c.report["step_seconds"] for c in points]
    ys = [_second_axis(c.report) for c in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)

    def at(x: float, y: float) -> tuple[float, float]:
        fx = (x - x0) / (x1 - x0) if x1 > x0 else 0.5
        fy = (y - y0) / (y1 - y0) if y1 > y0 else 0.5
        return margin + fx * (width - 2 * margin), height - margin - fy * (height - 2 * margin)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="pareto" '
             f'viewBox="0 0 {width} {height}">',
             f'<line x1="{margin}" y1="{height - margin}" x2="{width - margin}" y2="{height - margin}" stroke="black"/>',
             f'<line x1="{margin}" y1="{margin}" x2="{margin}" y2="{height - margin}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 15}" text-anchor="middle">step time (s): {x0:.4g} to {x1:.4g}'
             '</text>',
             f'<text x="15" y="{height / 2}" transform="rotate(-90 15 {height / 2})" text-anchor="middle">'
             f'{html.escape(_second_label(points))}: {y0:.4g} to {y1:.4g}</text>']
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (at(c.report["step_seconds"], _second_axis(c.report))
                                                    for c in front))
    parts.append(f'<polyline class="front" points="{line}" fill="none" stroke="crimson" stroke-width="2"/>')
    front_ids = {c.index for c in front}
    for config in points:
        x, y = at(config.report["step_seconds"], _second_axis(config.report))
        on = config.index in front_ids
        parts.append(f'<circle class="{"front" if on else "point"}" cx="{x:.1f}" cy="{y:.1f}" r="{6 if on else 4}" '
                     f'fill="{"crimson" if on else "steelblue"}"><title>{html.escape(config.label())}</title>'
                     '</circle>')
    parts.append("</svg>")
    return "\n".join(parts)


def _breakdown(config: Configuration) -> str:
    """A configuration's step split by what it went to: a bar and its table."""
    report = config.report
    step = report["step_seconds"] or 1.0
    parts = [(name, seconds) for name, seconds in report["breakdown"].items() if seconds > 0]
    bar, left = [], 0.0
    colours = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
               "#bab0ac")
    for i, (name, seconds) in enumerate(parts):
        share = seconds / step * 600
        bar.append(f'<rect x="{left:.1f}" y="0" width="{share:.1f}" height="20" fill="{colours[i % len(colours)]}">'
                   f'<title>{html.escape(name)}: {seconds:.4g} s</title></rect>')
        left += share
    rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{seconds:.4g}</td><td>{seconds / step:.1%}</td></tr>"
                   for name, seconds in parts)
    return (f'<details><summary>{html.escape(config.label())}: {report["step_seconds"]:.4g} s a step</summary>'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="600" height="20" class="breakdown">{"".join(bar)}</svg>'
            f'<table class="breakdown"><tr><th>part</th><th>seconds</th><th>share</th></tr>{rows}</table></details>')


def write_html(path: str, configs: list[Configuration], summary: dict[str, Any]) -> None:
    """The search as one page that needs nothing else: the Pareto chart (inline SVG), the ranked table, each planned
    configuration's step breakdown."""
    header = "".join(f"<th>{html.escape(h)}</th>" for h in ("#", "status", "configuration", *_COLUMNS))
    body = "".join("<tr class=\"config\">" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                   for row in _rows(configs))
    counts = html.escape("\n".join(_counts(summary)))
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>neuron-plan --search</title>
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:2px 6px}}
</style></head><body>
<h1>neuron-plan --search</h1>
<p><code>{html.escape(" ".join(summary["command"]))}</code>, objective {html.escape(summary["objective"])}</p>
<pre>{counts}</pre>
<h2>Pareto front: step time against cost</h2>
{_chart(configs)}
<h2>Configurations</h2>
<table class="configurations"><tr>{header}</tr>{body}</table>
<h2>Where each step goes</h2>
{"".join(_breakdown(c) for c in configs if c.report is not None)}
</body></html>
"""
    with open(path, "w") as handle:
        handle.write(page)
