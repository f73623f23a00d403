"""The custom op ``epilab::template_call``: one fused template launch in a graph.

It is defined with ``torch.library.Library`` (schema, one implementation for
every device, and ``torch.library.register_fake`` for shapes) rather than the
``torch.library.custom_op`` decorator: on an H200 host the decorator's Python
wrappers cost about 26 us per call on top of a 20 us Triton launch
(benchmarks/launch_overhead.py), which decode-sized models pay once per matmul.

Its only non-tensor arguments are the canonical problem JSON and the plan JSON
(a config, or configs by M bucket), so graphs that hold it stay serializable
and cacheable. Operands come in the problem's order (sorted by name). Both JSON
texts are parsed once per process; the first call with given tensor shapes and
layouts picks the config for its M and launches the template
(``templates.matmul``); later calls like it replay that launch
(``templates.launcher``), which keeps the per-call Python cost small.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from epilab.compiler.decide import Plan
from epilab.templates import dtypes
from epilab.templates.conv2d import (
    as_conv_outputs,
    as_matmul,
    as_matmul_output,
    out_shape_of,
    out_strides_of,
)
from epilab.templates.kinds import bind
from epilab.templates.launcher import Replay, replay_key
from epilab.templates.problem import Problem

_replays: dict[tuple, Replay] = {}
MAX_REPLAYS = 4096


@lru_cache(maxsize=4096)
def _problem(text: str) -> tuple[Problem, tuple[str, ...]]:
    problem = Problem.from_json(text)
    return problem, tuple(o.name for o in problem.operands)


@lru_cache(maxsize=4096)
def _plan(text: str) -> Plan:
    return Plan.from_json(text)


def output_specs(
    problem: Problem, a: torch.Tensor, b: torch.Tensor
) -> list[tuple[tuple[object, ...], tuple[object, ...], torch.dtype]]:
    """Sizes, strides and dtype of each output of a call with inputs ``a`` and ``b`` (real or
    fake). They follow from the problem and the inputs' *sizes* alone, never from the
    inputs' strides: the fake implementation and the real call both allocate from this one
    function, so they agree whatever strides Inductor hands the call (it may re-layout the
    inputs of an op it did not trace). Matmul and gemv outputs are contiguous; a convolution's
    are in the memory format of the problem's input layout (channels_last for ``nhwc``); a
    1x1 convolution run as its matmul twin (a 4-D ``a``) gives channels_last outputs."""
    out_dtypes = [dtypes.torch_dtype(o.dtype) for o in problem.epilogue.outputs]
    if problem.conv is not None:
        shape, strides = out_shape_of(problem), out_strides_of(problem)
    elif a.dim() == 4:
        n, _, h, w = a.shape
        k = b.shape[0]
        shape, strides = (n, k, h, w), (k * h * w, 1, w * k, k)
    else:
        batches = [t.shape[0] for t in (a, b) if t.dim() == 3]
        batch = [max(batches)] if len(batches) == 2 else batches  # a batch of 1 broadcasts
        shape = (*batch, a.shape[-2], b.shape[-1])
        strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return [(tuple(shape), tuple(strides), dt) for dt in out_dtypes]


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
    """Run the template of ``problem`` with the plan's config for this call's M. A 4-D ``a``
    with a matmul problem is a 1x1 convolution run as its matmul twin (``conv2d.matmul_twin``):
    its tensors are viewed as matrices and its outputs viewed back."""
    tensors = [a, b, *operands]
    key = (problem, plan, replay_key(tensors))
    replay = _replays.get(key)
    p, names = _problem(problem)
    as_conv = p.conv is None and a.dim() == 4
    if replay is not None:
        outs = replay(tensors)  # a view has its tensor's address: the 4-D tensors serve as they are
        return as_conv_outputs(outs, tensors[0]) if as_conv else outs
    outs = [torch.empty_strided(s, st, dtype=dt, device=a.device) for s, st, dt in output_specs(p, a, b)]
    into = outs
    if as_conv:
        a, b, operands = as_matmul(a, b, operands)
        into = [as_matmul_output(o) for o in outs]
    config = _plan(plan).choose(a.shape[-2])
    bound = bind(p, config, a, b, dict(zip(names, operands, strict=True)), tuple(into))
    compiled = bound.run()
    if a.is_cuda and compiled is not None and bound.kernel is not None and len(_replays) < MAX_REPLAYS:
        inputs = ["x_ptr", "w_ptr"] if p.conv is not None else ["a_ptr", "b_ptr"]
        _replays[key] = Replay(bound, compiled, [*inputs, *(f"op_{n}_ptr" for n in names)])
    return outs


_LIB.impl("template_call", template_call, "CompositeExplicitAutograd")


@torch.library.register_fake("epilab::template_call")
def _fake(
    problem: str, plan: str, a: torch.Tensor, b: torch.Tensor, operands: list[torch.Tensor]
) -> list[torch.Tensor]:
    p, _ = _problem(problem)
    return [a.new_empty_strided(s, st, dtype=dt) for s, st, dt in output_specs(p, a, b)]


TEMPLATE_CALL = torch.ops.epilab.template_call.default
