"""Intervals and decisions over interleaved timing rounds (``tune --model``).

A round times every variant once, back to back; rounds interleave the variants, so a slow
spell of a shared host falls on every variant of the round alike. A comparison of two
variants is therefore *paired*: round ``i`` gives one ratio ``theirs_i / ours_i`` (above 1:
ours is faster), and the statement made is about the median of those ratios.

The interval is distribution-free: for ``n`` independent ratios with median ``m``, each lies
below ``m`` with probability 1/2, so ``[x_(k), x_(n+1-k)]`` (order statistics) covers ``m``
with probability ``1 - 2 P(Binomial(n, 1/2) <= k - 1)`` (the sign test's interval). No
normality, no bootstrap resampling of a handful of rounds (whose percentile interval is too
narrow at n < 20); the cost is that it needs ``n >= 6`` rounds to say anything at 95%
(``[min, max]`` of 6 rounds covers with 1 - 2/64 = 96.9%). A variant's own time gets the same
interval over its rounds.

Decisions (``decide``): ours is *faster* when the whole interval lies at or above
``1 + margin``, *not faster* when it lies below ``1 + margin``, *undecided* otherwise. Rounds
are added in looks (``looks``: after ``rounds``, ``2 rounds``, ... up to ``max_rounds``); a
comparison stops at the first look that decides it. Looking several times at growing data
and stopping when it looks decided inflates the error rate; each look is therefore held to
``1 - (1 - confidence) / number of looks`` (Bonferroni), which keeps the chance of any wrong
decision over all looks at or below ``1 - confidence``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
MARGIN = 0.01  # a template is kept where the model is faster with it by at least 1%
FASTER, NOT_FASTER, UNDECIDED = "faster", "not faster", "undecided"


@dataclass(frozen=True)
class Interval:
    """A median and its distribution-free interval; ``low``/``high`` None: too few rounds
    to reach ``confidence``."""

    estimate: float
    low: float | None
    high: float | None
    n: int
    confidence: float

    @property
    def known(self) -> bool:
        return self.low is not None and self.high is not None

    def contains(self, value: float) -> bool:
        """True also where the rounds are too few to say."""
        return not self.known or self.low <= value <= self.high  # type: ignore[operator]

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "confidence": self.confidence,
        }


def rank(n: int, confidence: float) -> int | None:
    """The largest ``k >= 1`` such that ``[x_(k), x_(n+1-k)]`` of ``n`` values covers their
    median with at least ``confidence``; None when even ``[min, max]`` falls short."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence!r}: give a probability strictly between 0 and 1")
    best, tail = None, 0.0
    for k in range(1, n // 2 + 1):
        tail += math.comb(n, k - 1) / 2.0**n  # P(Binomial(n, 1/2) <= k - 1)
        if 1.0 - 2.0 * tail < confidence:
            break
        best = k
    return best


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The median of ``values`` and its sign-test interval at ``confidence``."""
    if not values:
        raise ValueError("no values: an interval needs at least one round")
    ordered = sorted(values)
    k = rank(len(ordered), confidence)
    low, high = (ordered[k - 1], ordered[-k]) if k is not None else (None, None)
    return Interval(statistics.median(ordered), low, high, len(ordered), confidence)


def paired_ratio(theirs: Sequence[float], ours: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """``theirs / ours`` over paired rounds (round i of each): above 1, ours is faster."""
    if len(theirs) != len(ours):
        raise ValueError(f"paired rounds differ in number: {len(theirs)} against {len(ours)}")
    if any(t <= 0 for t in (*theirs, *ours)):
        raise ValueError("every round's time must be positive")
    return median_interval([t / o for t, o in zip(theirs, ours, strict=True)], confidence)


def decide(interval: Interval, margin: float = MARGIN) -> str:
    """``FASTER`` where the whole interval is at or above ``1 + margin``, ``NOT_FASTER`` where
    it is below, ``UNDECIDED`` where it straddles ``1 + margin`` or the rounds are too few."""
    if not interval.known:
        return UNDECIDED
    if interval.low >= 1.0 + margin:  # type: ignore[operator]
        return FASTER
    if interval.high < 1.0 + margin:  # type: ignore[operator]
        return NOT_FASTER
    return UNDECIDED


def looks(rounds: int, max_rounds: int) -> list[int]:
    """The round counts at which comparisons are looked at: every ``rounds``, up to ``max_rounds``."""
    if rounds < 1 or max_rounds < rounds:
        raise ValueError(f"rounds {rounds}, max_rounds {max_rounds}: need 1 <= rounds <= max_rounds")
    return [*range(rounds, max_rounds, rounds), max_rounds]


def per_look(confidence: float, n_looks: int) -> float:
    """The confidence each of ``n_looks`` looks is held to (Bonferroni)."""
    return 1.0 - (1.0 - confidence) / n_looks


def min_rounds(confidence: float) -> int:
    """The fewest rounds whose ``[min, max]`` reaches ``confidence``."""
    n = 1
    while rank(n, confidence) is None:
        n += 1
    return n


__all__ = [
    "CONFIDENCE",
    "FASTER",
    "MARGIN",
    "NOT_FASTER",
    "UNDECIDED",
    "Interval",
    "decide",
    "looks",
    "median_interval",
    "min_rounds",
    "paired_ratio",
    "per_look",
    "rank",
]
