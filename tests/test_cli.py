"""The command line: help, version, and the demo on the CPU interpreter."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from epilab.cli import app

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "demo" in result.output and "version" in result.output


def test_version():
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and "epilab 0.1.0" in result.output and "triton" in result.output


def test_demo_runs_and_checks_against_float64():
    result = runner.invoke(app, ["demo", "--m", "33", "--n", "47", "--k", "29", "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output and "33x47x29 float32" in result.output


def test_demo_rejects_bad_options():
    result = runner.invoke(app, ["demo", "--dtype", "int8"])
    assert result.exit_code == 2 and "not one of" in result.output
    result = runner.invoke(app, ["demo", "--m", "0"])
    assert result.exit_code == 2 and "must be positive" in result.output


def test_one_config_shorthand_everywhere():
    """ "st" is stages and "split" split-K in tune, db list, explain and the report alike."""
    from epilab import cli
    from epilab.compiler import explain
    from epilab.ir.config import Config, config_text
    from epilab.reports import html

    c = Config(128, 64, 32, 8, SPLIT_K=4, num_warps=4, num_stages=3, EPILOGUE_SUBTILE=2)
    text = "128x64x32 g8 w4 st3 split4 sub2"
    assert config_text(c) == c.short() == config_text(c.to_dict()) == text
    assert explain._short(c.to_dict()) == cli.common.config_cell(c.to_dict()) == text
    assert html.config_text is config_text
    tma = Config(64, 64, 64, num_warps=4, num_stages=4, variant="tma_persistent", TMA_STORE=1)
    assert config_text(tma) == "64x64x64 g8 w4 st4 tma_persistent tma-store"


def test_python_m_epilab_version_and_completion():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "epilab", "--version"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.startswith("epilab 0.1.0  torch "), done.stderr[-2000:]
    helped = runner.invoke(app, ["--help"])
    assert "--version" in helped.output and "--install-completion" in helped.output


@pytest.mark.parametrize(
    "args,words",
    [
        (["tune", "--trials", "abc"], "Invalid value for '--trials'"),
        (["db", "list", "--no-such-option"], "No such option"),
        (["nosuch"], "No such command 'nosuch'"),
    ],
)
def test_usage_errors_are_one_error_line_with_status_2(args, words):
    """Run as a user runs it (a subprocess, no terminal): one line on stderr, no box."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "epilab", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout)
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and words in line and "--help" in line, done.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """`epilab db stats | head`: the pipe's reader closed before the output was written. No
    "error: Broken pipe", no traceback, nothing said about the flush at exit."""
    import subprocess
    import sys

    from epilab.db import TuningDB

    TuningDB.open(tmp_path / "t.db").close()
    code = (
        "import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
        "from epilab.cli import app; app(['db', 'stats', '--db', sys.argv[1]], prog_name='epilab')"
    )
    db = str(tmp_path / "t.db")
    done = subprocess.run([sys.executable, "-c", code, db], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr == "", (done.returncode, done.stderr[-2000:])


def test_help_and_version_import_no_torch_and_name_what_exists():
    import subprocess
    import sys

    from epilab import cli
    from epilab.ir.dtypes import WIDE_INPUT_DTYPES
    from epilab.policy.suites import SUITES
    from epilab.templates.registry import problem_ops

    assert cli.DEMO_DTYPES == WIDE_INPUT_DTYPES
    assert set(cli.SUITE_EXAMPLES) <= set(SUITES) and set(cli.OP_EXAMPLES) <= set(problem_ops())
    probe = (
        "import sys, epilab, epilab.cli\n"
        "from epilab.cli import app\n"
        "for args in (['--help'], ['--version'], ['tune', '--help']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (args, e.code)\n"
        "print('torch' in sys.modules, 'triton' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "False False", done.stderr[-2000:]
    assert all(name in done.stdout for name in cli.SUITE_EXAMPLES)  # examples in tune --help


def test_tune_help_shows_examples_not_source_files():
    text = runner.invoke(app, ["tune", "--help"], env={"COLUMNS": "200"}).output
    assert "Examples (" in text and "epilab tune --suite smoke --interpret" in text
    assert '"epilogue": "gelu_tanh(acc + bias[n])"' in text and "suites.py" not in text


@pytest.mark.parametrize("args", [["--help"], ["tune", "--help"], ["db", "--help"], ["report", "--help"]])
def test_help_fits_80_columns_with_every_option_named_whole(args):
    """At 80 columns (a pty's default): no line wider, each option's name whole (rich's
    boxes cut them to `--max-rou…` before), the examples one a line."""
    import re

    text = runner.invoke(app, args, env={"COLUMNS": "80"}, terminal_width=80).output
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text and "╭" not in text
    names = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    if args[0] == "tune":
        assert {"--max-rounds", "--no-max-autotune", "--total-time", "--lease-ttl"} <= names
        assert "  epilab tune --model mypkg.models:build --input 8x1024x1024:bf16 --train" in text
