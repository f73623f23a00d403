"""The ``epilab`` command line (typer). ``epilab --help`` lists the commands. A module each:
the app, its error handling, ``version`` and what every command prints with (``common``),
``demo``, ``tune`` (``tune status`` and ``tune compile-server``: ``workers``), ``report`` and
``db``; registered here, in the order ``--help`` lists them."""

from epilab.cli import db, demo, report, tune, workers
from epilab.cli.common import (
    DEMO_DTYPES,
    OP_EXAMPLES,
    SUITE_EXAMPLES,
    app,
    console,
    err_console,
    printable,
    user_error,
)

app.command()(demo.demo)
app.add_typer(tune.tune_app, name="tune")
tune.tune_app.command("compile-server")(workers.tune_compile_server)
tune.tune_app.command("status")(workers.tune_status)
app.command()(report.report)
app.add_typer(db.db_app, name="db")

__all__ = [
    "DEMO_DTYPES",
    "OP_EXAMPLES",
    "SUITE_EXAMPLES",
    "app",
    "console",
    "err_console",
    "printable",
    "user_error",
]
