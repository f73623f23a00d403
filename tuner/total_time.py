"""A total time for a tuning run (``epilab tune --total-time 10m``), spread over its problems.

Each list of problems the run tunes (a suite, or a model's pass) shares the time left until
the run's deadline, times the number of GPUs tuning it, by each problem's share of the time:
its floor (``roofline.floor_ms``: the fewest milliseconds its FLOPs and bytes take on the
device; on a device or dtype without a figure, the H100's bf16 figures stand in, since only the
ratios count). A problem that is a third of the list's time gets a third of its search time.
The share caps the problem's ``--time-budget`` (never raises it); its ``--trials`` still apply.
It bounds the searches, whose clocks are read between batches, not the baselines or a model's
checks in context: a run can end a little past its deadline. A list that starts after the
deadline gives its problems no search time (no trial is run; their baselines still are), and
the work list counts them done, as it does a search that ran out of ``--time-budget``: a larger
``--trials`` or ``--restart`` tunes them again.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence

from epilab.ir.problem import Problem
from epilab.policy.roofline import floor_ms
from epilab.tuner.tune import problem_bytes, problem_flops

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*$")


def parse_duration(text: str) -> float:
    """Seconds of ``90``, ``90s``, ``10m``, ``10min``, ``1.5h``; ValueError otherwise."""
    found = _DURATION.match(text.lower())
    seconds = float(found.group(1)) * _UNITS[found.group(2) or ""] if found else 0.0
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a duration: give seconds, or a number with s, m or h (10m, 1.5h)")
    return seconds


def weight(problem: Problem, device_name: str) -> float:
    """A problem's share of the time, before normalising: its floor in ms on the device."""
    flops, nbytes = problem_flops(problem), problem_bytes(problem)
    found = floor_ms(flops, nbytes, problem.dtype, device_name)
    return found if found is not None else floor_ms(flops, nbytes, "bfloat16", "H100") or 0.0


def spread(
    deadline: float,
    problems: Sequence[Problem],
    device_name: str,
    gpus: int = 1,
    floor_s: float = 0.0,
    counts: Mapping[str, int] | None = None,
) -> dict[str, float]:
    """Problem key -> seconds of search: the time until ``deadline`` (``time.monotonic``) on
    ``gpus`` GPUs, by each problem's ``weight`` (times its ``counts``: the sites a model runs
    it at, default 1); 0 for all once the deadline has passed. ``floor_s``: every problem's
    seconds first, where the time left covers them all (a small problem still gets its seeds
    tried), the rest by weight."""
    left = max(0.0, deadline - time.monotonic()) * max(gpus, 1)
    counts = counts or {}
    weights = {p.key: weight(p, device_name) * counts.get(p.key, 1) for p in problems}
    floor = floor_s if floor_s * len(weights) <= left else 0.0
    left -= floor * len(weights)
    total = sum(weights.values())
    if total <= 0:
        return {k: floor + left / max(len(weights), 1) for k in weights}
    return {k: floor + left * w / total for k, w in weights.items()}


# ``tune --model`` without ``--total-time``: the tuning of a model's problems takes
# MODEL_BASE_S + MODEL_PER_PROBLEM_S a problem, within MODEL_LIMITS_S, spread by weight with at
# least MODEL_FLOOR_S each: a 2-layer decoder's 9 problems ~50 s, a convnet's 60 ~3 min
MODEL_BASE_S, MODEL_PER_PROBLEM_S, MODEL_LIMITS_S, MODEL_FLOOR_S = 20.0, 3.0, (45.0, 240.0), 1.5


def model_tuning_s(problems: int) -> float:
    """The default seconds for tuning a model's ``problems`` (see the constants above)."""
    low, high = MODEL_LIMITS_S
    return min(high, max(low, MODEL_BASE_S + MODEL_PER_PROBLEM_S * problems))
