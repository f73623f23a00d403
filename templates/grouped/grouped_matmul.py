"""The grouped GEMM template's Python half (a mixture of experts' projections): problems from
tensors, the untuned config, the launch, inputs and the float64 reference.

    C[m, n] = epilogue(sum_k A[m, k] * B[e, k, n], operands)   for offs[e - 1] <= m < offs[e]

A is ``[T, K]`` (every expert's rows, grouped: the tokens routed to expert 0, then to expert 1,
...), B ``[E, K, N]`` (``w.transpose(-1, -2)`` of experts' ``[E, N, K]`` weights is the col
layout), ``offs`` int32 ``[E]`` the cumulative row ends, as ``torch._grouped_mm(A, B, offs)``
takes them, clamped to [0, T], each group starting where the furthest group before it ended.
Calls pass the offsets in ``operands`` under ``"offs"`` (the kind's extra input): they are read
on the device, so a call never waits for the host. Epilogue operands broadcast to
``[E, T, N]``: ``[N]`` one value per column shared by the experts, ``[E, 1, N]`` one per
expert (each expert's bias), ``[T, 1]`` one per row (a routing weight), ``[T, N]`` a tile. Rows
past every group are not written.

Routed problems (``GroupedGeometry``: gather, scatter, topk) move the rows inside the kernel:
row m of A is row ``gather[m]`` of the tokens' ``x [T / topk, K]``, and output row m is stored
at row ``scatter[m]`` ("store") or added there ("add": the top-k combine ``out[token] += y``
with fp32/fp16/bf16 atomics into outputs the launch zeroes; with three or more rows a token
the order of its additions, and so the last bit of the sum, is not fixed). The indices are
int32 or int64 ``[T]``, passed in ``operands`` under ``"gather"`` and ``"scatter"``; one outside
the rows it indexes reads zeros (gather) or is dropped (scatter), never out of bounds.

The kernel (``grouped_matmul.py.jinja``) numbers the experts' m-tiles one after another and
finds a tile's expert from the offsets on the device; its main loops are the matmul's pointer
loop and TMA loop (A as a [T, K] matrix, B as a 3-D descriptor), each also persistent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
import triton

from epilab.ir import dtypes
from epilab.ir.config import Config, extend
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import Problem, Shape
from epilab.templates.bound import Bound, Described
from epilab.templates.gemm.matmul import H100_SMS, contiguous_specs
from epilab.templates.gemm.matmul_config import idle_threads_error
from epilab.templates.grouped import grouped_geometry
from epilab.templates.grouped.grouped_geometry import (
    GATHER,
    OFFS,
    SCATTER,
    GroupedGeometry,
    experts_of,
    geometry_of,
    output_rows,
)
from epilab.templates.grouped.grouped_reference import (
    _outputs,
    eager_grouped,
    grouped_inputs,
    grouped_reference,
)
from epilab.templates.kind import MAX_ACC_REGS, OutputSpec, TemplateKind
from epilab.templates.runtime.binding import (
    INT32_MAX,
    checked_operands,
    epilogue_args,
    extent,
    layout_of,
    outputs_for,
    single_launch,
    sm_count,
    target_for,
)
from epilab.templates.runtime.render import EPILOGUE_FILES, Target, kernel_hash

FILES = ("grouped_matmul.py.jinja", "tile_order.py.jinja", *EPILOGUE_FILES)
OP = "grouped_mm"  # a problem op of its own (torch._grouped_mm's)
# default: the pointer loop; tma: A and B through TMA descriptors (Hopper; row- or column-major
# A and B, 16-byte aligned); persistent, tma_persistent: the same on one program per SM
VARIANTS = extend("variant", ("default", "tma", "persistent", "tma_persistent"))
TMA_VARIANTS = ("tma", "tma_persistent")
PERSISTENT_VARIANTS = ("persistent", "tma_persistent")
LAYOUTS = ("row", "col", "strided")
TMA_ALIGN_BYTES = 16


# ------------------------------------------------------------------ what the template accepts


def config_error(problem: Problem, config: Config) -> str | None:
    """Why ``config`` does not fit the grouped template for ``problem`` (None when it does)."""
    if config.variant not in VARIANTS:
        return f"the grouped templates have no variant {config.variant!r}; use one of {VARIANTS}"
    wrong = [f"SPLIT_K={config.SPLIT_K}"] if config.SPLIT_K != 1 else []
    wrong += [f"{name}={value!r}" for name, value in config.knobs]  # the other kinds' knobs, all
    if wrong:
        return f"the grouped templates have no splits, slices or stores by TMA; got {', '.join(wrong)}"
    if config.BLOCK_M > 256 or config.BLOCK_N > 256:
        return f"the grouped templates take tiles of 256x256 at most, got {config.BLOCK_M}x{config.BLOCK_N}"
    if config.variant in TMA_VARIANTS:
        if "strided" in (problem.layout_a, problem.layout_b):
            return "the tma variants take row- or column-major A and B"
        s = problem.shape
        leading = {
            "A": s.k if problem.layout_a == "row" else s.m,
            "B": s.n if problem.layout_b == "row" else s.k,
        }
        for name, dim in leading.items():
            if isinstance(dim, int) and dim * dtypes.itemsize(problem.dtype) % TMA_ALIGN_BYTES:
                return (
                    f"TMA needs {name}'s rows {TMA_ALIGN_BYTES}-byte aligned: a leading dim of {dim} is not"
                )
    return None


def grouped_search_error(problem: Problem, config: Config) -> str | None:
    return idle_threads_error(config)


def render_vars(problem: Problem, config: Config) -> dict[str, object]:
    g = geometry_of(problem)
    return {"gather": g.gather, "scatter": g.scatter}


def routing_inputs(problem: Problem) -> tuple[str, ...]:
    return geometry_of(problem).routing_inputs()


# ------------------------------------------------------------------ problems from tensors


def check_tensors(a: torch.Tensor, b: torch.Tensor, offs: object) -> tuple[int, int, int, int]:
    """(E, T, N, K) of a grouped call's A [T, K], B [E, K, N] and offsets [E]; clear errors
    for anything else."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if dtypes.name_or_none(t.dtype) not in dtypes.WIDE_INPUT_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; the grouped GEMM takes {dtypes.WIDE_INPUT_DTYPES}")
    if a.dim() != 2 or b.dim() != 3:
        raise ValueError(
            f"a grouped GEMM takes A [T, K] (every expert's rows) and B [E, K, N], got "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.dtype != b.dtype or a.device != b.device:
        raise ValueError(
            f"a and b must share dtype and device, got {a.dtype} on {a.device}, {b.dtype} on {b.device}"
        )
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"A [T, K] {tuple(a.shape)} and B [E, K, N] {tuple(b.shape)} differ in K")
    e = b.shape[0]
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or tuple(offs.shape) != (e,):
        got = f"{offs.dtype} {tuple(offs.shape)}" if isinstance(offs, torch.Tensor) else type(offs).__name__
        raise ValueError(f"offs must be int32 [{e}], the cumulative row ends of the {e} experts, got {got}")
    if offs.device != a.device:
        raise ValueError(f"offs is on {offs.device}, the inputs on {a.device}")
    GroupedGeometry(e)  # the expert count's range
    return e, a.shape[0], b.shape[2], a.shape[1]


def _index(name: str, x: object, rows: int | None, device: torch.device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.dtype not in (torch.int32, torch.int64):
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a 1-D int32 or int64 tensor of row indices, got {got}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device}, the inputs on {device}")
    if rows is not None and x.shape[0] != rows:
        raise ValueError(f"{name} has {x.shape[0]} indices; the grouped rows are {rows}")
    return x


def check_routing(
    experts: int,
    a: torch.Tensor,
    gather: object = None,
    scatter: object = None,
    combine: str = "",
    topk: int | None = None,
) -> tuple[GroupedGeometry, int]:
    """The geometry of a call's routing (``gather``, ``scatter`` and ``combine`` "store" or
    "add"; ``topk`` inferred from the gather where there is one) and its grouped rows T."""
    if (scatter is None) != (not combine):
        raise ValueError('a scatter index and its combine ("store" or "add") come together')
    t = a.shape[0]
    if gather is not None:
        t = _index("gather", gather, None, a.device).shape[0]
        tokens = a.shape[0]
        if tokens and t % tokens:
            raise ValueError(
                f"a gathered GEMM's rows are tokens x topk: {t} gather indices over {tokens} tokens"
            )
        found = t // tokens if tokens else topk or 1
        if topk is not None and topk != found:
            raise ValueError(f"topk {topk} differs from the gather's {t} rows over {tokens} tokens")
        topk = found
    if scatter is not None:
        _index("scatter", scatter, t, a.device)
    if combine == "add" and topk is None:
        raise ValueError("adding rows back to their tokens needs topk (rows per token) or a gather")
    topk = 1 if topk is None else topk
    if combine == "add" and t % topk:
        raise ValueError(f"adding rows back to tokens needs tokens x topk rows: {t} rows, topk {topk}")
    return GroupedGeometry(experts, topk, gather is not None, combine), t


def make_grouped_problem(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor,
    epilogue: Epilogue,
    operands: Mapping[str, torch.Tensor],
    *,
    op: str = OP,
    template: str = "grouped_matmul",
    files: tuple[str, ...] = FILES,
    gather: object = None,
    scatter: object = None,
    combine: str = "",
    topk: int | None = None,
) -> Problem:
    """The problem these tensors make (checks them all); ``operands`` are the epilogue's; a
    routed problem's indices and combine as ``check_routing`` takes them."""
    e, _, n, k = check_tensors(a, b, offs)
    geometry, t = check_routing(e, a, gather, scatter, combine, topk)
    target_for(a.device)
    specs = checked_operands(epilogue, operands, a.device, (e, t, n))
    for name, o in operands.items():
        if o.dim() == 3 and o.shape[0] > 1 and o.shape[1] > 1:
            raise ValueError(
                f"operand {name!r} {tuple(o.shape)}: an operand per expert is [E, 1, N] (or [E, 1, 1]); "
                "one per row is [T, 1] or [T, N]"
            )
    return Problem(
        op=op,
        template=template,
        template_hash=kernel_hash(files, epilogue),
        dtype=dtypes.name_of(a.dtype),
        layout_a=layout_of(a.shape, a.stride()),
        layout_b=layout_of(b.shape[1:], b.stride()[1:]),
        operands=specs,
        epilogue=epilogue,
        shape=Shape(1, t, n, k),
        geometry=geometry,
    )


def routing_of(problem: Problem, operands: Mapping[str, torch.Tensor]) -> dict[str, object]:
    """``make_grouped_problem``'s routing arguments for a call of ``problem`` (its indices
    from ``operands``)."""
    g = geometry_of(problem)
    for name in g.routing_inputs():
        if name not in operands:
            raise ValueError(f"a routed grouped GEMM's call passes operands[{name!r}]")
    return {
        "gather": operands.get(GATHER) if g.gather else None,
        "scatter": operands.get(SCATTER) if g.scatter else None,
        "combine": g.scatter,
        "topk": g.topk,
    }


def grouped_problem_of(
    problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
) -> Problem:
    """The grouped problem these tensors make on ``problem``'s template (offsets and routing
    indices in ``operands``)."""
    if OFFS not in operands:
        raise ValueError(f"a grouped GEMM's call passes its offsets as operands[{OFFS!r}]")
    return make_grouped_problem(
        a,
        b,
        operands[OFFS],
        problem.epilogue,
        _epilogue_operands(operands, KIND.inputs_of(problem)),
        op=problem.op,
        **routing_of(problem, operands),  # type: ignore[arg-type]
    )


def _epilogue_operands(operands: Mapping[str, torch.Tensor], extra: tuple[str, ...]) -> dict:
    return {name: t for name, t in operands.items() if name not in extra}


# ------------------------------------------------------------------ launch


def bind_grouped(
    problem: Problem,
    config: Config,
    a: torch.Tensor,
    b: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    out: tuple[torch.Tensor, ...] | None = None,
    *,
    kind: TemplateKind | None = None,
) -> Bound:
    """Everything a grouped launch does up to the launch itself (``kind``: the dual grouped
    kind, whose second weight comes in ``operands`` too, read as B is)."""
    kind = KIND if kind is None else kind
    names = kind.inputs_of(problem)
    missing = [name for name in names if name not in operands]
    if missing:
        raise ValueError(f"a {kind.name} call of this problem passes operands {missing} too")
    extra = {name: operands[name] for name in names}
    operands = _epilogue_operands(operands, names)
    e, _, n, k = check_tensors(a, b, extra[OFFS])
    g = geometry_of(problem)
    found, t = check_routing(e, a, extra.get(GATHER), extra.get(SCATTER), g.scatter, g.topk)
    if found != g:
        raise ValueError(f"these tensors are routed as {found}, the problem as {g}")
    why = kind.config_error(problem, config)
    if why is not None:
        raise ValueError(why)
    outs = outputs_for(problem, (output_rows(problem, t), n), a.device, out)
    fills = tuple((i, 0.0) for i in range(len(outs))) if g.scatter == "add" else ()  # the combine's zeros
    if t == 0 or n == 0:
        return Bound(outs, lambda: [o.zero_() for o in outs if fills], lambda: None)
    if k == 0:
        return _zero_k_bound(problem, t, n, {**operands, **extra}, outs)
    target = target_for(a.device)
    bs = {name: extra[name] for name in kind.extra_inputs if name != OFFS}  # a dual kind's B2
    routing = {f"{name}_ptr": extra[name] for name in g.routing_inputs()}
    tensors = [a, b, *bs.values(), *outs, *operands.values(), *routing.values()]
    index_64 = any(extent(x) > INT32_MAX for x in tensors) or t * n > INT32_MAX
    m_tiles = triton.cdiv(t, config.BLOCK_M) + e  # every expert adds at most one partial tile
    grid = (m_tiles * triton.cdiv(n, config.BLOCK_N),)
    args: dict[str, object] = {
        "a_ptr": a,
        "b_ptr": b,
        **{f"{name}_ptr": x for name, x in bs.items()},
        "offs_ptr": extra[OFFS],
        **routing,
        **({"A_ROWS": a.shape[0]} if g.gather else {}),
        **({"OUT_ROWS": outs[0].shape[0]} if g.scatter else {}),
        "M": t,
        "N": n,
        "K": k,
        "stride_am": a.stride(0),
        "stride_ak": a.stride(1),
        "stride_be": b.stride(0),
        "stride_bk": b.stride(1),
        "stride_bn": b.stride(2),
        "EXPERTS": e,
        "EXPERTS_POW2": max(2, triton.next_power_of_2(e)),
    }
    args.update(epilogue_args(problem.epilogue, operands, outs, (e, t, n), (e, outs[0].shape[0], n)))
    if config.variant in PERSISTENT_VARIANTS:
        grid = (min(sm_count(a.device), grid[0]),)
        args["NUM_SMS"] = grid[0]
    described: tuple[Described, ...] = ()
    if config.variant in TMA_VARIANTS:
        found = tma_descriptors(problem, config, a, {"b": b, **bs})
        if found is None:  # strides or addresses TMA cannot read: the pointer loop
            config = dataclasses.replace(
                config, variant="persistent" if "persistent" in config.variant else "default"
            )
        else:
            described = found
            args.update({d.arg: d.make(args[d.tensor]) for d in described})  # type: ignore[arg-type]
    bound = single_launch(kind, problem, config, target, index_64, grid, args, outs)
    if fills:
        bound = _zeroed_first(bound, fills)
    return dataclasses.replace(bound, descriptors=described) if described else bound


def _zeroed_first(bound: Bound, fills: tuple[tuple[int, float], ...]) -> Bound:
    """``bound`` with its outputs zeroed before each launch (a combine adds into them), and
    the zeros named as fills for its replays."""
    launch, outs = bound.run, bound.outs

    def run() -> object:
        for o in outs:
            o.zero_()
        return launch()

    return dataclasses.replace(bound, run=run, fills=fills)


def _tma_ok(x: torch.Tensor) -> bool:
    """A tensor TMA can address as stored: unit inner stride, 16-byte aligned outer strides
    and address."""
    size = x.element_size()
    return (
        x.stride(-1) == 1
        and all(s * size % TMA_ALIGN_BYTES == 0 for s in x.stride()[:-1])
        and x.data_ptr() % TMA_ALIGN_BYTES == 0
    )


def tma_descriptors(
    problem: Problem, config: Config, a: torch.Tensor, bs: Mapping[str, torch.Tensor]
) -> tuple[Described, ...] | None:
    """A as a [T, K] matrix (transposed where column-major; not where its rows are gathered:
    those are loaded by pointers) and each B as [E, K, N] (its [E, N, K] storage where
    column-major), or None where TMA cannot read them."""
    bm, bn, bk = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    a_row, b_row = problem.layout_a == "row", problem.layout_b == "row"
    gathered = geometry_of(problem).gather
    stored_a = () if gathered else (a if a_row else a.t(),)
    stored_bs = [x if b_row else x.transpose(-1, -2) for x in bs.values()]
    if not all(_tma_ok(x) for x in (*stored_a, *stored_bs)):
        return None
    return (
        *(() if gathered else (Described("a_desc", "a_ptr", not a_row, (bm, bk) if a_row else (bk, bm)),)),
        *(
            Described(f"{name}_desc", f"{name}_ptr", not b_row, (1, bk, bn) if b_row else (1, bn, bk))
            for name in bs
        ),
    )


def _zero_k_bound(
    problem: Problem, t: int, n: int, operands: Mapping[str, torch.Tensor], outs: tuple
) -> Bound:
    """K = 0: the epilogue of a zero accumulator, on the expert's rows (routed as the kernel
    routes them)."""

    def run() -> None:
        zero = torch.zeros((t, n), dtype=torch.float32, device=outs[0].device)
        values = _outputs(problem, zero, zero, operands)
        for o, v, spec in zip(outs, values, problem.epilogue.outputs, strict=True):
            o.copy_(v.to(dtypes.torch_dtype(spec.dtype)))

    return Bound(outs, run, lambda: None)


# ------------------------------------------------------------------ references and baselines


def grouped_input_elements(problem: Problem) -> tuple[int, int]:
    """A once (the tokens' rows where they are gathered) and every expert's B (the bytes a
    grouped GEMM must move at least)."""
    s, g = problem.shape, geometry_of(problem)
    rows = int(s.m) // g.topk if g.gather else int(s.m)
    return rows * int(s.k), g.experts * int(s.k) * int(s.n)


def grouped_rows(problem: Problem, a: torch.Tensor) -> object:
    """The grouped rows T of a call with A ``a``: the tokens x topk where A's rows are gathered."""
    g = geometry_of(problem)
    return a.shape[0] * g.topk if g.gather else a.shape[0]


def grouped_output_specs(problem: Problem, a: torch.Tensor, b: torch.Tensor) -> list[OutputSpec]:
    """[rows, N] outputs: the grouped rows T, or the tokens where they are added back."""
    return contiguous_specs(problem, (output_rows(problem, grouped_rows(problem, a)), b.shape[-1]))


def empty_grouped_outputs(problem: Problem, device: torch.device) -> tuple[torch.Tensor, ...]:
    shape = (output_rows(problem, int(problem.shape.m)), int(problem.shape.n))
    return tuple(
        torch.empty(o.shape(shape), dtype=dtypes.torch_dtype(o.dtype), device=device)
        for o in problem.epilogue.outputs
    )


# ------------------------------------------------------------------ configs


def kernel_shape(problem: Problem) -> Shape:
    """The shape one expert's tiles cover: the bucket's rows (T / E, rounded up), N and K."""
    s = problem.shape
    rows = -(-s.m // experts_of(problem)) if isinstance(s.m, int) else s.m
    return Shape(1, max(1, rows), s.n, s.k)


def default_grouped_config(
    problem: Problem, target: Target = "cuda", *, sm_count: int = H100_SMS, accumulators: int = 1
) -> Config:
    """The untuned config. Interpreter: tiles just large enough (16..32). CUDA: BLOCK_M the
    bucket's rows (T / E) rounded up to a power of two in 16..128; 128 columns (256 for one
    accumulator and 128 rows; 64 when the rows are 16 or fewer: a decode step streams the
    weights), K blocks of 64 (32 for fp32; 128 when streaming); warps enough for 128
    accumulator registers a thread; 3 stages for tiles of 128x256 accumulators, else 4; the
    TMA loop where the layouts allow it, persistent over 16 rows (the probe of
    ``benchmarks/moe.py`` on an H200, RESULTS.md 2026-11-27)."""
    shape = kernel_shape(problem)

    def fit(dim: object, lo: int, hi: int) -> int:
        return hi if not isinstance(dim, int) else max(lo, min(hi, triton.next_power_of_2(max(dim, 1))))

    if target == "interpreter":
        return Config(
            fit(shape.m, 16, 32), fit(shape.n, 16, 32), fit(shape.k, 16, 32), 4, num_warps=4, num_stages=1
        )
    bm = fit(shape.m, 16, 128)
    streaming = bm == 16
    bn = 64 if streaming else 256 if bm == 128 and accumulators == 1 else 128
    bk = 32 if problem.dtype == "float32" else 128 if streaming else 64
    warps = 4
    while accumulators * bm * bn // (32 * warps) > MAX_ACC_REGS:
        warps *= 2
    stages = 3 if accumulators * bm * bn >= 128 * 256 else 4
    config = Config(bm, bn, bk, 8, num_warps=warps, num_stages=stages)
    for variant in ("tma_persistent" if not streaming else "tma", "default"):
        candidate = dataclasses.replace(config, variant=variant)
        if config_error(problem, candidate) is None:
            return candidate
    return config


SPACE: dict[str, tuple[int, ...] | tuple[str, ...]] = {
    "BLOCK_M": (16, 32, 64, 128),
    "BLOCK_N": (32, 64, 128, 256),
    "BLOCK_K": (32, 64, 128),
    "GROUP_M": (1, 4, 8),
    "num_warps": (4, 8),
    "num_stages": (2, 3, 4, 5),
    "variant": VARIANTS,
}

SEEDS = (
    Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="tma_persistent"),
    Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma_persistent"),
    Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="tma"),
    Config(64, 128, 64, 8, num_warps=4, num_stages=4, variant="tma"),
    Config(128, 128, 64, 8, num_warps=4, num_stages=4),
    Config(64, 128, 64, 8, num_warps=4, num_stages=4, variant="persistent"),
    # a decode step's few rows per expert: stream each expert's weight once
    Config(16, 64, 128, 8, num_warps=4, num_stages=4, variant="tma"),
    Config(16, 128, 128, 8, num_warps=4, num_stages=3),
    Config(32, 64, 128, 8, num_warps=4, num_stages=4, variant="tma"),
)


KIND = TemplateKind(
    name="grouped_matmul",
    files=FILES,
    ops=(OP,),
    library="grouped_mm",
    input_args=("a_ptr", "b_ptr"),
    space=SPACE,
    seeds=SEEDS,
    check=config_error,
    default_config=default_grouped_config,
    kernel_shape=kernel_shape,
    problem_of=grouped_problem_of,
    bind=bind_grouped,
    output_specs=grouped_output_specs,
    empty_outputs=empty_grouped_outputs,
    inputs=grouped_inputs,
    reference=grouped_reference,
    baseline=eager_grouped,
    input_elements=grouped_input_elements,
    search_error=grouped_search_error,
    extra_inputs=(OFFS,),
    problem_inputs=routing_inputs,
    call_rows=grouped_rows,
    render_vars=render_vars,
    input_dtypes=dtypes.WIDE_INPUT_DTYPES,
    layouts=LAYOUTS,
    geometry=GroupedGeometry,
    problem_error=grouped_geometry.problem_error,
    label=grouped_geometry.label,
    transfer_key=grouped_geometry.transfer_key,
    spec_module="epilab.templates.grouped.grouped_spec",
)
