"""The grouped GEMM kinds' geometry: what a grouped problem has beyond its GEMM view
(``Shape``: batch 1, m = the rows of A over every expert, n, k), how its problems are
checked against it, labelled, and which of them share configs.

A grouped problem runs ``E`` GEMMs of one N and K and of different M, one per expert: the
rows of A ``[T, K]`` in ``E`` groups given by cumulative offsets ``offs[E]`` (as
``torch._grouped_mm`` takes them), group ``e`` multiplied by ``B[e]`` of ``B [E, K, N]``.
The offsets change every batch, so they are not part of the problem: one record serves every
split of the same ``T`` rows over the same experts (its bucket of rows per expert is
``T / E``). The kinds (``grouped_matmul.py``) declare the geometry; the problem keeps it in its
``geometry`` slot and its JSON under ``GroupedGeometry.KEY``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from epilab.ir.problem import Problem

MAX_EXPERTS = 1024  # the most experts a kernel takes (it loads every expert's offset at once)


@dataclass(frozen=True)
class GroupedGeometry:
    """``experts`` groups of rows, each with a B of its own."""

    KEY: ClassVar[str] = "grouped"  # its place in the problem's JSON

    experts: int

    def __post_init__(self) -> None:
        e = self.experts
        if isinstance(e, bool) or not isinstance(e, int) or not 1 <= e <= MAX_EXPERTS:
            raise ValueError(f"a grouped GEMM has 1..{MAX_EXPERTS} experts, got {e!r:.40}")

    def to_dict(self) -> dict[str, Any]:
        return {"experts": self.experts}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GroupedGeometry:
        try:
            return cls(d["experts"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a valid grouped geometry: missing or malformed {e}") from e


def experts_of(problem: Problem) -> int:
    """The experts of a grouped problem (``Problem`` has checked its geometry's class)."""
    g = problem.geometry
    assert isinstance(g, GroupedGeometry), "a grouped problem carries its GroupedGeometry"
    return g.experts


def problem_error(problem: Problem) -> str | None:
    """Why a grouped problem's shape does not fit its geometry, or None: all experts' rows
    are one [T, K] A (batch 1)."""
    if problem.shape.batch != 1:
        return f"a grouped GEMM's rows are one [T, K] matrix (batch 1), got batch {problem.shape.batch}"
    return None


def rows_per_expert(problem: Problem) -> float | None:
    """Its bucket: rows per expert on average (None for a symbolic T)."""
    m = problem.shape.m
    return m / experts_of(problem) if isinstance(m, int) else None


def label(problem: Problem) -> str:
    """T rows over E experts, then N x K: ``8192 rows / 8 experts -> 14336x4096``."""
    s = problem.shape
    return f"{s.m} rows / {experts_of(problem)} experts -> {s.n}x{s.k}"


def transfer_key(problem: Problem) -> tuple[str, int]:
    """Configs carry between grouped problems of one op and one expert count (their rows,
    N and K measured by ``tuner/nearest``'s distance)."""
    return problem.op, experts_of(problem)
