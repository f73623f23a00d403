"""The custom op ``epilab::template_call``: one fused template launch in a graph.

Its only non-tensor arguments are the canonical problem JSON and the plan JSON
(a config, or configs by M bucket), so graphs that hold it stay serializable
and cacheable. Operands come in the problem's order (sorted by name). Both JSON
texts are parsed once per process; a call then picks the config for its M and
launches the template (``templates.matmul``) into freshly allocated outputs.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from epilab.compiler.decide import Plan
from epilab.templates.matmul import launch_unchecked
from epilab.templates.problem import Problem
from epilab.templates.rules import DTYPES


@lru_cache(maxsize=4096)
def _problem(text: str) -> tuple[Problem, tuple[str, ...]]:
    problem = Problem.from_json(text)
    return problem, tuple(o.name for o in problem.operands)


@lru_cache(maxsize=4096)
def _plan(text: str) -> Plan:
    return Plan.from_json(text)


def _out_shape(a: torch.Tensor, b: torch.Tensor) -> list:
    m, n = a.shape[-2], b.shape[-1]
    if a.dim() == 3:
        return [a.shape[0], m, n]
    if b.dim() == 3:
        return [b.shape[0], m, n]
    return [m, n]


@torch.library.custom_op("epilab::template_call", mutates_args=())
def template_call(
    problem: str, plan: str, a: torch.Tensor, b: torch.Tensor, operands: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Run the template of ``problem`` with the plan's config for this call's M."""
    p, names = _problem(problem)
    config = _plan(plan).choose(a.shape[-2])
    return list(launch_unchecked(p, config, a, b, dict(zip(names, operands, strict=True))))


@template_call.register_fake
def _(
    problem: str, plan: str, a: torch.Tensor, b: torch.Tensor, operands: list[torch.Tensor]
) -> list[torch.Tensor]:
    p, _ = _problem(problem)
    shape = _out_shape(a, b)
    return [a.new_empty(shape, dtype=DTYPES[o.dtype]) for o in p.epilogue.outputs]
