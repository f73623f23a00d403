"""A model's variants: the modes it runs in, the options of ``tune --model``, and one
compile of the model in a mode (``model_tuning/tune.py`` records, checks and measures with them;
``model_tuning/in_context.py`` checks).

Modes (``MODES``): the model runs per call or replayed as CUDA graphs, compiled by Inductor
default or max-autotune (where Inductor autotunes the kernels of the matmuls it keeps).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from epilab.db import TuningDB
from epilab.model_tuning import significance as sig
from epilab.model_tuning.interleave import Comparison, Timer, Variant, compare
from epilab.model_tuning.step import Workload

# how the model runs: per call or replayed as CUDA graphs, Inductor default or max-autotune
MODES = ("per call", "CUDA graphs", "per call, max-autotune", "CUDA graphs, max-autotune")
# what a model is checked and timed in unless asked for more: Inductor's max-autotune compiles
# the model's matmuls against Triton templates (minutes a compile), which would make every
# ``tune --model`` a long one; ``--max-autotune`` (``modes=MODES``) adds those two modes
DEFAULT_MODES = tuple(m for m in MODES if not m.endswith("max-autotune"))
MAX_PASSES = 4
ROUNDS = 8  # rounds before the first look at the intervals (model_tuning/interleave.py)
MAX_ROUNDS = 32  # ... and the most rounds a comparison gets before it is left undecided


def cuda_graphs(mode: str) -> bool:
    return mode.startswith("CUDA graphs")


def inductor_mode(mode: str) -> str:
    """The verdicts' name of Inductor's mode: "default" or "max-autotune"."""
    return "max-autotune" if mode.endswith("max-autotune") else "default"


def torch_mode(mode: str) -> str | None:
    """``torch.compile``'s ``mode`` for one of ``MODES``: never Inductor's CUDA-graph trees,
    the CUDA-graph modes replay the compiled step in a CUDA graph of their own (``replayed``)."""
    return "max-autotune-no-cudagraphs" if inductor_mode(mode) == "max-autotune" else None


@dataclass(frozen=True)
class ModelOptions:
    modes: tuple[str, ...] = DEFAULT_MODES  # of MODES; the CUDA-graph modes on a GPU only
    rounds: int = ROUNDS  # rounds before the first look at the intervals, and between looks
    max_rounds: int = MAX_ROUNDS  # a comparison still undecided after these is left undecided
    confidence: float = sig.CONFIDENCE  # of every decision, over all looks (model_tuning/significance.py)
    margin: float = sig.MARGIN  # a template is kept where the model is faster with it by this much
    max_passes: int = MAX_PASSES
    check_context: bool = True
    measure: bool = True
    eager: bool = True  # time eager PyTorch too (per call)
    # every variant compiled with Inductor's freezing (weights as constants: inference only),
    # what the norm fold (``compiler/norms.py``) needs; Inductor is compared under it too
    freezing: bool = False
    # a call is a training step (``model_tuning/step.py``: grads reset, forward, backward of every
    # output that requires grad): the forward's and the backward's problems are tuned, checked
    # and stored as verdicts of training steps. The module's train()/eval() mode is the caller's
    train: bool = False
    # seconds for tuning all the model's problems, spread by each one's share of the model
    # (``tuner/total_time.py``); None: ``model_tuning_s`` of the problems the first pass finds.
    # Used where the tuner has no deadline of its own (``--total-time``)
    tuning_s: float | None = None


def epilab_options(store: TuningDB, mode: str, **extra: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"db": store.url, "policy": "auto", **extra}
    if cuda_graphs(mode):
        options["cuda_graphs"] = True  # decided as under CUDA graphs: the step is replayed in one
    if torch_mode(mode) is not None:
        options["mode"] = torch_mode(mode)
    return {"backend": "epilab", "options": options}


def inductor_options(mode: str) -> dict[str, Any]:
    return {"backend": "inductor", **({"mode": torch_mode(mode)} if torch_mode(mode) else {})}


def compile_variant(work: Workload, name: str, mode: str, how: dict[str, Any]) -> Variant:
    """The workload compiled as ``how`` says (eager: not compiled), called once (its forward
    and, for a training step, its backward compiled then): its step and decisions."""
    from epilab.compiler.explain import explain

    explain(clear=True)
    step = work.bind(work.model if name == "eager" else torch.compile(work.model, **how))
    started = time.perf_counter()
    step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return Variant(name, mode, step, time.perf_counter() - started, explain(clear=True))


class Compiles:
    """The compiles of one ``tune_model`` run that several of its steps ask for, made once:
    Inductor's per Inductor mode (the capture probe's, the check's and the measurement's), the
    record step's last epilab compile (what the capture probe compiles again), and the check's
    model with its kept templates (what the measurement compiles again, ``keep``). A variant
    asked for again with the same name and options is the same compiled step, timed apart.

    Dynamo keeps every compiled variant's cache entry (each its own backend) until
    ``torch._dynamo.reset()``, which makes them compile again at their next call: ``clear``
    forgets them all with it. Epilab's compiles read the database, so ``changed`` forgets them
    whenever records or verdicts are written; Inductor's read nothing of it."""

    def __init__(self, work: Workload) -> None:
        self.work = work
        self._made: dict[str, tuple[Variant, bool]] = {}  # key -> (variant, reads the database)

    def get(self, report: Any, step: str, name: str, mode: str, how: dict[str, Any]) -> Variant:
        """``name`` compiled as ``how`` says (``compile_variant``), counted in ``step`` when it
        is compiled now; a variant of ``mode`` with times of its own either way."""
        key = _key(name, how)
        made = self._made[key][0] if key in self._made else None
        if made is None:
            made = counted(report, step, compile_variant(self.work, name, mode, how))
            self.keep(name, how, made)
        return Variant(name, mode, made.fn, made.compile_s, made.decisions)

    def keep(self, name: str, how: dict[str, Any], variant: Variant) -> None:
        """``variant`` is what ``name`` compiled as ``how`` says would be."""
        key = _key(name, how)
        if key is not None:
            self._made[key] = (variant, how.get("backend") == "epilab")

    def changed(self) -> None:
        """The database changed: forget epilab's compiles (they would decide otherwise now)."""
        self._made = {k: made for k, made in self._made.items() if not made[1]}

    def clear(self) -> None:
        self._made = {}
        torch._dynamo.reset()


def _key(name: str, how: dict[str, Any]) -> str | None:
    """The memo key of a compile: None where its options hold an object (a switch vector:
    every switched compile is its own)."""
    try:
        return json.dumps([name, how], sort_keys=True)
    except TypeError:
        return None


def counted(report: Any, step: str, variant: Variant) -> Variant:
    """``variant``, its compile (and first call) added to ``step``'s seconds spent compiling."""
    report.compiling[step] = report.compiling.get(step, 0.0) + variant.compile_s
    report.compiles[step] = report.compiles.get(step, 0) + 1
    return variant


def compared(comparisons: Sequence[Comparison], options: ModelOptions, timer: Timer) -> float:
    """``interleave.compare`` with the options' rounds and confidence rule: the confidence
    each look was held to."""
    return compare(
        comparisons,
        rounds=options.rounds,
        max_rounds=options.max_rounds,
        confidence=options.confidence,
        margin=options.margin,
        timer=timer,
    )
