"""The template kinds, by name: the one registry (see kind.py for what a kind is).

Adding a kind is one module beside its Jinja file, exposing ``KIND``, and one line in
``KINDS`` below. The functions here are what the rest of epilab calls for any problem.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from epilab.templates import conv2d, gemv, matmul
from epilab.templates.kind import TemplateKind
from epilab.templates.problem import Config, Problem
from epilab.templates.render import Target
from epilab.templates.runtime import Bound, check_apart

KINDS: dict[str, TemplateKind] = {
    kind.name: kind
    for kind in (
        matmul.KIND,
        gemv.KIND,
        conv2d.KIND,
    )
}


def kind_of(problem_or_name: Problem | str) -> TemplateKind:
    """The kind of a problem (by its template) or of a template name."""
    name = problem_or_name if isinstance(problem_or_name, str) else problem_or_name.template
    kind = KINDS.get(name)
    if kind is None:
        raise ValueError(f"unknown template {name!r}; known: {sorted(KINDS)}")
    return kind


def default_config(problem: Problem, target: Target = "cuda", *, sm_count: int = matmul.H100_SMS) -> Config:
    """The problem's kind's untuned heuristic config."""
    return kind_of(problem).default_config(problem, target, sm_count=sm_count)


def problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    """The problem these tensors make under ``problem``'s kind: equal to ``problem``
    exactly when they fit it (checks them all)."""
    return kind_of(problem).problem_of(problem, a, b, operands)


def bind(
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
) -> Bound:
    """Everything ``launch_unchecked`` does up to the launch itself."""
    return kind_of(problem).bind(problem, config, a, b, operands, out)


def twins(problem: Problem) -> list[Problem]:
    """``problem`` first, then the same computation on every other kind that can run it."""
    found = [k.twin_of(problem) for k in KINDS.values() if k.name != problem.template]
    return [problem, *(t for t in found if t is not None)]


def launch(
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Run ``problem`` with ``config``; returns the epilogue's outputs.

    ``out`` (optional) are preallocated outputs of the right shape and dtype,
    with any strides; otherwise contiguous ones are allocated.
    """
    if problem_of(problem, a, b, operands) != problem:
        raise ValueError("the tensors do not match the problem (shape, dtype, layout or operands differ)")
    if out is not None:
        check_apart(out, (a, b, *operands.values()))
    return launch_unchecked(problem, config, a, b, operands, out)


def launch_unchecked(
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, ...]:
    """``launch`` for tensors already checked against ``problem`` by ``make_problem``."""
    bound = bind(problem, config, a, b, operands, out)
    bound.run()
    return bound.outs
