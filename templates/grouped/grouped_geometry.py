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

A *routed* problem fuses the moves of a mixture of experts' rows around it: with ``gather``
row ``r`` of A is row ``gather[r]`` of the tokens' activations ``x [T / topk, K]`` (no permuted
copy of them); with ``scatter`` the output row ``r`` goes to row ``scatter[r]``: ``"store"``
writes it there (a permutation, in any order the caller keeps: ``[T, N]``), ``"add"`` adds it
there with an atomic (``out[token] += y[r]``, the top-k combine: ``[T / topk, N]``, zeroed
first). ``topk`` is each token's rows (``T = tokens * topk``); the indices are extra inputs
of the call, as the offsets are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from epilab.ir.problem import Problem

MAX_EXPERTS = 1024  # the most experts a kernel takes (it loads every expert's offset at once)
SCATTERS = ("", "store", "add")  # the output rows: in A's order, written to scatter[r], added there
GATHER, SCATTER = "gather", "scatter"  # the names of the routing indices in a call's operands
OFFS = "offs"  # the name of the offsets in a call's operands


@dataclass(frozen=True)
class GroupedGeometry:
    """``experts`` groups of rows, each with a B of its own; a routed problem's ``topk``
    rows per token, its A rows gathered by token (``gather``) and its output rows scattered
    back to token order (``scatter``: "store" or "add")."""

    KEY: ClassVar[str] = "grouped"  # its place in the problem's JSON

    experts: int
    topk: int = 1
    gather: bool = False
    scatter: str = ""

    def __post_init__(self) -> None:
        e = self.experts
        if isinstance(e, bool) or not isinstance(e, int) or not 1 <= e <= MAX_EXPERTS:
            raise ValueError(f"a grouped GEMM has 1..{MAX_EXPERTS} experts, got {e!r:.40}")
        if not isinstance(self.gather, bool):
            raise ValueError(f"gather is true or false, got {self.gather!r:.40}")
        if self.scatter not in SCATTERS:
            raise ValueError(f"scatter is one of {SCATTERS[1:]} (or none), got {self.scatter!r:.40}")
        k = self.topk
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= e:
            raise ValueError(f"topk is 1..experts ({e}), got {k!r:.40}")
        if k != 1 and not self.routed:
            raise ValueError("topk is the rows per token of a routed problem (gather or scatter)")

    @property
    def routed(self) -> bool:
        return self.gather or bool(self.scatter)

    def routing_inputs(self) -> tuple[str, ...]:
        """The routing indices a call passes beside the offsets, in this order."""
        return (GATHER,) * self.gather + (SCATTER,) * bool(self.scatter)

    def to_dict(self) -> dict[str, Any]:
        routing = {"topk": self.topk, "gather": self.gather, "scatter": self.scatter}
        return {"experts": self.experts, **({k: v for k, v in routing.items() if v} if self.routed else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GroupedGeometry:
        try:
            return cls(d["experts"], d.get("topk", 1), d.get("gather", False), d.get("scatter", ""))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a valid grouped geometry: missing or malformed {e}") from e


def geometry_of(problem: Problem) -> GroupedGeometry:
    """A grouped problem's geometry (``Problem`` has checked its class)."""
    g = problem.geometry
    assert isinstance(g, GroupedGeometry), "a grouped problem carries its GroupedGeometry"
    return g


def experts_of(problem: Problem) -> int:
    return geometry_of(problem).experts


def output_rows(problem: Problem, rows: Any) -> Any:
    """The output rows for ``rows`` grouped rows: the tokens where they are added back to
    token order, else the rows themselves."""
    g = geometry_of(problem)
    return rows // g.topk if g.scatter == "add" else rows


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
    s, g = problem.shape, geometry_of(problem)
    routing = (", gathered" if g.gather else "") + (f", top-{g.topk} {g.scatter}ed back" if g.scatter else "")
    return f"{s.m} rows / {g.experts} experts -> {s.n}x{s.k}{routing}"


def transfer_key(problem: Problem) -> tuple[str, int, bool]:
    """Configs carry between grouped problems of one op, one expert count and one way of
    reading A (gathered rows are loaded by pointers, never by TMA): their rows, N and K are
    measured by ``policy/nearest``'s distance."""
    return problem.op, experts_of(problem), geometry_of(problem).gather
