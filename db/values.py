"""What the tuning database gives and takes: plain frozen dataclasses (devices, versions,
timings, records, lookups, verdicts, statistics) and the protocols of what it is given."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

# how a check in context ended (model_tuning/in_context.py; "faster", alone or with the others of its
# group, keeps the template)
FASTER_TOGETHER = "faster together"  # kept with the other templates of its group (model_tuning/in_context.py)
SKIPPED = "skipped"  # too small a share of the model's time to move it by the margin: aten kept
VERDICT_OUTCOMES = ("faster", "not faster", "undecided", "slower than inductor", FASTER_TOGETHER, SKIPPED)


INDUCTOR_MODES = ("default", "max-autotune")  # what a verdict's aten alternative was compiled with


# (a record's config) -> whether this epilab can run it (ir.config.Config.is_valid)
ConfigCheck = Callable[[Mapping[str, Any]], bool]


# whether a stored problem (its canonical JSON) is current: its kernels rendered as when recorded
IsCurrent = Callable[[str], bool]


class ProblemLike(Protocol):
    """What the db needs of a problem (epilab.ir.problem.Problem fits)."""

    @property
    def key(self) -> str: ...

    def to_json(self) -> str: ...

    @property
    def epilogue(self) -> Any: ...  # has .text()


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    capability: str  # "9.0"
    sm_count: int

    @classmethod
    def of_cuda(cls, device: object) -> DeviceInfo:
        """How the database names a CUDA device (a torch.device or index)."""
        import torch

        props = torch.cuda.get_device_properties(device)  # type: ignore[arg-type]
        return cls(props.name, f"{props.major}.{props.minor}", props.multi_processor_count)


# How the database names Triton's interpreter, where interpreter-mode runs record their trials.
INTERPRETER_DEVICE = DeviceInfo("Triton interpreter (CPU)", "interpreter", 1)


@dataclass(frozen=True)
class Timing:
    """A measured time: median and spread in ms, and how it was measured."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    method: str
    tflops: float | None = None
    gbps: float | None = None
    graph_ms: float | None = None  # per call under CUDA-graph replay, for short kernels


@dataclass(frozen=True)
class Versions:
    torch: str
    triton: str


@dataclass(frozen=True)
class Record:
    """A trial record (``config`` set) or a baseline (``library`` set), as read back."""

    problem_key: str
    device: DeviceInfo
    status: str
    config: dict[str, Any] | None
    library: str | None
    median_ms: float | None
    p20_ms: float | None
    p80_ms: float | None
    graph_ms: float | None
    tflops: float | None
    gbps: float | None
    max_rel_error: float | None
    timing_method: str
    versions: Versions
    study: str | None
    trial_number: int | None
    detail: str | None
    created_at: datetime


def comparable_ms(r: Record, other: Record | None = None) -> float:
    """A record's time to compare with ``other``'s: CUDA-graph times when both have them
    (the tuner replays every candidate and baseline in a graph; records made before it did
    have graph times only under 50 us), else the events median: never one of each."""
    if r.graph_ms is not None and (other is None or other.graph_ms is not None):
        return r.graph_ms
    return float(r.median_ms or 0.0)


@dataclass(frozen=True)
class Snapshot:
    """Everything in the database, read in three queries (reports)."""

    problems: dict[str, dict[str, Any]]  # key -> readable columns and "json"
    trials: list[Record]
    baselines: list[Record]


@dataclass(frozen=True)
class Lookup:
    """The answer to 'what is best for this problem': exact, or a fallback from the family."""

    record: Record
    exact: bool  # False: taken from another problem (of the same identity, or family at another M)
    m: int | None  # M of the problem the record belongs to
    same_versions: bool
    via: str = ""  # "exact", "identity" (the same math), "family" (another M), "transfer" (nearest)
    distance: float | None = None  # "transfer": the caller's distance to the record's problem
    source_json: str | None = None  # "transfer": the problem the record was tuned for

    @property
    def fallback(self) -> bool:
        return not self.exact


@dataclass(frozen=True)
class Verdict:
    """A template's problem checked inside a compiled model (``model_tuning/tune.py``)."""

    problem_key: str
    keep: bool  # the model was faster with the template (by the confidence rule, since 0006)
    with_ms: float
    without_ms: float
    context: str  # the model it was measured in
    cuda_graphs: bool
    inductor_mode: str  # "default" or "max-autotune"
    timing_method: str
    versions: Versions
    created_at: datetime
    training: bool = False  # measured in a training step (forward and backward; revision 0007)
    # the paired ratio without/with: its interval, rounds, and the outcome (VERDICT_OUTCOMES);
    # None for verdicts recorded before revision 0006
    ratio_low: float | None = None
    ratio_high: float | None = None
    rounds: int | None = None
    outcome: str | None = None

    def describe(self) -> str:
        mode = "under CUDA graphs" if self.cuda_graphs else "per call"
        if self.inductor_mode != "default":
            mode += f", Inductor {self.inductor_mode}"
        if self.training:
            mode = f"a training step, {mode}"
        with_ = (
            "with the template and the others of its group"
            if self.outcome == FASTER_TOGETHER
            else "with the template"
        )
        if self.outcome == SKIPPED:
            return f"skipped in {self.context} ({mode}): too small a share of its {self.with_ms:.4g} ms"
        text = f"checked in {self.context} ({mode}): {self.with_ms:.4g} ms {with_}, "
        text += f"{self.without_ms:.4g} ms without"
        if self.ratio_low is not None and self.ratio_high is not None:
            text += f" (speedup [{self.ratio_low:.3f}, {self.ratio_high:.3f}] over {self.rounds} rounds)"
        return text

    def why_not(self) -> str:
        """Why the problem goes to the aten op, where ``keep`` is False."""
        if self.outcome == "not faster" and self.ratio_high is not None and self.ratio_high >= 1.0:
            return "the model is not faster with it by the margin"
        return {
            "undecided": "no significant difference within the rounds' budget: the aten op is kept",
            "slower than inductor": "the model with its kept templates was not faster than Inductor",
            SKIPPED: "its share of the model's time is too small to move the model by the margin",
        }.get(self.outcome or "", "the model is faster without it")


@dataclass(frozen=True)
class Stats:
    url: str
    revision: str
    devices: int
    problems: int
    trials_by_status: dict[str, int]
    baselines: int
    stale_problems: int
    stale_trials: int
    stale_by_template: dict[str, int]
