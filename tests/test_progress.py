"""The Python API's progress (tuner/progress.py): lines in logs, a bar in a terminal."""

from __future__ import annotations

import io
from types import SimpleNamespace

from epilab.ir.config import Config
from epilab.tuner.progress import Reporter, duration, progress_bar, summary
from epilab.tuner.search import Outcome
from epilab.tuner.tune import ProblemResult


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _result(label: str, best_ms: float | None, refused: str | None = None) -> ProblemResult:
    return ProblemResult(label, "k", None, best_ms, None, {"cublas": 2.0}, 3, 3, "trials", {}, 1.4, refused)


class FakeTuner:
    """A test double of Tuner: three trials, each reported."""

    options = SimpleNamespace(budget=SimpleNamespace(trials=3))

    def tune_problem(self, problem, label, on_trial=None):
        for done in (1, 2, 3):
            on_trial(done, Config(64, 64, 32), Outcome("ok", 1.0 / done), 1.0 / done)
        return _result(label, 1 / 3)


def test_lines_when_not_a_terminal():
    out = io.StringIO()
    reporter = Reporter(out, total=2)
    reporter.tune(FakeTuner(), None, "mm 8x8x8")
    reporter.tune(FakeTuner(), None, "mm 16x8x8")
    assert out.getvalue().splitlines() == [
        "epilab: tuning [1/2] mm 8x8x8 (up to 3 trials)",
        "epilab: tuned [1/2] mm 8x8x8: best 0.3333 ms (6.00x cublas), 3 trials, 1 s; "
        "about 1 s left (1 problem x 1 s)",
        "epilab: tuning [2/2] mm 16x8x8 (up to 3 trials)",
        "epilab: tuned [2/2] mm 16x8x8: best 0.3333 ms (6.00x cublas), 3 trials, 1 s",
    ]


def test_a_bar_in_a_terminal_and_the_summary_kept():
    out = Terminal()
    Reporter(out).tune(FakeTuner(), None, "mm 8x8x8")
    text = out.getvalue()
    assert "(up to 3 trials)" not in text  # the bar, not the log line
    assert text.rstrip().endswith("epilab: tuned mm 8x8x8: best 0.3333 ms (6.00x cublas), 3 trials, 1 s")
    assert summary(_result("x", None, refused="too large")) == "refused: too large"


def test_at_80_columns_a_long_label_is_cut_and_the_times_are_whole():
    """A terminal of 80 columns: the description gives way ("…"); the bar, the count, the
    elapsed and remaining times keep their width (rich squeezed them to `0:00:…` before)."""
    from rich.console import Console
    from rich.markup import escape

    label = "[3/12] 4096x14336x4096 bfloat16 row/col gelu_tanh(acc + bias[n]) + residual  best 0.1234 ms"
    bar = progress_bar(Console(width=80, force_terminal=True), remaining=True)
    task = bar.add_task(escape(label), total=64)
    bar.update(task, completed=10)
    out = io.StringIO()
    Console(file=out, width=80).print(bar.make_tasks_table(bar.tasks))
    (line,) = out.getvalue().splitlines()
    assert len(line) <= 80 and line.startswith("[3/12] 4096x14336x4096 bfloat16 row/col")
    assert "…" in line and line.rstrip().endswith("10/64 0:00:00 -:--:--"), line
    # in a pipe or a log nothing is cut: the description wraps
    piped = progress_bar(Console(width=80, file=io.StringIO()), remaining=True)
    piped.update(piped.add_task(escape(label), total=64), completed=10)
    out = io.StringIO()
    Console(file=out, width=80).print(piped.make_tasks_table(piped.tasks))
    assert "best 0.1234 ms" in " ".join(out.getvalue().split()) and "…" not in out.getvalue()


def test_the_time_left_is_the_problems_left_times_the_mean_so_far():
    reporter = Reporter(io.StringIO(), total=10)
    reporter.done, reporter.seconds = 4, 4 * 41.0
    assert reporter.left() == "; about 4 min left (6 problems x 41 s)"
    reporter.done = 10
    assert reporter.left() == ""  # all done
    assert Reporter(io.StringIO()).left() == ""  # no count: no estimate
    assert duration(45) == "45 s" and duration(4000) == "67 min" and duration(3 * 3600) == "3.0 h"
