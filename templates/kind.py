"""What a template kind is: ``TemplateKind``, one object per template.

A kind is one module beside its Jinja file (``matmul.py`` with ``matmul.py.jinja``) whose
``KIND = TemplateKind(...)`` answers every question the rest of epilab has about the
template: its files, which configs it takes, where the tuner searches, what it starts
from, how a problem is made from tensors, bound and launched, what its calls return, how
the tuner and the tests make its inputs and float64 reference, what it is timed against,
and which other templates run the same computation (its twins). ``templates/registry.py``
lists the kinds; nothing outside the kind modules branches on a template's name. (The
model: Inductor's ``TritonTemplate`` objects with their config heuristics.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from epilab.ir.config import Config
from epilab.ir.dtypes import WIDE_INPUT_DTYPES, itemsize
from epilab.ir.epilogue import Epilogue
from epilab.ir.problem import BATCHED_OPS, LAYOUTS, Problem, Shape
from epilab.templates.bound import Bound

MAX_ACC_REGS = 128  # accumulator registers per thread at most (half of the 255 a thread may have)

InputSet = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]
# sizes and strides of an output (ints, or SymInts of a traced call)
OutputSpec = tuple[tuple[object, ...], tuple[object, ...]]
Tensors = tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]  # A, B and the operands of a call


# variants whose BLOCK_M counts warp groups of 64 rows (192: three), not a power of two
WARP_GROUP_ROWS_VARIANTS = ("sm90_cooperative",)
WARP_GROUP_COLS_VARIANTS = ("sm90_weight_only",)  # BLOCK_N in warp groups of 64 (weight rows)


@dataclass(frozen=True)
class TwinCall:
    """A call of a twin (another template's problem) with its original problem's tensors,
    as the kind that made the twin converts them: the call's outputs, the views the twin's
    kernel reads and writes, and its outputs viewed back as the call's."""

    outputs: list[OutputSpec]
    inputs: Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor]], Tensors]
    to_kernel: Callable[[torch.Tensor], torch.Tensor]  # a call output as the kernel's output
    from_kernel: Callable[[list[torch.Tensor], torch.Tensor], list[torch.Tensor]]  # (outs, call's a)


Tensor = torch.Tensor
Operands = Mapping[str, torch.Tensor]


def _no_vars(problem: Problem, config: Config) -> dict[str, object]:
    return {}


def _no_error(problem: Problem, config: Config) -> str | None:
    return None


def _whole_space(problem: Problem, space: Mapping[str, tuple]) -> Mapping[str, tuple]:
    return space


def _always(name: str, chosen: Mapping[str, object]) -> bool:
    return True


def _no_source(config: Config) -> str | None:
    return None


def _any_device(variant: str, capability: str, interpreter: bool) -> str | None:
    return None


def _one_copy(config: Config) -> int:
    return 1


def _not_stream_k(config: Config) -> bool:
    return False


def _no_exchange(problem: Problem, config: Config) -> int:
    return 0


def _as_written(epilogue: Epilogue) -> tuple[Epilogue, ...]:
    return (epilogue,)


def _no_problem_error(problem: Problem) -> str | None:
    return None


def _no_whole_rows(problem: Problem) -> str | None:
    return "its programs do not hold whole output rows"


# the ops of a batch: B's too (bmm, baddbmm), or A's alone (matmul, a 3-D activation)
BATCH_OPS = (*BATCHED_OPS, "matmul")


def gemm_label(problem: Problem) -> str:
    """MxNxK, or BxMxNxK where the op has a batch (bmm, baddbmm, matmul)."""
    s = problem.shape
    return f"{s.batch}x{s.m}x{s.n}x{s.k}" if problem.op in BATCH_OPS else f"{s.m}x{s.n}x{s.k}"


def batched(problem: Problem) -> bool:
    """Whether B has a batch of its own: configs do not carry between batched and 2-D GEMMs."""
    return problem.op in BATCHED_OPS


def _no_inputs(problem: Problem) -> tuple[str, ...]:
    return ()


def _rows_of_a(problem: Problem, a: Tensor) -> object:
    return a.shape[-2]


def _no_twins(problem: Problem) -> tuple[Problem, ...]:
    return ()


def _heuristic_everywhere(problem: Problem, config: Config, capability: str, sm_count: int) -> Config:
    return config


def _as_given(operands: Operands) -> Operands:
    return operands


def _no_twin_call(problem: Problem, a: Tensor, b: Tensor) -> TwinCall | None:
    return None


def _a_dtype(problem: Problem) -> str:
    return problem.dtype


@dataclass(frozen=True, eq=False)
class TemplateKind:
    """A template and everything epilab asks of it (functions take the problem first)."""

    name: str
    files: tuple[str, ...]  # its Jinja file first, then every file its source depends on (hashed)
    ops: tuple[str, ...]  # the problem ops it is made for first (``registry.default_template``)
    library: str  # the vendor library it is timed against: "cublas" or "cudnn"
    input_args: tuple[str, str]  # its kernel's pointer arguments of A and B
    # -- configs
    space: Mapping[str, tuple[int, ...] | tuple[str, ...]]  # the tuner's search space
    seeds: tuple[Config, ...]  # known-good configs a new study tries first
    # why ``config`` does not fit the template for ``problem`` (what rendering refuses), or None
    check: Callable[[Problem, Config], str | None]
    # the untuned heuristic: (problem, target, *, sm_count) -> Config
    default_config: Callable[..., Config]
    kernel_shape: Callable[[Problem], Shape]  # the shape its tiles cover (blocks are capped at it)
    # -- tensors
    # (problem, a, b, operands) -> the problem these tensors make under ``problem``'s op,
    # precision and geometry: equal to ``problem`` exactly when they fit it
    problem_of: Callable[[Problem, Tensor, Tensor, Operands], Problem]
    # (problem, config, a, b, operands, out) -> everything up to the launch: outputs
    # allocated (or ``out`` checked), the kernel built, its arguments fixed
    bind: Callable[..., Bound]
    # (problem, a, b) -> sizes and strides of each output of a call, from the problem and the
    # inputs' *sizes* alone: the compiler's fake and real calls both allocate from it
    output_specs: Callable[[Problem, Tensor, Tensor], list[OutputSpec]]
    # (problem, device) -> uninitialised outputs in the layout its callers get (conv2d: its input's)
    empty_outputs: Callable[[Problem, torch.device], tuple[Tensor, ...]]
    # -- checking and measuring
    # (problem, device, generator) -> random A, B, operands of exactly the problem's shapes,
    # dtypes and layouts
    inputs: Callable[[Problem, torch.device, torch.Generator], InputSet]
    # (problem, a, b, operands) -> the outputs in float64, before rounding to their dtypes
    reference: Callable[[Problem, Tensor, Tensor, Operands], tuple[Tensor, ...]]
    # (problem, a, b, operands) -> ``library`` for the main loop and eager torch for the
    # epilogue, at the input dtype, not yet rounded to the output dtypes
    baseline: Callable[[Problem, Tensor, Tensor, Operands], tuple[Tensor, ...]]
    # elements of A and B as stored (a convolution's input and weight, not its im2col
    # matrix): with the operands and outputs, the bytes a kernel must move
    input_elements: Callable[[Problem], tuple[int, int]]
    # -- optional parts
    # operands -> the same values in the layouts the baseline's library takes (block scales
    # M-major for cuBLASLt), made once per input set before the baseline is timed: a copy
    # inside every timed call would be charged to the library
    baseline_layouts: Callable[[Operands], Operands] = _as_given
    render_vars: Callable[[Problem, Config], dict[str, object]] = _no_vars  # beyond the common ones
    # the Jinja file (one of ``files``) that renders ``config``, where not the first of ``files``
    source: Callable[[Config], str | None] = _no_source
    # why the tuner should not spend a trial on a config the template takes, or None
    search_error: Callable[[Problem, Config], str | None] = _no_error
    # whether search dimension ``name`` means anything given the values chosen before it
    applies: Callable[[str, Mapping[str, object]], bool] = _always
    # (problem, space) -> the space cut to values ``search_error`` can pass for this problem,
    # so the sampler does not draw from dimensions it always refuses (feasibility stays
    # ``search_error``'s: a narrowing only spares proposals)
    narrow: Callable[[Problem, Mapping[str, tuple]], Mapping[str, tuple]] = _whole_space
    # the same computation as ``problem`` on other templates, those this kind knows of
    # (conv2d: a 1x1 convolution as a matmul; gemv: a skinny matmul on gemv)
    twins: Callable[[Problem], tuple[Problem, ...]] = _no_twins
    # for a twin this kind made, called with the original problem's tensors: how they convert
    twin_call: Callable[[Problem, Tensor, Tensor], TwinCall | None] = _no_twin_call
    # the ops of the problems it runs besides ``ops``: its twins' (gemv runs matmul's); a
    # problem of another op on this template is refused where it is made (``Problem``)
    takes: tuple[str, ...] = ()
    prefer_untuned: bool = False  # its heuristic beats the other template's on the twins it takes
    # (problem, heuristic config, capability "9.0", SMs) -> the untuned config on a GPU of that
    # capability, where the kind has kernels of that architecture's own that win untuned (the
    # block-scaled kind: sm_90's cooperative kernel, twice its Triton loops); ``registry.default_config``
    device_default: Callable[[Problem, Config, str, int], Config] = _heuristic_everywhere
    # templates whose problems it takes as twins and always runs far faster (depthwise: conv2d's
    # implicit GEMM, 4-30x slower on every depthwise layer measured): the tuner leaves those
    # problems to their twin here (``registry.superseded``) instead of spending trials on them
    supersedes: tuple[str, ...] = ()
    # tensors its calls take besides A, B and the epilogue's operands, each shaped and strided
    # as B (a dual GEMM's second weight, "b2"): passed in ``operands`` under these names (first,
    # in this order, in a compiled call's operand list); its kernel reads each at ``{name}_ptr``
    extra_inputs: tuple[str, ...] = ()
    # the extra inputs a problem adds after those (a routed grouped problem's row indices),
    # passed as they are: ``inputs_of`` gives all of a problem's
    problem_inputs: Callable[[Problem], tuple[str, ...]] = _no_inputs
    # (problem, a) -> the M a call of these inputs has, by which a plan picks its config
    # (A's rows; a grouped GEMM's gathered rows are its tokens x topk)
    call_rows: Callable[[Problem, Tensor], object] = _rows_of_a
    accumulators: int = 1  # fp32 accumulators per tile, one per B-side input (feasibility counts them)
    # the tuner tries SPLIT_K > 1 only where the output tiles underfill the device (``policy/space``)
    split_k_underfilled: bool = False
    input_dtypes: tuple[str, ...] = WIDE_INPUT_DTYPES  # the A and B dtypes its main loops take
    # B's dtype as its kernels read it: the problem's (A's), except where the kind stores B in
    # another (weight-only: fp8); shared memory, bytes moved and the device's dtypes count it
    b_dtype: Callable[[Problem], str] = _a_dtype
    # whether its epilogue may have reduction outputs (row / column statistics: ``REDUCTIONS``)
    reductions: bool = False
    # whether its tiles may hold whole groups of columns (``Epilogue.group_size``: ``group_max``
    # nodes and group outputs, a per-token-group quantization); its ``check`` says which configs
    groups: bool = False
    # why its programs cannot hold every column of ``problem``'s output rows, which an
    # epilogue's ``row_total`` needs (a LayerNorm over a depthwise conv's channels), or None
    row_error: Callable[[Problem], str | None] = _no_whole_rows
    # seeds tried before ``seeds`` for problems of these input dtypes (fp8's K blocks of 128)
    dtype_seeds: tuple[tuple[str, tuple[Config, ...]], ...] = ()  # (dtype, seeds) pairs
    # (variant, capability "9.0", interpreter) -> why a device cannot run the kernel of that
    # config variant (matmul: its Gluon variants need sm_90 and no interpreter), or None
    device_error: Callable[[str, str, bool], str | None] = _any_device
    # copies of each TMA-stored output tile a program stages in shared memory (one per consumer)
    output_staging: Callable[[Config], int] = _one_copy
    # shared memory a program's warp groups hand accumulators through, in bytes (the paired
    # dual weight-only kernel's halves: ``matmul_sm90.exchange_bytes``)
    exchange_smem: Callable[[Problem, Config], int] = _no_exchange
    # whether ``config`` shares K blocks between programs (stream-K: the tuner's own limits)
    stream_k: Callable[[Config], bool] = _not_stream_k
    # -- geometry: what its problems are beyond (batch, m, n, k), and how they are told apart
    layouts: tuple[str, ...] = LAYOUTS  # the layouts of A and B it takes
    geometry: type | None = None  # its problems' ``Geometry`` class (conv2d: ``ConvGeometry``)
    # why a problem's shape does not fit its geometry (what ``Problem`` refuses), or None
    problem_error: Callable[[Problem], str | None] = _no_problem_error
    label: Callable[[Problem], str] = gemm_label  # its shape as every table shows it
    # what two problems must share for a config to carry between them (``policy/nearest``)
    transfer_key: Callable[[Problem], object] = batched
    # the forms of a problem's epilogue its kernels render, in an order of their own (the
    # problem's hash covers each: ``render.kernel_hash``): gemv's, and its transpose's
    kernel_epilogues: Callable[[Epilogue], tuple[Epilogue, ...]] = _as_written
    # the module of the spec format its problems are written in (shapes files, built-in
    # suites: its ``FORMAT``, an ``ir.spec.SpecFormat``), by name: a format builds problems
    # through the registry, so the registry loads it (``registry.spec_formats``), not the kind
    spec_module: str | None = None

    def inputs_of(self, problem: Problem) -> tuple[str, ...]:
        """The extra inputs of ``problem``'s calls, in the order its operand list has them."""
        return (*self.extra_inputs, *self.problem_inputs(problem))

    def runs_op(self, op: str) -> bool:
        """Whether a problem of ``op`` may be made for this template."""
        return op in self.ops or op in self.takes

    def seeds_for(self, problem: Problem) -> tuple[Config, ...]:
        """The seeds a new study of ``problem`` tries first: its dtype's, then the kind's."""
        return (*(c for dt, cs in self.dtype_seeds if dt == problem.dtype for c in cs), *self.seeds)

    def smem_bytes(self, problem: Problem, config: Config) -> int:
        """Shared memory one program of ``config`` takes: its pipeline's A and B stages (a dual
        GEMM stages two B tiles), what its warp groups exchange (``exchange_smem``), and the
        staging of TMA-stored outputs: the tile outputs (the statistics and the group outputs
        are stored by pointers, never staged)."""
        a_bytes = config.BLOCK_M * config.BLOCK_K * itemsize(problem.dtype)
        b_bytes = self.accumulators * config.BLOCK_K * config.BLOCK_N * itemsize(self.b_dtype(problem))
        smem = config.num_stages * (a_bytes + b_bytes) + self.exchange_smem(problem, config)
        if config.TMA_STORE:  # each output's slice is staged in shared memory for its TMA store
            out_bytes = sum(itemsize(o.dtype) for o in problem.epilogue.outputs if not o.reduce)
            copies = self.output_staging(config)  # the ping-pong's consumers have one each
            smem += copies * config.BLOCK_M * config.BLOCK_N // config.EPILOGUE_SUBTILE * out_bytes
        return smem

    def config_error(self, problem: Problem, config: Config) -> str | None:
        """Why the template does not run ``problem`` tiled by ``config``: its input dtype,
        then its ``check``; None when it does."""
        if problem.dtype not in self.input_dtypes:
            return (
                f"the {self.name} template takes {', '.join(self.input_dtypes)} inputs, not "
                f"{problem.dtype}"
                + (" (fp8 runs on the matmul template)" if "float8" in problem.dtype else "")
            )
        if problem.epilogue.reductions and not self.reductions:
            return (
                f"the {self.name} template has no reduction outputs (row or column statistics); "
                "the matmul and dual_matmul templates do"
            )
        if problem.epilogue.group_size and not self.groups:
            return (
                f"the {self.name} template has no column groups (group_max, group outputs: a "
                "per-token-group quantization); the matmul, dual_matmul, weight-only and "
                "block-scaled templates do"
            )
        if config.BLOCK_M & (config.BLOCK_M - 1) and config.variant not in WARP_GROUP_ROWS_VARIANTS:
            return (
                f"BLOCK_M={config.BLOCK_M} is not a power of two: only {', '.join(WARP_GROUP_ROWS_VARIANTS)} "
                "takes it (warp groups of 64 rows)"
            )
        if config.BLOCK_N & (config.BLOCK_N - 1) and config.variant not in WARP_GROUP_COLS_VARIANTS:
            return (
                f"BLOCK_N={config.BLOCK_N} is not a power of two: only {', '.join(WARP_GROUP_COLS_VARIANTS)} "
                "takes it (warp groups of 64 weight rows)"
            )
        if problem.epilogue.row_totals:
            why = self.row_error(problem)
            if why is not None:
                return f"the {self.name} template cannot sum over whole output rows (row_total): {why}"
        if config.TILE_H != 1 and "TILE_H" not in self.space:
            return (
                f"TILE_H={config.TILE_H} is the depthwise template's knob (output rows a program "
                f"walks); the {self.name} template takes TILE_H=1"
            )
        return self.check(problem, config)

    def __repr__(self) -> str:
        return f"TemplateKind({self.name!r})"
