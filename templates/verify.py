"""The one check of a template against its kind's float64 reference: what the tuner runs
on every candidate and what every template's tests run.

Inputs come from the kind (``random_inputs``: exactly the problem's shapes, dtypes and
layouts) or from a test that builds awkward ones itself; outputs are NaN-poisoned before
the launch, so an element the kernel skips shows; each output's error is checked against
the bound of the problem's precision and the output's dtype (``check.tolerance``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from epilab.ir.check import poisoned_like, rel_error, tolerance
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.templates.bound import Bound
from epilab.templates.kind import InputSet
from epilab.templates.registry import bind, check_call, kind_of, problem_of


def random_inputs(problem: Problem, device: torch.device | str, seed: int) -> InputSet:
    """Random inputs made by the problem's kind, checked against the problem (inputs that
    do not fit it are a bug of the kind)."""
    if not problem.shape.is_static():
        raise ValueError("random inputs need a static shape")
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    a, b, operands = kind_of(problem).inputs(problem, device, gen)
    if problem_of(problem, a, b, operands) != problem:
        raise ValueError("could not build inputs that match the problem")
    return a, b, operands


def poisoned_outputs(problem: Problem, device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """NaN-filled outputs laid out as the kind lays them out."""
    return tuple(poisoned_like(o) for o in kind_of(problem).empty_outputs(problem, torch.device(device)))


def output_errors(
    problem: Problem, outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor]
) -> list[tuple[float, float]]:
    """(error, bound) of each output against its reference."""
    return [
        (rel_error(o, r), tolerance(problem.dtype, problem.precision, spec.dtype))
        for o, r, spec in zip(outs, refs, problem.epilogue.outputs, strict=True)
    ]


def failure(errors: Sequence[tuple[float, float]]) -> str | None:
    """What is wrong with the outputs (the worst one against its bound), or None."""
    if all(e <= bound for e, bound in errors):
        return None
    worst = max(range(len(errors)), key=lambda i: errors[i][0] / max(errors[i][1], 1e-30))
    err, bound = errors[worst]
    return f"output {worst}: ||out-ref||/||ref|| = {err:.3e} > {bound:.0e}"


def checked_launch(
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
) -> Bound:
    """Launch into ``out`` (NaN-poisoned first) or into the kind's own outputs, and compare
    each output with the kind's float64 reference; AssertionError on a miss. The tensors
    are checked against the problem first, as ``registry.launch`` checks them."""
    check_call(problem, a, b, operands, out)
    if out is not None:
        for o in out:
            o.copy_(poisoned_like(o))
    bound = bind(problem, config, a, b, operands, out)
    if out is None:
        for o in bound.outs:
            o.copy_(poisoned_like(o))
    bound.run()
    refs = kind_of(problem).reference(problem, a, b, operands)
    for o, r in zip(bound.outs, refs, strict=True):
        assert o.shape == r.shape, (
            f"output shape {tuple(o.shape)} differs from the reference {tuple(r.shape)}"
        )
    why = failure(output_errors(problem, bound.outs, refs))
    assert why is None, f"{why} for {problem.template} {problem.shape} config={config.short()}"
    return bound
