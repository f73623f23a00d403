"""``epilab tune``: a suite, a shapes file, the problems the compiler recorded, or a model's
(``--model``), tuned by one or more GPU workers with a progress bar per problem."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Annotated, Any

import typer
from rich.console import Console

from epilab import config
from epilab.cli.common import (
    SUITE_EXAMPLES,
    DbOption,
    JsonOption,
    console,
    err_console,
    ms_cell,
    open_db,
    print_json,
    print_rows,
    printable,
    tflops_text,
)
from epilab.tuner.baselines import BASELINES, KIND_LIBRARIES

tune_app = typer.Typer(no_args_is_help=False, add_completion=False, rich_markup_mode=None)


# the options of `epilab tune` (the command's signature reads as a list of them)
SuiteOpt = Annotated[
    str | None,
    typer.Option(
        help=f"built-in suite, e.g. {', '.join(SUITE_EXAMPLES)}, or several: quick,llm (each problem "
        "once; a name that is not one lists them all)"
    ),
]
ShapesOpt = Annotated[
    str | None,
    typer.Option(
        help='JSON or JSON Lines file of problems, e.g. {"m": 4096, "n": 4096, "k": 4096, '
        '"dtype": "bfloat16", "epilogue": "bias_gelu_tanh"} per line (keys: m n k batch dtype '
        "layout epilogue template scales; a conv: n c h w k r s stride padding dilation groups)"
    ),
]
TrialsOpt = Annotated[int, typer.Option(min=1, max=10_000, help="trial budget per problem")]
TimeBudgetOpt = Annotated[float, typer.Option(min=1, help="seconds of search per problem")]
PatienceOpt = Annotated[int, typer.Option(min=1, help="stop after this many trials without a better one")]
BaselinesOpt = Annotated[
    str,
    typer.Option(
        help=f"comma list of {', '.join(BASELINES)} "
        "(each is timed where it applies: cuBLAS for matmuls, cuDNN for convolutions, "
        "torch._grouped_mm for grouped GEMMs)"
    ),
]
DEFAULT_BASELINES = ",".join(KIND_LIBRARIES)  # each problem's kind's own
OnlyOpt = Annotated[str | None, typer.Option(help="tune only these problems of the list, e.g. 1-3,7")]
DbOpt = DbOption
DeviceOpt = Annotated[str, typer.Option(help="CUDA device to tune on")]
DevicesOpt = Annotated[
    str | None,
    typer.Option(
        help="tune on several GPUs of this host, one worker each: 'all' or indices like 0,1,3 "
        "(overrides --device; with --interpret, that many interpreter workers, at most one a "
        "CPU core)"
    ),
]
LeaseTtlOpt = Annotated[
    float,
    typer.Option(
        min=1,
        max=config.MAX_LEASE_TTL_S,
        help="seconds a problem stays leased to a worker that stopped renewing it (killed, host "
        "down) before another worker takes it over (at most a day)",
    ),
]
ResumeOpt = Annotated[
    bool, typer.Option("--resume/--restart", help="continue each problem's study, or start over")
]
JobsOpt = Annotated[
    int, typer.Option(min=0, max=64, help="parallel compile processes per GPU (0: compile in the worker)")
]
InterpretOpt = Annotated[
    bool, typer.Option("--interpret", help="no GPU: correctness-only dry run in Triton's interpreter")
]
SeedOpt = Annotated[int, typer.Option(help="seed of the sampler and of the random inputs")]
WarmOpt = Annotated[
    bool,
    typer.Option(
        "--warm/--cold",
        help="a new problem's search starts from the configs of its nearest records (and of the "
        "same problem on other devices), or from the template's own seeds only",
    ),
]
TotalTimeOpt = Annotated[
    str | None,
    typer.Option(
        help="a total time for the run, e.g. 10m, 1.5h, 600 (seconds): each problem's search gets "
        "its share of the time by its FLOPs and bytes (at most --time-budget); with --model the "
        "default grows with the model: 20 s + 3 s a problem, 45 s to 4 min of tuning",
    ),
]
RemeasureBaselinesOpt = Annotated[
    bool,
    typer.Option(
        "--remeasure-baselines",
        help="time the baselines again even where this device and these torch/triton versions "
        "recorded them (--restart does too)",
    ),
]
CompileServerOpt = Annotated[
    bool,
    typer.Option(
        "--compile-server/--no-compile-server",
        help="compile in the host's compile server, which later commands find warm (it leaves "
        "after EPILAB_COMPILE_SERVER_IDLE seconds, default 300, without a command; `epilab tune "
        "compile-server` shows or stops it), or in this command's own processes",
    ),
]
ProfileOpt = Annotated[
    bool,
    typer.Option(
        "--profile",
        help="where the time goes: each problem's seconds by phase (render, compile and its cache "
        "hits, feasibility, the float64 check, timing, baselines, the database) and a trial's "
        "median; with --json, a row of each trial too",
    ),
]
SeenOpt = Annotated[
    bool,
    typer.Option(
        "--seen", help="tune the problems the compiler recorded in the database that have no record yet"
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        help="MODULE:FACTORY returning an nn.Module (or (module, inputs)): compile it, tune every problem "
        "it has until no new one appears, check each template in the model, time eager, Inductor, epilab"
    ),
]
InputsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--input",
        help="with --model: an example input SHAPE:DTYPE, e.g. 8x1024x1024:bfloat16 (repeatable)",
    ),
]
ContextOpt = Annotated[
    bool,
    typer.Option("--context/--no-context", help="with --model: check each template in the compiled model"),
]
RoundsOpt = Annotated[
    int,
    typer.Option(
        min=1,
        max=100,
        help="with --model: interleaved timing rounds before the first look at the intervals, and "
        "between looks",
    ),
]
MaxRoundsOpt = Annotated[
    int,
    typer.Option(
        min=1,
        max=400,
        help="with --model: the most rounds a comparison gets; one still undecided then keeps "
        "Inductor (reported 'undecided')",
    ),
]
ConfidenceOpt = Annotated[
    float,
    typer.Option(
        min=0.5, max=0.999, help="with --model: confidence of every verdict and speedup (over all looks)"
    ),
]
MarginOpt = Annotated[
    float,
    typer.Option(
        min=0.0,
        max=0.5,
        help="with --model: keep a template only where the model is faster with it by this fraction",
    ),
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help="with --model: cast the model's floating parameters and buffers to this dtype "
        "(float8 and integer ones are never cast); default: cast them to the first floating "
        "input's dtype only where a parameter differs from it",
    ),
]
MaxAutotuneOpt = Annotated[
    bool,
    typer.Option(
        "--max-autotune/--no-max-autotune",
        help="with --model: also check and time in Inductor's max-autotune mode (compiles take minutes)",
    ),
]
FreezingOpt = Annotated[
    bool,
    typer.Option(
        "--freezing",
        help="with --model: compile every variant with Inductor's freezing (weights as constants, "
        "inference only): what folding a norm into the next GEMM needs",
    ),
]
TrainOpt = Annotated[
    bool,
    typer.Option(
        "--train",
        help="with --model: a call is a training step (the model in train mode, grads reset, "
        "forward, backward; no optimizer step): tune the forward's and the backward's GEMMs, "
        "check and time the step",
    ),
]
OutFileOpt = Annotated[
    str | None, typer.Option("--out", help="with --model: also write the report as JSON to this file")
]
JsonOutOpt = JsonOption


@tune_app.callback(invoke_without_command=True)
def tune(
    ctx: typer.Context,
    suite: SuiteOpt = None,
    shapes: ShapesOpt = None,
    trials: TrialsOpt = 64,
    time_budget: TimeBudgetOpt = 90.0,
    patience: PatienceOpt = 24,
    baselines: BaselinesOpt = DEFAULT_BASELINES,
    only: OnlyOpt = None,
    db: DbOpt = None,
    device: DeviceOpt = "cuda:0",
    devices: DevicesOpt = None,
    lease_ttl: LeaseTtlOpt = 60.0,
    resume: ResumeOpt = True,
    jobs: JobsOpt = 8,
    interpret: InterpretOpt = False,
    seed: SeedOpt = 0,
    warm: WarmOpt = True,
    total_time: TotalTimeOpt = None,
    remeasure_baselines: RemeasureBaselinesOpt = False,
    compile_server: CompileServerOpt = True,
    profile: ProfileOpt = False,
    seen: SeenOpt = False,
    model: ModelOpt = None,
    inputs: InputsOpt = None,
    context: ContextOpt = True,
    rounds: RoundsOpt = 8,
    max_rounds: MaxRoundsOpt = 32,
    confidence: ConfidenceOpt = 0.95,
    margin: MarginOpt = 0.01,
    dtype: DtypeOpt = None,
    max_autotune: MaxAutotuneOpt = False,
    freezing: FreezingOpt = False,
    train: TrainOpt = False,
    out_file: OutFileOpt = None,
    json_out: JsonOutOpt = False,
) -> None:
    """Tune problems: search configs with optuna, check and time each on the GPU, record it all.

    The summary is a table (plain text when stdout is not a terminal, never cut to its width);
    --json prints the results as JSON on stdout and the progress on stderr.

    Workers share the work through the database: --devices runs one per GPU, and every
    `epilab tune` pointed at the same database (a PostgreSQL URL for several hosts) takes
    problems from the same list, each tuned once. A killed worker's problem is taken over
    after --lease-ttl seconds; the same command resumes. `epilab tune status` shows the work.

    With --model, the problems are the model's own (see model_tuning/tune.py): it is compiled with
    the epilab backend, what it needs is tuned, each template the records choose is kept only
    where the compiled model is faster with it (the verdict is stored for later compiles),
    and the model is timed per call and under CUDA graphs against Inductor. With --train a
    call is a training step: the backward's GEMMs are tuned too, and the verdicts are those of
    training steps (inference compiles do not follow them, nor training compiles inference's).

    Examples (one problem per line in a shapes file, e.g.
    {"m": 8192, "n": 14336, "k": 4096, "epilogue": "gelu_tanh(acc + bias[n])"}):

    \b
      epilab tune --suite smoke --interpret --trials 3   # no GPU: a dry run
      epilab tune --suite llm --db tuned.db --devices all
      epilab tune --shapes shapes.jsonl --db tuned.db
      epilab tune --model mypkg.models:build --input 8x1024x1024:bf16
      epilab tune --model mypkg.models:build --input 8x1024x1024:bf16 --train"""
    if ctx.invoked_subcommand is not None:
        return
    _check_tune_flags(suite, shapes, seen, model, inputs, train, freezing, dtype, rounds, max_rounds)
    _start_early(ctx, device, devices, jobs, interpret, compile_server)
    deadline = None if total_time is None else time.monotonic() + _duration(total_time, "--total-time")
    device_index, fleet = _devices(device, devices, lease_ttl, interpret)
    given = SimpleNamespace(**ctx.params)
    options = _tune_options(given, device_index, deadline)
    if model is not None:
        _tune_a_model(given, options, fleet)
    else:
        _tune_a_list(given, options, fleet)


def _tune_options(given: SimpleNamespace, device_index: int, deadline: float | None) -> Any:
    """The tuner's options (``TuneOptions``) from the command's."""
    from epilab.tuner.search import Budget
    from epilab.tuner.tune import TuneOptions

    return TuneOptions(
        budget=Budget(trials=given.trials, seconds=given.time_budget, patience=given.patience),
        baselines=tuple(b for b in given.baselines.split(",") if b),
        restart=not given.resume,
        jobs=0 if given.interpret else given.jobs,
        device_index=device_index,
        interpret=given.interpret,
        seed=given.seed,
        warm=given.warm,
        remeasure_baselines=given.remeasure_baselines or not given.resume,
        deadline=deadline,
        profile=given.profile,
        compile_server=given.compile_server,
    )


def _tune_a_model(given: SimpleNamespace, options: Any, fleet: Any) -> None:
    """``tune --model``: the model built first (a factory that fails, or a model on no device,
    leaves no database made), then recorded, tuned, checked and measured."""
    import torch

    from epilab.model_tuning.load import build_model
    from epilab.model_tuning.variants import DEFAULT_MODES, MODES, ModelOptions
    from epilab.tuner.tune import Tuner

    how = ModelOptions(
        rounds=given.rounds,
        max_rounds=given.max_rounds,
        confidence=given.confidence,
        margin=given.margin,
        check_context=given.context,
        modes=MODES if given.max_autotune else DEFAULT_MODES,
        freezing=given.freezing,
        train=given.train,
    )
    where = torch.device("cpu") if given.interpret else torch.device(given.device)
    built = build_model(
        given.model, given.inputs or [], where, seed=given.seed, dtype=given.dtype, train=given.train
    )
    store = open_db(given.db, write=True)
    with store, config.patch(interpret=given.interpret), Tuner(store, options) as tuner:
        _tune_model(tuner, store, built, how, fleet, given.trials, given.out_file, given.json_out)


def _tune_a_list(given: SimpleNamespace, options: Any, fleet: Any) -> None:
    """A suite, a shapes file or the recorded problems, tuned by the fleet, then summed up."""
    # a list's problems are read before the database is opened (or created)
    work = [] if given.seen else _listed(given.suite, given.shapes, given.only)
    store = open_db(given.db, write=True)
    with store, config.patch(interpret=given.interpret):
        if given.seen:
            work = _seen(store, fleet, given.only, given.interpret)
        out = err_console if given.json_out else console
        results, interrupted = _run_fleet(store, work, options, fleet, given.trials, out)
    if given.json_out:
        print_json([r.to_dict() for r in results])
    else:
        _tune_summary(results, given.interpret)
        if given.profile:
            _profile_summary(results)
    if interrupted:
        (err_console if given.json_out else console).print(
            "[yellow]interrupted[/yellow]: every trial finished so far is in the database; "
            "run the same command again to resume"
        )
        raise typer.Exit(130)


def _duration(text: str, flag: str) -> float:
    from epilab.tuner.total_time import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=flag) from None


def _check_tune_flags(
    suite: str | None,
    shapes: str | None,
    seen: bool,
    model: str | None,
    inputs: list[str] | None,
    train: bool,
    freezing: bool,
    dtype: str | None,
    rounds: int,
    max_rounds: int,
) -> None:
    """Refuse flags that do not go together: exactly one source of problems, and the
    --model flags only with --model."""
    if (suite is not None) + (shapes is not None) + seen + (model is not None) != 1:
        raise ValueError("give exactly one of --suite NAME, --shapes FILE, --seen or --model MODULE:FACTORY")
    if inputs and model is None:
        raise typer.BadParameter("--input goes with --model", param_hint="--input")
    for flag, given in (("--train", train), ("--freezing", freezing)):
        if given and model is None:
            raise typer.BadParameter(f"{flag} goes with --model", param_hint=flag)
    if train and freezing:
        raise typer.BadParameter(
            "--freezing makes the weights constants, for inference only: give --train or --freezing",
            param_hint="--train",
        )
    if dtype is not None:
        if model is None:
            raise typer.BadParameter("--dtype goes with --model", param_hint="--dtype")
        from epilab.model_tuning.load import parse_dtype

        parse_dtype(dtype)  # before the database is opened (or created)
    if max_rounds < rounds:
        raise typer.BadParameter(
            f"--max-rounds {max_rounds} is below --rounds {rounds}: give at least as many",
            param_hint="--max-rounds",
        )


def _start_early(
    ctx: typer.Context, device: str, devices: str | None, jobs: int, interpret: bool, shared: bool
) -> None:
    """The GPU worker (``worker.start_early``), or a process a GPU, and the compile server
    (``compile_server.EarlyStart``), started now to overlap this command's imports."""
    from epilab.config import settings
    from epilab.tuner.gpus import gpus_named_without_torch

    indices = None if interpret else gpus_named_without_torch(device, devices)
    if indices is None:
        return  # no GPU here, or one the command refuses: it says so
    from epilab.tuner.fleet_process import start_early_for

    ctx.call_on_close(start_early_for(indices))
    if jobs > 0 and shared and settings().compile_server_idle_s > 0:
        from epilab.tuner.compile_server import EarlyStart

        ctx.call_on_close(EarlyStart(jobs, indices).close)


def _devices(device: str, devices: str | None, lease_ttl: float, interpret: bool) -> tuple[int, Any]:
    """The device index and the fleet (``tuner.work.tune_devices``); a --device torch cannot
    parse is a usage error."""
    from epilab.tuner.work import DeviceSpecError, tune_devices

    try:
        return tune_devices(device, devices, lease_ttl, interpret)
    except DeviceSpecError as e:
        raise typer.BadParameter(str(e), param_hint="--device") from None


def _listed(suite: str | None, shapes: str | None, only: str | None) -> list[tuple[str, Any]]:
    """The work of a suite or a shapes file (``tuner.work.listed_work``), saying how many
    entries repeated a problem."""
    from epilab.tuner.work import listed_work

    listed = listed_work(suite, shapes, only)
    if listed.repeated:
        what = (
            "1 entry of the list is a problem"
            if listed.repeated == 1
            else f"{listed.repeated} entries of the list are problems"
        )
        console.print(f"{what} listed before (the same problem written another way): each is tuned once")
    return listed.work


def _seen(store: Any, fleet: Any, only: str | None, interpret: bool) -> list[tuple[str, Any]]:
    """The recorded problems nothing serves yet (``tuner.work.seen_work``), or a line saying
    there is nothing to tune."""
    from epilab.tuner.work import seen_work, tuned_on

    where = tuned_on(fleet, interpret)
    work = seen_work(store, where, only)
    if not work:
        console.print(
            f"nothing to tune: every problem recorded in {printable(store.url)} has records "
            f"on {printable(where.name)} (its own, or of the same math)"
        )
    return work


def _tune_model(
    tuner: Any,
    store: Any,
    built: tuple[Any, tuple[Any, ...], str],
    how: Any,
    fleet: Any,
    trials: int,
    out_file: str | None,
    json_out: bool,
) -> None:
    from epilab.model_tuning.report import save
    from epilab.model_tuning.tune import tune_model

    net, example, label = built
    out = err_console if json_out else console
    report = tune_model(
        net,
        *example,
        db=store,
        tuner=tuner,
        options=how,
        label=label,
        tune_jobs=lambda t, jobs: _run_fleet(store, jobs, t.options, fleet, trials, out),
        say=lambda text: out.print(printable(text)),
    )
    if out_file:
        out.print(f"report written to {printable(save(report, out_file))}")
    if json_out:
        print_json(report.to_dict())
    else:
        if report.tuned:
            _tune_summary(report.tuned, tuner.options.interpret)
            if tuner.options.profile:
                _profile_summary(report.tuned)
        typer.echo(report.table())
    if report.interrupted:
        (err_console if json_out else console).print(
            "[yellow]interrupted[/yellow]: every trial finished so far is in the database; "
            "run the same command again to resume"
        )
        raise typer.Exit(130)


def _run_fleet(
    store: Any, jobs: list[tuple[str, Any]], options: Any, fleet: Any, trials: int, out: Console
) -> tuple[list, bool]:
    """Tune each (label, problem) with the fleet's workers (tuner/fleet.py), a progress line a
    problem this command takes; stops cleanly on Ctrl-C; a worker's bug raised at the end."""
    from epilab.tuner.fleet import run_fleet
    from epilab.tuner.fleet_worker import Event
    from epilab.tuner.progress import progress_bar
    from epilab.tuner.work import shared_time

    several = len(fleet.devices) > 1
    with progress_bar(
        out,
        remaining=True,  # the steps left at the mean pace of the run so far (next line)
        transient=False,
        speed_estimate_period=24 * 3600.0,  # rich's default (30 s) forgets problems a minute long
    ) as progress:
        where = "the interpreter" if options.interpret else f"{len(fleet.devices)} GPU(s)"
        overall = progress.add_task(f"tuning {len(jobs)} problem(s) on {where}", total=len(jobs))
        tasks: dict[tuple[str, str], Any] = {}
        order = {p.key: i for i, (_, p) in enumerate(jobs, 1)}

        def name(e: Event) -> str:
            prefix = printable(f"[{e.worker}] ") if several else ""
            return f"{prefix}[{order.get(e.key, '?')}/{len(jobs)}] {printable(e.label)}"

        def listen(e: Event) -> None:
            if e.what == "start":
                note = f"  ({printable(e.detail)})" if e.detail else ""
                tasks[(e.worker, e.key)] = progress.add_task(name(e) + note, total=trials)
            elif e.what == "trial" and (e.worker, e.key) in tasks:
                best = "-" if e.best_ms is None else f"{e.best_ms:.4f} ms"
                progress.update(
                    tasks[(e.worker, e.key)],
                    completed=min(e.done, trials),
                    description=f"{name(e)}  best {best}",
                )
            elif e.what == "end" and (e.worker, e.key) in tasks:
                r = e.result
                base = None if r is None else r.library_ms
                vs = f" vs library+eager {base:.4f} ms" if base else ""
                best = "none" if r is None or r.best_ms is None else f"{r.best_ms:.4f} ms"
                if r is not None and r.refused is not None:
                    best, vs = "-", f"  [yellow]refused[/yellow]: {printable(r.refused)}"
                if e.detail:
                    best, vs = "-", f"  [yellow]{printable(e.detail)}[/yellow]: another worker finishes it"
                if vs.startswith("  [yellow]") and out.is_terminal:  # the bar cuts it: a line of its own
                    progress.console.print(f"{name(e)}{vs}", soft_wrap=True)
                progress.update(
                    tasks[(e.worker, e.key)], completed=trials, description=f"{name(e)}  best {best}{vs}"
                )
                progress.advance(overall)
            elif e.what == "waiting" and e.detail:
                out.print(f"worker {printable(e.worker)} waits: {printable(e.detail)}")
            elif e.what == "stopped" and e.detail:  # the last line of a traceback: its error
                why = printable(e.detail.strip().splitlines()[-1][:300])
                out.print(f"[yellow]worker {printable(e.worker)} stopped[/yellow]: {why}")

        shared = shared_time(options, jobs, len(fleet.devices))
        report = run_fleet(store, jobs, shared, fleet, trials=trials, listener=listen)
    for w in report.workers:
        if w.error is not None:
            raise w.error
    results = sorted(report.results, key=lambda r: order.get(r.key, 0))
    if len(results) < len(jobs) and not report.interrupted:
        lost = [w for w in report.workers if w.state == "lost"]
        if lost and all(w.state == "lost" for w in report.workers):
            err_console.print(
                "[red]error:[/red] every device of this process was lost; the problems it held were "
                "given back (another worker, or the same command, takes them); every recorded trial "
                "is kept: " + printable("; ".join(f"{w.device_label}: {w.detail}" for w in lost)),
                soft_wrap=True,
            )
            raise typer.Exit(1)
        out.print(
            f"{len(jobs) - len(results)} problem(s) of the list were finished by other workers or "
            "before this run (`epilab tune status` shows them)"
        )
    return results, report.interrupted


def _tune_summary(results: list, interpret: bool) -> None:
    import functools

    from epilab.tuner.phases import add_phases, phase_text

    unit = "interpreter ms (not GPU time)" if interpret else "ms"
    headers = [
        "problem",
        "best config",
        "best",
        "TFLOP/s",
        "library+eager",
        "speedup",
        "timed as",
        "trials",
        "failed",
        "wall s",
    ]
    rows = []
    for r in results:
        failed = sum(n for s, n in r.statuses.items() if s != "ok")
        tuned = r.compared.get(r.library, (None, r.best_ms, None))[1]
        rows.append(
            [
                r.label,
                "refused" if r.refused else "-" if r.best is None else r.best.short(),
                ms_cell(tuned),
                "" if interpret else tflops_text(r.tflops),
                ms_cell(r.library_ms),
                "" if r.speedup is None else f"{r.speedup:.2f}x",
                r.timed_as or "",
                str(r.evaluated),
                str(failed),
                f"{r.seconds:.0f}",
            ]
        )
    if interpret:  # no GPU: no throughput, no library timed, nothing to compare
        gpu_only = {"TFLOP/s", "library+eager", "speedup", "timed as"}
        keep = [i for i, h in enumerate(headers) if h not in gpu_only]
        headers, rows = [headers[i] for i in keep], [[row[i] for i in keep] for row in rows]
    optional = ("timed as", "wall s", "failed", "TFLOP/s", "trials")
    print_rows(f"epilab tune: best config per problem ({unit})", headers, rows, left=2, optional=optional)
    if not interpret:
        typer.echo(
            "speedup: the library's time (cuBLAS for matmuls, cuDNN for convolutions, torch._grouped_mm "
            "for grouped GEMMs; the epilogue in eager torch) over the tuned one, like with like: CUDA-graph "
            "times where both have one (kernels under 50 us), else CUDA-event medians"
        )
    spent = functools.reduce(add_phases, (r.phases for r in results), {})
    if spent:
        typer.echo(f"time spent: {phase_text(spent)}")
    for r in results:
        if r.refused is not None:
            console.print(f"[yellow]not tuned[/yellow] {printable(r.label)}: {printable(r.refused)}")


def _profile_summary(results: list) -> None:
    """``--profile``: each problem's seconds by phase, its compiles, and a trial's median."""
    from epilab.tuner.phases import PHASES
    from epilab.tuner.profile import median_phases

    tuned = [r for r in results if r.refused is None]
    shown = [p for p in PHASES if any(r.phases.get(p, 0) >= 0.05 for r in tuned)]
    headers = ["problem", "trials", "wall s", *shown, "built", "cached"]
    rows = [
        [
            r.label,
            str(r.evaluated),
            f"{r.seconds:.1f}",
            *(f"{r.phases.get(p, 0.0):.1f}" for p in shown),
            f"{r.compiles.get('built', 0)} ({r.compiles.get('build_s', 0.0):.0f} s)",
            str(r.compiles.get("cache_hits", 0)),
        ]
        for r in tuned
    ]
    print_rows("epilab tune --profile: seconds by phase", headers, rows, left=1)
    trials = [t for r in tuned for t in r.trials_profile]
    if trials:
        median = median_phases(trials)
        per_trial = ", ".join(f"{k} {v:.3f} s" for k, v in median.items() if v >= 0.0005)
        typer.echo(f"a trial's median seconds, by phase ({len(trials)} trials): {per_trial or '-'}")
    typer.echo(
        "compile: the wait for the compile pool (its compiles overlap the checks of the candidates "
        "before); built: kernels Triton compiled (seconds of its own count); cached: loaded from "
        "Triton's cache"
    )
