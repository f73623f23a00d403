"""Tuning a model: its problems found by compiling it, tuned, checked in context, measured.

    report = epilab.tune_model(model, x, db="tuned.db")      # or: epilab tune --model pkg.mod:factory
    print(report.table())

Modes (``MODES``): the model runs per call or replayed as CUDA graphs, compiled by Inductor
default or max-autotune (where Inductor autotunes the kernels of the matmuls it keeps);
epilab is compiled in the same mode as the Inductor it is compared with. A call is an
inference call (autograd off), or with ``ModelOptions.train`` a training step
(``model_tuning/step.py``: grads reset, forward, backward; no optimizer step), whose forward and
backward graphs both bring problems, and whose verdicts are stored as a training step's: the
compiler follows them only in training graphs (``compiler/backend.py:_training``), and
inference's only at inference.

1. **Record.** The model is compiled with the epilab backend (policy ``auto``, this
   database) per call and as under CUDA graphs (option ``cuda_graphs``: the launch-bound
   rules of ``compiler/decide.py`` do not apply); one call each. Every matched anchor's
   decision names its problem and its twins.
2. **Tune.** Each of those problems that no record serves (its own, or one of the same
   math: ``Problem.identity``) is tuned with the budget, like ``epilab tune``.
3. Steps 1-2 repeat until a pass finds no new problem (``max_passes``): decisions change
   the graph (a template that fuses a SwiGLU's ``silu(gate) * up`` changes what is left
   for the up projection), so the problems of a tuned model are not all visible at first.
4. **Check in context** (``model_tuning/in_context.py``; ``compiler/decide.py`` reads the
   verdicts). Per Inductor mode the model is compiled once with every chosen template
   switchable at run time against its aten path (``compiler/switch.py``); the templates are
   judged in groups on that one compile (all at once, halves where a group may lose), problems
   too small to move the model by ``margin`` are skipped, and the model with the kept
   templates, compiled without switches, is timed against Inductor: unless it is faster by the
   same rule (``margin`` at ``confidence``, ``model_tuning/significance.py``), every template of the
   model is rejected. Each verdict is stored (problem, device, versions, CUDA-graph and
   Inductor mode, both times, the interval, the rounds, the outcome, the model's label); later
   compiles in that mode follow it without measuring.
5. **Measure.** In each mode, Inductor and epilab (and eager, per call) in interleaved
   rounds until epilab's paired ratios against each decide: every time with its interval,
   every speedup with its interval, called significant only where that excludes 1 (and
   never where epilab kept no template: then it compiles Inductor's graph, and that
   comparison only follows the others' rounds, ``Comparison.follows``).

A compile that several steps need is made once (``variants.Compiles``): Inductor's per
Inductor mode (probe, check, measurement), the record step's last (the capture probe's), and
the check's model with its kept templates (the measurement's epilab, wherever the verdicts
stored make it what a later compile gives). Default modes, nothing new in the second pass:
two record passes of one compile a mode, then the switched model, Inductor and one model
with its kept templates a mode.

Timing, per call (``time_calls``): CUDA events around groups of back-to-back calls after a
warm-up (host overhead included, as a serving loop sees it; L2 is not flushed between calls
of a model), the median of the groups' per-call times, in a short window per variant and
round (``PER_CALL_WINDOW_MS``) so that a round's variants are timed close together. Under
CUDA graphs (``replayed``): the compiled step (Inductor without its CUDA-graph trees)
captured ``REPLAY_CALLS`` times in one CUDA graph and replayed, the GPU time of a step. Not
``reduce-overhead`` timed per call: at decode a small model's step there is bound by the
trees' host work (Dynamo's guards, the trees' bookkeeping, the input copy: 90-135 us a step
against 40 us of GPU work for a Qwen2 MLP on an H100, benchmarks/RESULTS.md), the
same with or without a template, so a kernel's gain drowned in host noise and verdicts were
coin flips; a real model's step (dozens of layers, one graph) is GPU-bound, what
``replayed`` measures. A step that cannot be captured (a host sync) skips the CUDA-graph
modes, and the report says so. Each variant is timed once per round, rounds interleave the
variants, a variant's time is the median over rounds and a ratio the median of the rounds'
paired ratios. In Triton's interpreter (CPU tests) the times are wall-clock and say nothing
of a GPU.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from epilab.db import TuningDB
from epilab.ir.problem import Problem
from epilab.model_tuning import significance as sig
from epilab.model_tuning.interleave import Comparison, Timer, Variant
from epilab.model_tuning.load import one_line
from epilab.model_tuning.report import ModelReport, rule_text
from epilab.model_tuning.step import NothingToTrain, Workload
from epilab.model_tuning.timing import default_timer, replayed
from epilab.model_tuning.variants import (
    MAX_ROUNDS,
    MODES,
    ROUNDS,
    Compiles,
    ModelOptions,
    compared,
    compile_variant,
    cuda_graphs,
    epilab_options,
    inductor_mode,
    inductor_options,
)
from epilab.tuner.baselines import KIND_LIBRARIES
from epilab.tuner.tune import ProblemResult, Tuner
from epilab.tuner.work import unserved

# the steps whose compiles the report counts (besides the context check's)
RECORD, PROBE, MEASURE = "record", "capture probe", "measure"

# runs the tuning of (label, problem) jobs: returns the results and whether it was interrupted
TuneJobs = Callable[[Tuner, list[tuple[str, Problem]]], tuple[list[ProblemResult], bool]]


def tune_model(
    model: torch.nn.Module,
    *example_inputs: Any,
    db: str | Path | TuningDB | None = None,
    tuner: Tuner | None = None,
    options: ModelOptions | None = None,
    label: str | None = None,
    tune_jobs: TuneJobs | None = None,
    timer: Timer | None = None,
    say: Callable[[str], None] | None = None,
    progress: bool = True,
) -> ModelReport:
    """Record, tune, check in context and measure ``model`` on ``example_inputs`` (see the
    module's text). ``tuner``: a ``Tuner`` over ``db`` (default: one with the default budget
    and cuBLAS/cuDNN baselines); ``tune_jobs``: how a list of problems is tuned (the command
    line's progress bars); ``timer``: how a variant is timed, given its name and its call
    (default ``time_calls`` on a GPU, wall-clock in the interpreter); ``say``: where its steps
    are told, and ``progress``: whether they are (default: on stderr, with each problem's tuning
    as ``tuner/progress.py`` reports it)."""
    from epilab.config import settings
    from epilab.tuner import progress as reported

    if say is None:
        say = (lambda text: print(f"epilab: {text}", file=sys.stderr, flush=True)) if progress else _silent
    if tune_jobs is None:
        tune_jobs = reported.tune_all if progress else _tune_all

    options = options or ModelOptions()
    _check_options(options)
    work = Workload(model, example_inputs, options.train)
    if options.train:
        _check_trainable(work, options)
    store = db if isinstance(db, TuningDB) else TuningDB.open(str(db) if db is not None else settings().db)
    owned = tuner is None
    if tuner is None:
        from epilab.tuner.tune import TuneOptions

        interpret = not any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs)
        tuner = Tuner(
            store, TuneOptions(baselines=KIND_LIBRARIES, interpret=interpret, jobs=0 if interpret else 8)
        )
    on_gpu = not tuner.options.interpret
    modes = tuple(m for m in options.modes if on_gpu or m == "per call")
    timers = {mode: timer or default_timer(mode, on_gpu) for mode in modes}
    report = _new_report(label or type(model).__name__, tuner, options, on_gpu)
    try:
        with _compiling(work, options.freezing):
            compiles = Compiles(work)
            _record_and_tune(work, store, tuner, modes, options, report, tune_jobs, say, compiles)
            if report.interrupted:
                return report
            timed = modes
            if options.check_context or options.measure:  # probed once for both steps
                started = time.monotonic()
                timed = _replayable(store, modes, on_gpu, report, say, compiles)
                report.seconds["capture probe"] = time.monotonic() - started
            if options.check_context:
                from epilab.model_tuning.in_context import check_in_context

                started = time.monotonic()
                check_in_context(store, tuner, timed, options, report, timers, say, compiles)
                report.seconds["context check"] = time.monotonic() - started
            if options.measure:
                started = time.monotonic()
                for mode in timed:
                    _measure(store, mode, options, report, timers[mode], say, compiles)
                report.seconds["measure"] = time.monotonic() - started
            compiles.clear()
    finally:
        if owned:
            tuner.close()
        if not isinstance(db, TuningDB):
            store.close()
    return report


def _check_options(options: ModelOptions) -> None:
    """Refuse options that name no mode, or whose rounds can decide nothing."""
    unknown = set(options.modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown mode(s) {sorted(unknown)}; choose from {MODES}")
    if not 0.5 <= options.confidence < 1.0 or not 0.0 <= options.margin < 1.0:
        raise ValueError(
            f"confidence {options.confidence!r}, margin {options.margin!r}: give a confidence in "
            "[0.5, 1) and a margin in [0, 1)"
        )
    schedule = sig.looks(options.rounds, options.max_rounds)  # refuses rounds outside 1..max_rounds
    needed = sig.min_rounds(sig.per_look(options.confidence, len(schedule)))
    if (options.check_context or options.measure) and options.max_rounds < needed:
        raise ValueError(
            f"max_rounds {options.max_rounds} (rounds {options.rounds}) can decide nothing at "
            f"{options.confidence:.0%}: with {len(schedule)} look(s) the interval needs at least "
            f"{needed} rounds; give more (the default is {ROUNDS} rounds, up to {MAX_ROUNDS})"
        )


def _new_report(label: str, tuner: Tuner, options: ModelOptions, on_gpu: bool) -> ModelReport:
    """The report of a model's tuning, its timing method and rule stated before anything runs."""
    report = ModelReport(
        label,
        tuner.device.name,
        tuner.versions,
        method="interleaved rounds: per call time_calls, under CUDA graphs the step replayed in one "
        "(GPU time); medians of rounds and of paired ratios (model_tuning/tune.py)",
    )
    if not on_gpu:
        report.method = "interpreter wall-clock (not GPU time)"
    report.rule = rule_text(options)
    if options.freezing:
        report.method += "; every variant compiled with Inductor freezing (weights as constants)"
    if options.train:
        report.training = True
        report.method += (
            "; a call is a training step: grads reset, forward, backward of a fixed random "
            "cotangent (no optimizer step; model_tuning/step.py)"
        )
    return report


def _check_trainable(work: Workload, options: ModelOptions) -> None:
    """A training step needs something to differentiate, and no freezing (which makes the
    weights constants)."""
    if options.freezing:
        raise ValueError(
            "freezing makes the weights constants, for inference only: give train or freezing, not both"
        )
    tensors = [t for t in (*work.model.parameters(), *work.inputs) if isinstance(t, torch.Tensor)]
    if not any(t.requires_grad for t in tensors):
        raise NothingToTrain(
            "a training step needs a parameter (or input) that requires grad, and none does; "
            "leave --train out to tune the model for inference"
        )


@contextlib.contextmanager
def _compiling(work: Workload, freezing: bool = False) -> Iterator[None]:
    """Every compile runs the pass (no graph cache hit hides a decision; Triton's kernel
    cache stays on) and many variants of one model live side by side (each its own
    backend: Dynamo keeps one cache entry each). ``freezing`` is Inductor's, set globally:
    it is read when Dynamo traces, not from a compile's options. Autograd is on for a
    training step, off for inference."""
    import torch._dynamo
    import torch._functorch.config
    import torch._inductor.config

    torch._dynamo.reset()
    with (
        torch._dynamo.config.patch(cache_size_limit=256, accumulated_cache_size_limit=4096),
        # (on CPU tensors freezing would also prepack linear weights into mkldnn ops: kept as GEMMs)
        torch._inductor.config.patch(
            {"fx_graph_cache": False, "freezing": freezing, "cpp.weight_prepack": False}
        ),
        torch._functorch.config.patch(enable_autograd_cache=False),
        work.grad_mode(),
    ):
        try:
            yield
        finally:
            torch._dynamo.reset()


def _replayable(
    store: TuningDB,
    modes: tuple[str, ...],
    on_gpu: bool,
    report: ModelReport,
    say: Callable[[str], None],
    compiles: Compiles,
) -> list[str]:
    """``modes`` less the CUDA-graph ones where the compiled step cannot be captured (told,
    and noted in ``report.skipped``). Inductor's compile and the record step's last are the
    later steps' too (``compiles``)."""
    out = []
    for mode in modes:
        if on_gpu and cuda_graphs(mode):
            try:
                probed = (("inductor", inductor_options(mode)), ("epilab", epilab_options(store, mode)))
                for name, how in probed:
                    replayed(compiles.get(report, PROBE, name, mode, how).fn)
            except Exception as e:  # a host sync or CPU op in the step: capture fails
                report.skipped[mode] = f"the compiled step cannot be captured in a CUDA graph: {one_line(e)}"
                say(f"{mode}: skipped, {report.skipped[mode]}")
                compiles.clear()
        if mode not in report.skipped:
            out.append(mode)
    return out


def _record_and_tune(
    work: Workload,
    store: TuningDB,
    tuner: Tuner,
    modes: tuple[str, ...],
    options: ModelOptions,
    report: ModelReport,
    tune_jobs: TuneJobs | None,
    say: Callable[[str], None],
    compiles: Compiles,
) -> None:
    seen: set[str] = set()
    record_s = tune_s = 0.0
    compile_s: list[float] = []
    own_deadline = tuner.options.deadline is None  # no --total-time: the model's size sets one
    for n in range(1, options.max_passes + 1):
        report.passes = n
        started = time.monotonic()
        keys: list[str] = []
        compiles.clear()  # the last pass's compiles are kept: the capture probe's
        for mode in modes:
            if inductor_mode(mode) != "default":
                continue  # the same problems; max-autotune compiles take minutes
            variant = compiles.get(report, RECORD, "epilab", mode, epilab_options(store, mode))
            compile_s.append(variant.compile_s)
            keys += [k for d in variant.decisions for k in d.candidates]
        record_s += time.monotonic() - started
        new = [k for k in dict.fromkeys(keys) if k not in seen]
        seen.update(new)
        problems = [Problem.from_json(found[1]) for k in new if (found := store.problem_json(k)) is not None]
        jobs = [(_label(p), p) for p in unserved(store, tuner.device, problems)]
        say(f"pass {n}: {len(new)} new problem(s), {len(jobs)} to tune")
        if not jobs:
            break
        if own_deadline:
            _share_time(tuner, options, jobs, collections.Counter(keys), n == 1, say)
            if n == 1:
                say(expected_text(tuner, options, modes, len(jobs), statistics.median(compile_s)))
        started = time.monotonic()
        results, interrupted = (tune_jobs or _tune_all)(tuner, jobs)
        compiles.changed()
        tune_s += time.monotonic() - started
        report.tuned += results
        if interrupted:
            report.interrupted = True
            break
    report.seconds["record"] = record_s
    report.seconds["tune"] = tune_s


def _share_time(
    tuner: Tuner,
    options: ModelOptions,
    jobs: list[tuple[str, Problem]],
    counts: collections.Counter[str],
    first: bool,
    say: Callable[[str], None],
) -> None:
    """The tuner's options with a deadline (set on the first pass: ``options.tuning_s``, else
    ``total_time.model_tuning_s`` of the problems found) and each job's share of the time left
    (``total_time.spread``: by its weight times its sites in the model, at least
    ``MODEL_FLOOR_S``)."""
    from epilab.tuner.total_time import MODEL_FLOOR_S, model_tuning_s, spread

    o = tuner.options
    deadline = o.deadline
    if first or deadline is None:
        seconds = options.tuning_s if options.tuning_s is not None else model_tuning_s(len(jobs))
        deadline = time.monotonic() + seconds
    shares = spread(deadline, [p for _, p in jobs], tuner.device.name, floor_s=MODEL_FLOOR_S, counts=counts)
    tuner.options = dataclasses.replace(o, deadline=deadline, seconds_for={**o.seconds_for, **shares})


# seconds one variant takes to time in a round (a guess from the H100 host): per call a short
# window of calls, under CUDA graphs a capture and its replays
VARIANT_S = {"per call": 0.1, "CUDA graphs": 0.3}


def expected_text(
    tuner: Tuner, options: ModelOptions, modes: Sequence[str], jobs: int, compile_s: float
) -> str:
    """How long the run is expected to take, said before its tuning starts: the tuning's total
    time; the compiles still to come, each about as long as the record step's (its next pass,
    per Inductor mode the check's switched model and Inductor, per mode the model with its
    kept templates, which the measurement times; without the check, the measurement's own);
    their timing rounds: per mode, the check's comparisons where one template of ``jobs``
    loses (1 + 2 log2 of them, ``model_tuning/in_context.py``) and the measurement's, each its first
    look's rounds of two or three variants (``VARIANT_S``). More losers, or undecided
    comparisons that take more rounds, take longer."""
    tuning = max(0.0, (tuner.options.deadline or time.monotonic()) - time.monotonic())
    inductor_modes = len({inductor_mode(m) for m in modes})
    record = sum(inductor_mode(m) == "default" for m in modes)
    if options.check_context:
        compiles = record + 2 * inductor_modes + len(modes)
    else:
        compiles = record + (inductor_modes + len(modes)) * options.measure
    comparisons = 1 + 2 * math.ceil(math.log2(max(jobs, 2)))
    timing = sum(
        options.rounds
        * VARIANT_S["CUDA graphs" if cuda_graphs(m) else "per call"]
        * (2 * comparisons * options.check_context + 3 * options.measure)
        for m in modes
    )
    total = tuning + compiles * compile_s + timing
    return (
        f"expected: tuning {jobs} problem(s) in about {tuning:.0f} s (by the model's size; "
        f"--total-time sets it), then about {compiles} compiles of ~{compile_s:.0f} s and "
        f"~{timing:.0f} s of timing rounds: about {total / 60:.1f} min in all"
    )


def _silent(_: str) -> None:
    pass


def _tune_all(tuner: Tuner, jobs: list[tuple[str, Problem]]) -> tuple[list[ProblemResult], bool]:
    return [tuner.tune_problem(p, label) for label, p in jobs], False


def _label(problem: Problem) -> str:
    from epilab.policy.suites import problem_label

    return problem_label(problem)


def _measure(
    store: TuningDB,
    mode: str,
    options: ModelOptions,
    report: ModelReport,
    timer: Timer,
    say: Callable[[str], None],
    compiles: Compiles,
) -> None:
    """Eager (per call), Inductor and epilab timed in ``mode``: Inductor's compile and the
    check's model with its kept templates come from ``compiles`` where those steps made them."""
    variants = []
    if options.eager and mode == "per call":
        variants.append(compile_variant(compiles.work, "eager", mode, {}))
    variants.append(compiles.get(report, MEASURE, "inductor", mode, inductor_options(mode)))
    variants.append(compiles.get(report, MEASURE, "epilab", mode, epilab_options(store, mode)))
    ours = variants[-1]
    # with no template the epilab step is Inductor's graph: timed alongside, never decided
    # (it ran every per-call measurement to MAX_ROUNDS, 25 of MobileNet's 32 s of measuring)
    comparisons = [
        Comparison(ours=ours, theirs=v, key=v.name, follows=_same_graph(ours, v)) for v in variants[:-1]
    ]
    say(f"{mode}: timing {len(variants)} variants in interleaved rounds until the intervals decide")
    held = compared(comparisons, options, timer)
    speedups = {c.key: c for c in comparisons}
    for v in variants:
        interval = v.interval(held)
        c = speedups.get(v.name)
        speedup = None
        if c is not None and c.interval is not None:
            same_graph = _same_graph(ours, v)
            speedup = {
                **c.to_dict(),
                "same_graph": same_graph,
                "significant": not same_graph and not c.interval.contains(1.0),
            }
        report.rows.append(
            {
                "mode": mode,
                "variant": v.name,
                "ms": v.ms,
                "low_ms": interval.low,
                "high_ms": interval.high,
                "confidence": held,
                "min_ms": min(v.rounds_ms),
                "max_ms": max(v.rounds_ms),
                "rounds_ms": v.rounds_ms,
                "speedup": speedup,
                "compile_s": v.compile_s,
                "templates": v.templates,
                "anchors": sum(1 for d in v.decisions if not d.tried),
                "method": v.times[0].method,
            }
        )


def _same_graph(ours: Variant, theirs: Variant) -> bool:
    """The epilab step chose no template: it is Inductor's graph."""
    return ours.templates == 0 and theirs.name == "inductor"
