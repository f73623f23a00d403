"""What a GPU worker does with one task: check a candidate against the float64
reference on fresh random inputs (outputs poisoned with NaN first), then time it;
or time a library baseline the same way.

Only known failures become a failed trial: Triton compile errors, out of
resources, wrong results, and CUDA errors (after which the worker must restart).
Anything else propagates: it is a bug, not a bad config.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from epilab.ir import dtypes
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.templates.kind import InputSet
from epilab.templates.registry import bind, kind_of
from epilab.templates.runtime.binding import target_for
from epilab.templates.verify import failure, output_errors, poisoned_outputs, random_inputs
from epilab.tuner.baselines import baseline, serves
from epilab.tuner.timing import Measured, time_cuda, time_graph, time_wall

GRAPH_REPLAY_MS = 2.0  # a CUDA-graph replay holds about this much work (at least one call a set)
# how long a candidate (and a baseline, alike) is timed: events over EVENT_REP_MS of L2-flushed
# repetitions (at most EVENT_MAX_REPS) after EVENT_WARMUP_MS, then GRAPH_REPLAYS replays of a
# graph. (Half of the 100 ms / 500 reps / 20 replays before: at 12 trials the timing was 0.10-
# 0.26 s of each trial on an H100, a third of a problem's tuning; RESULTS.md, 2026-11-27.)
EVENT_WARMUP_MS, EVENT_REP_MS, EVENT_MAX_REPS, GRAPH_REPLAYS = 10.0, 40.0, 200, 10
ROTATE_L2_MULTIPLE = 3  # graph replays rotate over input sets of this many times L2 in all ...
MAX_INPUT_SETS = 16  # ... but never more sets than this (tiny problems stay in L2: the method says so)
# the family of each vendor baseline: a kind is timed against those of its ``library``


def device_for_tuning() -> torch.device:
    return (
        torch.device("cpu")
        if target_for_is_interpreter()
        else torch.device("cuda", torch.cuda.current_device())
    )


def target_for_is_interpreter() -> bool:
    from epilab.templates.runtime.build import interpreter_active

    return interpreter_active()


make_inputs = random_inputs  # fresh inputs of exactly the problem's shapes, dtypes and layouts


def _known_failure(e: BaseException) -> tuple[str, bool] | None:
    """(status, worker must restart) for failures that are a property of the config."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    if isinstance(e, OutOfResources):
        return "out_of_resources", False
    if isinstance(e, CompilationError):
        return "compile_error", False
    text = str(e)
    if "out of resource" in text.lower() or "shared memory" in text.lower():
        return "out_of_resources", False
    if isinstance(e, RuntimeError) and "PassManager::run failed" in text:
        # Triton's MLIR pipeline rejected the kernel (seen with Triton 3.6 on an H200: "operand
        # does not dominate this use" in make_ttgir for some configs of an epilogue with three
        # outputs at M=1); other configs of the same problem compile.
        return "compile_error", False
    if isinstance(e, RuntimeError) and ("CUDA error" in text or "illegal" in text.lower()):
        return "crashed", True
    return None


def input_set_count(bytes_per_set: int, device: torch.device) -> int:
    """How many input sets a graph replay rotates over so that together they outgrow L2."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 * 2**20)
    return max(1, min(MAX_INPUT_SETS, math.ceil(ROTATE_L2_MULTIPLE * l2 / max(bytes_per_set, 1))))


def _set_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)  # metadata only: never touches the data


def _measure(
    run: Callable[[], object], interpreter: bool, more_runs: Callable[[], list[Callable[[], object]]]
) -> tuple[Measured, Measured | None]:
    """Events with L2 flushed, and a CUDA graph over ``run`` and ``more_runs()`` (the same
    computation on other input sets), so that neither launch gaps nor an L2 kept warm between
    calls flatter the number. Every candidate and every baseline gets both, so a template is
    always compared with a library by the same method (``db.comparable_ms``: graph with graph):
    a baseline of several launches (Inductor's cuBLAS call and its pointwise kernel) is not
    charged host time that a template's single launch escapes, whatever their lengths."""
    if interpreter:
        return time_wall(run), None
    events = time_cuda(run, warmup_ms=EVENT_WARMUP_MS, rep_ms=EVENT_REP_MS, max_reps=EVENT_MAX_REPS)
    runs = [run, *more_runs()]
    rounds = max(1, min(64 // len(runs), round(GRAPH_REPLAY_MS / max(events.median_ms * len(runs), 1e-3))))
    try:
        return events, time_graph(runs, calls=rounds, replays=GRAPH_REPLAYS)
    except RuntimeError as e:  # code a CUDA graph cannot capture: compared by events only
        if "capture" not in str(e).lower():
            raise
        torch.cuda.synchronize()
        return events, None


_rotating: dict[tuple[str, int, torch.device], list[InputSet]] = {}  # the last problem's only


def _other_sets(
    problem: Problem, first: InputSet, outs: tuple[torch.Tensor, ...], seed: int
) -> list[InputSet]:
    """The input sets a graph replay rotates over besides ``first``: made once per problem and
    worker, and shared by its candidates and baselines (the same data for each, instead of new
    random sets for every candidate)."""
    a, b, operands = first
    count = input_set_count(_set_bytes(a, b, *operands.values(), *outs), a.device)
    key = (problem.key, count, a.device)
    if key not in _rotating:
        _rotating.clear()
        _rotating[key] = [make_inputs(problem, a.device, seed + 1 + i) for i in range(count - 1)]
    return _rotating[key]


def _result(status: str, **fields: Any) -> dict[str, Any]:
    return {"status": status, **fields}


def method_text(events: Measured, graph: Measured) -> str:
    """Both methods in the database's 64 characters."""
    rotating = " rotating" if graph.rotating else " L2-warm"
    return f"events x{events.reps} L2-flushed; graph {graph.calls} calls x{graph.reps}{rotating}; medians"


def _timed(events: Measured, graph: Measured | None, err: float) -> dict[str, Any]:
    out = {
        "median_ms": events.median_ms,
        "p20_ms": events.p20_ms,
        "p80_ms": events.p80_ms,
        "method": events.method if graph is None else method_text(events, graph),
        "max_rel_error": err,
    }
    if graph is not None:
        out["graph_ms"] = graph.median_ms
    return out


class CompileCounts:
    """Triton's compiles in a block, through its compilation listener: how many kernels were
    built and how many came from its on-disk cache (a binary another problem or an earlier
    command built for the same source and specialization), and the seconds of the builds.
    Nested or not, the listener set before is called too and put back after."""

    def __init__(self) -> None:
        self.hits = 0
        self.built = 0
        self.build_s = 0.0

    def __enter__(self) -> CompileCounts:
        from triton import knobs

        self._before = knobs.compilation.listener

        def listen(**kw: Any) -> None:
            if kw.get("cache_hit"):
                self.hits += 1
            else:
                self.built += 1
                self.build_s += getattr(kw.get("times"), "total", 0) / 1e6  # microseconds
            if self._before is not None:
                self._before(**kw)

        knobs.compilation.listener = listen
        return self

    def __exit__(self, *exc: object) -> None:
        from triton import knobs

        knobs.compilation.listener = self._before

    def fields(self) -> dict[str, Any]:
        """What a task's result says of its compiles (``profile.CompileStats``)."""
        return {"cache_hits": self.hits, "built": self.built, "build_s": round(self.build_s, 4)}


class Phases:
    """Where a task's seconds went, phase by phase (``lap(name)`` ends the phase under way):
    what ``epilab tune`` reports as the time spent on compiles, checks and timing."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._since
        self._since = now


def evaluate_candidate(problem_json: str, config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Check, then time, one config; returns a result dict (status, timings, error, detail,
    the seconds of each phase: inputs, render, launch, reference, timing, and its Triton
    compiles: ``CompileCounts.fields``)."""
    phases = Phases()
    problem = Problem.from_json(problem_json)
    cfg = Config.from_dict(config)
    interpreter = target_for_is_interpreter()
    device = torch.device("cpu") if interpreter else torch.device("cuda", torch.cuda.current_device())
    a, b, operands = make_inputs(problem, device, seed)
    outs = poisoned_outputs(problem, device)
    phases.lap("inputs")
    with CompileCounts() as counts:
        try:
            bound = bind(problem, cfg, a, b, operands, out=outs)
            phases.lap("render")  # the template rendered and its module imported
            bound.run()
            if not interpreter:
                torch.cuda.synchronize()
        except Exception as e:
            known = _known_failure(e)
            if known is None:
                raise
            phases.lap("launch")
            return _result(
                known[0], detail=_short(e), restart=known[1], phases=phases.seconds, **counts.fields()
            )
    phases.lap("launch")  # the first call: loading the kernel (compiling it if the pool did not)
    errors = output_errors(problem, outs, kind_of(problem).reference(problem, a, b, operands))
    err = max(e for e, _ in errors)
    why = failure(errors)
    phases.lap("reference")
    if why is not None:
        return _result(
            "incorrect",
            max_rel_error=err if math.isfinite(err) else None,
            detail=why,
            phases=phases.seconds,
            **counts.fields(),
        )
    try:
        events, graph = _measure(
            bound.run,
            interpreter,
            lambda: [bind(problem, cfg, *x).run for x in _other_sets(problem, (a, b, operands), outs, seed)],
        )
    except Exception as e:
        known = _known_failure(e)
        if known is None:
            raise
        phases.lap("timing")
        return _result(known[0], detail=_short(e), restart=known[1], phases=phases.seconds, **counts.fields())
    phases.lap("timing")
    return _result("ok", **_timed(events, graph, err), phases=phases.seconds, **counts.fields())


def vendor_serves(problem: Problem, library: str) -> bool:
    """Whether ``library`` runs ``problem``'s kind (``baselines.serves``)."""
    return serves(library, kind_of(problem).library)


def baseline_fn(problem: Problem, library: str) -> Callable[..., tuple[torch.Tensor, ...]] | None:
    """A function ``(a, b, operands) -> outputs`` computing the problem with ``library``
    (``tuner/baselines.BASELINES``), or None where it does not apply. Each library builds on
    the kind's ``baseline`` (its ``library``'s op: torch.matmul for the matmul kinds, torch's
    conv2d for conv2d) then the epilogue in eager torch at the input dtype."""
    kind = kind_of(problem)
    if not serves(library, kind.library):
        return None
    out_dtypes = [dtypes.torch_dtype(o.dtype) for o in problem.epilogue.outputs]

    def eager(
        a: torch.Tensor, b: torch.Tensor, operands: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        outs = kind.baseline(problem, a, b, operands)
        return tuple(v.to(dt) for v, dt in zip(outs, out_dtypes, strict=True))

    return baseline(library).build(problem, eager)


def evaluate_baseline(problem_json: str, library: str, seed: int) -> dict[str, Any]:
    problem = Problem.from_json(problem_json)
    if not vendor_serves(problem, library):  # skipped before any input is made
        return _result("skipped", detail=f"{library} does not apply to this problem")
    interpreter = target_for_is_interpreter()
    if interpreter:
        return _result("skipped", detail="baselines are not timed in the interpreter")
    device = torch.device("cuda", torch.cuda.current_device())
    a, b, operands = make_inputs(problem, device, seed)
    base = baseline_fn(problem, library)
    if base is None:
        return _result("skipped", detail=f"{library} does not apply to this problem")
    laid = kind_of(problem).baseline_layouts  # once per input set, not inside the timed calls
    given = operands
    operands = laid(given)
    outs = base(a, b, operands)
    torch.cuda.synchronize()
    refs = kind_of(problem).reference(problem, a, b, given)
    err = max(rel_error(o, r) for o, r in zip(outs, refs, strict=True))

    def others() -> list[Callable[[], object]]:
        sets = [(x, y, laid(ops)) for x, y, ops in _other_sets(problem, (a, b, given), outs, seed)]
        return [lambda s=s: base(*s) for s in sets]

    events, graph = _measure(lambda: base(a, b, operands), False, others)
    return _result("ok", **_timed(events, graph, err if math.isfinite(err) else 1e30))


def _short(e: BaseException) -> str:
    lines = traceback.format_exception_only(type(e), e)
    return "".join(lines).strip()[-1500:]


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Entry point of a worker for one task (see worker.py)."""
    job = task["job"]
    try:
        if job == "candidate":
            return evaluate_candidate(task["problem"], task["config"], task["seed"])
        if job == "baseline":
            return evaluate_baseline(task["problem"], task["library"], task["seed"])
        if job == "compile":
            return compile_candidate(task["problem"], task["config"])
        if job == "probe":
            return probe_device()
    except (torch.OutOfMemoryError, MemoryError) as e:  # the problem is too large, not the config wrong
        return _result("out_of_resources", detail=f"out of memory: {_short(e)}", restart=True)
    except RuntimeError as e:
        if "can't allocate memory" not in str(e):  # the CPU allocator's words
            raise
        return _result("out_of_resources", detail=f"out of memory: {_short(e)}", restart=True)
    raise ValueError(f"unknown job {job!r}: compile, candidate, baseline or probe")


def probe_device() -> dict[str, Any]:
    """Whether the worker's device still computes (asked after a candidate crashed: a
    crash of every candidate is a lost device, not bad configs)."""
    try:
        device = device_for_tuning()
        x = torch.arange(64, dtype=torch.float32, device=device)
        total = float((x * 2).sum().item())
    except Exception as e:  # whatever the driver says, the device cannot be used
        return _result("crashed", detail=_short(e))
    if total != 4032.0:
        return _result("crashed", detail=f"{device} computed a wrong sum ({total}, not 4032)")
    return _result("ok")


def compile_candidate(problem_json: str, config: dict[str, Any]) -> dict[str, Any]:
    """Compile (not launch) a candidate: what the parallel compile pool runs; with the seconds
    of its phases in the pool's process (inputs, render, compile) and its Triton compiles."""
    phases = Phases()
    problem = Problem.from_json(problem_json)
    cfg = Config.from_dict(config)
    device = device_for_tuning()
    a, b, operands = make_inputs(problem, device, 0)
    phases.lap("inputs")
    with CompileCounts() as counts:
        try:
            bound = bind(problem, cfg, a, b, operands)
            phases.lap("render")
            bound.compile()
        except Exception as e:
            known = _known_failure(e)
            if known is None:
                raise
            phases.lap("compile")
            return _result(known[0], detail=_short(e), pool_phases=phases.seconds, **counts.fields())
    phases.lap("compile")
    return _result("compiled", pool_phases=phases.seconds, **counts.fields())


__all__ = ["evaluate_baseline", "evaluate_candidate", "make_inputs", "run_task", "target_for"]
