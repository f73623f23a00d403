"""``python -m epilab.cli``: the command line, as ``epilab``."""

from epilab.cli import app

app(prog_name="epilab")
