"""``python -m epilab``: the ``epilab`` command line."""

from epilab.cli import app

app(prog_name="epilab")
