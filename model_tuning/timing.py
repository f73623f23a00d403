"""How a model's call is timed: per call (``time_calls``: CUDA events around groups of
back-to-back calls, host time in) or replayed under CUDA graphs (``replayed``: the step's GPU
time); ``default_timer`` picks one by mode."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from epilab.model_tuning.interleave import Timer
from epilab.model_tuning.variants import cuda_graphs
from epilab.tuner.timing import Measured, time_wall

REPLAY_CALLS = 10  # steps per CUDA graph in the CUDA-graph modes


def replayed(fn: Callable[[], object]) -> Measured:
    """Per-step ms of ``fn`` captured ``REPLAY_CALLS`` times in one CUDA graph, replayed: the
    GPU time of the step, without host work between steps (L2 warm)."""
    from epilab.tuner.timing import time_graph

    return time_graph(fn, calls=REPLAY_CALLS, replays=20)


# per call, one variant's time in a round: a short window (after a short warm-up), so that
# the variants of a round are timed close together and a slow spell of the shared host
# falls on all of them alike; the rounds, not the windows, carry the statistics
PER_CALL_WARMUP_MS = 20.0
PER_CALL_WINDOW_MS = 60.0


def default_timer(mode: str, on_gpu: bool) -> Timer:
    if not on_gpu:
        return lambda _, fn: time_wall(fn, reps=3)
    if cuda_graphs(mode):
        return lambda _, fn: replayed(fn)
    return lambda _, fn: time_calls(fn, warmup_ms=PER_CALL_WARMUP_MS, rep_ms=PER_CALL_WINDOW_MS)


def time_calls(
    fn: Callable[[], object], *, calls: int = 10, warmup_ms: float = 50.0, rep_ms: float = 300.0
) -> Measured:
    """Per-call ms of ``fn`` called back to back: CUDA events around groups of ``calls``."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while (time.perf_counter() - start) * 1e3 < warmup_ms:
        fn()
        torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    groups = int(min(200, max(5, rep_ms / max(begin.elapsed_time(end), 1e-3))))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(groups)
    ]
    for s, e in events:
        s.record()
        for _ in range(calls):
            fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) / calls for s, e in events)
    q = statistics.quantiles(times, n=10, method="inclusive")
    return Measured(
        statistics.median(times),
        q[1],
        q[7],
        groups,
        f"cuda-events, {groups} groups of {calls} back-to-back calls (host time in, L2 warm); median",
    )
