"""The custom op ``epilab::template_call``: one fused template launch in a graph.

It is defined with ``torch.library.Library`` (schema, one implementation for
every device, and ``torch.library.register_fake`` for shapes) rather than the
``torch.library.custom_op`` decorator: its Python wrappers cost more per call than
the Triton launch itself (benchmarks/launch_overhead.py; RESULTS.md, "Launch cost"),
which decode-sized models pay once per matmul.

Its only non-tensor arguments are the canonical problem JSON and the plan JSON
(a config, or configs by M bucket), so graphs that hold it stay serializable
and cacheable. Operands come in the problem's order: the kind's extra inputs (a dual
GEMM's second weight) first, then the epilogue's operands sorted by name. Both JSON
texts are parsed once per process; the first call with given tensor shapes and
layouts picks the config for its M and launches the template
(its kind's ``bind``); later calls like it replay that launch
(``templates.launcher``), which keeps the per-call Python cost small.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from epilab.compiler.decide import Plan
from epilab.ir import dtypes
from epilab.ir.problem import Problem
from epilab.templates import registry
from epilab.templates.registry import bind
from epilab.templates.runtime.replay import Replay, replay_key

_replays: dict[tuple, tuple[Replay, registry.TwinCall | None]] = {}
MAX_REPLAYS = 4096


def operand_names(problem: Problem) -> tuple[str, ...]:
    """The names of a call's operand list: its kind's extra inputs (a dual GEMM's B2, a
    grouped GEMM's offsets and routing indices), then the epilogue's operands (sorted by
    name); the custom op's and the emitted launches' (``emit.py``) alike."""
    return (*registry.kind_of(problem).inputs_of(problem), *(o.name for o in problem.operands))


@lru_cache(maxsize=4096)
def _problem(text: str) -> tuple[Problem, tuple[str, ...]]:
    """The problem, and the names of its call's operand list (``operand_names``)."""
    problem = Problem.from_json(text)
    return problem, operand_names(problem)


@lru_cache(maxsize=4096)
def _plan(text: str) -> Plan:
    return Plan.from_json(text)


def output_specs(
    problem: Problem, a: torch.Tensor, b: torch.Tensor
) -> list[tuple[tuple[object, ...], tuple[object, ...], torch.dtype]]:
    """Sizes, strides and dtype of each output of a call with inputs ``a`` and ``b`` (real or
    fake), from the kind (``registry.output_specs``): they follow from the problem and the
    inputs' *sizes* alone, never from the inputs' strides, so the fake implementation and
    the real call agree whatever strides Inductor hands the call (it may re-layout the
    inputs of an op it did not trace)."""
    out_dtypes = [dtypes.torch_dtype(o.dtype) for o in problem.epilogue.outputs]
    specs = registry.output_specs(problem, a, b)
    return [(tuple(sz), tuple(st), dt) for (sz, st), dt in zip(specs, out_dtypes, strict=True)]


_LIB = torch.library.Library("epilab", "DEF")
# needs_exact_strides: Inductor passes the inputs with exactly the strides of the values the
# graph pass recorded (node.meta["eager_input_vals"]), i.e. the layouts the problem was made for
# (torch before 2.7 has only the weaker fixed stride order).
_EXACT_STRIDES = getattr(torch.Tag, "needs_exact_strides", torch.Tag.needs_fixed_stride_order)
_LIB.define(
    "template_call(str problem, str plan, Tensor a, Tensor b, Tensor[] operands) -> Tensor[]",
    tags=(_EXACT_STRIDES,),
)


def template_call(
    problem: str, plan: str, a: torch.Tensor, b: torch.Tensor, operands: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Run the template of ``problem`` with the plan's config for this call's M. A twin
    called with its original problem's tensors (a 1x1 convolution's 4-D tensors for its
    matmul twin) runs on the views its kind gives (``registry.twin_call``)."""
    tensors = [a, b, *operands]
    key = (problem, plan, replay_key(tensors))
    found = _replays.get(key)
    if found is not None:
        replay, twin = found
        if twin is None:
            return replay(tensors)
        # the views the twin's kernel reads: same addresses, but a TMA descriptor is made over
        # their shapes (a 1x1 convolution's 4-D input is a rank mismatch for its matmul twin's)
        a, b, operands = twin.inputs(a, b, operands)
        return twin.from_kernel(replay([a, b, *operands]), tensors[0])
    p, names = _problem(problem)
    twin = registry.twin_call(p, a, b)
    outs = [torch.empty_strided(s, st, dtype=dt, device=a.device) for s, st, dt in output_specs(p, a, b)]
    into = outs
    if twin is not None:
        a, b, operands = twin.inputs(a, b, operands)
        into = [twin.to_kernel(o) for o in outs]
    config = _plan(plan).choose(registry.kind_of(p).call_rows(p, a))  # type: ignore[arg-type]
    bound = bind(p, config, a, b, dict(zip(names, operands, strict=True)), tuple(into))
    compiled = bound.run()
    if a.is_cuda and compiled is not None and bound.kernel is not None and len(_replays) < MAX_REPLAYS:
        extra = registry.kind_of(p).inputs_of(p)
        inputs = [
            *registry.kind_of(p).input_args,
            *(f"{n}_ptr" if n in extra else f"op_{n}_ptr" for n in names),
        ]
        _replays[key] = (Replay(bound, compiled, inputs), twin)
    return outs


_LIB.impl("template_call", template_call, "CompositeExplicitAutograd")


@torch.library.register_fake("epilab::template_call")
def _fake(
    problem: str, plan: str, a: torch.Tensor, b: torch.Tensor, operands: list[torch.Tensor]
) -> list[torch.Tensor]:
    p, _ = _problem(problem)
    return [a.new_empty_strided(s, st, dtype=dt) for s, st, dt in output_specs(p, a, b)]


TEMPLATE_CALL = torch.ops.epilab.template_call.default
