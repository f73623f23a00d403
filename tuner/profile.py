"""Where a tuning run's time goes, trial by trial (``epilab tune --profile``).

A problem's ``phases`` (tuner/phases.py) say where its seconds went on the tuner's own
timeline. The profile adds, for each trial, the same phases and what its compile was:
built by Triton, or a hit in Triton's on-disk cache (the same kernel source and
specialization built by another problem or an earlier command: the templates take the
problem's sizes M, N, K as runtime arguments, so problems that differ only in them share
binaries), with the seconds the compile pool's process spent rendering and compiling it
(overlapped with the checks of the candidates before it, so not on the timeline).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epilab.ir.config import Config
from epilab.tuner.phases import PHASES


@dataclass
class CompileStats:
    """A problem's Triton compiles, in the compile pool and in the GPU worker."""

    cache_hits: int = 0  # binaries loaded from Triton's cache (built before, for any problem)
    built: int = 0  # binaries Triton built
    build_s: float = 0.0  # the builds' seconds (Triton's own count)
    pool_render_s: float = 0.0  # rendering and importing the templates in the pool's processes
    pool_compile_s: float = 0.0  # the pool's compiles, cache hits included

    def add(self, result: Mapping[str, Any]) -> None:
        """Count a compile or candidate result's compiles (``evaluate.CompileCounts.fields``)."""
        self.cache_hits += int(result.get("cache_hits", 0))
        self.built += int(result.get("built", 0))
        self.build_s += float(result.get("build_s", 0.0))
        pool = result.get("pool_phases") or {}
        self.pool_render_s += float(pool.get("render", 0.0))
        self.pool_compile_s += float(pool.get("compile", 0.0))

    def to_dict(self) -> dict[str, float | int]:
        return {
            "cache_hits": self.cache_hits,
            "built": self.built,
            "build_s": round(self.build_s, 3),
            "pool_render_s": round(self.pool_render_s, 3),
            "pool_compile_s": round(self.pool_compile_s, 3),
        }

    def merge(self, other: CompileStats) -> None:
        """Add ``other``'s counts and seconds (a trial's, to its problem's)."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def trial_profile(
    number: int,
    config: Config,
    status: str,
    ms: float | None,
    phases: Mapping[str, float],
    compiles: Mapping[str, Any],
) -> dict[str, Any]:
    """One trial's row of ``--profile``'s JSON: its config and outcome, the seconds of each
    phase on the tuner's timeline (``PHASES``), and its compiles (pool and worker)."""
    return {
        "trial": number,
        "config": config.short(),
        "status": status,
        "ms": ms,
        "phases": {k: round(phases[k], 4) for k in PHASES if phases.get(k)},
        "compiles": dict(compiles),
    }


def trial_compiles(pre: Mapping[str, Any], result: Mapping[str, Any]) -> CompileStats:
    """A trial's compiles: the pool's (``pre``) and the worker's (``result``; the same dict where
    the pool's compile failed and the worker never ran it)."""
    stats = CompileStats()
    stats.add(pre)
    if result is not pre:
        stats.add(result)
    return stats


def median_phases(trials: list[dict[str, Any]]) -> dict[str, float]:
    """A trial's median seconds in each phase, over ``trials`` (``trial_profile`` rows; a phase
    a trial did not meet counts 0 for it)."""
    names = [k for k in PHASES if any(k in t["phases"] for t in trials)]
    return {k: statistics.median(t["phases"].get(k, 0.0) for t in trials) for k in names}
