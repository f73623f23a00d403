"""Ahead-of-time packages: a model with epilab's templates as an AOTInductor package.

    path = epilab.aot_compile(model, (x,), "model.pt2", db="tuning.db")
    # later, in any process (epilab need not be installed):
    runner = torch._inductor.aoti_load_package("model.pt2")
    y = runner(x)

The model is exported (``torch.export``) and compiled by ``aoti_compile_and_package`` with
epilab's pass as Inductor's post-grad pass. Only templates whose calls are Inductor's own
kernel launches (``emit.py``) can live in a package, so the pass runs with
``Context.emit = "kernels_only"``: a template that cannot be emitted so (a Gluon kernel, a
call whose shapes are not static) leaves its group to the aten op, and ``explain()`` says
which and why. The package holds the kernels' compiled code and launches them from C++.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from epilab.compiler.backend import _context, _policy


def aot_compile(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: Sequence[Any],
    package_path: str | Path,
    *,
    kwargs: Mapping[str, Any] | None = None,
    db: str | Path | None = None,
    policy: str | None = None,
    dynamic_shapes: Any = None,
    inductor_configs: Mapping[str, Any] | None = None,
) -> str:
    """Export ``model`` with example ``args`` (or take an ``ExportedProgram``) and compile it
    into an AOTInductor package at ``package_path`` with epilab's templates as kernels; the
    package's path. ``db`` and ``policy`` as for the backend; ``inductor_configs`` are passed
    on to Inductor (a ``post_grad_custom_post_pass`` of the user's own runs before epilab's)."""
    from torch._inductor import aoti_compile_and_package

    from epilab.compiler.graph_pass import ChainedPass, EpilabPass

    if isinstance(model, torch.export.ExportedProgram):
        exported = model
    else:
        exported = torch.export.export(model, tuple(args), dict(kwargs or {}), dynamic_shapes=dynamic_shapes)
    flat = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    context, facts = _context(_policy(policy), db, False, False, flat, progress=False)
    context.emit = "kernels_only"
    ours = EpilabPass(context, facts + "|emit=kernels_only|aot")
    configs = dict(inductor_configs or {})
    user = configs.get("post_grad_custom_post_pass")
    configs["post_grad_custom_post_pass"] = ours if user is None else ChainedPass(user, ours)
    return str(aoti_compile_and_package(exported, package_path=str(package_path), inductor_configs=configs))
