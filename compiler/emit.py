"""A template call as Inductor's own kernel launches.

The graph pass (``graph_pass._rewrite``) puts a chosen template into the graph as the
launches themselves where it can: each launch becomes one ``triton_kernel_wrapper_functional``
node, the higher-order op Dynamo makes of a user's ``kernel[grid](...)``. Inductor compiles
it into its output code like a kernel of its own: the kernel's source, its constexprs and
its grid are fixed here, at compile time; Inductor's launcher runs it with no Python of
epilab's in between; its output code is cached by Inductor's FX graph cache and carried into
AOTInductor packages and the C++ wrapper (the custom op, ``op.py``, can be in none of them).

The launches are bound as a call binds them (``registry.bind``), on meta tensors of the inputs'
sizes, strides and storage offsets, under ``binding.cross_binding`` (the device's SMs, the
target), so every argument is the one a call with such tensors passes. Each tensor argument
is then traced back to the graph: an input (the input itself where the kernel takes a pointer
to where it starts, since the strides are arguments of their own; else an ``as_strided`` view
of its storage: a TMA descriptor's tensor, a view from another offset, each made per call), an
output (a new ``empty_strided``; a ``full`` where the kernel adds into it, ``Bound.fills``)
or scratch (``empty_strided``; zeros where a launch needs them, ``Bound.zeroed``). The
functional nodes list every output and scratch argument as written (``tensors_to_clone``);
Inductor's reinplacing pass drops the copies of fresh buffers, so each launch writes its
outputs in place. ``num_warps`` and ``num_stages`` travel as the one config of a
``triton.autotune`` wrapper (Inductor launches a plain kernel with its own defaults). The
launch's sizes and strides are the kernel's constexprs (``folded``): a launch passes only
its tensors.

Where a call cannot be emitted so, ``emit`` returns why, and the pass inserts the custom op
instead: kernels in Triton's interpreter (Inductor compiles kernels from their source for a
GPU; an interpreted kernel runs in Python), Gluon kernels (Inductor compiles ``triton.jit``
source only), shapes that are not static (the op picks a config per call's M), and calls
that do more than launch kernels (ordered statistics sum their partials with torch).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import triton
from torch._higher_order_ops.triton_kernel_wrap import (
    create_tma_stable_metadata,
    kernel_side_table,
    triton_kernel_wrapper_functional,
)
from torch.multiprocessing.reductions import StorageWeakRef

from epilab.compiler.decide import Plan
from epilab.compiler.op import output_specs
from epilab.ir.problem import Problem
from epilab.templates import registry
from epilab.templates.bound import Bound
from epilab.templates.runtime.binding import cross_binding, extent, sm_count
from epilab.templates.runtime.build import with_constexprs
from epilab.templates.runtime.render import Target

# what a launch takes beside the kernel's own arguments (``triton.Config``'s options)
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

_wrapped: dict[tuple[int, tuple[tuple[str, object], ...]], object] = {}


class NotEmitted(Exception):
    """Why a call stays the custom op."""


@dataclass
class _Buffers:
    """The graph's nodes of a call's tensors: its inputs by meta tensor, and the buffers it
    writes (outputs and scratch) by the meta tensor that owns their storage."""

    graph: fx.Graph
    fake: object
    device: torch.device
    inputs: dict[int, tuple[torch.Tensor, fx.Node]] = field(default_factory=dict)  # by id of the root
    written: dict[int, tuple[torch.Tensor, fx.Node]] = field(default_factory=dict)  # view, latest node
    made: list[fx.Node] = field(default_factory=list)

    def add(self, target: object, args: tuple, value: object, kwargs: dict | None = None) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs or {})  # type: ignore[arg-type]
        node.meta["val"] = value
        self.made.append(node)
        return node

    def undo(self) -> None:
        """Erase every node made so far (a call that cannot be emitted leaves no trace)."""
        for node in reversed(self.made):
            self.graph.erase_node(node)
        self.made.clear()

    def fake_empty(self, t: torch.Tensor) -> torch.Tensor:
        with self.fake:  # type: ignore[attr-defined]
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=self.device)

    def input(self, t: torch.Tensor, pointer: bool = False) -> fx.Node:
        """The node of input tensor ``t`` (a meta input, or a view of one's storage).
        ``pointer``: the kernel reads only ``t``'s address (its strides are arguments of
        their own), so a view that starts where its input does is the input itself, and the
        input, where it is a view (a weight's transpose), the tensor it views: no view is made
        on every call."""
        meta, node = self.inputs[id(_root(t))]
        if pointer and t.storage_offset() == meta.storage_offset():
            return _first_at_address(node)
        if t is meta:
            return node
        size, stride, offset = list(t.shape), list(t.stride()), t.storage_offset()
        with self.fake:  # type: ignore[attr-defined]
            value = torch.ops.aten.as_strided.default(node.meta["val"], size, stride, offset)
        return self.add(torch.ops.aten.as_strided.default, (node, size, stride, offset), value)

    def buffer(self, t: torch.Tensor, fill: float | None, zero: bool) -> fx.Node:
        """The latest node of the written buffer whose view ``t`` a kernel gets: made at its
        first use, as ``t`` lays it out (a view that spans its whole storage from its start)."""
        root = _root(t)
        have = self.written.get(id(root))
        if have is not None:
            view, node = have
            if (view.shape, view.stride()) != (t.shape, t.stride()):
                raise NotEmitted("a written buffer is passed to its launches as different views")
            return node
        if t.storage_offset() != 0 or extent(t) != extent(root):
            raise NotEmitted(f"a written tensor of shape {tuple(t.shape)} is a part of its buffer")
        value = self.fake_empty(t)
        size, stride = list(t.shape), list(t.stride())
        if fill is None and zero:
            fill = 0.0
        if fill is None:
            kwargs = {"dtype": t.dtype, "device": self.device}
            node = self.add(torch.ops.aten.empty_strided.default, (size, stride), value, kwargs)
        else:
            if not t.is_contiguous():
                raise NotEmitted("a buffer filled before the launch is not contiguous")
            kwargs = {"dtype": t.dtype, "device": self.device, "pin_memory": False}
            node = self.add(torch.ops.aten.full.default, (size, fill), value, kwargs)
        self.written[id(root)] = (t, node)
        return node

    def wrote(self, t: torch.Tensor, node: fx.Node) -> None:
        view, _ = self.written[id(_root(t))]
        self.written[id(_root(t))] = (view, node)

    def output(self, call_out: torch.Tensor) -> fx.Node:
        """The node of a call output: its buffer's latest node, viewed as the call's output
        where the kernel wrote a view of it (a twin's matrix of a convolution's output)."""
        view, node = self.written[id(call_out)]
        if view is call_out:
            return node
        size, stride = list(call_out.shape), list(call_out.stride())
        with self.fake:  # type: ignore[attr-defined]
            value = torch.ops.aten.as_strided.default(node.meta["val"], size, stride, 0)
        return self.add(torch.ops.aten.as_strided.default, (node, size, stride, 0), value)


def emit(
    graph: fx.Graph,
    problem: Problem,
    plan: Plan,
    a: fx.Node,
    b: fx.Node,
    operands: Sequence[fx.Node],
    names: Sequence[str],
    fake: object,
    *,
    interpreted: bool = False,
) -> list[fx.Node]:
    """Insert the launches of ``problem`` (its plan's config for this M) on the nodes ``a``,
    ``b`` and ``operands`` (named ``names``: the kind's extra inputs, then the epilogue's
    operands) at the graph's insertion point; the nodes of the call's outputs. Raises
    ``NotEmitted`` (and inserts nothing) where the call must stay the custom op.
    ``interpreted``: emit the interpreter's kernels for CPU tensors too: a graph that runs them
    eagerly (the higher-order op's own implementation launches them), as the tests do;
    Inductor cannot compile it."""
    values = [_val(n) for n in (a, b, *operands)]
    device = values[0].device
    target = _target(device, interpreted)
    if not all(_static(v) for v in values):
        raise NotEmitted("its shapes are not static (the custom op picks the config per call's M)")
    metas = [_meta(v) for v in values]
    ma, mb, mops = metas[0], metas[1], metas[2:]
    specs = output_specs(problem, ma, mb)
    if not all(_static_dims((*size, *stride)) for size, stride, _ in specs):
        raise NotEmitted("its outputs' shapes are not static")
    outs = [torch.empty_strided(size, stride, dtype=dt, device="meta") for size, stride, dt in specs]
    twin = registry.twin_call(problem, ma, mb)
    into = outs
    if twin is not None:
        ma, mb, mops = twin.inputs(ma, mb, list(mops))
        into = [twin.to_kernel(o) for o in outs]
    config = plan.choose(int(registry.kind_of(problem).call_rows(problem, ma)))  # type: ignore[call-overload]
    sms = sm_count(device) if device.type == "cuda" else 4
    with cross_binding(sms, target):
        bound = registry.bind(problem, config, ma, mb, dict(zip(names, mops, strict=True)), tuple(into))
    launches = _checked(bound, target)
    buffers = _Buffers(graph, fake, device)
    for meta, node in zip(metas, (a, b, *operands), strict=True):
        buffers.inputs.setdefault(id(_root(meta)), (meta, node))
    fills = {id(_root(into[i])): value for i, value in bound.fills}
    try:
        for kernel, grid, args in launches:
            _launch(buffers, kernel, grid, args, bound, fills, target)
        missing = [i for i, o in enumerate(outs) if id(o) not in buffers.written]
        if missing:
            raise NotEmitted(f"no launch writes output {missing[0]}")
        return [buffers.output(o) for o in outs]
    except NotEmitted:
        buffers.undo()
        raise


def _launch(
    buffers: _Buffers,
    kernel: object,
    grid: tuple[int, ...],
    args: Mapping[str, object],
    bound: Bound,
    fills: Mapping[int, float],
    target: Target,
) -> None:
    """One launch as a ``triton_kernel_wrapper_functional`` node, and its written tensors'
    nodes (``getitem`` of it) noted as their buffers' latest."""
    names = set(kernel.arg_names)  # type: ignore[attr-defined]
    options = {k: v for k, v in args.items() if k in LAUNCH_OPTIONS}
    unknown = sorted(k for k in args if k not in names and k not in LAUNCH_OPTIONS)
    if unknown:
        raise NotEmitted(f"its launch takes options Inductor does not pass: {unknown}")
    described = {d.arg: d for d in bound.descriptors}
    kwargs: dict[str, fx.Node] = {}
    constants: dict[str, object] = {}
    written: dict[str, torch.Tensor] = {}
    tma: dict[str, object] = {}
    for name, value in args.items():
        if name in options:
            continue
        if name in described:
            d = described[name]
            if d.layout is not None:
                raise NotEmitted("a Gluon tensor descriptor")
            value = args[d.tensor]
            assert isinstance(value, torch.Tensor)
            value = value.transpose(-1, -2) if d.transposed else value
            tma[name] = create_tma_stable_metadata(list(d.block))
        if not isinstance(value, torch.Tensor):
            constants[name] = value
            continue
        if id(_root(value)) in buffers.inputs:
            kwargs[name] = buffers.input(value, pointer=name not in tma)
            continue
        fill = fills.get(id(_root(value)))
        kwargs[name] = buffers.buffer(value, fill, name in bound.zeroed)
        written[name] = value
    kernel = folded(kernel, constants, target)
    # one name per written buffer (a TMA store's descriptor shares its output's): a buffer
    # named twice would be copied for the second, and the kernel's two writes would part
    by_buffer: dict[int, str] = {}
    for name in sorted(written, key=lambda n: (n in tma, n)):
        by_buffer.setdefault(id(_root(written[name])), name)
    cloned = sorted(by_buffer.values())
    call = {
        "kernel_idx": kernel_side_table.add_kernel(_wrap(kernel, options)),  # type: ignore[arg-type]
        "constant_args_idx": kernel_side_table.add_constant_args(constants),
        "grid": [(*grid, *(1,) * (3 - len(grid)))],
        "tma_descriptor_metadata": tma,
        "kwargs": kwargs,
        "tensors_to_clone": cloned,
    }
    results = {name: buffers.fake_empty(written[name]) for name in cloned}
    node = buffers.add(triton_kernel_wrapper_functional, (), results, call)
    # the strides this launch was bound for: Inductor holds its inputs to exactly these
    node.meta["eager_input_vals"] = ((), fx.node.map_arg(node.kwargs, lambda n: n.meta["val"]))
    for name in cloned:
        buffers.wrote(written[name], buffers.add(operator.getitem, (node, name), results[name]))


def folded(kernel: object, args: Mapping[str, object], target: Target) -> object:
    """``kernel`` with its numeric arguments in ``args`` as constexprs. A static graph passes
    the same sizes and strides on every call: folded in, they leave the launch (Inductor's
    own templates bake them in too: its launcher then passes only the tensors) and the
    kernel's index arithmetic is done at compile time."""
    numbers = [n for n, v in args.items() if isinstance(v, int | float)]
    return with_constexprs(kernel, numbers, target=target)


def _checked(bound: Bound, target: str) -> tuple:
    launches = bound.launches
    if not launches:
        raise NotEmitted("the call does more than launch kernels (ordered statistics, or nothing to launch)")
    for kernel, _, _ in launches:
        if target == "interpreter":
            continue
        if not isinstance(kernel, triton.JITFunction):
            raise NotEmitted(f"its kernel is a {type(kernel).__name__}, not a triton.jit function")
        if kernel.is_gluon():
            raise NotEmitted("a Gluon kernel: Inductor compiles triton.jit kernels only")
    return launches


def _wrap(kernel: object, options: Mapping[str, object]) -> object:
    """``kernel`` with its launch options as the one config of a ``triton.autotune`` wrapper
    (one per kernel and options: the side table keeps each once)."""
    key = (id(kernel), tuple(sorted(options.items())))
    wrapped = _wrapped.get(key)
    if wrapped is None:
        config = triton.Config({}, **options)  # type: ignore[arg-type]
        wrapped = _wrapped[key] = triton.autotune(configs=[config], key=[])(kernel)
    return wrapped


def _target(device: torch.device, interpreted: bool) -> Target:
    if device.type == "cpu" and interpreted:
        return "interpreter"
    if device.type != "cuda":
        raise NotEmitted(
            "its tensors are not on a GPU (Triton's interpreter runs kernels in Python: "
            "Inductor compiles kernels from their source for a GPU)"
        )
    return "cuda"


def _first_at_address(node: fx.Node) -> fx.Node:
    """The node furthest up ``node``'s chain of views (each of its first argument) whose tensor
    starts at the same address, of the same dtype: what a kernel taking a pointer to
    ``node``'s tensor may take instead."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], fx.Node):
        view, base = node.meta.get("val"), node.args[0].meta.get("val")
        if not (isinstance(view, torch.Tensor) and isinstance(base, torch.Tensor)):
            break
        if _start(view) != _start(base):
            break
        node = node.args[0]
    return node


def _start(v: torch.Tensor) -> tuple:
    """Where a tensor's data starts: its storage, offset, dtype and device."""
    return (StorageWeakRef(v.untyped_storage()), v.storage_offset(), v.dtype, v.device)


def _root(t: torch.Tensor) -> torch.Tensor:
    return t if t._base is None else t._base


def _val(node: fx.Node) -> torch.Tensor:
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor):
        raise NotEmitted(f"input {node.name} has no tensor value")
    return v


def _static_dims(dims: Sequence[object]) -> bool:
    return all(isinstance(d, int) for d in dims)


def _static(v: torch.Tensor) -> bool:
    return _static_dims((*v.shape, *v.stride(), v.storage_offset()))


def _meta(v: torch.Tensor) -> torch.Tensor:
    """A meta tensor of ``v``'s sizes, strides, storage offset and dtype: a view of a storage
    of its own, so that its address (0 + the offset's bytes) tells its alignment."""
    offset = v.storage_offset()
    span = offset + extent(v) if v.numel() else offset
    base = torch.empty(span, dtype=v.dtype, device="meta")
    return base.as_strided(v.shape, v.stride(), offset)
