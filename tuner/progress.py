"""Progress of the Python API's tuning on stderr, as the command line shows it.

``epilab.tune_model`` and ``epilab.compile(..., tune_missing=True)`` run for minutes; they
report each problem they tune: in a terminal a rich progress bar per problem (trials done, the
best time so far), otherwise one line when a problem starts and one when it ends, so that logs
stay readable. ``progress=False`` (an argument of both) turns it off.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from epilab.tuner.phases import phase_text

if TYPE_CHECKING:
    from epilab.ir.config import Config
    from epilab.ir.problem import Problem
    from epilab.tuner.search import Outcome
    from epilab.tuner.tune import ProblemResult, Tuner

OnTrial = Callable[[int, "Config", "Outcome", "float | None"], None]


def progress_bar(console: Any, *, remaining: bool = False, **kw: Any) -> Any:
    """Every progress bar (``epilab tune``'s, the Python API's): in a terminal the description
    takes what the terminal leaves and is cut with "…"; the bar, the count and the times keep
    their width, so an 80-column terminal still reads the elapsed time (what must not be cut
    is printed on a line of its own). Elsewhere (a pipe, a log) nothing is cut: the
    description wraps. ``remaining``: the time left too (rich's estimate); ``kw``: rich's
    ``Progress`` options."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column

    fixed = Column(no_wrap=True)
    cut = bool(getattr(console, "is_terminal", False))
    description = Column(ratio=1, no_wrap=cut, overflow="ellipsis" if cut else "fold")
    columns = [
        TextColumn("{task.description}", table_column=description),
        BarColumn(bar_width=12),
        MofNCompleteColumn(table_column=fixed),
        TimeElapsedColumn(table_column=Column(no_wrap=True)),
        *([TimeRemainingColumn(table_column=Column(no_wrap=True))] if remaining else []),
    ]
    return Progress(*columns, console=console, expand=True, **kw)  # expand: the ratio column takes the rest


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f} ms"


def summary(result: ProblemResult) -> str:
    """What one problem's tuning found, on one line."""
    if result.refused is not None:
        return f"refused: {result.refused}"
    base = result.library_ms
    vs = f" ({base / result.best_ms:.2f}x {result.library})" if base and result.best_ms else ""
    spent = f" ({phase_text(result.phases)})" if result.phases else ""
    return f"best {_ms(result.best_ms)}{vs}, {result.evaluated} trials, {result.seconds:.0f} s{spent}"


class Reporter:
    """Reports the problems of one tuning run on ``stream`` (see the module doc)."""

    def __init__(self, stream: TextIO | None = None, *, total: int | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total = total
        self.done = 0
        self.seconds = 0.0  # the problems' tuning so far: what the estimate of the rest is made of
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())

    def _name(self, label: str) -> str:
        count = f"[{self.done + 1}/{self.total}] " if self.total else ""
        return f"epilab: tuning {count}{label}"

    @contextmanager
    def problem(self, label: str, trials: int) -> Iterator[OnTrial]:
        """Around one problem's tuning; yields the ``on_trial`` callback of ``Tuner.tune_problem``."""
        name = self._name(label)
        if not self.terminal:
            print(f"{name} (up to {trials} trials)", file=self.stream, flush=True)
            yield lambda *_: None
        else:
            from rich.console import Console
            from rich.markup import escape

            name = escape(name)  # a label's [n] is text, not markup

            with progress_bar(Console(file=self.stream), transient=True) as bar:
                task = bar.add_task(name, total=trials)

                def on_trial(done: int, _config: Config, _outcome: Outcome, best_ms: float | None) -> None:
                    bar.update(task, completed=min(done, trials), description=f"{name}  best {_ms(best_ms)}")

                yield on_trial
        self.done += 1

    def tune(self, tuner: Tuner, problem: Problem, label: str) -> ProblemResult:
        """``tuner.tune_problem`` with the problem reported."""
        name = self._name(label).replace("tuning ", "tuned ", 1)
        with self.problem(label, tuner.options.budget.trials) as on_trial:
            result = tuner.tune_problem(problem, label, on_trial)
        self.seconds += result.seconds
        print(f"{name}: {summary(result)}{self.left()}", file=self.stream, flush=True)
        return result

    def left(self) -> str:
        """``; about 3 min left (4 problems x 41 s)``: the problems still to tune times the
        mean seconds of those tuned; empty when the count is unknown or all are done."""
        if not self.total or not self.done or self.done >= self.total:
            return ""
        rest, mean = self.total - self.done, self.seconds / self.done
        return f"; about {duration(rest * mean)} left ({rest} problem{'s' * (rest > 1)} x {mean:.0f} s)"


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``1.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def tune_all(tuner: Tuner, jobs: list[tuple[str, Problem]]) -> tuple[list[ProblemResult], bool]:
    """Tune (label, problem) jobs one after another, reported (``tune_model``'s default)."""
    reporter = Reporter(total=len(jobs))
    return [reporter.tune(tuner, problem, label) for label, problem in jobs], False
