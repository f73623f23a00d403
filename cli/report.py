"""``epilab report``: the HTML report of a tuning database."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from epilab.cli.common import OP_EXAMPLES, DbOption, console, is_current_now, open_db, printable


def report(
    db: DbOption = None,
    out: Annotated[str, typer.Option(help="HTML file to write")] = "report.html",
    device: Annotated[
        str | None, typer.Option(help="device name (or part of it); default: the one with most trials")
    ] = None,
    suite: Annotated[str | None, typer.Option(help="only the problems of this built-in suite")] = None,
    op: Annotated[
        str | None,
        typer.Option(
            help=f"only this op, e.g. {', '.join(OP_EXAMPLES)} (one that is not an op lists them all)"
        ),
    ] = None,
    peak_tflops: Annotated[
        float | None, typer.Option(help="measured fp16/bf16 peak TFLOP/s (default: the data sheet)")
    ] = None,
    peak_gbs: Annotated[
        float | None, typer.Option(help="measured memory bandwidth in GB/s (default: the data sheet)")
    ] = None,
    open_it: Annotated[
        bool, typer.Option("--open", help="open the report in a browser when written")
    ] = False,
    plotly: Annotated[
        str,
        typer.Option(
            help="where the page gets plotly.js: cdn (a small file; the plots need the network) "
            "or inline (4.8 MB more; opens with no network)"
        ),
    ] = "cdn",
) -> None:
    """Write an HTML report of tuned versus cuBLAS/Inductor throughput (one file).

    Summary, roofline and speedup plots, sortable per-op tables, each problem's optuna
    history and parameter importances, and every failed config with its message.
    """
    from pathlib import Path

    from epilab.files import check_target
    from epilab.reports import data as report_data
    from epilab.reports import html as report_html

    keys = _checked_filters(op, plotly, peak_tflops, peak_gbs, suite)
    filters = ", ".join(f"{k} {v}" for k, v in (("suite", suite), ("op", op)) if v)
    check_target(out)
    store = open_db(db)
    with store, console.status("reading the database and drawing the plots"):
        data = report_data.collect(
            store.snapshot(),
            db_url=store.url,
            is_current=is_current_now,
            device=device,
            keys=keys,
            op=op,
            filters=filters,
            peak_tflops=peak_tflops,
            peak_gbs=peak_gbs,
        )
        path = report_html.write(data, out, db=store, plotly=plotly)
    tuned = len(data.tuned)
    console.print(
        f"wrote {printable(path)} ({path.stat().st_size / 1e6:.1f} MB): {tuned} problem(s) tuned"
        + (f" on {printable(data.device.name)}" if data.device else "")
        + ("" if tuned else " — nothing tuned yet")
    )
    if open_it:
        import webbrowser

        webbrowser.open(Path(path).resolve().as_uri())


def _checked_filters(
    op: str | None, plotly: str, peak_tflops: float | None, peak_gbs: float | None, suite: str | None
) -> list[str] | None:
    """``report``'s options checked (a clear error for each); the keys of ``suite``'s
    problems and their twins (None: every problem)."""
    from epilab.reports.html import PLOTLY

    if op is not None:
        from epilab.templates.registry import problem_ops

        if op not in problem_ops():
            raise typer.BadParameter(f"{op!r} is not one of {', '.join(problem_ops())}", param_hint="--op")
    if plotly not in PLOTLY:
        raise typer.BadParameter(f"{plotly!r} is not one of {', '.join(PLOTLY)}", param_hint="--plotly")
    for hint, peak in (("--peak-tflops", peak_tflops), ("--peak-gbs", peak_gbs)):
        if peak is not None and not (math.isfinite(peak) and peak > 0):
            raise typer.BadParameter(f"must be a positive number, got {peak}", param_hint=hint)
    keys = None
    if suite is not None:
        from epilab.policy.suites import suite as builtin_suite
        from epilab.templates.registry import twins

        try:
            keys = [p.key for spec in builtin_suite(suite) for p in twins(spec.problem())]
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--suite") from None
    return keys
