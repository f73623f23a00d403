"""Where a problem's tuning time goes, phase by phase: what ``epilab tune`` and the model
report say of it (``ProblemResult.phases``)."""

from __future__ import annotations

# where a problem's tuning time goes, in the order a trial meets them: the wait for the
# compile pool (a candidate's compile, less what overlapped the checks of those before it),
# the GPU worker's (its process started or restarted, results passed back, a hung or crashed
# candidate's wait), a candidate's fresh inputs, its template rendered and imported in the
# worker, its first launch (loading the compiled kernel, or compiling it where the pool did
# not), the float64 reference and the comparison, its timing (events and CUDA graphs, with
# the rotating input sets), the library baselines, the feasibility rules over the proposals,
# the tuning database (the problem, the study and its resume, the warm seeds' queries, each
# trial's record), and the rest: the sampler (with the trials it adds to the stored study)
PHASES = (
    "compile",
    "worker",
    "inputs",
    "render",
    "launch",
    "reference",
    "timing",
    "baselines",
    "feasibility",
    "database",
    "search",
)


def phase_text(phases: dict[str, float]) -> str:
    """``compile 12 s, reference 3 s, ...``: the phases that took a second or more (at
    least 0.1 s where all are short), largest first."""
    total = sum(phases.values())
    least = 1.0 if total >= 10 else 0.1
    shown = sorted(((v, k) for k, v in phases.items() if v >= least), reverse=True)
    return ", ".join(f"{k} {v:.0f} s" if least >= 1 else f"{k} {v:.1f} s" for v, k in shown) or "-"


def add_phases(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """``total`` with ``more``'s seconds added, phase by phase (in ``PHASES`` order)."""
    return {k: total.get(k, 0.0) + more.get(k, 0.0) for k in PHASES if k in total or k in more}
