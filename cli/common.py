"""The ``epilab`` application: its error handling (one ``error:`` line, exit statuses 1 and 2,
a quiet end on a closed pipe), ``version``, and what every command prints with (text from
outside made printable, tables, JSON, the database option)."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
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
    return escape(plain(text))


def plain(text: object) -> str:
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


def print_rows(
    title: str, headers: list[str], rows: list[list[str]], left: int = 1, optional: tuple[str, ...] = ()
) -> None:
    """The command line's tables (``tables.print_table``), their cells made plain text."""
    from epilab.tables import print_table

    cells = [[plain(c) for c in row] for row in rows]
    print_table(console, title, headers, cells, left=left, optional=optional)


DbOption = Annotated[
    str | None,
    typer.Option("--db", help="database path or SQLAlchemy URL (default: EPILAB_DB or the cache dir)"),
]


def open_db(target: str | None, *, write: bool = False):  # -> TuningDB
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


def is_current_now(problem_json: str) -> bool:
    """Whether a stored problem's kernels would be rendered now as when it was recorded."""
    from epilab.templates.registry import is_current

    return is_current(problem_json)


def print_json(obj: object) -> None:
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


def config_cell(config: dict | None) -> str:
    from epilab.ir.config import config_text

    return config_text(config)


def interpreted(r: Any) -> bool:
    from epilab.db import INTERPRETER_DEVICE

    return r.device == INTERPRETER_DEVICE


def tflops_cell(r: Any) -> str:
    """A record's TFLOP/s; none for the interpreter's wall-clock times (not GPU time)."""
    return "" if interpreted(r) else tflops_text(r.tflops)


def tflops_text(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def ms_cell(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"
