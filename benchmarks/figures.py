"""The policy benchmark's report (``python -m benchmarks --html``), written by the benchmarks'
one writer (``html.write_page``).

Figures: the TTFT CDF per policy, the TTFT tail per bid class (the share of requests waiting at
least x, log-log), welfare and cache-hit bars, latency by bid class per policy,
the goal's trade-off (TTFT against the best bid-blind policy vs welfare capture, a marker per
bid-using policy and point), and for sweeps, mean TTFT / cache hit rate / welfare against load
and against sharing.
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .goal import CAPTURE_MIN, TTFT_SLACK, point_goals
from .html import Section, write_page
from .metrics import by_class
from .report import point_header
from .runner import Point
from .sweep import SweepPoint

_CDF_POINTS = 400
_COLORS = {
    "fcfs": "#7f7f7f",
    "lpm": "#1f77b4",
    "dfs-weight": "#17becf",
    "highest-bid": "#d62728",
    "dfs-auction": "#2ca02c",
    "dfs-auction-density": "#9467bd",
    "dfs-auction-kv": "#ff7f0e",
    "dfs-auction-kv-split": "#8c564b",
}
_SWEEP_METRICS = (
    ("mean_ttft_s", "mean TTFT (s)"),
    ("cache_hit_rate", "cache hit rate"),
    ("welfare", "welfare ($)"),
)


def _color(policy: str) -> str:
    return _COLORS.get(policy, "#333333")


def _line(policy: str, x: list, y: list, mode: str = "lines", **more: object) -> go.Scatter:
    """A policy's line, in its color."""
    return go.Scatter(x=x, y=y, name=policy, mode=mode, line={"color": _color(policy)}, **more)


def _sampled(ttfts: list[float]) -> list[int]:
    """At most ``_CDF_POINTS`` indices into the sorted ``ttfts``, the first and last included."""
    n = len(ttfts)
    return sorted({round(i * (n - 1) / (_CDF_POINTS - 1)) for i in range(_CDF_POINTS)})


def ttft_cdf(point: Point) -> go.Figure:
    """Share of requests with TTFT at most x, one line per policy (log x)."""
    fig = go.Figure()
    for name, run in point.runs.items():
        ttfts = sorted(s.ttft_s for s in run.served)
        n = len(ttfts)
        idx = _sampled(ttfts)
        fig.add_trace(_line(name, [ttfts[i] for i in idx], [(i + 1) / n for i in idx]))
    fig.update_layout(title="TTFT CDF", xaxis_title="TTFT (s)", yaxis_title="share of requests")
    fig.update_xaxes(type="log")
    return fig


def ttft_tail(ttfts: list[float]) -> tuple[list[float], list[float]]:
    """The tail of a TTFT distribution: sampled TTFTs x (ascending) and the share of requests
    whose TTFT is at least x (from 1 down to 1/n, so a log axis shows the slowest request)."""
    ordered = sorted(ttfts)
    n = len(ordered)
    idx = _sampled(ordered) if n else []
    return [ordered[i] for i in idx], [(n - i) / n for i in idx]


def ttft_tail_by_class(point: Point) -> go.Figure:
    """The TTFT tail per bid class (a panel each), one line per policy, both axes log: who
    waits longest under each policy, and whether it is the low bidders who pay for priority."""
    classes = sorted({s.bid_class for run in point.runs.values() for s in run.served})
    fig = make_subplots(
        rows=1,
        cols=max(len(classes), 1),
        shared_yaxes=True,
        subplot_titles=[f"bid class {cls}" for cls in classes],
    )
    for col, cls in enumerate(classes, start=1):
        for name, run in point.runs.items():
            x, y = ttft_tail([s.ttft_s for s in run.served if s.bid_class == cls])
            fig.add_trace(_line(name, x, y, legendgroup=name, showlegend=col == 1), row=1, col=col)
        fig.update_xaxes(type="log", title_text="TTFT (s)", row=1, col=col)
    fig.update_yaxes(type="log", title_text="share with TTFT at least x", row=1, col=1)
    fig.update_yaxes(type="log")
    fig.update_layout(title="TTFT tail by bid class")
    return fig


def welfare_and_hits(point: Point) -> go.Figure:
    """Realized welfare and cache hit rate, a bar per policy."""
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("welfare ($, -sum bid x TTFT)", "cache hit rate")
    )
    names = list(point.runs)
    for col, metric in enumerate(("welfare", "cache_hit_rate"), start=1):
        values = [getattr(point.runs[n].metrics, metric) for n in names]
        fig.add_trace(go.Bar(x=names, y=values, marker_color=[_color(n) for n in names]), 1, col)
    fig.update_layout(title="Welfare and cache hits", showlegend=False)
    return fig


def latency_by_class(point: Point) -> go.Figure:
    """Mean and p99 TTFT per bid class (urgent vs background), grouped by policy."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("mean TTFT (s)", "p99 TTFT (s)"))
    names = list(point.runs)
    stats = {n: by_class(point.runs[n].served) for n in names}
    classes = sorted({c for s in stats.values() for c in s})
    palette = ("#ff7f0e", "#1f77b4", "#2ca02c", "#d62728")
    for i, cls in enumerate(classes):
        for col, key in ((1, "mean_ttft_s"), (2, "p99_ttft_s")):
            fig.add_bar(
                x=names,
                y=[stats[n].get(cls, {}).get(key) for n in names],
                name=cls,
                legendgroup=cls,
                showlegend=col == 1,
                marker_color=palette[i % len(palette)],
                row=1,
                col=col,
            )
    fig.update_layout(title="Latency by bid class", barmode="group")
    return fig


def goal_tradeoff(points: list[tuple[str, Point]]) -> go.Figure:
    """Mean TTFT / the best bid-blind policy's against welfare capture, a marker per bid-using
    policy and labelled point; the goal is the lower right of the dashed lines."""
    fig = go.Figure()
    series: dict[str, tuple[list[float], list[float], list[str]]] = {}
    for label, point in points:
        for name, g in point_goals(point).items():
            xs, ys, texts = series.setdefault(name, ([], [], []))
            xs.append(g.capture)
            ys.append(g.ttft_vs_best)
            texts.append(f"{label}: hit {g.hit_gap_pp:+.2f} pp vs lpm")
    for name, (xs, ys, texts) in series.items():
        fig.add_scatter(
            x=xs,
            y=ys,
            text=texts,
            name=name,
            mode="markers",
            marker={"color": _color(name), "size": 9},
            hovertemplate="%{text}<br>capture %{x:.2f}, TTFT %{y:.3f}x<extra></extra>",
        )
    fig.add_hline(y=TTFT_SLACK, line_dash="dash", line_color="#888")
    fig.add_vline(x=CAPTURE_MIN, line_dash="dash", line_color="#888")
    fig.update_layout(
        title="The goal's trade-off: TTFT ratio vs welfare capture",
        xaxis_title="capture of highest-bid's welfare gain over lpm",
        yaxis_title="mean TTFT / best of lpm, dfs-weight",
    )
    return fig


def _lines(
    series: dict[object, list[Point]], x_of, x_title: str, col_title, log_x: bool = False
) -> go.Figure:
    """Rows: the sweep metrics; columns: ``series`` keys; a line per policy along ``x_of``."""
    cols = list(series)
    fig = make_subplots(
        rows=len(_SWEEP_METRICS),
        cols=len(cols),
        subplot_titles=[col_title(c) if r == 0 else "" for r in range(3) for c in cols],
        vertical_spacing=0.08,
    )
    shown: set[str] = set()
    for ci, c in enumerate(cols, start=1):
        points = sorted(series[c], key=x_of)
        policies = list(points[0].runs)
        for ri, (key, label) in enumerate(_SWEEP_METRICS, start=1):
            for name in policies:
                fig.add_trace(
                    _line(
                        name,
                        [x_of(p) for p in points],
                        [p.runs[name].metrics.as_dict()[key] for p in points],
                        "lines+markers",
                        legendgroup=name,
                        showlegend=name not in shown,
                    ),
                    row=ri,
                    col=ci,
                )
                shown.add(name)
            fig.update_yaxes(title_text=label, row=ri, col=1)
        fig.update_xaxes(title_text=x_title, row=len(_SWEEP_METRICS), col=ci)
        if log_x:
            fig.update_xaxes(type="log")
    fig.update_layout(height=300 * len(_SWEEP_METRICS))
    return fig


def vs_load(points: list[tuple[int | None, Point]]) -> go.Figure:
    """The sweep metrics against load, a column per sharing level."""
    series: dict[object, list[Point]] = {}
    for groups, p in points:
        series.setdefault(groups, []).append(p)
    fig = _lines(
        series,
        lambda p: p.load,
        "load (x measured capacity)",
        lambda g: f"{g} groups" if g is not None else "",
    )
    fig.update_layout(title="Against load")
    return fig


def vs_sharing(points: list[SweepPoint]) -> go.Figure:
    """The sweep metrics against the number of groups, a column per load."""
    series: dict[object, list[Point]] = {}
    groups = {id(sp.point): sp.groups for sp in points}
    for sp in points:
        series.setdefault(sp.point.load, []).append(sp.point)
    fig = _lines(
        series,
        lambda p: groups[id(p)],
        "groups (fewer = more sharing)",
        lambda load: f"load {load:g}",
        log_x=True,
    )
    fig.update_layout(title="Against sharing")
    return fig


def write_report(
    path: str | Path,
    main: list[Point],
    tables: list[str],
    sweep: list[SweepPoint] | None,
    findings: str | None,
    command: str,
) -> None:
    """Write the report for the main run (its first point in detail) and the sweep, if any;
    ``command``: the command line that ran them."""
    first = main[0]
    figures = [
        ttft_cdf(first),
        ttft_tail_by_class(first),
        welfare_and_hits(first),
        latency_by_class(first),
    ]
    if sweep:
        figures.append(
            goal_tradeoff(
                [
                    (
                        f"kv {sp.kv_capacity_tokens // 1000}k, {sp.groups} groups, "
                        f"load {sp.point.load:g}",
                        sp.point,
                    )
                    for sp in sweep
                ]
            )
        )
    elif any(point_goals(p) for p in main):
        figures.append(goal_tradeoff([(point_header(p), p) for p in main]))
    if len(main) > 1:
        figures.append(vs_load([(None, p) for p in main]))
    if sweep:
        for kv in sorted({sp.kv_capacity_tokens for sp in sweep}, reverse=True):
            at = [sp for sp in sweep if sp.kv_capacity_tokens == kv]
            for fig in (vs_load([(sp.groups, sp.point) for sp in at]), vs_sharing(at)):
                fig.update_layout(title=f"{fig.layout.title.text}, KV cache {kv // 1000}k tokens")
                figures.append(fig)
    text = "\n\n".join(tables + ([findings] if findings else []))
    write_page(
        path,
        "Inference market benchmark",
        [Section(point_header(first), text, figures=figures)],
        command=command,
    )
