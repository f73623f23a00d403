"""Variants of a model timed in interleaved rounds until their comparisons decide.

    with_all = Variant("epilab", mode, fn, compile_s)
    c = Comparison(ours=with_all, theirs=without)        # is ours faster?
    compare([c], rounds=8, max_rounds=32, confidence=0.95, margin=0.01, timer=timer)
    c.outcome, c.interval                                 # "faster" [1.03, 1.07] ...

Each round times every variant that an undecided comparison names, once each, back to back;
after ``rounds`` rounds (and every ``rounds`` more, up to ``max_rounds``) each undecided
comparison's paired interval is looked at (``model_tuning/significance.py``: sign-test interval
of the rounds' ratios, each look held to the Bonferroni share of ``1 - confidence``) and
decided ones leave. What is still open at ``max_rounds`` stays ``undecided``. Comparisons
that only follow (``Comparison.follows``) are timed until the others are decided, at least
until the first look.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from epilab.model_tuning import significance as sig
from epilab.tuner.timing import Measured

# times one variant: (its name, its call) -> per-call time
Timer = Callable[[str, Callable[[], object]], Measured]


@dataclass(eq=False)
class Variant:
    """One way of running the model, compiled once and timed once per round it is in."""

    name: str
    mode: str
    fn: Callable[[], object]
    compile_s: float
    decisions: list[Any] = field(default_factory=list)
    times: list[Measured] = field(default_factory=list)

    @property
    def rounds_ms(self) -> list[float]:
        return [t.median_ms for t in self.times]

    @property
    def ms(self) -> float:
        return statistics.median(self.rounds_ms)

    def interval(self, confidence: float) -> sig.Interval:
        return sig.median_interval(self.rounds_ms, confidence)

    @property
    def templates(self) -> int:
        return sum(1 for d in self.decisions if d.template)


@dataclass(eq=False)
class Comparison:
    """Whether ``ours`` is faster than ``theirs``: the paired ratio theirs/ours over the
    rounds both were timed in, and the outcome (``significance.decide``). One that
    ``follows`` is timed in the rounds the others need and never needs one more: its
    answer is known without timing (the same graph on both sides), its times are the row's."""

    ours: Variant
    theirs: Variant
    key: str = ""
    follows: bool = False
    interval: sig.Interval | None = None
    outcome: str = sig.UNDECIDED
    ours_ms: list[float] = field(default_factory=list)
    theirs_ms: list[float] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return len(self.ours_ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio": None if self.interval is None else self.interval.to_dict(),
            "outcome": self.outcome,
            "rounds": self.rounds,
        }


def compare(
    comparisons: Sequence[Comparison],
    *,
    rounds: int,
    max_rounds: int,
    confidence: float,
    margin: float,
    timer: Timer,
) -> float:
    """Time the comparisons' variants in interleaved rounds until each is decided or
    ``max_rounds`` (see the module's text); returns the confidence each look was held to."""
    schedule = sig.looks(rounds, max_rounds)
    held = sig.per_look(confidence, len(schedule))
    open_ = list(comparisons)
    done = 0
    for look in schedule:
        variants = list(dict.fromkeys(v for c in open_ for v in (c.ours, c.theirs)))
        for _ in range(look - done):
            timed = {}
            for v in variants:
                t = timer(v.name, v.fn)
                v.times.append(t)
                timed[id(v)] = t.median_ms
            for c in open_:
                c.ours_ms.append(timed[id(c.ours)])
                c.theirs_ms.append(timed[id(c.theirs)])
        done = look
        for c in open_:
            c.interval = sig.paired_ratio(c.theirs_ms, c.ours_ms, held)
            c.outcome = sig.decide(c.interval, margin)
        open_ = [c for c in open_ if c.outcome == sig.UNDECIDED]
        if all(c.follows for c in open_):
            break
    return held


__all__ = ["Comparison", "Timer", "Variant", "compare"]
