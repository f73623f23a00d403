"""What every template kind shares at run time: the target a device runs
on, how operands and outputs are laid out and passed, the check that outputs stand apart
from the inputs, the kernel cache, and ``Bound`` (a launch with every argument fixed, which
``replay.Replay`` and CUDA graphs run again)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from epilab.config import settings
from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import REDUCTIONS, Epilogue
from epilab.ir.problem import Dim, OperandSpec, Problem
from epilab.templates.bound import Bound, CallScratch, Launch, Workspace
from epilab.templates.kind import TemplateKind
from epilab.templates.runtime.build import build, interpreter_active
from epilab.templates.runtime.render import Target, kernel_name, render

INT32_MAX = 2**31 - 1


# ------------------------------------------------------------------ tensors in


# Set while binding launches without launching them: on CPU tensors for CUDA without a GPU
# (``templates/tools/cross.py``), or on meta tensors for a kernel a compiled graph launches
# (``compiler/emit.py``). Such tensors then stand for ones of a device with this many SMs
# whose kernels are built for this target, and nothing is launched.
_binding: ContextVar[tuple[int, Target] | None] = ContextVar("epilab_binding", default=None)


@contextlib.contextmanager
def cross_binding(sms: int, target: Target = "cuda") -> Iterator[None]:
    """Bind launches for ``target`` on CPU or meta tensors (a device of ``sms`` SMs), to
    compile them or to emit them into a graph, not to run them."""
    token = _binding.set((sms, target))
    try:
        yield
    finally:
        _binding.reset(token)


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (the interpreter's: 4; a cross binding's: its own)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    binding = _binding.get()
    return 4 if binding is None else binding[0]


def target_for(device: torch.device) -> Target:
    """Where kernels run: compiled for CUDA, or in Triton's interpreter when it is on."""
    binding = _binding.get()
    if device.type in ("cpu", "meta") and binding is not None:
        return binding[1]
    if device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"device {device} is not supported; use a CUDA device (or CPU with EPILAB_INTERPRET=1)"
        )
    if device.type == "cpu" and not settings().interpret:
        raise ValueError(
            "epilab kernels need CUDA tensors; got CPU tensors. Set EPILAB_INTERPRET=1 "
            "to run them on the CPU in Triton's interpreter (slow: for tests)"
        )
    if interpreter_active():
        return "interpreter"
    if device.type == "cpu":
        raise RuntimeError(
            "EPILAB_INTERPRET is on, but Triton was imported before it was: set EPILAB_INTERPRET=1 "
            "(or TRITON_INTERPRET=1) in the environment before Python starts"
        )
    return "cuda"


def layout_of(sizes: Sequence[Dim], strides: Sequence[Dim]) -> str:
    """'row' if the last dim is contiguous, 'col' if the one before it is (sizes and
    strides may be sympy expressions: only a literal 1 counts)."""
    if strides[-1] == 1 or sizes[-1] == 1:
        return "row"
    if strides[-2] == 1 or sizes[-2] == 1:
        return "col"
    return "strided"


def operand_layout(broadcast: str, sizes: Sequence[Dim], strides: Sequence[Dim]) -> str:
    """The layout an OperandSpec records for an operand of ``broadcast`` with these sizes."""
    if broadcast == "scalar":
        return "scalar"
    if broadcast in ("row", "col"):
        return "vector"
    return layout_of(sizes, strides) if len(sizes) >= 2 else "row"


def operand_strides(
    name: str, broadcast: str, t: torch.Tensor, out_shape: tuple[int, ...]
) -> tuple[int, int, int]:
    """Strides (batch, m, n) of operand ``t`` broadcast to C; 0 where it broadcasts."""
    if t.dim() > len(out_shape) or any(
        size not in (1, want) for size, want in zip(reversed(t.shape), reversed(out_shape), strict=False)
    ):
        raise ValueError(
            f"operand {name!r} of shape {tuple(t.shape)} does not broadcast to the output "
            f"shape {out_shape} (each dim must be 1 or match, and it may not have more dims)"
        )
    sizes = [1] * (3 - t.dim()) + list(t.shape)
    strides = [0] * (3 - t.dim()) + list(t.stride())
    sb, sm, sn = (0 if size == 1 else stride for size, stride in zip(sizes, strides, strict=True))
    needs = {"row": sm == 0, "col": sn == 0, "scalar": sm == 0 and sn == 0, "tile": True}
    if not needs[broadcast] or (broadcast == "scalar" and sizes[0] != 1):
        want = {"row": "[N] or [1, N]", "col": "[M, 1]", "scalar": "a single element"}[broadcast]
        raise ValueError(f"operand {name!r} is declared {broadcast} ({want}) but has shape {tuple(t.shape)}")
    return sb, sm, sn


def checked_operands(
    epilogue: Epilogue, operands: Mapping[str, object], device: torch.device, out_shape: tuple[int, ...]
) -> tuple[OperandSpec, ...]:
    """The specs of the tensors a call passes for the epilogue's operands, each checked: the
    names the epilogue reads, tensors on ``device`` of an operand dtype, broadcast to
    ``out_shape`` as the epilogue reads them (``operand_strides``)."""
    declared = dict(epilogue.operands)
    missing, extra = sorted(set(declared) - set(operands)), sorted(set(operands) - set(declared))
    if missing or extra:
        raise ValueError(
            f"operands do not match the epilogue: missing {missing}, unexpected {extra} "
            f"(the epilogue reads {sorted(declared)})"
        )
    specs = []
    for name, broadcast in declared.items():
        t = operands[name]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"operand {name!r} must be a tensor, got {type(t).__name__}")
        if t.device != device:
            raise ValueError(f"operand {name!r} is on {t.device}, the inputs on {device}")
        if dtypes.name_or_none(t.dtype) not in dtypes.OPERAND_DTYPES:
            raise TypeError(f"operand {name!r} has dtype {t.dtype}; supported: {dtypes.OPERAND_DTYPES}")
        operand_strides(name, broadcast, t, out_shape)
        specs.append(
            OperandSpec(name, dtypes.name_of(t.dtype), operand_layout(broadcast, t.shape, t.stride()))
        )
    return tuple(specs)


def epilogue_args(
    ep: Epilogue,
    operands: Mapping[str, torch.Tensor],
    outs: tuple[torch.Tensor, ...],
    out_shape: tuple[int, ...],
    out3: tuple[int, int, int],
) -> dict[str, object]:
    """The kernel arguments ``epilogue_params()`` declares: each operand's pointer and
    (batch, m, n) strides (0 where it broadcasts), then each output's."""
    args: dict[str, object] = {}
    for name, broadcast in ep.operands:
        t = operands[name]
        sb, sm, sn = operand_strides(name, broadcast, t, out_shape)
        args.update(
            {
                f"op_{name}_ptr": t,
                f"op_{name}_stride_b": sb,
                f"op_{name}_stride_m": sm,
                f"op_{name}_stride_n": sn,
            }
        )
    for i, (o, spec) in enumerate(zip(outs, ep.outputs, strict=True)):
        if spec.reduce in REDUCTIONS:
            args.update(_reduction_strides(i, o, REDUCTIONS[spec.reduce][1]))
            continue
        # a tile output, or a group output (its N counts groups): a batch of 1 broadcasts
        o3 = o if o.dim() == 3 else o.unsqueeze(0).expand((out3[0], *o.shape))
        args.update(
            {
                f"out{i}_ptr": o,
                f"out{i}_stride_b": o3.stride(0) if o.dim() == 3 else 0,
                f"out{i}_stride_m": o3.stride(1),
                f"out{i}_stride_n": o3.stride(2),
            }
        )
    return args


def _reduction_strides(i: int, o: torch.Tensor, axis: str) -> dict[str, object]:
    """Arguments of reduction output ``i`` ([batch,] M for axis n, [batch,] N for axis m): its
    strides, and a slot stride of 0 (every tile adds into the one vector)."""
    sb, s = (o.stride(0), o.stride(1)) if o.dim() == 2 else (0, o.stride(0))
    return {
        f"out{i}_ptr": o,
        f"out{i}_stride_b": sb,
        f"out{i}_stride_m": s if axis == "n" else 0,
        f"out{i}_stride_n": 0 if axis == "n" else s,
    }


def outputs_for(
    problem: Problem, shape: tuple[int, ...], device: torch.device, out: tuple[torch.Tensor, ...] | None
) -> tuple[torch.Tensor, ...]:
    """The outputs of a call whose tile outputs have ``shape`` (reduction outputs: that shape
    without N, or without M), allocated or checked."""
    specs = problem.epilogue.outputs
    out_dtypes = [dtypes.torch_dtype(o.dtype) for o in specs]
    if out is None:
        return tuple(
            torch.empty(o.shape(shape), dtype=dt, device=device)
            for o, dt in zip(specs, out_dtypes, strict=True)
        )
    if len(out) != len(out_dtypes):
        raise ValueError(f"out has {len(out)} tensors; the epilogue has {len(out_dtypes)} outputs")
    for i, (o, dt, spec) in enumerate(zip(out, out_dtypes, specs, strict=True)):
        want = spec.shape(shape)
        if tuple(o.shape) != want or o.dtype != dt or o.device != device:
            raise ValueError(
                f"out[{i}] must be {dt} of shape {want} on {device}, got {o.dtype} "
                f"{tuple(o.shape)} on {o.device}"
            )
        if 0 in o.stride() and o.numel() > 1:
            raise ValueError(f"out[{i}] has a zero stride; outputs must not overlap")
    return tuple(out)


def check_apart(outs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> None:
    """Refuse outputs that may overlap themselves, each other or an input: tiles are written
    as others are still read, so any overlap gives wrong results. Conservative: memory
    ranges that interleave without touching (even and odd columns) are refused too."""
    for i, o in enumerate(outs):
        if _may_overlap_itself(o):
            raise ValueError(f"out[{i}] (strides {o.stride()}) overlaps itself; outputs must not")
        for j, other in enumerate([*outs[:i], *inputs]):
            if _ranges_meet(o, other):
                what = f"out[{j}]" if j < i else f"input {j - i} of the call"
                raise ValueError(f"out[{i}] shares memory with {what}; outputs must be apart from them")


def _may_overlap_itself(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share an address: dims by increasing stride, each
    stride must step over all that the smaller ones address."""
    reach = 1
    for stride, size in sorted((abs(st), s) for s, st in zip(t.shape, t.stride(), strict=True) if s > 1):
        if stride < reach:
            return True
        reach = stride * size
    return False


def _ranges_meet(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.device != y.device or x.numel() == 0 or y.numel() == 0:
        return False
    x0, y0 = x.data_ptr(), y.data_ptr()
    return x0 < y0 + extent(y) * y.element_size() and y0 < x0 + extent(x) * x.element_size()


def extent(t: torch.Tensor) -> int:
    """One past the largest element offset ``t`` addresses."""
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))


def tma_readable(t: torch.Tensor) -> bool:
    """A 2-D tensor TMA can address: unit inner stride, 16-byte aligned row stride and address."""
    return (
        t.dim() == 2
        and t.stride(1) == 1
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


_kernels: dict[tuple[Problem, Config, Target, bool, str, bool], object] = {}


def kernel_for(
    kind: TemplateKind, problem: Problem, config: Config, target: Target, index_64: bool, suffix: str = ""
) -> object:
    """The jitted kernel (``kernel_name`` + ``suffix``) of ``kind``'s template for this
    problem and config, rendered and built once."""
    key = (problem, config, target, index_64, suffix, settings().exact_math)
    kernel = _kernels.get(key)
    if kernel is None:
        module = build(render(kind, problem, config, target=target, index_64=index_64), target=target)
        kernel = _kernels[key] = getattr(module, kernel_name(problem) + suffix)
    return kernel


def tile_args(config: Config) -> dict[str, object]:
    """The tiling arguments every tiled template takes."""
    return {
        "BLOCK_M": config.BLOCK_M,
        "BLOCK_N": config.BLOCK_N,
        "BLOCK_K": config.BLOCK_K,
        "GROUP_M": config.GROUP_M,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }


def single_launch(
    kind: TemplateKind,
    problem: Problem,
    config: Config,
    target: Target,
    index_64: bool,
    grid: tuple[int, ...],
    args: dict[str, object],
    outs: tuple[torch.Tensor, ...],
    workspace: Workspace | CallScratch | None = None,
    slots: tuple[int, int] = (1, 1),
) -> Bound:
    """The Bound of one kernel launch (replayable) with ``args`` (tiling arguments added, and
    the ``workspace``'s scratch tensors). ``slots``: the tiles along M and N, where the
    epilogue has reduction outputs (``Statistics``)."""
    args = {**args, **tile_args(config)}
    if workspace is not None:
        args.update(workspace.tensors(outs[0].device))
    kernel = kernel_for(kind, problem, config, target, index_64)
    launcher = kernel[grid]
    stats = Statistics.of(problem.epilogue, outs, slots)
    args.update(stats.args)

    def compile_only() -> None:
        if target != "interpreter":  # the interpreter has nothing to compile
            kernel.warmup(grid=grid, **args)

    if stats.finish is not None:  # ordered statistics: fill, launch, sum the partials (no replay)

        def run_ordered() -> None:
            stats.fill()
            launcher(**args)
            stats.finish()  # type: ignore[misc]

        return Bound(outs, run_ordered, compile_only, workspace=workspace)

    def run() -> object:
        stats.fill()
        return launcher(**args)

    zeroed = ("flags_ptr",) if workspace is not None else ()
    return Bound(
        outs, run, compile_only, kernel, args, grid, workspace=workspace, fills=stats.fills, zeroed=zeroed
    )


@dataclass(frozen=True)
class Statistics:
    """How a launch fills the epilogue's reduction outputs (``Output.reduce``). Each tile adds
    its share with an fp32 atomic (``store_output.py.jinja``) at its slot (its tile index
    along N for row statistics, along M for column ones). By default every slot is the
    output itself (slot stride 0), filled with 0 (or -inf for a max) before the launch: one
    kernel, but the sums' order varies run to run. Deterministic (``settings().deterministic``
    or ``torch.use_deterministic_algorithms``): each tile writes a slot of its own in a
    workspace [slots, *output], summed (or maxed) in slot order after the kernel."""

    args: dict[str, object]  # kernel arguments that replace the outputs' (workspaces)
    to_fill: tuple[tuple[torch.Tensor, float], ...]
    fills: tuple[tuple[int, float], ...]  # (output index, value) of the outputs filled
    finish: Callable[[], None] | None

    @staticmethod
    def of(ep: Epilogue, outs: Sequence[torch.Tensor], slots: tuple[int, int]) -> Statistics:
        if not ep.reductions:
            return Statistics({}, (), (), None)
        ordered = settings().deterministic or torch.are_deterministic_algorithms_enabled()
        args: dict[str, object] = {}
        to_fill, fills, partials = [], [], []
        for i in ep.reductions:
            how, axis = REDUCTIONS[ep.outputs[i].reduce]
            fill = 0.0 if how == "sum" else -math.inf
            if not ordered:
                to_fill.append((outs[i], fill))
                fills.append((i, fill))
                continue
            count = slots[1] if axis == "n" else slots[0]
            ws = torch.empty((count, *outs[i].shape), dtype=torch.float32, device=outs[i].device)
            to_fill.append((ws, fill))
            # a statistic of more dims than [batch, M] (a conv's per pixel [N, P, Q]): [batch, rest]
            args.update(_reduction_strides(i, ws[0] if ws.dim() <= 3 else ws[0].flatten(1), axis))
            args[f"out{i}_ptr"] = ws
            args[f"out{i}_stride_{axis}"] = ws.stride(0)
            partials.append((ws, outs[i], how))

        def finish() -> None:
            for ws, out, how in partials:
                if how == "sum":
                    torch.sum(ws, 0, out=out)
                else:
                    torch.amax(ws, 0, out=out)

        return Statistics(args, tuple(to_fill), tuple(fills), finish if partials else None)

    def fill(self) -> None:
        for t, value in self.to_fill:
            t.fill_(value)


def two_pass_bound(
    outs: tuple[torch.Tensor, ...],
    target: Target,
    first: Launch,
    second: Launch,
    stats: Statistics | None = None,
) -> Bound:
    """The Bound of a two-pass split-K launch: the partial sums, then the reduction that
    runs the epilogue (two launches: no single-kernel replay); ``stats``: how the second
    fills the epilogue's reduction outputs."""
    launches = [(kernel[grid], args) for kernel, grid, args in (first, second)]  # type: ignore[index]

    def run_both() -> None:
        if stats is not None:
            stats.fill()
        for launcher, args in launches:
            launcher(**args)
        if stats is not None and stats.finish is not None:
            stats.finish()

    def compile_both() -> None:
        if target != "interpreter":
            for kernel, grid, args in (first, second):
                kernel.warmup(grid=grid, **args)  # type: ignore[attr-defined]

    if stats is not None and stats.finish is not None:  # partials summed by torch: not launches alone
        return Bound(outs, run_both, compile_both)
    fills = () if stats is None else stats.fills
    return Bound(outs, run_both, compile_both, fills=fills, steps=(first, second))


REDUCE_BLOCK = (32, 128)  # the split-K reduction's tile (M x N), 4 warps


def split_k_bound(
    kind: TemplateKind,
    problem: Problem,
    config: Config,
    target: Target,
    index_64: bool,
    grid: tuple[int, ...],
    args: Mapping[str, object],
    ep_args: Mapping[str, object],
    outs: tuple[torch.Tensor, ...],
    out3: tuple[int, int, int],
) -> Bound:
    """Two-pass split-K (``templates/split_k.py.jinja``): the main kernel, launched on ``grid``
    (its splits on one axis), writes each split's fp32 partial sums to a fresh workspace of
    [accumulators x SPLIT_K, batch, M, N] (``out3`` = batch, M, N as the epilogue indexes the
    outputs); the reduction adds them in split order and runs the epilogue (deterministic)."""
    batch, m, n = out3
    split = config.SPLIT_K
    ws = torch.empty((kind.accumulators * split, batch, m, n), dtype=torch.float32, device=outs[0].device)
    index_64 = index_64 or ws.numel() > INT32_MAX
    main = {**args, **tile_args(config), "ws_ptr": ws, "SPLIT_K": split}
    block_m, block_n = REDUCE_BLOCK
    reduce_args = {
        **ep_args,
        "ws_ptr": ws,
        "M": m,
        "N": n,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "SPLIT_K": split,
        "num_warps": 4,
    }
    reduce_grid = (-(-m // block_m) * -(-n // block_n), batch)
    stats = Statistics.of(problem.epilogue, outs, (-(-m // block_m), -(-n // block_n)))
    reduce_args.update(stats.args)
    return two_pass_bound(
        outs,
        target,
        (kernel_for(kind, problem, config, target, index_64), grid, main),
        (kernel_for(kind, problem, config, target, index_64, "_reduce"), reduce_grid, reduce_args),
        stats,
    )
