"""The intervals and decisions of `tune --model` (model_tuning/significance.py, model_tuning/interleave.py):
exact coverage of the sign-test interval, the error rate of decisions over several looks on
pure noise, and rounds that stop where a comparison decides."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from epilab.model_tuning import significance as sig
from epilab.model_tuning.interleave import Comparison, Variant, compare
from epilab.tuner.timing import Measured


def _coverage(n: int, k: int) -> float:
    """P(x_(k) <= median <= x_(n+1-k)) for n draws of a continuous law, by counting the
    draws below the median: all 2^n below/above patterns are equally likely."""
    inside = sum(1 for below in itertools.product((0, 1), repeat=n) if k <= sum(below) <= n - k)
    return inside / 2**n


@pytest.mark.parametrize("n", range(1, 16))
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_the_rank_is_the_narrowest_interval_that_covers(n, confidence):
    k = sig.rank(n, confidence)
    if k is None:
        assert _coverage(n, 1) < confidence  # even [min, max] falls short
        return
    assert _coverage(n, k) >= confidence
    assert k == n // 2 or _coverage(n, k + 1) < confidence  # one step narrower would not


def test_too_few_rounds_give_no_interval_and_no_decision():
    assert sig.min_rounds(0.95) == 6 and sig.rank(5, 0.95) is None
    interval = sig.paired_ratio([2.0] * 5, [1.0] * 5)
    assert interval.estimate == 2.0 and not interval.known and interval.contains(1.0)
    assert sig.decide(interval) == sig.UNDECIDED
    assert sig.decide(sig.paired_ratio([2.0] * 6, [1.0] * 6)) == sig.FASTER


def test_ratios_are_paired_by_round():
    # a slow spell that hits both variants of a round cancels in the pair; unpaired medians
    # of the same rounds would overlap completely
    ours = [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    theirs = [1.05 * t for t in ours]
    interval = sig.paired_ratio(theirs, ours)
    assert interval.low == pytest.approx(1.05) and interval.high == pytest.approx(1.05)
    assert sig.decide(interval, margin=0.01) == sig.FASTER
    assert sig.decide(interval, margin=0.10) == sig.NOT_FASTER
    wide = sig.Interval(1.05, 0.98, 1.12, 8, 0.95)
    assert sig.decide(wide) == sig.UNDECIDED and wide.contains(1.0)


@pytest.mark.parametrize(
    "args, words",
    [
        (([1.0, 2.0], [1.0]), "differ in number"),
        (([0.0], [1.0]), "positive"),
        (([], []), "at least one round"),
    ],
)
def test_bad_rounds_are_refused(args, words):
    with pytest.raises(ValueError, match=words):
        sig.paired_ratio(*args)


def test_looks_and_their_confidence():
    assert sig.looks(8, 32) == [8, 16, 24, 32] and sig.looks(8, 8) == [8] and sig.looks(5, 12) == [5, 10, 12]
    assert sig.per_look(0.95, 4) == pytest.approx(0.9875)
    for bad in [(0, 4), (8, 4)]:
        with pytest.raises(ValueError, match="rounds"):
            sig.looks(*bad)
    with pytest.raises(ValueError, match="between 0 and 1"):
        sig.rank(6, 1.0)


def _noisy(seed: int, ratio: float, sigma: float):
    """A timer: ``ours`` takes 1 ms, ``theirs`` ``ratio`` ms, both times a shared slow spell
    of the round (lognormal, drift) and noise of their own (lognormal, ``sigma``)."""
    rng = random.Random(seed)
    spell = {"ms": 1.0}

    def timer(name, fn):
        if name == "ours":
            spell["ms"] = math.exp(rng.gauss(0.0, 0.3))  # a new round: the host's mood
        base = 1.0 if name == "ours" else ratio
        ms = base * spell["ms"] * math.exp(rng.gauss(0.0, sigma))
        return Measured(ms, ms, ms, 1, "fake")

    return timer


def _decide(seed: int, ratio: float, sigma: float = 0.05, margin: float = 0.0, max_rounds: int = 32):
    ours, theirs = Variant("ours", "m", lambda: None, 0.0), Variant("theirs", "m", lambda: None, 0.0)
    c = Comparison(ours=ours, theirs=theirs)
    compare(
        [c], rounds=8, max_rounds=max_rounds, confidence=0.95, margin=margin, timer=_noisy(seed, ratio, sigma)
    )
    return c


def test_decisions_on_pure_noise_are_rarely_wrong_over_all_looks():
    # the same speed on both sides: "faster" is a false claim; four looks at 98.75% each keep
    # the chance of any false claim (either way) under 5%
    outcomes = [_decide(seed, ratio=1.0).outcome for seed in range(400)]
    faster, slower = outcomes.count(sig.FASTER), outcomes.count(sig.NOT_FASTER)
    assert faster / len(outcomes) <= 0.03 and (faster + slower) / len(outcomes) <= 0.06, (faster, slower)


def test_a_real_difference_is_found_and_rounds_stop_when_it_is():
    c = _decide(0, ratio=1.10, sigma=0.02)
    assert c.outcome == sig.FASTER and c.rounds == 8  # decided at the first look
    assert c.interval is not None and c.interval.low > 1.0 and len(c.ours.times) == 8
    # a gain smaller than the margin is called not faster; a tie within the noise can stay open
    assert _decide(1, ratio=1.005, sigma=0.002, margin=0.02).outcome == sig.NOT_FASTER
    noisy = _decide(2, ratio=1.01, sigma=0.2, margin=0.01, max_rounds=16)
    assert noisy.outcome == sig.UNDECIDED and noisy.rounds == 16


def _ratios_timer(seed: int, ratios: dict[str, float]):
    """A timer: each variant takes its ``ratios`` ms, with 5% noise of its own."""
    rng = random.Random(seed)

    def timer(name, fn):
        ms = ratios[name] * math.exp(rng.gauss(0.0, 0.05))
        return Measured(ms, ms, ms, 1, "fake")

    return timer


def _against(ours: Variant, name: str, follows: bool = False) -> Comparison:
    return Comparison(ours=ours, theirs=Variant(name, "m", lambda: None, 0.0), follows=follows)


def test_only_undecided_comparisons_get_more_rounds():
    # one shared "ours" against a clear loser and a near tie: the loser leaves at the first
    # look, the tie's rounds go on (still paired with the same rounds of ours)
    timer = _ratios_timer(3, {"ours": 1.0, "clear": 1.5, "tie": 1.0})
    ours = Variant("ours", "m", lambda: None, 0.0)
    clear, tie = _against(ours, "clear"), _against(ours, "tie")
    compare([clear, tie], rounds=8, max_rounds=24, confidence=0.95, margin=0.01, timer=timer)
    assert clear.outcome == sig.FASTER and clear.rounds == 8 and len(clear.theirs.times) == 8
    assert tie.rounds > 8 and len(ours.times) == tie.rounds == len(tie.theirs.times)
    assert tie.outcome in (sig.UNDECIDED, sig.NOT_FASTER)


def test_a_comparison_that_follows_is_timed_with_the_others_and_never_prolongs_the_rounds():
    # the same graph on both sides (an epilab step with no template, against Inductor): timed
    # in the rounds the clear comparison needs, then left undecided, not timed to max_rounds
    timer = _ratios_timer(4, {"ours": 1.0, "clear": 1.5, "same": 1.0})
    ours = Variant("ours", "m", lambda: None, 0.0)
    clear, same = _against(ours, "clear"), _against(ours, "same", follows=True)
    compare([clear, same], rounds=8, max_rounds=32, confidence=0.95, margin=0.01, timer=timer)
    assert clear.outcome == sig.FASTER and clear.rounds == 8
    assert same.rounds == 8 and len(same.theirs.times) == 8 and same.outcome == sig.UNDECIDED
    # alone, it gets the first look's rounds; without ``follows`` it ran to max_rounds
    for follows, rounds in ((False, 32), (True, 8)):
        alone = _against(Variant("ours", "m", lambda: None, 0.0), "same", follows=follows)
        compare([alone], rounds=8, max_rounds=32, confidence=0.95, margin=0.01, timer=timer)
        assert alone.outcome == sig.UNDECIDED and alone.rounds == rounds
