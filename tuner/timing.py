"""Timing a launch on the GPU, the same way for candidates and baselines.

``time_cuda``: warm-up by time, then N repetitions, each preceded by a 256 MiB
write that flushes L2 (and keeps the GPU busy while the next launch is queued,
so launch latency stays out of the number), each timed with its own pair of
CUDA events; the median with p20/p80. ``time_graph``: per-call time of a CUDA
graph of many calls, for kernels so short that even that is dominated by launch
gaps; given several functions over different input sets it rotates through them
(the tuner sizes them to outgrow L2, so the data comes from DRAM on every call). ``time_wall``: the
interpreter's wall-clock time, labelled as such: it is not GPU time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

FLUSH_BYTES = 256 * 2**20
_flush_buffers: dict[torch.device, torch.Tensor] = {}


@dataclass(frozen=True)
class Measured:
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    method: str
    calls: int = 1  # calls per repetition (a CUDA graph's)
    rotating: bool = False  # over several input sets


def _quantiles(times: list[float]) -> tuple[float, float, float]:
    if len(times) == 1:
        return times[0], times[0], times[0]
    q = statistics.quantiles(times, n=10, method="inclusive")
    return statistics.median(times), q[1], q[7]


def _flush_buffer(device: torch.device) -> torch.Tensor:
    if device not in _flush_buffers:
        _flush_buffers[device] = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)
    return _flush_buffers[device]


def time_cuda(
    fn: Callable[[], object],
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 10,
    max_reps: int = 500,
) -> Measured:
    """Median/p20/p80 ms of ``fn`` with L2 flushed before every repetition."""
    device = torch.device("cuda", torch.cuda.current_device())
    flush = _flush_buffer(device)
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    calls = 0
    while (time.perf_counter() - start) * 1e3 < warmup_ms or calls < 3:
        flush.zero_()
        fn()
        calls += 1
        if calls % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(begin.elapsed_time(end) / 5, 1e-3)
    reps = int(min(max_reps, max(min_reps, rep_ms / estimate)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends, strict=True):
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    med, p20, p80 = _quantiles([s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)])
    return Measured(med, p20, p80, reps, f"cuda-events; L2 flushed before each of {reps} reps; median")


def time_graph(
    fns: Callable[[], object] | Sequence[Callable[[], object]], *, calls: int = 50, replays: int = 20
) -> Measured:
    """Per-call ms of a CUDA graph that makes ``calls`` rounds through ``fns`` (one
    function, or several over rotating input sets so that they outgrow L2)."""
    fns = [fns] if callable(fns) else list(fns)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            for fn in fns:
                fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / (calls * len(fns)))
    med, p20, p80 = _quantiles(times)
    warm = "rotating inputs" if len(fns) > 1 else "L2 warm"
    return Measured(
        med,
        p20,
        p80,
        replays,
        f"cuda-graph of {calls * len(fns)} calls, {replays} replays; {warm}; median",
        calls * len(fns),
        len(fns) > 1,
    )


def time_wall(fn: Callable[[], object], *, reps: int = 1) -> Measured:
    """Wall-clock ms in Triton's interpreter: NOT GPU time, only for dry runs."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    med, p20, p80 = _quantiles(times)
    return Measured(med, p20, p80, reps, "interpreter wall-clock (not GPU time)")
