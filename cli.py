"""The ``epilab`` command line (typer). ``epilab --help`` lists the commands."""

from __future__ import annotations

import math
import os
import sys
import time
from collections import Counter
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

import epilab
from epilab import config

# Named here so that `--help` imports no torch; tests/test_cli.py checks them against
# ir.dtypes.WIDE_INPUT_DTYPES, policy.suites.SUITES and kinds.problem_ops(). The suites and
# ops are examples: the kinds own them, and a wrong name is answered with the whole list.
DEMO_DTYPES = ("float16", "bfloat16", "float32")
SUITE_EXAMPLES = ("smoke", "quick", "llm", "mlp", "conv")
OP_EXAMPLES = ("mm", "addmm", "bmm", "dual_mm", "conv2d")


def user_error(e: BaseException) -> str | None:
    """The one-line message of an exception the command line expects (bad input, a bad
    setting, a file or database that cannot be used), or None for a bug (a traceback)."""
    from sqlalchemy.exc import DatabaseError

    from epilab.db.schema import DatabaseOpenError

    if isinstance(e, (DatabaseOpenError, ValueError)):
        return str(e)
    if isinstance(e, OSError):
        where = f": {e.filename}" if e.filename else ""
        return f"{e.strerror or e}{where}"
    if isinstance(e, DatabaseError):  # damaged pages met while reading, a lock held too long
        return f"the database could not be used: {str(e.orig).splitlines()[0][:300]}"
    if isinstance(e, MemoryError) or (
        isinstance(e, RuntimeError) and ("out of memory" in str(e) or "can't allocate memory" in str(e))
    ):  # torch's OutOfMemoryError, and its CPU allocator's words: too large for this machine
        return f"out of memory: {str(e).splitlines()[0][:300]}"
    optuna = sys.modules.get("optuna")
    if optuna is not None and isinstance(e, optuna.exceptions.StorageInternalError):
        cause = e.__cause__ or e
        return f"the optuna studies could not be used: {str(getattr(cause, 'orig', cause)).splitlines()[0]}"
    return None


class _Commands(TyperGroup):
    """epilab's commands, with one formatter of expected errors: an `error:` line on stderr
    and exit status 1, never a traceback; anything else is a bug and keeps its traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise  # the reader has gone (`| head`): ``main`` ends quietly
        except Exception as e:
            message = user_error(e)
            if message is None:
                raise
            err_console.print(f"[red]error:[/red] {printable(message)}", soft_wrap=True)
            raise typer.Exit(1) from None

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """A usage error (an unknown option, a value of the wrong type) is one ``error:`` line
        on stderr with exit status 2, as Unix tools have it, not a box drawn around it."""
        # click's classes, vendored by newer typer releases: found from one typer re-exports
        usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
        click_exception = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except usage_error as e:
            where = e.ctx.command_path if e.ctx is not None else "epilab"
            err_console.print(
                f"[red]error:[/red] {printable(e.format_message())} (see '{where} --help')", soft_wrap=True
            )
            sys.exit(2)
        except click_exception as e:
            e.show()
            sys.exit(e.exit_code)
        except typer.Abort:
            err_console.print("aborted")
            sys.exit(1)
        except BrokenPipeError:
            _reader_gone()
        sys.exit(code if isinstance(code, int) else 0)


def _reader_gone() -> None:
    """The output's reader closed the pipe (``epilab db show KEY | head``): stop without a
    word, as Unix tools do; standard output goes to /dev/null so that the interpreter's last
    flush has nowhere to fail, and the status is 1 (Python's advice: the output was cut)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(1)


def printable(text: object) -> str:
    """Text from outside (a database, a file, an exception) as it may reach a terminal: rich
    markup escaped, and every control character but line breaks and tabs (an escape sequence,
    a bidi override) shown as its code instead of acting."""
    return escape(_plain(text))


def _plain(text: object) -> str:
    """Text from outside with every control character but line breaks and tabs shown as its
    code (for plain output: a Markdown table, a log)."""
    from epilab.db.models import CONTROL_CHARS

    return CONTROL_CHARS.sub(lambda m: m[0] if m[0] in "\n\t" else repr(m[0])[1:-1], str(text))


app = typer.Typer(
    name="epilab",
    help="Autotuned Triton templates for matmul-like ops with fused epilogues.",
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    cls=_Commands,
)
console = Console()
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON for scripts instead of tables")]
err_console = Console(stderr=True)


def _print_version(asked: bool) -> None:
    if asked:
        version()
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="print the versions of epilab, torch, triton",
        ),
    ] = False,
) -> None:
    """Autotuned Triton templates for matmul-like ops with fused epilogues."""
    if ctx.invoked_subcommand != "version":
        config.settings()  # a bad EPILAB_* value is an error line now, whatever the command reads


@app.command()
def version() -> None:
    """Print the versions of epilab, torch and triton."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    def of(name: str) -> str:  # the installed distribution's version: no torch import for this
        try:
            return installed(name)
        except PackageNotFoundError:
            return "not installed"

    console.print(f"epilab {epilab.__version__}  torch {of('torch')}  triton {of('triton')}")


@app.command()
def demo(
    m: Annotated[
        int | None, typer.Option(help="rows of A and C (default: 2048 on a GPU, 96 on the CPU)")
    ] = None,
    n: Annotated[int | None, typer.Option(help="columns of B and C (default: 2048 / 80)")] = None,
    k: Annotated[int | None, typer.Option(help="inner dimension (default: 2048 / 72)")] = None,
    dtype: Annotated[
        str, typer.Option(help=f"input dtype: one of {', '.join(DEMO_DTYPES)} (fp8: benchmarks/fp8.py)")
    ] = "bfloat16",
    seed: Annotated[int, typer.Option(help="random seed of the inputs")] = 0,
) -> None:
    """Run one fused matmul, gelu_tanh(A @ B + bias) + residual, and print its error.

    On a machine without CUDA it runs in Triton's interpreter on the CPU.
    """
    import torch

    if dtype not in DEMO_DTYPES:
        raise typer.BadParameter(
            f"{dtype!r} is not one of {', '.join(DEMO_DTYPES)} (the demo's bias and residual are of "
            "the input dtype; fp8 matmuls: epilab.matmul(a8, b8, scale_a=..., scale_b=...))",
            param_hint="--dtype",
        )
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ["EPILAB_INTERPRET"] = os.environ["TRITON_INTERPRET"] = "1"
        epilab.enable_interpreter_if_asked()  # and numpy's warnings on masked lanes kept quiet
        console.print("[yellow]No CUDA device: running in Triton's interpreter on the CPU.[/yellow]")
    m = (2048 if cuda else 96) if m is None else m
    n = (2048 if cuda else 80) if n is None else n
    k = (2048 if cuda else 72) if k is None else k
    for name, v in (("--m", m), ("--n", n), ("--k", k)):
        if v <= 0:
            raise typer.BadParameter(f"must be positive, got {v}", param_hint=name)

    from epilab.ir.check import rel_error, tolerance
    from epilab.templates.kinds import default_config, kind_of
    from epilab.templates.matmul_api import matmul_problem, simple_epilogue

    device = "cuda" if cuda else "cpu"
    gen = torch.Generator().manual_seed(seed)
    tdt = getattr(torch, dtype)
    a = torch.randn(m, k, generator=gen).to(device, tdt)
    b = torch.randn(k, n, generator=gen).to(device, tdt)
    bias = torch.randn(n, generator=gen).to(device, tdt)
    residual = torch.randn(m, n, generator=gen).to(device, tdt)
    ep, operands = simple_epilogue(a, b, bias=bias, activation="gelu_tanh", residual=residual)
    with config.patch(interpret=not cuda):
        problem = matmul_problem(a, b, ep, operands)
        cfg = default_config(problem, "cuda" if cuda else "interpreter")
        start = time.perf_counter()
        out = epilab.matmul(a, b, epilogue=ep, operands=operands, config=cfg)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    (ref64,) = kind_of(problem).reference(problem, a, b, operands)
    eager = torch.nn.functional.gelu(torch.addmm(bias, a, b), approximate="tanh") + residual
    err, eager_err = rel_error(out, ref64), rel_error(eager, ref64)
    bound = tolerance(dtype, "ieee", dtype)

    table = Table(title=f"gelu_tanh(A @ B + bias) + residual, {m}x{n}x{k} {dtype} on {device}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("config (default heuristic)", cfg.short())
    table.add_row("first call, incl. compile", f"{seconds:.2f} s")
    table.add_row("epilab ||out-ref||/||ref||", f"{err:.2e}")
    table.add_row("torch eager ||out-ref||/||ref||", f"{eager_err:.2e}")
    table.add_row("bound for this dtype", f"{bound:.0e}")
    console.print(table)
    if not err <= bound:
        console.print(f"[red]FAILED: error {err:.2e} is above {bound:.0e}[/red]")
        raise typer.Exit(1)
    console.print("[green]OK[/green]: epilab matches the float64 reference")


# ------------------------------------------------------------------ epilab tune


tune_app = typer.Typer(no_args_is_help=False, add_completion=False, rich_markup_mode=None)
app.add_typer(tune_app, name="tune")


@tune_app.callback(invoke_without_command=True)
def tune(
    ctx: typer.Context,
    suite: Annotated[
        str | None,
        typer.Option(
            help=f"built-in suite, e.g. {', '.join(SUITE_EXAMPLES)}, or several: quick,llm (each problem "
            "once; a name that is not one lists them all)"
        ),
    ] = None,
    shapes: Annotated[
        str | None,
        typer.Option(
            help='JSON or JSON Lines file of problems, e.g. {"m": 4096, "n": 4096, "k": 4096, '
            '"dtype": "bfloat16", "epilogue": "bias_gelu_tanh"} per line (keys: m n k batch dtype '
            "layout epilogue template scales; a conv: n c h w k r s stride padding dilation groups)"
        ),
    ] = None,
    trials: Annotated[int, typer.Option(min=1, max=10_000, help="trial budget per problem")] = 64,
    time_budget: Annotated[float, typer.Option(min=1, help="seconds of search per problem")] = 90.0,
    patience: Annotated[
        int, typer.Option(min=1, help="stop after this many trials without a better one")
    ] = 24,
    baselines: Annotated[
        str,
        typer.Option(
            help="comma list of cublas, cublaslt, cudnn, grouped_mm, inductor, inductor-max-autotune "
            "(each is timed where it applies: cuBLAS for matmuls, cuDNN for convolutions, "
            "torch._grouped_mm for grouped GEMMs)"
        ),
    ] = "cublas,cudnn,grouped_mm",
    only: Annotated[str | None, typer.Option(help="tune only these problems of the list, e.g. 1-3,7")] = None,
    db: DbOption = None,
    device: Annotated[str, typer.Option(help="CUDA device to tune on")] = "cuda:0",
    devices: Annotated[
        str | None,
        typer.Option(
            help="tune on several GPUs of this host, one worker each: 'all' or indices like 0,1,3 "
            "(overrides --device; with --interpret, that many interpreter workers, at most one a "
            "CPU core)"
        ),
    ] = None,
    lease_ttl: Annotated[
        float,
        typer.Option(
            min=1,
            max=config.MAX_LEASE_TTL_S,
            help="seconds a problem stays leased to a worker that stopped renewing it (killed, host "
            "down) before another worker takes it over (at most a day)",
        ),
    ] = 60.0,
    resume: Annotated[
        bool, typer.Option("--resume/--restart", help="continue each problem's study, or start over")
    ] = True,
    jobs: Annotated[
        int, typer.Option(min=0, max=64, help="parallel compile processes per GPU (0: compile in the worker)")
    ] = 8,
    interpret: Annotated[
        bool, typer.Option("--interpret", help="no GPU: correctness-only dry run in Triton's interpreter")
    ] = False,
    seed: Annotated[int, typer.Option(help="seed of the sampler and of the random inputs")] = 0,
    warm: Annotated[
        bool,
        typer.Option(
            "--warm/--cold",
            help="a new problem's search starts from the configs of its nearest records (and of the "
            "same problem on other devices), or from the template's own seeds only",
        ),
    ] = True,
    total_time: Annotated[
        str | None,
        typer.Option(
            help="a total time for the run, e.g. 10m, 1.5h, 600 (seconds): each problem's search gets "
            "its share of the time by its FLOPs and bytes (at most --time-budget); with --model the "
            "default grows with the model: 20 s + 3 s a problem, 45 s to 4 min of tuning",
        ),
    ] = None,
    remeasure_baselines: Annotated[
        bool,
        typer.Option(
            "--remeasure-baselines",
            help="time the baselines again even where this device and these torch/triton versions "
            "recorded them (--restart does too)",
        ),
    ] = False,
    compile_server: Annotated[
        bool,
        typer.Option(
            "--compile-server/--no-compile-server",
            help="compile in the host's compile server, which later commands find warm (it leaves "
            "after EPILAB_COMPILE_SERVER_IDLE seconds, default 300, without a command; `epilab tune "
            "compile-server` shows or stops it), or in this command's own processes",
        ),
    ] = True,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="where the time goes: each problem's seconds by phase (render, compile and its cache "
            "hits, feasibility, the float64 check, timing, baselines, the database) and a trial's "
            "median; with --json, a row of each trial too",
        ),
    ] = False,
    seen: Annotated[
        bool,
        typer.Option(
            "--seen", help="tune the problems the compiler recorded in the database that have no record yet"
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            help="MODULE:FACTORY returning an nn.Module (or (module, inputs)): compile it, tune every "
            "problem it has until no new one appears, check each template in the compiled model, "
            "then time eager, Inductor, Inductor max-autotune and epilab"
        ),
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            help="with --model: an example input SHAPE:DTYPE, e.g. 8x1024x1024:bfloat16 (repeatable)",
        ),
    ] = None,
    context: Annotated[
        bool,
        typer.Option(
            "--context/--no-context", help="with --model: check each template in the compiled model"
        ),
    ] = True,
    rounds: Annotated[
        int,
        typer.Option(
            min=1,
            max=100,
            help="with --model: interleaved timing rounds before the first look at the intervals, and "
            "between looks",
        ),
    ] = 8,
    max_rounds: Annotated[
        int,
        typer.Option(
            min=1,
            max=400,
            help="with --model: the most rounds a comparison gets; one still undecided then keeps "
            "Inductor (reported 'undecided')",
        ),
    ] = 32,
    confidence: Annotated[
        float,
        typer.Option(
            min=0.5, max=0.999, help="with --model: confidence of every verdict and speedup (over all looks)"
        ),
    ] = 0.95,
    margin: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.5,
            help="with --model: keep a template only where the model is faster with it by this fraction",
        ),
    ] = 0.01,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="with --model: cast the model's floating parameters and buffers to this dtype "
            "(float8 and integer ones are never cast); default: cast them to the first floating "
            "input's dtype only where a parameter differs from it",
        ),
    ] = None,
    max_autotune: Annotated[
        bool,
        typer.Option(
            "--max-autotune/--no-max-autotune",
            help="with --model: also check and time in Inductor's max-autotune mode (slow to compile)",
        ),
    ] = True,
    freezing: Annotated[
        bool,
        typer.Option(
            "--freezing",
            help="with --model: compile every variant with Inductor's freezing (weights as constants, "
            "inference only): what folding a norm into the next GEMM needs",
        ),
    ] = False,
    train: Annotated[
        bool,
        typer.Option(
            "--train",
            help="with --model: a call is a training step (the model in train mode, grads reset, "
            "forward, backward; no optimizer step): tune the forward's and the backward's GEMMs, "
            "check and time the step",
        ),
    ] = False,
    out_file: Annotated[
        str | None, typer.Option("--out", help="with --model: also write the report as JSON to this file")
    ] = None,
    json_out: JsonOption = False,
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
    device_index, fleet = _tune_devices(device, devices, lease_ttl, interpret)
    from epilab.tuner.search import Budget
    from epilab.tuner.tune import TuneOptions, Tuner

    options = TuneOptions(
        budget=Budget(trials=trials, seconds=time_budget, patience=patience),
        baselines=tuple(b for b in baselines.split(",") if b),
        restart=not resume,
        jobs=0 if interpret else jobs,
        device_index=device_index,
        interpret=interpret,
        seed=seed,
        warm=warm,
        remeasure_baselines=remeasure_baselines or not resume,
        deadline=deadline,
        profile=profile,
        compile_server=compile_server,
    )
    if model is not None:
        from epilab.model_tuning.variants import MODES, ModelOptions

        how = ModelOptions(
            rounds=rounds,
            max_rounds=max_rounds,
            confidence=confidence,
            margin=margin,
            check_context=context,
            modes=tuple(m for m in MODES if max_autotune or not m.endswith("max-autotune")),
            freezing=freezing,
            train=train,
        )
        import torch

        from epilab.model_tuning.load import build_model

        # the model first: a factory that fails (or a model on no device) leaves no database made
        where = torch.device("cpu") if interpret else torch.device(device)
        built = build_model(model, inputs or [], where, seed=seed, dtype=dtype, train=train)
        store = _open_db(db, write=True)
        with store, config.patch(interpret=interpret), Tuner(store, options) as tuner:
            _tune_model(tuner, store, built, how, fleet, trials, out_file, json_out)
        return
    work = [] if seen else _listed_work(suite, shapes, only)  # before the database is opened (or created)
    store = _open_db(db, write=True)
    with store, config.patch(interpret=interpret):
        if seen:
            work = _seen_work(store, fleet, only, interpret)
        results, interrupted = _run_fleet(
            store, work, options, fleet, trials, err_console if json_out else console
        )
    if json_out:
        _print_json([r.to_dict() for r in results])
    else:
        _tune_summary(results, interpret)
        if profile:
            _profile_summary(results)
    if interrupted:
        (err_console if json_out else console).print(
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
    """This command's GPU workers (``worker.start_early``) and the host's compile server with
    its processes for these GPUs (``compile_server.EarlyStart``, from a thread), started now so
    that their imports and CUDA contexts overlap this command's; only where the GPUs can be
    named without importing torch. What the command does not take is closed with it."""
    from epilab.config import settings

    indices = None if interpret else _gpus_named_without_torch(device, devices)
    if indices is None:
        return  # no GPU here, or one the command refuses: it says so
    from epilab.tuner.worker import close_early, start_early

    start_early(indices)
    ctx.call_on_close(close_early)
    if jobs > 0 and shared and settings().compile_server_idle_s > 0:
        from epilab.tuner.compile_server import EarlyStart

        ctx.call_on_close(EarlyStart(jobs, indices).close)


def _gpus_named_without_torch(device: str, devices: str | None) -> tuple[int, ...] | None:
    """The indices ``--device``/``--devices`` name, where they can be read without importing
    torch and name distinct GPUs this host has; None otherwise."""
    count = _gpus_without_torch()
    named = devices if devices is not None else device.removeprefix("cuda").removeprefix(":") or "0"
    if named.strip() == "all":
        indices = list(range(count))
    else:
        parts = [p.strip().removeprefix("cuda:") for p in named.split(",")]
        if not all(p.isdigit() for p in parts):
            return None
        indices = [int(p) for p in parts]
    if not indices or any(i >= count for i in indices) or len(set(indices)) != len(indices):
        return None
    return tuple(indices)


def _gpus_without_torch() -> int:
    """How many GPUs this process may use, from CUDA_VISIBLE_DEVICES or the NVIDIA device files
    (0 where neither says: a guess that only decides whether to start compiles early)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    if not os.path.isdir("/dev"):
        return 0
    return len([d for d in os.listdir("/dev") if d.startswith("nvidia") and d[6:].isdigit()])


def _tune_devices(device: str, devices: str | None, lease_ttl: float, interpret: bool) -> tuple[int, Any]:
    """The device index to tune on and the fleet's (workers on --devices), after checking
    that a GPU is there (or switching to the interpreter for --interpret)."""
    import torch

    if interpret:
        os.environ["EPILAB_INTERPRET"] = os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        raise ValueError(
            "no CUDA device: epilab tune times kernels on a GPU. Use --interpret for a "
            "correctness-only dry run in Triton's interpreter (timings are not GPU times)"
        )
    try:
        device_index = 0 if interpret else torch.device(device).index or 0
    except RuntimeError as e:  # torch's words for a device string it cannot parse
        raise typer.BadParameter(str(e), param_hint="--device") from None
    if not interpret and device_index >= torch.cuda.device_count():
        raise ValueError(f"{device} does not exist ({torch.cuda.device_count()} CUDA device(s))")
    from epilab.tuner.fleet import FleetOptions, parse_devices

    count = torch.cuda.device_count() if not interpret else max(1, os.cpu_count() or 1)  # a worker a core
    fleet = FleetOptions(
        devices=parse_devices(devices, count) if devices is not None else (device_index,),
        lease_ttl_s=lease_ttl,
    )
    return device_index, fleet


def _listed_work(suite: str | None, shapes: str | None, only: str | None) -> list[tuple[str, Any]]:
    """(label, problem) of every problem of a built-in suite or a shapes file, and of each
    twin (the same computation on another template), cut to --only."""
    from epilab.policy.suites import load_shapes
    from epilab.policy.suites import suite as builtin_suite
    from epilab.templates.kinds import twins

    specs = builtin_suite(suite) if suite is not None else load_shapes(shapes) if shapes else []
    work = [
        (spec.label() if i == 0 else f"{spec.label()} [{p.template}]", p)
        for spec in specs
        for i, p in enumerate(twins(spec.problem()))
    ]
    first: dict[str, tuple[str, Any]] = {}
    for label, p in work:
        first.setdefault(p.key, (label, p))
    unique = list(first.values())
    repeated = len(specs) - len({spec.problem().key for spec in specs})
    if repeated:
        what = (
            "1 entry of the list is a problem"
            if repeated == 1
            else f"{repeated} entries of the list are problems"
        )
        console.print(f"{what} listed before (the same problem written another way): each is tuned once")
    return unique if only is None else [unique[i] for i in _indices(only, len(unique))]


def _seen_work(store: Any, fleet: Any, only: str | None, interpret: bool) -> list[tuple[str, Any]]:
    """(label, problem) of every problem the compiler recorded that nothing serves on this
    device yet (no record of its own or of the same math), cut to --only."""
    from epilab.db import INTERPRETER_DEVICE, DeviceInfo
    from epilab.policy.suites import problem_label

    where = INTERPRETER_DEVICE if interpret else DeviceInfo.of_cuda(fleet.devices[0])
    recorded = store.untuned(where, _is_current)
    work = [(problem_label(p), p) for p in _not_served(store, where, recorded)]
    if only is not None:
        work = [work[i] for i in _indices(only, len(work))]
    if not work:
        console.print(
            f"nothing to tune: every problem recorded in {printable(store.url)} has records "
            f"on {printable(where.name)} (its own, or of the same math)"
        )
    return work


@tune_app.command("compile-server")
def tune_compile_server(
    stop_them: Annotated[
        bool, typer.Option("--stop", help="stop them now (their compiles are lost)")
    ] = False,
) -> None:
    """This user's compile servers on this host (the processes `epilab tune` compiles in, shared by
    its commands): each one's pid, the commands connected, its processes and compiles, and when
    it leaves if no command comes."""
    from epilab.tuner.compile_server import holder, servers, stop

    found = servers()
    if not found:
        typer.echo("no compile server is running")
        return
    rows = []
    done: Counter[str] = Counter()
    for sock, status in found:
        if stop_them:
            done[stop(sock)] += 1
        if status is None:
            pid = holder(sock)
            if pid is None:
                rows.append([sock.stem, "-", "-", "-", "-", "-", "stale: its server is gone"])
            else:
                shown = str(pid) if pid > 0 else "?"
                rows.append([sock.stem, shown, "-", "-", "-", "-", "not answering (stopped or hung)"])
            continue
        leaves = status["leaves_in_s"]
        rows.append(
            [
                sock.stem,
                str(status["pid"]),
                str(status["clients"]),
                f"{status['jobs']} x {len(status['devices'])} device(s)",
                str(status["compiles"]),
                f"{status['up_s']:.0f} s",
                "with its commands" if leaves is None else f"in {leaves:.0f} s",
            ]
        )
    headers = ["fingerprint", "pid", "commands", "processes", "compiles", "up", "leaves"]
    _print_table("compile servers", headers, rows)
    if stop_them:
        said = {
            "stopped": "stopped {} server(s)",
            "killed": "killed {} server(s) that did not answer",
            "removed": "removed {} stale socket(s)",
            "not answering": "left {} server(s) that do not answer and whose pid is unknown",
        }
        typer.echo("; ".join(said[k].format(n) for k, n in done.items()))


@tune_app.command("status")
def tune_status(
    db: DbOption = None,
    silent_after: Annotated[
        float, typer.Option(min=1, help="seconds without a heartbeat after which a worker shows as silent")
    ] = 180.0,
    json_out: JsonOption = False,
) -> None:
    """The shared tuning work in a database: problems pending, leased, done, failed or
    refused; the leases held (who, last heartbeat, expiry); every worker and its heartbeat;
    the throughput of the finished work."""
    from epilab.db.leases import fleet_status

    with _open_db(db) as store:
        status = fleet_status(store, silent_after_s=silent_after)
    if json_out:
        _print_json(status)
        return
    order = ("pending", "leased", "done", "failed", "refused")
    counts = ", ".join(f"{status.counts.get(k, 0)} {k}" for k in order)
    typer.echo(f"problems: {counts}")
    if status.problems_per_hour is not None:
        trials = "" if status.trials_per_hour is None else f", {status.trials_per_hour:.0f} trials/hour"
        typer.echo(
            f"throughput: {status.problems_per_hour:.1f} problems/hour{trials} "
            f"(done problems over {status.span_s:.0f} s from the first start to the last end)"
        )

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f} s"

    if status.active:
        _print_table(
            "leased problems",
            ["problem", "device", "worker", "takes", "last heartbeat", "expires in"],
            [
                [
                    printable(v.label),
                    printable(v.device),
                    printable(v.owner or "-"),
                    str(v.attempts),
                    secs(v.heartbeat_age_s) + " ago",
                    secs(v.expires_in_s),
                ]
                for v in status.active
            ],
        )
    if status.failed:
        _print_table(
            "failed problems",
            ["problem", "device", "worker", "why"],
            [
                [
                    printable(v.label),
                    printable(v.device),
                    printable(v.owner or "-"),
                    printable((v.detail or "").strip().splitlines()[-1:][0] if v.detail else ""),
                ]
                for v in status.failed
            ],
        )
    if status.workers:
        _print_table(
            "workers",
            ["worker", "device", "state", "last heartbeat", "problems", "trials", "trials/hour", "note"],
            [
                [
                    printable(w.name),
                    printable(w.device),
                    w.state,
                    secs(w.heartbeat_age_s) + " ago",
                    str(w.problems),
                    str(w.trials),
                    "-" if w.trials_per_hour is None else f"{w.trials_per_hour:.0f}",
                    printable((w.detail or "")[:120]),
                ]
                for w in status.workers
            ],
        )
    if status.older_workers:
        typer.echo(f"({status.older_workers} worker(s) that ended over a day ago not shown)")
    if not status.counts and not status.workers:
        typer.echo(f"no shared tuning work recorded in {printable(store.url)}")


def _not_served(store: Any, device: Any, recorded: list[str]) -> list[Any]:
    """The recorded problems that no record serves yet (``model_tuning.tune.unserved``)."""
    from epilab.ir.problem import Problem
    from epilab.model_tuning.tune import unserved

    return unserved(store, device, [Problem.from_json(text) for text in recorded])


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
        _print_json(report.to_dict())
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


def _shared_time(options: Any, jobs: list[tuple[str, Any]], fleet: Any) -> Any:
    """``options`` with each job's share of the time left before ``--total-time``'s deadline."""
    if options.deadline is None or all(p.key in options.seconds_for for _, p in jobs):
        return options  # no total time, or shared already (tune --model's default: model_tuning/tune.py)
    import dataclasses

    import torch

    from epilab.tuner.total_time import spread

    name = "interpreter" if options.interpret else torch.cuda.get_device_name(options.device_index)
    shares = spread(options.deadline, [p for _, p in jobs], name, gpus=len(fleet.devices))
    return dataclasses.replace(options, seconds_for={**options.seconds_for, **shares})


def _run_fleet(
    store: Any, jobs: list[tuple[str, Any]], options: Any, fleet: Any, trials: int, out: Console
) -> tuple[list, bool]:
    """Tune each (label, problem) with the fleet's workers (tuner/fleet.py), a progress line
    per problem this process takes; stops cleanly on Ctrl-C. A worker's bug is raised once
    the others have stopped."""
    from epilab.tuner.fleet import Event, run_fleet
    from epilab.tuner.progress import progress_bar

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

        shared = _shared_time(options, jobs, fleet)
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


def _indices(text: str, count: int) -> list[int]:
    """0-based indices from a 1-based selection like '1-3,7'."""
    picked: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--only {text!r}: use 1-based numbers and ranges such as 1-3,7")
        first, last = int(lo), int(hi or lo)
        if not 1 <= first <= last <= count:
            raise ValueError(f"--only {text!r}: the list has problems 1..{count}")
        picked += [i - 1 for i in range(first, last + 1) if i - 1 not in picked]
    return picked


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
                _ms(tuned),
                "" if interpret else _tflops_text(r.tflops),
                _ms(r.library_ms),
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
    _print_table(f"epilab tune: best config per problem ({unit})", headers, rows, left=2, optional=optional)
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
    _print_table("epilab tune --profile: seconds by phase", headers, rows, left=1)
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


def _print_table(
    title: str, headers: list[str], rows: list[list[str]], left: int = 1, optional: tuple[str, ...] = ()
) -> None:
    """The command line's tables (``tables.print_table``), their cells made plain text."""
    from epilab.tables import print_table

    cells = [[_plain(c) for c in row] for row in rows]
    print_table(console, title, headers, cells, left=left, optional=optional)


# ------------------------------------------------------------------ epilab db


@app.command()
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

    if op is not None:
        from epilab.templates.kinds import problem_ops

        if op not in problem_ops():
            raise typer.BadParameter(f"{op!r} is not one of {', '.join(problem_ops())}", param_hint="--op")
    if plotly not in report_html.PLOTLY:
        raise typer.BadParameter(
            f"{plotly!r} is not one of {', '.join(report_html.PLOTLY)}", param_hint="--plotly"
        )
    for hint, peak in (("--peak-tflops", peak_tflops), ("--peak-gbs", peak_gbs)):
        if peak is not None and not (math.isfinite(peak) and peak > 0):
            raise typer.BadParameter(f"must be a positive number, got {peak}", param_hint=hint)
    keys = None
    if suite is not None:
        from epilab.policy.suites import suite as builtin_suite
        from epilab.templates.kinds import twins

        try:
            keys = [p.key for spec in builtin_suite(suite) for p in twins(spec.problem())]
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--suite") from None
    filters = ", ".join(f"{k} {v}" for k, v in (("suite", suite), ("op", op)) if v)
    check_target(out)
    store = _open_db(db)
    with store, console.status("reading the database and drawing the plots"):
        data = report_data.collect(
            store.snapshot(),
            db_url=store.url,
            is_current=_is_current,
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


db_app = typer.Typer(
    help="Inspect and maintain the tuning database.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(db_app, name="db")

DbOption = Annotated[
    str | None,
    typer.Option("--db", help="database path or SQLAlchemy URL (default: EPILAB_DB or the cache dir)"),
]


def _open_db(target: str | None, *, write: bool = False):  # -> TuningDB
    """The database of ``--db`` (else EPILAB_DB, else the cache dir's); ``write``: refuse a
    read-only one now, before any work that would have nowhere to go."""
    from epilab.db import DatabaseReadOnlyError, TuningDB

    store = TuningDB.open(target, create=write)
    if write and store.readonly:
        store.close()
        raise DatabaseReadOnlyError(
            f"{store.url} is read-only (the file or its directory): this command writes to it"
        )
    return store


def _is_current(problem_json: str) -> bool:
    """Whether a stored problem's kernels would be rendered now as when it was recorded."""
    from epilab.templates.kinds import is_current

    return is_current(problem_json)


def _print_json(obj: object) -> None:
    import dataclasses
    import json
    from datetime import datetime

    def default(o: object) -> object:
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return dataclasses.asdict(o)
        if isinstance(o, datetime):
            return o.isoformat()
        raise TypeError(type(o).__name__)

    typer.echo(json.dumps(obj, default=default, indent=1))


def _config_text(config: dict | None) -> str:
    from epilab.ir.problem import config_text

    return config_text(config)


def _interpreted(r: Any) -> bool:
    from epilab.db import INTERPRETER_DEVICE

    return r.device == INTERPRETER_DEVICE


def _tflops(r: Any) -> str:
    """A record's TFLOP/s; none for the interpreter's wall-clock times (not GPU time)."""
    return "" if _interpreted(r) else _tflops_text(r.tflops)


def _tflops_text(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


@db_app.command("stats")
def db_stats(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Counts of devices, problems, records by status, baselines, and stale records."""
    with _open_db(db) as store:
        stats = store.stats(_is_current)
    if as_json:
        _print_json(stats)
        return
    rows = [["devices", str(stats.devices)], ["problems", str(stats.problems)]]
    rows += [[f"trial records: {status}", str(n)] for status, n in stats.trials_by_status.items()]
    rows += [
        ["baselines", str(stats.baselines)],
        ["stale problems (kernels changed)", str(stats.stale_problems)],
        ["stale trial records", str(stats.stale_trials)],
    ]
    rows += [[f"  stale problems of template {t}", str(n)] for t, n in stats.stale_by_template.items()]
    _print_table(f"epilab tuning database {stats.url} (schema {stats.revision})", ["what", "count"], rows)
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

    with _open_db(db) as store:
        rows = store.list_records(op=op, device=device, status=status, limit=limit)
    if as_json:
        _print_json([{"problem": p, "record": r} for p, r in rows])
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
                _config_text(r.config),
                _ms(r.median_ms),
                _tflops(r),
            ]
        )
    _print_table(
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

    with _open_db(db) as store:
        found = store.problem_json(key)
        if found is None:
            raise ValueError(f"no problem with key {key!r}")
        full_key, text = found
        records, baselines = store.records(full_key), store.baselines(full_key)
    if as_json:
        _print_json(
            {"key": full_key, "problem": json.loads(text), "records": records, "baselines": baselines}
        )
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
                _config_text(r.config) or (r.library or ""),
                _ms(r.median_ms),
                spread,
                "" if _interpreted(r) else _ms(r.graph_ms),
                _tflops(r),
                "" if r.max_rel_error is None else f"{r.max_rel_error:.1e}",
                r.versions.torch,
                r.versions.triton,
                r.created_at.strftime("%Y-%m-%d %H:%M"),
            ]
        )
    optional = ("created", "torch", "triton", "TFLOP/s", "max err", "p20-p80 ms", "device", "kind")
    _print_table("records (fastest ok first) and baselines", headers, cells, left=4, optional=optional)


@db_app.command("export")
def db_export(file: Annotated[str, typer.Argument(help="JSON file to write")], db: DbOption = None) -> None:
    """Write the whole database as JSON (for sharing, or import elsewhere)."""
    from epilab.db.transfer import export_json
    from epilab.files import check_target

    check_target(file)
    with _open_db(db) as store:
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

    stale: list[str] = []

    def parse(text: str) -> tuple[str, str]:
        now, epilogue = parse_problem(text)
        if not _is_current(now):
            stale.append(now)
        return now, epilogue

    with _open_db(db, write=True) as store:
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


def parse_problem(text: str) -> tuple[str, str]:
    """What `db import` checks of a problem's JSON: (its JSON as this epilab writes it,
    canonical epilogue text); an older epilab's form is read as what it means, and a problem
    exported before revision 0008 gets its kernel hash of today where it was current then,
    as the migration gives a stored one (else every record of an older export was stale)."""
    import dataclasses
    from importlib import import_module

    from epilab.ir.problem import Problem

    problem = Problem.from_json(text)
    then = import_module("epilab.db.migrations.versions.0008_kernel_hashes")
    hashed = then.hash_now(problem.template, problem.to_json())
    if hashed is not None:
        problem = dataclasses.replace(problem, template_hash=hashed)
    return problem.to_json(), problem.epilogue.text()


def validate_config(d: Any, problem_json: str | None = None) -> dict[str, Any]:
    """What `db import` checks of a config: ``Config.from_dict``, the one validation; and,
    given the JSON of the problem it must run, that its template runs it (the kind's own
    rules and the device-independent ones: ``policy.space.run_error``)."""
    from epilab.ir.problem import Config, Problem
    from epilab.policy.space import run_error

    config = Config.from_dict(d)
    if problem_json is not None:
        problem = Problem.from_json(problem_json)
        why = run_error(problem, config)
        if why is not None:
            raise ValueError(f"config {config.short()} cannot run its problem on {problem.template}: {why}")
    return config.to_dict()


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
    with _open_db(db, write=True) as store:
        removed = store.prune_stale(_is_current)
    console.print(f"removed {removed} stale problem(s) with their records")


if __name__ == "__main__":
    app()
