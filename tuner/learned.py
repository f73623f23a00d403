"""Feasibility rules learned from Triton's refusals.

A config that Triton failed to build for one problem (``compile_error``: its passes refused
the kernel, e.g. the warp-specialization pass on some persistent TMA configs;
``out_of_resources``: more shared memory or registers than the device has) is recorded as a
trial of that problem. Triton builds a kernel from its source, its constexpr arguments (the
config's tiles, warps and stages) and the specialization of its integer arguments (a value
of 1, a multiple of 16). So the same config fails again wherever it renders the same source
and the arguments specialize alike: problems that differ only in runtime sizes (M, N, K and
the batch are arguments, and the strides; a conv's geometry is in its source) share their
binaries, and their failures. ``LearnedRules`` holds those failures of a problem's template and dtype on this
device and Triton version (``TuningDB.failed_compiles``), and refuses a config whose kernel
would be one of them before it is drawn, seeded or compiled again.
"""

from __future__ import annotations

import hashlib

from epilab.db import Record
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.policy.suites import problem_label
from epilab.templates.registry import source


def specialization(problem: Problem) -> tuple[object, ...]:
    """What Triton's specialization of the integer arguments can see of the problem: its
    layouts (which stride is 1) and each of batch, M, N and K as 1 or its residue mod 16, so
    that the strides (products of sizes) divide by 16 alike too."""
    s = problem.shape
    return (
        problem.layout_a,
        problem.layout_b,
        *("one" if d == 1 else d % 16 if isinstance(d, int) else "any" for d in (s.batch, s.m, s.n, s.k)),
    )


def _source_hash(problem: Problem, config: Config) -> str | None:
    try:
        return hashlib.sha256(source(problem, config).encode()).hexdigest()
    except (ValueError, KeyError, TypeError):  # a config or problem this epilab no longer renders
        return None


class LearnedRules:
    """The configs whose kernels Triton failed to build, for ``problem``: see the module doc."""

    def __init__(self, problem: Problem, failures: list[tuple[str, Record]]) -> None:
        self.problem = problem
        self.refused: set[Config] = set()  # the configs refused so far (``why`` said why)
        self._failed: dict[Config, list[tuple[Problem, str]]] = {}
        self._verdicts: dict[Config, str | None] = {}
        mine = specialization(problem)
        for text, record in failures:
            try:
                config = Config.from_dict(record.config or {})
                other = Problem.from_json(text)
            except (ValueError, TypeError, KeyError):  # stored by another epilab
                continue
            if specialization(other) == mine:
                why = f"{record.status}: {record.detail or ''}".strip().rstrip(":")
                self._failed.setdefault(config, []).append((other, why))

    def __len__(self) -> int:
        return len(self._failed)

    def refusal(self) -> str | None:
        """Why a search that evaluated nothing was refused: every config drawn was one Triton
        failed to build before (None where no config was refused so)."""
        if not self.refused:
            return None
        return (
            f"every config drawn ({len(self.refused)}) is one Triton failed to build before for "
            "a problem like this (learned compile failures); `epilab tune --restart` tries them again"
        )

    def why(self, config: Config) -> str | None:
        """Why Triton would fail to build ``config`` for the problem (it failed to build the same
        kernel for another), or None."""
        if config not in self._failed:
            return None
        if config not in self._verdicts:
            self._verdicts[config] = self._same_kernel(config)
        verdict = self._verdicts[config]
        if verdict is not None:
            self.refused.add(config)
        return verdict

    def _same_kernel(self, config: Config) -> str | None:
        mine = _source_hash(self.problem, config)
        if mine is None:
            return None
        for other, why in self._failed[config]:
            if other.key == self.problem.key or _source_hash(other, config) == mine:
                return f"Triton failed to build the same kernel for {problem_label(other)} ({why[:300]})"
        return None
