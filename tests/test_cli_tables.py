"""The command line's tables as a user sees them: in a terminal of 80 columns they fit (the
least needed columns left out, and said so); in a pipe or a log they are plain Markdown with
every column and every character, never rich's boxes wrapping letter by letter."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys

import pytest
from test_report import VERSIONS, _fill

from epilab.db import TuningDB

BOX = set("│┃┏┓┗┛━─╇╈┡┩")


@pytest.fixture(scope="module")
def db_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "t.db"
    with TuningDB.open(str(path)) as db:
        _fill(db)
    return str(path)


def _run(args: list[str], terminal: bool) -> str:
    cmd = [sys.executable, "-m", "epilab", *args]
    env = {**os.environ, "COLUMNS": "80", "LINES": "40", "TERM": "xterm"}
    if not terminal:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout
    main, child = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    out = b""
    while True:
        ready, _, _ = select.select([main], [], [], 300)
        if not ready:
            proc.kill()
            raise AssertionError("no output for 300 s")
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=60) == 0, out.decode()[-2000:]
    os.close(main)
    return out.decode()


@pytest.mark.parametrize("command", [["db", "list"], ["db", "stats"]])
def test_tables_fit_80_columns_in_a_terminal(db_path, command):
    text = _run([*command, "--db", db_path], terminal=True)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")  # colours are not columns
    lines = [line for line in text.splitlines() if line.strip()]
    assert BOX & set(text), text  # a drawn table
    assert max(len(line) for line in lines) <= 80, text
    if command == ["db", "list"]:
        assert "left out to fit 80 columns" in text and "median ms" in text
        # the rows stay apart: their shape and epilogue are kept, what is left out is said
        assert "shape" in text and "epilogue" in text and "acc" in text, text


@pytest.mark.parametrize("command", [["db", "list"], ["db", "stats"]])
def test_tables_are_markdown_with_every_column_in_a_pipe(db_path, command):
    text = _run([*command, "--db", db_path], terminal=False)
    assert not BOX & set(text), text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows and all(line.endswith(" |") for line in rows), text
    if command == ["db", "list"]:
        assert rows[0].split(" | ")[0] == "| key" and "TFLOP/s" in rows[0] and "device" in rows[0]
        assert "NVIDIA H200" in text and "64x64x32 g8 w4 st1" in text  # whole cells, one shorthand


def test_interpreter_records_show_no_gpu_numbers(tmp_path):
    """Wall-clock times of Triton's interpreter are no GPU time: no TFLOP/s ("0" before)."""
    from typer.testing import CliRunner

    from epilab.cli import app
    from epilab.db import INTERPRETER_DEVICE, Timing
    from epilab.templates.gemm.gemm_spec import Spec

    path = str(tmp_path / "i.db")
    with TuningDB.open(path) as db:
        db.record_trial(
            Spec(64, 64, 64).problem(),
            INTERPRETER_DEVICE,
            config={
                "BLOCK_M": 16,
                "BLOCK_N": 16,
                "BLOCK_K": 16,
                "GROUP_M": 1,
                "num_warps": 2,
                "num_stages": 1,
            },
            status="ok",
            timing=Timing(
                12.0, 11.0, 13.0, "interpreter wall-clock (not GPU time)", tflops=4e-5, graph_ms=None
            ),
            max_rel_error=1e-6,
            versions=VERSIONS,
            study="i",
        )
    text = CliRunner().invoke(app, ["db", "list", "--db", path, "--status", "ok"]).output
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")]
    column = rows[0].index("TFLOP/s |") if "TFLOP/s |" in rows[0] else rows[0].index("TFLOP/s")
    assert len(rows) > 1 and all(row[column].strip(" |") == "" for row in rows[1:]), text


def test_db_list_labels_a_convolution_as_the_report_does(tmp_path):
    from test_report import CONFIG, H200, _timing
    from typer.testing import CliRunner

    from epilab.cli import app
    from epilab.templates.conv.conv_spec import ConvSpec

    path = str(tmp_path / "c.db")
    with TuningDB.open(path) as db:
        db.record_trial(
            ConvSpec(2, 8, 6, 6, 8, 3, 3, padding=1, epilogue="none").problem(),
            H200,
            config=CONFIG,
            status="ok",
            timing=_timing(0.01),
            max_rel_error=1e-3,
            versions=VERSIONS,
            study="c",
        )
    text = CliRunner().invoke(app, ["db", "list", "--db", path]).output
    assert "| 2x8x6x6 -> 8x6x6 3x3 |" in text, text
