"""The report's plotly figures, as JSON for ``Plotly.newPlot`` (the page inlines
plotly.js once and draws each figure from its JSON).

Labels that come from the database are HTML-escaped before they reach plotly:
plotly renders a few tags in text (``<b>``, ``<br>``, links), so a problem name
must not be able to add one.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from epilab.reports.data import ProblemReport, ReportData
from epilab.tuner.baselines import BASELINES, KIND_LIBRARIES

# The tuner tells optuna a penalty (1e3) for infeasible and failed configs; no measured
# log10(ms) comes near this (1e100 ms). Kept here so that reports depend on db only.
MEASURED_BELOW = 100.0

COLORS = {"tuned": "#1f77b4", **{name: b.color for name, b in BASELINES.items()}}
_LAYOUT = dict(margin=dict(l=60, r=20, t=50, b=60), height=420)


TEMPLATE = "plotly_white"  # every figure's look: the page holds it once (``template_json``)


def _json(fig: go.Figure) -> str:
    """The figure's JSON without its template (7 KB a figure), which the page adds to each
    from its one copy as it draws it."""
    d = json.loads(pio.to_json(fig, validate=False, pretty=False))
    d.get("layout", {}).pop("template", None)
    return json.dumps(d, separators=(",", ":"))


def template_json() -> str:
    """The figures' template, once for the page."""
    return json.dumps(pio.templates[TEMPLATE].to_plotly_json(), separators=(",", ":"))


def _text(s: str) -> str:
    return html.escape(s, quote=True)


def throughput(data: ReportData) -> str | None:
    """TFLOP/s of the tuned kernel and of each baseline, per problem; none for the
    interpreter's wall times (no throughput: the axis read `10μ TFLOP/s`)."""
    rows = [p for p in data.tuned if p.flops]
    if not rows or data.interpreter:
        return None
    labels = [_text(p.label) for p in rows]
    fig = go.Figure()
    fig.add_bar(name="tuned", x=labels, y=[p.tflops(p.ms) for p in rows], marker_color=COLORS["tuned"])
    for lib in data.libraries():
        fig.add_bar(
            name=lib,
            x=labels,
            y=[p.tflops(p.baselines.get(lib)) for p in rows],
            marker_color=COLORS.get(lib),
        )
    fig.update_layout(
        title="Throughput per problem", yaxis_title="TFLOP/s", barmode="group", xaxis_tickangle=-40, **_LAYOUT
    )
    fig.update_layout(height=480, margin=dict(l=60, r=20, t=50, b=160))
    return _json(fig)


def roofline(data: ReportData) -> str | None:
    """Arithmetic intensity against achieved TFLOP/s, with the memory and compute ceilings;
    none for the interpreter's wall times."""
    rows = [p for p in data.tuned if p.flops and p.nbytes]
    if not rows or data.interpreter:
        return None
    fig = go.Figure()
    ais = [p.intensity for p in rows]
    lo, hi = min(ais) / 2, max(ais) * 2
    for dtype, compute in sorted(data.peaks.tflops.items()):
        if data.peaks.gbs is None or dtype not in {p.dtype for p in rows}:
            continue
        ridge = compute * 1e3 / data.peaks.gbs
        xs = [lo, *([ridge] if lo < ridge < hi else []), hi]
        fig.add_scatter(
            x=xs,
            y=[min(compute, x * data.peaks.gbs / 1e3) for x in xs],
            mode="lines",
            name=f"ceiling {dtype} ({compute:.0f} TFLOP/s, {data.peaks.gbs:.0f} GB/s)",
            line=dict(dash="dash"),
        )
    fig.add_scatter(
        x=ais,
        y=[p.tflops(p.ms) for p in rows],
        mode="markers",
        name="tuned",
        text=[_text(p.label) for p in rows],
        marker=dict(size=9, color=COLORS["tuned"]),
    )
    for library in KIND_LIBRARIES:  # each problem's own kind's library
        have = [p for p in rows if p.library == library and library in p.baselines]
        if not have:
            continue
        fig.add_scatter(
            x=[p.intensity for p in have],
            y=[p.tflops(p.baselines[library]) for p in have],
            mode="markers",
            name=f"{library} (+eager epilogue)",
            text=[_text(p.label) for p in have],
            marker=dict(size=7, symbol="x", color=COLORS[library]),
        )
    fig.update_layout(
        title="Roofline",
        xaxis=dict(type="log", title="arithmetic intensity (FLOP/byte)"),
        yaxis=dict(type="log", title="TFLOP/s"),
        **_LAYOUT,
    )
    return _json(fig)


def speedups(data: ReportData) -> str | None:
    """Distribution of the tuned kernel's speedup over each baseline."""
    fig = go.Figure()
    for lib in data.libraries():
        vals = [p.speedups[lib] for p in data.tuned if lib in p.speedups]
        if vals:
            fig.add_histogram(
                x=vals, name=lib, opacity=0.7, marker_color=COLORS.get(lib), xbins=dict(size=0.02)
            )
    if not fig.data:
        return None
    fig.add_vline(x=1.0, line_dash="dot")
    fig.update_layout(
        title="Speedup over the baselines",
        xaxis_title="baseline time / tuned time",
        barmode="overlay",
        **_LAYOUT,
    )
    return _json(fig)


def study_figures(problem: ProblemReport, storage: Any) -> tuple[list[str], list[str]]:
    """(figures, notes) for one problem's optuna studies: the optimization history and
    the parameter importances (PED-ANOVA) of each, from the studies kept in the database."""
    import optuna

    figures: list[str] = []
    notes: list[str] = []
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created" line per plot
    try:
        for name in problem.studies:
            _one_study(name, storage, figures, notes)
    finally:
        optuna.logging.set_verbosity(verbosity)
    return figures, notes


def _one_study(name: str, storage: Any, figures: list[str], notes: list[str]) -> None:
    import optuna
    from optuna.visualization import plot_optimization_history, plot_param_importances

    try:
        stored = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        notes.append(f"study {name} is not in this database")
        return
    finished = [t for t in stored.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # Infeasible and failed configs were told the penalty: plotted, they would flatten the rest
    done = [t for t in finished if t.value is not None and t.value < MEASURED_BELOW]
    if len(done) < len(finished):
        notes.append(f"{len(finished) - len(done)} infeasible or failed configs of {name} are not plotted")
    if not done:
        notes.append(f"study {name} has no measured trial")
        return
    study = optuna.create_study(direction="minimize")  # in memory: the measured trials only
    study.add_trials(done)
    history = plot_optimization_history(study, target_name="log10(ms)")
    history.update_layout(title=f"Optimization history ({len(done)} measured trials)", **_LAYOUT)
    figures.append(_json(history))
    if len(done) < 4 or len({t.value for t in done if math.isfinite(t.value)}) < 2:
        notes.append("parameter importances need at least 4 measured trials with different times")
        return
    try:
        imp = plot_param_importances(study, target_name="log10(ms)")
    except (RuntimeError, ValueError) as e:  # optuna refuses degenerate studies
        notes.append(f"parameter importances: {e}")
        return
    imp.update_layout(title="Parameter importances (PED-ANOVA)", **_LAYOUT)
    figures.append(_json(imp))
