"""The template kinds, by name: the one registry (see kind.py for what a kind is).

Adding a kind is one module beside its Jinja file, exposing ``KIND``, and one line in
``KINDS`` below. The functions here are what the rest of epilab calls for any problem.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import torch

from epilab.ir import rules
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue
from epilab.ir.plugin import register_templates
from epilab.ir.problem import Problem
from epilab.ir.spec import SpecFormat
from epilab.templates.bound import Bound
from epilab.templates.conv import conv2d, depthwise
from epilab.templates.gemm import block_scaled, dual_matmul, dual_weight_only, matmul, weight_only
from epilab.templates.gemv import dual_gemv, gemv, weight_only_gemv
from epilab.templates.grouped import dual_grouped_matmul, grouped_matmul
from epilab.templates.kind import OutputSpec, TemplateKind, TwinCall
from epilab.templates.runtime.binding import check_apart
from epilab.templates.runtime.render import Target, files_hash, kernel_hash, render

KINDS: dict[str, TemplateKind] = {
    kind.name: kind
    for kind in (
        matmul.KIND,
        gemv.KIND,
        conv2d.KIND,
        depthwise.KIND,
        dual_matmul.KIND,
        dual_gemv.KIND,
        grouped_matmul.KIND,
        dual_grouped_matmul.KIND,
        block_scaled.KIND,
        weight_only.KIND,
        dual_weight_only.KIND,
        weight_only_gemv.KIND,
        weight_only_gemv.DUAL_KIND,
    )
}
register_templates(KINDS)


def kind_of(problem_or_name: Problem | str) -> TemplateKind:
    """The kind of a problem (by its template) or of a template name."""
    name = problem_or_name if isinstance(problem_or_name, str) else problem_or_name.template
    kind = KINDS.get(name)
    if kind is None:
        raise ValueError(f"unknown template {name!r}; known: {sorted(KINDS)}")
    return kind


def spec_formats() -> tuple[SpecFormat, ...]:
    """The spec formats of the registered kinds (``TemplateKind.spec_module``), each once,
    in the registry's order."""
    names = dict.fromkeys(kind.spec_module for kind in KINDS.values() if kind.spec_module)
    return tuple(importlib.import_module(name).FORMAT for name in names)


def problem_ops() -> tuple[str, ...]:
    """Every op a problem may have: what each kind is made for or takes, sorted."""
    return tuple(sorted({op for kind in KINDS.values() for op in (*kind.ops, *kind.takes)}))


def default_template(op: str) -> str:
    """The template a problem of ``op`` is made for first (its twins may run elsewhere)."""
    for kind in KINDS.values():
        if op in kind.ops:
            return kind.name
    raise ValueError(f"no template is made for op {op!r}")


def template_hash(name: str, epilogue: Epilogue) -> str:
    """The hash a problem of template ``name`` with ``epilogue`` carries: of what its kernels
    are made of (``render.kernel_hash``); a record made under another is stale."""
    kind = kind_of(name)
    return kernel_hash(kind.files, *kind.kernel_epilogues(epilogue))


@lru_cache(maxsize=4096)
def is_current(problem_json: str) -> bool:
    """Whether a stored problem's kernels would be rendered now as they were when it was
    recorded (its hash is the one it would get now); False for one this version cannot read."""
    try:
        problem = Problem.from_json(problem_json)
    except ValueError:
        return False
    return problem.template_hash == template_hash(problem.template, problem.epilogue)


def code_hash() -> str:
    """One hash over every template's files and the rule table: it changes whenever any
    kernel epilab renders could (the compiler's cache key)."""
    h = hashlib.sha256(Path(rules.__file__).read_bytes())
    for name, kind in sorted(KINDS.items()):
        h.update(name.encode() + b"\0" + files_hash(kind.files).encode())
    return h.hexdigest()


def for_template(problem: Problem, name: str) -> Problem:
    """``problem`` for the template ``name`` (its current hash): the same computation on
    another template, which that template's ``check`` may still refuse."""
    return dataclasses.replace(problem, template=name, template_hash=template_hash(name, problem.epilogue))


def source(problem: Problem, config: Config, *, target: Target = "cuda", index_64: bool = False) -> str:
    """The Triton source its kind renders for ``problem`` tiled by ``config``."""
    return render(kind_of(problem), problem, config, target=target, index_64=index_64)


def default_config(
    problem: Problem, target: Target = "cuda", *, sm_count: int = matmul.H100_SMS, capability: str = ""
) -> Config:
    """The problem's kind's untuned heuristic config (its tiles widened to hold whole column
    groups where the epilogue has them: ``Epilogue.group_size``); on a GPU of ``capability``
    ("9.0"; empty: not known) the kind's ``device_default`` for it."""
    kind = kind_of(problem)
    config = kind.default_config(problem, target, sm_count=sm_count)
    if target == "cuda" and capability:
        config = kind.device_default(problem, config, capability, sm_count)
    width = problem.epilogue.group_size
    if width and kind.groups and config.BLOCK_N // config.EPILOGUE_SUBTILE % width:
        config = dataclasses.replace(config, BLOCK_N=max(config.BLOCK_N, width), EPILOGUE_SUBTILE=1)
    return config


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
    """``problem`` first, then the same computation on the other templates that can run it
    (every kind is asked: the problem's own knows its rewrites, another its own cases); a
    twin's kind must take its input dtype and, where it has them, its reduction outputs, column
    groups and row totals."""
    others = (t for kind in KINDS.values() for t in kind.twins(problem))
    return [
        problem,
        *(
            t
            for t in others
            if t.dtype in kind_of(t).input_dtypes
            and (kind_of(t).reductions or not t.epilogue.reductions)
            and (kind_of(t).groups or not t.epilogue.group_size)
            and (not t.epilogue.row_totals or kind_of(t).row_error(t) is None)
        ),
    ]


def row_error(problem: Problem) -> str | None:
    """Why no template runs ``problem``'s row totals (``Epilogue.row_totals``: each template's
    reason), or None where one does, or where it has none."""
    if not problem.epilogue.row_totals:
        return None
    candidates = [problem, *(t for kind in KINDS.values() for t in kind.twins(problem))]
    reasons = [(t.template, kind_of(t).row_error(t)) for t in candidates]
    if any(why is None for _, why in reasons):
        return None
    return "; ".join(f"{name}: {why}" for name, why in reasons)


def superseded(problem: Problem) -> bool:
    """Whether a twin's kind always runs ``problem`` far faster than its own template does
    (``TemplateKind.supersedes``): the tuner tunes that twin and leaves ``problem`` untuned."""
    return any(problem.template in kind_of(t).supersedes for t in twins(problem)[1:])


def untuned_choice(problem: Problem) -> Problem:
    """The problem an untuned (heuristic) config runs: the first twin whose kind runs its
    cases better untuned than their own template does (gemv for a skinny matmul), else
    ``problem``."""
    return next((t for t in twins(problem)[1:] if kind_of(t).prefer_untuned), problem)


def twin_call(problem: Problem, a: torch.Tensor, b: torch.Tensor) -> TwinCall | None:
    """How a twin called with its original problem's tensors converts them (the kind that
    made the twin says), or None for a problem called with its own tensors."""
    for kind in KINDS.values():
        found = kind.twin_call(problem, a, b)
        if found is not None:
            return found
    return None


def output_specs(problem: Problem, a: torch.Tensor, b: torch.Tensor) -> list[OutputSpec]:
    """Sizes and strides of each output of a call of ``problem`` with ``a`` and ``b``."""
    twin = twin_call(problem, a, b)
    return twin.outputs if twin is not None else kind_of(problem).output_specs(problem, a, b)


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
    check_call(problem, a, b, operands, out)
    return launch_unchecked(problem, config, a, b, operands, out)


def check_call(
    problem: Problem,
    a: torch.Tensor,
    b: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
) -> None:
    """Refuse tensors that do not make ``problem``, and outputs that overlap the inputs."""
    if problem_of(problem, a, b, operands) != problem:
        raise ValueError("the tensors do not match the problem (shape, dtype, layout or operands differ)")
    if out is not None:
        check_apart(out, (a, b, *operands.values()))


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
