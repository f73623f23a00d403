"""``epilab db``: inspect and maintain the tuning database (stats, list, show, export,
import, prune)."""

from __future__ import annotations

from typing import Annotated

import typer

from epilab.cli.common import (
    DbOption,
    JsonOption,
    config_cell,
    console,
    interpreted,
    is_current_now,
    ms_cell,
    open_db,
    print_json,
    print_rows,
    printable,
    tflops_cell,
)

db_app = typer.Typer(
    help="Inspect and maintain the tuning database.", no_args_is_help=True, rich_markup_mode=None
)


@db_app.command("stats")
def db_stats(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Counts of devices, problems, records by status, baselines, and stale records."""
    with open_db(db) as store:
        stats = store.stats(is_current_now)
    if as_json:
        print_json(stats)
        return
    rows = [["devices", str(stats.devices)], ["problems", str(stats.problems)]]
    rows += [[f"trial records: {status}", str(n)] for status, n in stats.trials_by_status.items()]
    rows += [
        ["baselines", str(stats.baselines)],
        ["stale problems (kernels changed)", str(stats.stale_problems)],
        ["stale trial records", str(stats.stale_trials)],
    ]
    rows += [[f"  stale problems of template {t}", str(n)] for t, n in stats.stale_by_template.items()]
    print_rows(f"epilab tuning database {stats.url} (schema {stats.revision})", ["what", "count"], rows)
    if stats.stale_problems:
        console.print("Stale records are never used; remove them with [bold]epilab db prune --stale[/bold].")


@db_app.command("list")
def db_list(
    op: Annotated[str | None, typer.Option(help="only this op (mm, addmm, bmm, baddbmm, ...)")] = None,
    device: Annotated[str | None, typer.Option(help="only devices whose name contains this")] = None,
    status: Annotated[str | None, typer.Option(help="only this status (ok, incorrect, ...)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000, help="at most this many rows")] = 50,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Trial records, newest first, with their problems."""
    from epilab.reports.data import epilogue_text, shape_text

    with open_db(db) as store:
        rows = store.list_records(op=op, device=device, status=status, limit=limit)
    if as_json:
        print_json([{"problem": p, "record": r} for p, r in rows])
        return
    headers = [
        "key",
        "op",
        "template",
        "shape",
        "dtype",
        "epilogue",
        "device",
        "status",
        "config",
        "median ms",
        "TFLOP/s",
    ]
    cells = []
    for p, r in rows:
        cells.append(
            [
                p["key"][:12],
                p["op"],
                p["template"],  # a twin's (a depthwise convolution on the depthwise kind)
                shape_text(p),
                p["dtype"],
                epilogue_text(p),
                r.device.name,
                r.status,
                config_cell(r.config),
                ms_cell(r.median_ms),
                tflops_cell(r),
            ]
        )
    print_rows(
        f"{len(rows)} trial record(s), newest first",
        headers,
        cells,
        left=8,
        # left out first at a narrow terminal; the shape and the epilogue tell the rows apart
        optional=("device", "TFLOP/s", "dtype", "op", "template", "config"),
    )


@db_app.command("show")
def db_show(
    key: Annotated[str, typer.Argument(help="problem key (or its first 6+ characters)")],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """One problem: its JSON, every trial record and every baseline."""
    import json

    from epilab.reports.data import epilogue_text

    with open_db(db) as store:
        found = store.problem_json(key)
        if found is None:
            raise ValueError(f"no problem with key {key!r}")
        full_key, text = found
        records, baselines = store.records(full_key), store.baselines(full_key)
    if as_json:
        print_json({"key": full_key, "problem": json.loads(text), "records": records, "baselines": baselines})
        return
    console.print(f"[bold]problem[/bold] {printable(full_key)}")
    console.print(f"[bold]epilogue[/bold] {printable(epilogue_text({'json': text}))}")
    console.print_json(text)
    headers = [
        "kind",
        "device",
        "status",
        "config / library",
        "median ms",
        "p20-p80 ms",
        "graph ms",
        "TFLOP/s",
        "max err",
        "torch",
        "triton",
        "created",
    ]
    cells = []
    for r in [*records, *baselines]:
        spread = "" if r.p20_ms is None else f"{r.p20_ms:.4f}-{r.p80_ms:.4f}"
        cells.append(
            [
                "trial" if r.config is not None else "baseline",
                r.device.name,
                r.status,
                config_cell(r.config) or (r.library or ""),
                ms_cell(r.median_ms),
                spread,
                "" if interpreted(r) else ms_cell(r.graph_ms),
                tflops_cell(r),
                "" if r.max_rel_error is None else f"{r.max_rel_error:.1e}",
                r.versions.torch,
                r.versions.triton,
                r.created_at.strftime("%Y-%m-%d %H:%M"),
            ]
        )
    optional = ("created", "torch", "triton", "TFLOP/s", "max err", "p20-p80 ms", "device", "kind")
    print_rows("records (fastest ok first) and baselines", headers, cells, left=4, optional=optional)


@db_app.command("export")
def db_export(file: Annotated[str, typer.Argument(help="JSON file to write")], db: DbOption = None) -> None:
    """Write the whole database as JSON (for sharing, or import elsewhere)."""
    from epilab.db.transfer import export_json
    from epilab.files import check_target

    check_target(file)
    with open_db(db) as store:
        counts = export_json(store, file)
    console.print(
        f"exported {counts['problems']} problems, {counts['trials']} trial records and "
        f"{counts['baselines']} baselines to {printable(file)}"
    )


@db_app.command("import")
def db_import(
    file: Annotated[str, typer.Argument(help="JSON file from `epilab db export`")], db: DbOption = None
) -> None:
    """Merge an export into the database: all rows are checked first; the newer record wins."""
    from epilab.db.transfer import import_json
    from epilab.policy.imported import parse_problem, validate_config

    stale: list[str] = []

    def parse(text: str) -> tuple[str, str]:
        now, epilogue = parse_problem(text)
        if not is_current_now(now):
            stale.append(now)
        return now, epilogue

    with open_db(db, write=True) as store:
        report = import_json(store, file, parse_problem=parse, validate_config=validate_config)
    console.print(
        f"imported {report.problems} problems, {report.trials} trial records and "
        f"{report.baselines} baselines from {printable(file)} (newer records win)"
    )
    if stale:
        console.print(
            f"warning: {len(stale)} of its problems were recorded for other versions of their "
            "templates: their records are stale and never used (`epilab db stats` counts them, "
            "`epilab db prune --stale` removes them)"
        )


@db_app.command("prune")
def db_prune(
    stale: Annotated[
        bool, typer.Option("--stale", help="remove records of templates that have changed since")
    ] = False,
    db: DbOption = None,
) -> None:
    """Remove records that can no longer be used."""
    if not stale:
        raise ValueError("say what to prune: --stale (records made for other template versions)")
    with open_db(db, write=True) as store:
        removed = store.prune_stale(is_current_now)
    console.print(f"removed {removed} stale problem(s) with their records")
