"""Tuning a model: its problems found by compiling it, tuned, checked in context, measured.

    report = epilab.tune_model(model, x, db="tuned.db")      # or: epilab tune --model pkg.mod:factory
    print(report.table())

Modes (``MODES``): the model runs per call or replayed as CUDA graphs, compiled by Inductor
default or max-autotune (where Inductor autotunes the kernels of the matmuls it keeps);
epilab is compiled in the same mode as the Inductor it is compared with. A call is an
inference call (autograd off), or with ``ModelOptions.train`` a training step
(``tuner/step.py``: grads reset, forward, backward; no optimizer step), whose forward and
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
4. **Check in context** (``tuner/in_context.py``; ``compiler/decide.py`` reads the
   verdicts). Per Inductor mode the model is compiled once with every chosen template
   switchable at run time against its aten path (``compiler/switch.py``); the templates are
   judged in groups on that one compile (all at once, halves where a group may lose), problems
   too small to move the model by ``margin`` are skipped, and the model with the kept
   templates, compiled without switches, is timed against Inductor: unless it is faster by the
   same rule (``margin`` at ``confidence``, ``tuner/significance.py``), every template of the
   model is rejected. Each verdict is stored (problem, device, versions, CUDA-graph and
   Inductor mode, both times, the interval, the rounds, the outcome, the model's label); later
   compiles in that mode follow it without measuring.
5. **Measure.** In each mode, Inductor and epilab (and eager, per call) in interleaved
   rounds until epilab's paired ratios against each decide: every time with its interval,
   every speedup with its interval, called significant only where that excludes 1 (and
   never where epilab kept no template: then it compiles Inductor's graph, and that
   comparison only follows the others' rounds, ``Comparison.follows``).

Timing, per call (``time_calls``): CUDA events around groups of back-to-back calls after a
warm-up (host overhead included, as a serving loop sees it; L2 is not flushed between calls
of a model), the median of the groups' per-call times, in a short window per variant and
round (``PER_CALL_WINDOW_MS``) so that a round's variants are timed close together. Under
CUDA graphs (``replayed``): the compiled step (Inductor without its CUDA-graph trees)
captured ``REPLAY_CALLS`` times in one CUDA graph and replayed, the GPU time of a step. Not
``reduce-overhead`` timed per call: at decode a small model's step there is bound by the
trees' host work (Dynamo's guards, the trees' bookkeeping, the input copy: 90-135 us a step
against 40 us of GPU work for a Qwen2 MLP on an H100, ``benchmarks/decode_context.py``), the
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
import functools
import importlib
import json
import math
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from epilab.db import DeviceInfo, TuningDB, Versions
from epilab.db.models import KIND_LIBRARIES
from epilab.db.values import SKIPPED
from epilab.ir.dtypes import canonical_dtype
from epilab.ir.problem import Problem, identity_key_of
from epilab.tables import markdown
from epilab.tuner import significance as sig
from epilab.tuner.interleave import Comparison, Timer, Variant
from epilab.tuner.phases import add_phases, phase_text
from epilab.tuner.step import NothingToTrain, Workload
from epilab.tuner.timing import Measured, time_wall
from epilab.tuner.tune import ProblemResult, Tuner
from epilab.tuner.variants import (
    MAX_ROUNDS,
    MODES,
    ROUNDS,
    ModelOptions,
    compared,
    compile_variant,
    counted,
    cuda_graphs,
    epilab_options,
    inductor_mode,
    inductor_options,
)

# runs the tuning of (label, problem) jobs: returns the results and whether it was interrupted
TuneJobs = Callable[[Tuner, list[tuple[str, Problem]]], tuple[list[ProblemResult], bool]]


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


# integer dtypes an example input may have (token ids, masks); quantized dtypes are not inputs
INTEGER_INPUTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
MAX_INPUT_ELEMENTS = 1 << 40
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class ModelSpecError(ValueError):
    """A ``--model`` or ``--input`` the command line cannot use: what was wrong, what is accepted."""


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    high: int | None = None  # integer inputs: values in [0, high)

    def make(self, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        if self.dtype.is_floating_point:
            return torch.randn(self.shape, generator=generator, dtype=torch.float32).to(device, self.dtype)
        return torch.randint(0, self.high or 2, self.shape, generator=generator).to(device, self.dtype)


def parse_input(text: str) -> InputSpec:
    """``8x1024x1024:bfloat16``, ``4x128:int64:32000`` (integers in [0, 32000))."""
    parts = text.strip().split(":")
    usage = "give SHAPE:DTYPE such as 8x1024x1024:bfloat16, or 8x128:int64:VOCAB for token ids"
    if len(parts) not in (2, 3) or not re.fullmatch(r"\d+(x\d+)*", parts[0]):
        raise ModelSpecError(f"--input {text!r}: {usage}")
    shape = tuple(int(d) for d in parts[0].split("x"))
    if not all(shape):
        raise ModelSpecError(f"--input {text!r}: every dimension must be positive")
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise ModelSpecError(
            f"--input {text!r}: {math.prod(shape):.3g} elements, more than any device holds "
            f"(at most {MAX_INPUT_ELEMENTS:.3g})"
        )
    dtype = getattr(torch, canonical_dtype(parts[1].strip().lower()), None)
    if not isinstance(dtype, torch.dtype) or not (dtype.is_floating_point or dtype in INTEGER_INPUTS):
        raise ModelSpecError(
            f"--input {text!r}: {parts[1]!r} is not a dtype an example input can have: a float dtype "
            "such as bfloat16, or one of " + ", ".join(str(d).removeprefix("torch.") for d in INTEGER_INPUTS)
        )
    if len(parts) == 3:
        if dtype.is_floating_point or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ModelSpecError(
                f"--input {text!r}: only integer inputs take an upper bound (a positive int)"
            )
        return InputSpec(shape, dtype, int(parts[2]))
    return InputSpec(shape, dtype)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def load_factory(target: str) -> Callable[[], Any]:
    """``pkg.module:factory`` (the current directory is importable, as for ``python -m``)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not _MODULE_NAME.fullmatch(module_name) or not attr.isidentifier():
        raise ModelSpecError(
            f"--model {target!r}: give MODULE:FACTORY, a dotted module name (mymodels/gpt.py under "
            "the current directory is mymodels.gpt) and a function of it, e.g. mymodels.gpt:build"
        )
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # not found, or the module itself failed as it was imported
        raise ModelSpecError(f"--model {target!r}: cannot import {module_name!r}: {_one_line(e)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelSpecError(f"--model {target!r}: {module_name} has no callable {attr!r}")
    return factory


# the dtypes a model's tensors are cast between; float8 (scaled weights) and integers never are
CASTABLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def parse_dtype(text: str) -> torch.dtype:
    """``--dtype``: one of ``CASTABLE`` (or an alias: bf16, fp16, half, fp32, fp64)."""
    dtype = getattr(torch, canonical_dtype(text.strip().lower()), None)
    if dtype not in CASTABLE:
        raise ModelSpecError(
            f"--dtype {text!r}: cast the model to one of "
            + ", ".join(str(d).removeprefix("torch.") for d in CASTABLE)
            + " (float8 and integer tensors are never cast)"
        )
    return dtype


def cast_model(model: torch.nn.Module, dtype: torch.dtype | None, floating: torch.dtype | None) -> None:
    """Cast ``model``'s parameters and buffers of a ``CASTABLE`` dtype, in place: to ``dtype``
    where given (``--dtype``); else to ``floating`` (the first floating input's dtype) only
    where some floating parameter differs from it (a float32 factory run on bfloat16
    inputs), never where they already match (a float32 scale beside float8 weights stays)."""
    target = dtype
    if target is None and floating in CASTABLE:
        params = [p for p in model.parameters() if p.dtype in CASTABLE]
        if any(p.dtype != floating for p in params):
            target = floating
    if target is not None:
        model._apply(lambda t: t.to(target) if t.dtype in CASTABLE else t)


def build_model(
    target: str,
    inputs: Sequence[str],
    device: torch.device,
    seed: int = 0,
    dtype: str | None = None,
    train: bool = False,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], str]:
    """The model of ``--model`` and its example inputs (``--input``, or what the factory
    returns beside the model), on ``device``, cast by ``cast_model`` (``dtype``: ``--dtype``),
    in train mode for a training step (``--train``: dropout and batch statistics as training
    runs them), else in eval mode. Returns (model, inputs, label)."""
    specs = [parse_input(t) for t in inputs]
    cast_to = parse_dtype(dtype) if dtype is not None else None
    torch.manual_seed(seed)
    factory = load_factory(target)
    try:
        made = factory()
    except Exception as e:  # a factory that takes arguments (os:system), or one that fails
        raise ModelSpecError(f"--model {target!r}: calling it failed: {_one_line(e)}") from None
    given: tuple[torch.Tensor, ...] = ()
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        made, given = made[0], tuple(made[1]) if isinstance(made[1], (list, tuple)) else (made[1],)
        odd = [type(t).__name__ for t in given if not isinstance(t, torch.Tensor)]
        if odd:
            raise ModelSpecError(
                f"--model {target!r}: the factory's example inputs must be tensors, got {', '.join(odd[:3])}"
            )
    if not isinstance(made, torch.nn.Module):
        raise ModelSpecError(
            f"--model {target!r}: the factory returned {type(made).__name__}; return an nn.Module "
            "(or a tuple (module, example inputs))"
        )
    if not specs and not given:
        raise ModelSpecError(f"--model {target!r}: give the example inputs with --input SHAPE:DTYPE")
    generator = torch.Generator().manual_seed(seed)
    try:
        made_inputs = (s.make(device, generator) for s in specs) if specs else (t.to(device) for t in given)
        example = tuple(made_inputs)
    except (RuntimeError, MemoryError) as e:  # out of memory, mostly
        raise ModelSpecError(f"--model {target!r}: cannot make the example inputs: {_one_line(e)}") from None
    floating = next((t.dtype for t in example if t.dtype.is_floating_point), None)
    if any(t.is_meta for t in (*made.parameters(), *made.buffers(), *given)):
        raise ModelSpecError(
            f"--model {target!r}: the factory's model (or its inputs) is on the meta device: its weights "
            "hold no data to time or check; materialize them (to_empty and an init, or a checkpoint)"
        )
    try:
        model = made.to(device)
    except (RuntimeError, MemoryError) as e:  # the device out of memory
        why = _one_line(e)
        raise ModelSpecError(f"--model {target!r}: cannot move the model to {device}: {why}") from None
    cast_model(model, cast_to, floating)
    shapes = ",".join(
        "x".join(map(str, t.shape)) + f":{str(t.dtype).removeprefix('torch.')}" for t in example
    )
    return model.train(train), example, f"{target} {shapes}"


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


@dataclass
class ModelReport:
    label: str
    device: str
    versions: Versions
    passes: int = 0
    tuned: list[ProblemResult] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    compiling: dict[str, float] = field(default_factory=dict)  # a step's seconds spent compiling variants
    compiles: dict[str, int] = field(default_factory=dict)  # ... and how many compiles
    interrupted: bool = False
    method: str = ""
    rule: str = ""  # the confidence rule the verdicts and speedups were decided by
    skipped: dict[str, str] = field(default_factory=dict)  # mode -> why it was not checked or timed
    training: bool = False  # a call was a training step (forward and backward)

    @property
    def tune_phases(self) -> dict[str, float]:
        """Where the tuning's seconds went, over every problem tuned (``phases.PHASES``)."""
        return functools.reduce(add_phases, (r.phases for r in self.tuned), {})

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "training": self.training,
            "device": self.device,
            "torch": self.versions.torch,
            "triton": self.versions.triton,
            "passes": self.passes,
            "tuned": [r.to_dict() for r in self.tuned],
            "verdicts": self.verdicts,
            "rows": self.rows,
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
            "compiling": {k: round(v, 1) for k, v in self.compiling.items()},
            "compiles": self.compiles,
            "tune_phases": {k: round(v, 1) for k, v in self.tune_phases.items()},
            "interrupted": self.interrupted,
            "method": self.method,
            "rule": self.rule,
            "skipped": self.skipped,
        }

    def _seconds_text(self, step: str, seconds: float) -> str:
        compiling = self.compiling.get(step)
        if compiling is None:
            return f"{step} {seconds:.0f}"
        return f"{step} {seconds:.0f} (compiling {compiling:.0f}, {self.compiles.get(step, 0)} compiles)"

    def speedups(self, mode: str) -> dict[str, float]:
        """epilab against each other variant of ``mode``: the median of the rounds' paired
        ratios (their time over epilab's); see each row's ``speedup`` for its interval."""
        return {
            r["variant"]: r["speedup"]["ratio"]["estimate"]
            for r in self.rows
            if r["mode"] == mode and r.get("speedup") and r["speedup"]["ratio"]
        }

    def __str__(self) -> str:
        """``print(tune_model(...))`` prints the report's tables (``table``)."""
        return self.table()

    def __repr__(self) -> str:
        kept = sum(1 for v in self.verdicts if v.get("keep"))
        return (
            f"<ModelReport {self.label!r} on {self.device}: {len(self.tuned)} problem(s) tuned, "
            f"{kept} of {len(self.verdicts)} verdict(s) kept, {len(self.rows)} timed row(s); "
            "print() it for the tables>"
        )

    def table(self) -> str:
        """A Markdown table of the measured variants, then the verdicts."""
        held = next((r["confidence"] for r in self.rows), None)
        level = "" if held is None else f" [{held:.2%} interval]"
        step = ", a training step (forward and backward)" if self.training else ""
        versions = f"torch {self.versions.torch}, triton {self.versions.triton}"
        rows = [
            [
                r["mode"],
                r["variant"],
                _ms_text(r),
                str(len(r["rounds_ms"])),
                _speedup_text(r.get("speedup")),
                f"{r['compile_s']:.1f}",
                f"{r['templates']}/{r['anchors']}",
            ]
            for r in self.rows
        ]
        headers = ["mode", "variant", f"ms (median of rounds){level}", "rounds", f"epilab speedup{level}"]
        out = [
            f"{self.label}{step} on {self.device} ({versions})",
            "",
            markdown([*headers, "compile s", "templates"], rows, left=2),
        ]
        if any(r["variant"] == "epilab" and not r["templates"] for r in self.rows):
            out.append(
                "\nepilab with 0 templates compiles the same graph as Inductor: no speedup is claimed "
                "there (the rounds' ratio is timing noise; the JSON keeps it, marked same_graph)"
            )
        if self.verdicts:
            verdicts = []
            for v in self.verdicts:
                verdict = "keep" if v["keep"] else _NOT_KEPT.get(v["outcome"], "reject")
                ratio = v.get("ratio")
                verdicts.append(
                    [
                        v["mode"],
                        f"{v['problem'][:12]} {v['label']}",
                        verdict,
                        f"{v['with_ms']:.4f}",
                        f"{v['without_ms']:.4f}",
                        "" if ratio is None else _ratio_text(ratio),
                        str(v["rounds"] or "-"),
                        v["why"],
                    ]
                )
            headers = ["mode", "problem", "verdict", "with ms", "without ms", f"speedup with it{level}"]
            out += ["", markdown([*headers, "rounds", ""], verdicts, left=3)]
        out += [f"\n{mode}: not timed: {why}" for mode, why in self.skipped.items()]
        if self.rule:
            out += ["", self.rule]
        out += ["", "seconds: " + ", ".join(self._seconds_text(k, v) for k, v in self.seconds.items())]
        if self.tuned:
            out.append(f"tuning's seconds went to: {phase_text(self.tune_phases)}")
        return "\n".join(out)


_NOT_KEPT = {sig.UNDECIDED: "undecided", SKIPPED: "skipped"}  # the table's word for a verdict


def _ratio_text(ratio: dict[str, Any]) -> str:
    if ratio["low"] is None:
        return f"{ratio['estimate']:.3f}x [too few rounds]"
    return f"{ratio['estimate']:.3f}x [{ratio['low']:.3f}, {ratio['high']:.3f}]"


def _ms_text(row: dict[str, Any]) -> str:
    if row["low_ms"] is None:
        return f"{row['ms']:.4f}"
    return f"{row['ms']:.4f} [{row['low_ms']:.4f}, {row['high_ms']:.4f}]"


def _speedup_text(speedup: dict[str, Any] | None) -> str:
    """A speedup where its interval excludes 1, "no significant difference" where it does
    not, "same graph" where epilab kept no template."""
    if not speedup:
        return ""
    if speedup["same_graph"]:
        return "same graph as Inductor"
    text = _ratio_text(speedup["ratio"])
    return text if speedup["significant"] else f"no significant difference ({text})"


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
    report = ModelReport(
        label or type(model).__name__,
        tuner.device.name,
        tuner.versions,
        method="interleaved rounds: per call time_calls, under CUDA graphs the step replayed in one "
        "(GPU time); medians of rounds and of paired ratios (tuner/model.py)",
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
            "cotangent (no optimizer step; tuner/step.py)"
        )
    try:
        with _compiling(work, options.freezing):
            _record_and_tune(work, store, tuner, modes, options, report, tune_jobs, say)
            if report.interrupted:
                return report
            timed = modes
            if options.check_context or options.measure:  # probed once for both steps
                started = time.monotonic()
                timed = _replayable(work, store, modes, on_gpu, report, say)
                report.seconds["capture probe"] = time.monotonic() - started
            if options.check_context:
                from epilab.tuner.in_context import check_in_context

                started = time.monotonic()
                check_in_context(work, store, tuner, timed, options, report, timers, say)
                report.seconds["context check"] = time.monotonic() - started
            if options.measure:
                started = time.monotonic()
                for mode in timed:
                    _measure(work, store, mode, options, report, timers[mode], say)
                report.seconds["measure"] = time.monotonic() - started
    finally:
        if owned:
            tuner.close()
        if not isinstance(db, TuningDB):
            store.close()
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
    work: Workload,
    store: TuningDB,
    modes: tuple[str, ...],
    on_gpu: bool,
    report: ModelReport,
    say: Callable[[str], None],
) -> list[str]:
    """``modes`` less the CUDA-graph ones where the compiled step cannot be captured (told,
    and noted in ``report.skipped``)."""
    out = []
    for mode in modes:
        if on_gpu and cuda_graphs(mode):
            torch._dynamo.reset()
            try:
                for how in (inductor_options(mode), epilab_options(store, mode)):
                    step = work.bind(torch.compile(work.model, **how))
                    step()
                    replayed(step)
            except Exception as e:  # a host sync or CPU op in the step: capture fails
                report.skipped[mode] = f"the compiled step cannot be captured in a CUDA graph: {_one_line(e)}"
                say(f"{mode}: skipped, {report.skipped[mode]}")
            torch._dynamo.reset()
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
) -> None:
    seen: set[str] = set()
    record_s = tune_s = 0.0
    compile_s: list[float] = []
    own_deadline = tuner.options.deadline is None  # no --total-time: the model's size sets one
    for n in range(1, options.max_passes + 1):
        report.passes = n
        started = time.monotonic()
        keys: list[str] = []
        for mode in modes:
            if inductor_mode(mode) != "default":
                continue  # the same problems; max-autotune compiles take minutes
            torch._dynamo.reset()
            variant = compile_variant(work, "epilab", mode, epilab_options(store, mode))
            compile_s.append(variant.compile_s)
            keys += [k for d in variant.decisions for k in d.candidates]
        torch._dynamo.reset()
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
    time; the check's and the measurement's compiles, each about as long as the record step's;
    their timing rounds: per mode, the check's comparisons where one template of ``jobs``
    loses (1 + 2 log2 of them, ``tuner/in_context.py``) and the measurement's, each its first
    look's rounds of two or three variants (``VARIANT_S``). More losers, or undecided
    comparisons that take more rounds, take longer."""
    tuning = max(0.0, (tuner.options.deadline or time.monotonic()) - time.monotonic())
    inductor_modes = len({inductor_mode(m) for m in modes})
    compiles = 3 * inductor_modes * options.check_context + 2 * len(modes) * options.measure
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


def unserved(store: TuningDB, device: DeviceInfo, problems: Sequence[Problem]) -> list[Problem]:
    """The problems that no record serves yet: one per performance identity, and none whose
    math another problem's records already cover (``Problem.identity``). Records of
    another M (a family fallback) do not count: the problem is tuned. A problem whose twin's
    kind always runs it far faster (``kinds.superseded``: a depthwise convolution's implicit
    GEMM) is left to that twin."""
    from epilab.templates.kinds import superseded

    out, identities = [], set()
    for problem in problems:
        identity = problem.identity_key
        if identity in identities or superseded(problem):
            continue
        identities.add(identity)
        hit = store.lookup(problem, device, same=lambda t, identity=identity: identity_key_of(t) == identity)
        if hit is None or hit.via not in ("exact", "identity"):
            out.append(problem)
    return out


def rule_text(options: ModelOptions) -> str:
    """The confidence rule, as the report states it."""
    schedule = sig.looks(options.rounds, options.max_rounds)
    held = sig.per_look(options.confidence, len(schedule))
    return (
        f"rule: a template is kept where the model is faster with it by at least {options.margin:.0%} "
        f"at {options.confidence:.0%} confidence (the paired rounds' sign-test interval of the ratio "
        f"without/with lies at or above {1 + options.margin:g}), or, two or more undecided alone "
        "but each faster at the median round, where the model is faster with them together by "
        "the same rule; and only while the model with its "
        f"kept templates beats Inductor by the same rule; rounds are looked at after "
        f"{', '.join(map(str, schedule))} (each look at {held:.2%}, Bonferroni), and a comparison "
        "still straddling the margin after the last is undecided: Inductor is kept. A speedup is "
        "called significant where its interval excludes 1."
    )


def _measure(
    work: Workload,
    store: TuningDB,
    mode: str,
    options: ModelOptions,
    report: ModelReport,
    timer: Timer,
    say: Callable[[str], None],
) -> None:
    torch._dynamo.reset()
    variants = []
    if options.eager and mode == "per call":
        variants.append(compile_variant(work, "eager", mode, {}))
    say(f"{mode}: compiling inductor")
    inductor = compile_variant(work, "inductor", mode, inductor_options(mode))
    variants.append(counted(report, "measure", inductor))
    say(f"{mode}: compiling epilab")
    epilab = compile_variant(work, "epilab", mode, epilab_options(store, mode))
    variants.append(counted(report, "measure", epilab))
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
    torch._dynamo.reset()


def _same_graph(ours: Variant, theirs: Variant) -> bool:
    """The epilab step chose no template: it is Inductor's graph."""
    return ours.templates == 0 and theirs.name == "inductor"


def save(report: ModelReport, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=1))
    return path


__all__ = [
    "MODES",
    "InputSpec",
    "ModelOptions",
    "ModelReport",
    "ModelSpecError",
    "build_model",
    "cast_model",
    "load_factory",
    "parse_dtype",
    "parse_input",
    "save",
    "time_calls",
    "tune_model",
    "unserved",
]
