"""The matmul family's spec format: a GEMM written as ``{"m", "n", "k"}``, and its built-in
suites (every kind of the family names this module: matmul, gemv, dual_matmul, dual_gemv).

A spec takes optional ``batch`` (a batched bmm), ``dtype`` (float16, bfloat16, float32,
float8_e4m3fn, float8_e5m2; default bfloat16), ``scales`` (fp8 only: ``row``, the default,
scales per row of A and per column of B, ``tensor`` one each, ``none``: the epilogue starts
with ``acc * scale_a * scale_b``, float32 operands, as ``torch._scaled_mm`` applies them;
``block``: DeepSeek-V3's block scales, A's per row and 128 of K, B's per 128x128 block,
multiplied inside the K loop, a 2-D problem of the block_scaled_matmul template; an
fp8 spec's other operands and its outputs default to bfloat16), ``weight`` (an fp8 dtype: B is
a weight stored in it and A is ``dtype``, float16 or bfloat16: a 2-D problem of the
weight_only_matmul template whose epilogue starts with ``acc * weight_scale``, float32 per
column, as the compiler reads a dequantized weight), ``layout`` (NN, NT, TN, TT:
whether A and B are stored transposed; default NT, the layout of ``x @ W.T`` in a linear
layer), ``epilogue`` (``ir/spec.py``), ``quantize`` (a group width such as 128: the output,
rounded to its dtype, quantized to e4m3 per row and group in the epilogue, q and its float32
scales stored: ``ir/quantize.py``) and ``template`` (matmul, the default, or gemv for M or
N <= 16). An epilogue that reads ``acc2`` makes a dual GEMM (``ep(A @ B, A @ B2)``, 2-D): its
template is dual_matmul, or dual_gemv for M <= 16.

Built-in suites:
- ``smoke``: 3 tiny problems (for the interpreter dry run and CI);
- ``quick``: 10 problems across sizes, epilogues and dtypes;
- ``llm``: M in {1, 16, 128, 2048, 8192} x the three projections of a 4096-wide
  transformer layer in bf16: (N, K) = (14336, 4096) up-projection with
  bias + gelu(tanh), (4096, 14336) down-projection with a residual add, and
  (4096, 4096) with bias + residual;
- ``square``: bf16 cubes 512, 1024, 2048, 4096, 8192 with no epilogue;
- ``midm``: M in {128, 256, 512} x mid-M projections of other models (few output tiles,
  long K: where split-K pays): Llama-2-7B's up projection (11008, 4096) fp16 with bias +
  SiLU and its down projection (4096, 11008) with a residual, Qwen2-7B's attention output
  (3584, 3584) with bias + residual, a grouped-query K/V projection (1024, 4096) with a bias
  and Qwen2-7B's down projection (3584, 18944) with a residual;
- ``fp8``: rowwise-scaled float8_e4m3fn -> bf16 with bias + gelu(tanh): cubes 1024 to 8192
  and M in {16, 128, 512, 2048, 8192} x Llama-3-8B's projections (N, K) in {(4096, 4096),
  (14336, 4096), (4096, 14336)} (the matmul template; sm_89 or newer);
- ``fp8-block``: block-scaled float8_e4m3fn -> bf16, no epilogue, M in {16, 128, 2048, 8192}
  x Llama-3-8B's projections (N, K) in {(6144, 4096) fused QKV, (4096, 4096), (28672, 4096)
  fused gate and up, (4096, 14336)} and DeepSeek-V3's dense projections (DeepGEMM's table:
  (2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)),
  the DeepSeek-V3 ones at M = 4096 too (DeepGEMM's reported size);
- ``fp8-weight``: weight-only float8_e4m3fn weights with bf16 activations, no epilogue beyond
  the weight's scales, M in {1, 16, 128, 2048} x Llama-3-8B's projections as ``fp8-block``, and
  its gate and up projections (14336, 4096) as one dual GEMM (``silu(acc) * acc2``);
- ``gemv``: decode-sized bf16 matmuls for the gemv template, M in {1, 4, 8, 16} x
  (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (128256, 4096)},
  nn.Linear layout, no epilogue;
- ``gemv-fused``: the same 20 shapes with the epilogue of that projection in a
  decoder layer — (4096, 4096) bias + residual, (14336, 4096) bias + gelu(tanh),
  (4096, 14336) residual, (8192, 8192) bias + gelu(tanh) + residual, (128256, 4096)
  bias — plus the transposed case, a router with N = 8 experts over M = 2048 and
  8192 tokens (K = 4096);
- ``mlp-quant``: gate and up as one dual GEMM (``silu(acc) * acc2``, bf16) whose output is
  quantized to e4m3 per token and 128 channels in the epilogue (``quantize``: q and its scales,
  a block-scaled down projection's input), M in {128, 2048, 8192} x (d, F) of DeepSeek-V3's
  dense MLP (7168, 18432) and Llama-3-8B (4096, 14336);
- ``mlp``: gated MLPs' gate and up projections as one dual GEMM (``silu(acc) * acc2``; the
  dual_matmul template, and dual_gemv for M <= 16), bf16, nn.Linear layout, M in {1, 8,
  128, 2048, 8192} x (d, F) of Llama-2-7B (4096, 11008), Llama-3-8B (4096, 14336),
  Llama-3-70B (8192, 28672), Qwen2-7B (3584, 18944) and Gemma-7B (3072, 24576, GeGLU:
  ``gelu_tanh(acc) * acc2``).
"""

from __future__ import annotations

from dataclasses import dataclass

from epilab.ir.dtypes import FP8_DTYPES, INPUT_DTYPES
from epilab.ir.epilogue import MAX_GROUP, Epilogue, Expr, acc, acc2, operand
from epilab.ir.patterns import canonical_order, swap_accumulators
from epilab.ir.problem import OperandSpec, Problem, Shape
from epilab.ir.quantize import quantized_groups
from epilab.ir.spec import OPERAND_LAYOUTS, EpilogueSpec, SpecFormat, epilogue_label, int_in, spec_epilogue
from epilab.templates.gemm.ops import BLOCK_SCALED_OP, DUAL_OP, DUAL_WEIGHT_ONLY_OP, WEIGHT_ONLY_OP
from epilab.templates.gemm.weight_geometry import WEIGHT_ONLY_DTYPES, WEIGHT_SCALE, WeightGeometry
from epilab.templates.registry import (
    KINDS,
    default_config,
    default_template,
    for_template,
    template_hash,
    twins,
)
from epilab.templates.runtime.binding import layout_of

LAYOUTS = ("NN", "NT", "TN", "TT")
KEYS = frozenset(
    {"m", "n", "k", "batch", "dtype", "layout", "epilogue", "template", "scales", "weight", "quantize"}
)


LAYOUT_WORDS = {"N": "row", "T": "col"}  # a spec's layout letters as every label shows layouts


def _layout(sizes: tuple[int, int], letter: str) -> str:
    """The layout a tensor of ``sizes`` stored as ``letter`` says it has (``layout_of``): a
    matrix with a dimension of 1 is both, and the problem must be the one its inputs make."""
    rows, cols = sizes
    return layout_of(sizes, (1, rows) if letter == "T" else (cols, 1))


SCALINGS = {  # an fp8 spec's scales, as torch._scaled_mm takes them: (scale_a, scale_b) broadcasts
    "row": ("col", "row"),  # per row of A and per column of B (rowwise)
    "tensor": ("scalar", "scalar"),  # one each (tensorwise)
    "none": None,  # the epilogue as written (it may read scales of its own)
    "block": None,  # block scales in the K loop (the block_scaled_matmul template), not the epilogue
}


def scaled(ep: Epilogue, scaling: str) -> Epilogue:
    """``ep`` with its accumulator scaled first: ``acc * scale_a * scale_b`` (``SCALINGS``)."""
    broadcasts = SCALINGS[scaling]
    if broadcasts is None:
        return ep
    return _acc_replaced(ep, acc() * operand("scale_a", broadcasts[0]) * operand("scale_b", broadcasts[1]))


def weight_scaled(ep: Epilogue) -> Epilogue:
    """``ep`` with its accumulators scaled by their fp8 weights' scales first, one per output
    channel (as the compiler reads dequantized weights': ``weight_scale``, ``weight_scale2``)."""
    return _acc_replaced(
        ep, acc() * operand(WEIGHT_SCALE, "row"), acc2() * operand(WEIGHT_SCALE + "2", "row")
    )


def weight_op(ep: Epilogue) -> str:
    """The op of a weight-only spec of epilogue ``ep``: dual where it reads two accumulators."""
    return DUAL_WEIGHT_ONLY_OP if ep.accumulators == 2 else WEIGHT_ONLY_OP


def _acc_replaced(ep: Epilogue, value: Expr, value2: Expr | None = None) -> Epilogue:
    built: list[Expr] = []
    for node in ep.nodes:
        if node.op == "acc":
            built.append(value)
        elif node.op == "acc2" and value2 is not None:
            built.append(value2)
        else:
            built.append(Expr(node.op, tuple(built[i] for i in node.args), node.attrs))
    return ep.rebuilt([built[o.node] for o in ep.outputs])


@dataclass(frozen=True)
class Spec:
    m: int
    n: int
    k: int
    batch: int | None = None
    dtype: str = "bfloat16"
    layout: str = "NT"
    epilogue: EpilogueSpec = "none"
    template: str = "matmul"
    scales: str = "row"  # fp8 only: ``SCALINGS``
    weight: str | None = None  # an fp8 dtype: B is a weight stored so (weight-only; A is ``dtype``)
    quantize: int | None = None  # a group width: the output quantized to e4m3 per row and group

    def __post_init__(self) -> None:
        if self.quantize is not None:
            int_in("quantize", self.quantize, 2, MAX_GROUP)
            if self.quantize & (self.quantize - 1):
                raise ValueError(
                    f"quantize is a group width, a power of two up to {MAX_GROUP}: got {self.quantize}"
                )
            quantized_groups(spec_epilogue(self.epilogue, self.dtype), self.quantize)  # one 16/32-bit output
        if self.weight is not None:
            if self.weight not in FP8_DTYPES or self.dtype not in WEIGHT_ONLY_DTYPES:
                raise ValueError(
                    f"weight (weight-only fp8) is one of {FP8_DTYPES} with a dtype of {WEIGHT_ONLY_DTYPES}, "
                    f"got {self.weight!r:.40} with {self.dtype!r:.40}"
                )
            if self.batch is not None:
                raise ValueError("a weight-only GEMM is 2-D: leave out batch")
            if self.template == "matmul":
                op = weight_op(spec_epilogue(self.epilogue, self.dtype))
                object.__setattr__(self, "template", default_template(op))
        if self.scales not in SCALINGS:
            raise ValueError(f"scales {self.scales!r} is not one of {sorted(SCALINGS)}")
        if self.scales != "row" and self.dtype not in FP8_DTYPES:
            raise ValueError(f"scales apply to fp8 inputs ({', '.join(FP8_DTYPES)}), not {self.dtype}")
        for name in ("m", "n", "k"):
            int_in(name, getattr(self, name), 1, 1 << 20)
        if self.batch is not None:
            int_in("batch", self.batch, 1, 65535)
        if self.dtype not in INPUT_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {INPUT_DTYPES}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} is not one of {LAYOUTS}")
        ep = spec_epilogue(self.epilogue, self.dtype)  # a ValueError names the column
        if ep.accumulators == 2:  # a dual GEMM: its own template unless the spec names one
            if self.batch is not None:
                raise ValueError("a dual GEMM (an epilogue that reads acc2) is 2-D: leave out batch")
            if self.template == "matmul":
                object.__setattr__(self, "template", default_template(DUAL_OP))
        if self.scales == "block":
            if self.batch is not None:
                raise ValueError("a block-scaled GEMM is 2-D: leave out batch")
            if self.template == "matmul":
                object.__setattr__(self, "template", default_template(BLOCK_SCALED_OP))
        if self.template not in KINDS:
            raise ValueError(f"template {self.template!r} is not one of {sorted(KINDS)}")
        if self.template == default_template("mm"):
            return  # the op's own template runs every matmul spec
        problem = self._problem()
        able = [p.template for p in twins(problem)]
        if self.template not in able:
            try:
                other = for_template(problem, self.template)
                why = KINDS[self.template].config_error(other, default_config(other))
            except ValueError as e:  # a problem of an op the template does not run
                why = str(e)
            why = why or f"it cannot run {self.label()}"
            raise ValueError(f"{why}; templates that can: {able}")

    def problem(self) -> Problem:
        problem = self._problem()
        return problem if problem.template == self.template else for_template(problem, self.template)

    def _problem(self) -> Problem:
        """The problem on its op's template."""
        ep = spec_epilogue(self.epilogue, self.dtype)
        has_bias = ("bias", "row") in ep.operands  # as the compiler sees x @ W.T + b: addmm
        op = ("baddbmm" if has_bias else "bmm") if self.batch else ("addmm" if has_bias else "mm")
        if ep.accumulators == 2:  # in the order the compiler names a graph's two projections
            op, ep = DUAL_OP, ep if canonical_order(ep) else swap_accumulators(ep)
        fp8 = self.dtype in FP8_DTYPES
        if fp8 and self.scales == "block":  # the scales multiply inside the K loop
            op = BLOCK_SCALED_OP
        elif fp8:  # the compiler's scaled mm: an mm whose scales (float32) start the epilogue
            op, ep = ("bmm" if self.batch else "mm"), scaled(ep, self.scales)
        if self.weight is not None:  # the compiler's dequantized weight: its scales start the epilogue
            op, ep = weight_op(ep), weight_scaled(ep)
        if self.quantize is not None:  # the next block-scaled GEMM's input: q and its scales
            ep = quantized_groups(ep, self.quantize)
        operands = tuple(
            OperandSpec(name, _operand_dtype(name, self.dtype), OPERAND_LAYOUTS.get(broadcast, "row"))
            for name, broadcast in ep.operands
        )
        return Problem(
            op=op,
            template=default_template(op),
            template_hash=template_hash(default_template(op), ep),
            dtype=self.dtype,
            layout_a=_layout((self.m, self.k), self.layout[0]),
            layout_b=_layout((self.k, self.n), self.layout[1]),
            operands=operands,
            epilogue=ep,
            shape=Shape(self.batch or 1, self.m, self.n, self.k),
            geometry=None if self.weight is None else WeightGeometry(self.weight),
        )

    def label(self) -> str:
        shape = (
            f"{self.m}x{self.n}x{self.k}"
            if self.batch is None
            else f"{self.batch}x{self.m}x{self.n}x{self.k}"
        )
        ep = spec_epilogue(self.epilogue, self.dtype)
        op = BLOCK_SCALED_OP if self.scales == "block" else DUAL_OP if ep.accumulators == 2 else "mm"
        own = default_template(weight_op(ep) if self.weight else op)
        suffix = "" if self.template == own else f" [{self.template}]"
        scales = f" {self.scales}-scaled" if self.scales != "none" else " unscaled"
        scales = scales if self.dtype in FP8_DTYPES else f" x {self.weight} weight" if self.weight else ""
        ep_label = epilogue_label(self.epilogue, self.dtype) + (
            f" quantized per {self.quantize}" if self.quantize else ""
        )
        layouts = "/".join(LAYOUT_WORDS[letter] for letter in self.layout)
        return f"{shape} {self.dtype}{scales} {layouts} {ep_label}{suffix}"

    def flops(self) -> int:
        return 2 * (self.batch or 1) * self.m * self.n * self.k


def _operand_dtype(name: str, dtype: str) -> str:
    """An operand's dtype in a spec of ``dtype`` inputs: theirs; with fp8 inputs float32 for
    scales (``scale*``), else bfloat16; a weight's scales (``WEIGHT_SCALE``) float32."""
    if name.startswith(WEIGHT_SCALE):
        return "float32"
    if dtype not in FP8_DTYPES:
        return dtype
    return "float32" if name.startswith("scale") else "bfloat16"


_LLM_PROJECTIONS = ((14336, 4096, "bias_gelu_tanh"), (4096, 14336, "residual"), (4096, 4096, "bias_residual"))

# mid-M projections of models outside ``llm`` (few output tiles, long K): Llama-2-7B's up
# projection with bias + SiLU in fp16 and its down projection, Qwen2-7B's attention output,
# grouped-query K/V (1024 wide) and down projection (K = 18944)
_MID_M = (
    (11008, 4096, "float16", "bias_silu"),
    (4096, 11008, "bfloat16", "residual"),
    (3584, 3584, "bfloat16", "bias_residual"),
    (1024, 4096, "bfloat16", "bias"),
    (3584, 18944, "bfloat16", "residual"),
)

_DECODE_PROJECTIONS = (
    (4096, 4096, "bias_residual"),
    (14336, 4096, "bias_gelu_tanh"),
    (4096, 14336, "residual"),
    (8192, 8192, "bias_gelu_tanh_residual"),
    (128256, 4096, "bias"),
)

# (d, F, join) of gated MLPs: Llama-2-7B, Llama-3-8B, Llama-3-70B, Qwen2-7B (SwiGLU), Gemma-7B (GeGLU)
_GATED_MLPS = (
    (4096, 11008, "silu(acc) * acc2"),
    (4096, 14336, "silu(acc) * acc2"),
    (8192, 28672, "silu(acc) * acc2"),
    (3584, 18944, "silu(acc) * acc2"),
    (3072, 24576, "gelu_tanh(acc) * acc2"),
)

# block-scaled fp8 projections (N, K): Llama-3-8B's (QKV and gate+up fused) and DeepSeek-V3's
# dense ones as DeepGEMM's performance table lists them
_LLAMA3_8B_FP8 = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
_DEEPSEEK_V3_DENSE = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))

SUITES: dict[str, list[Spec]] = {
    "smoke": [
        Spec(64, 64, 64, dtype="float32"),
        Spec(33, 47, 29, epilogue="bias_relu"),
        Spec(16, 32, 48, batch=2, dtype="float16", layout="NN", epilogue="residual"),
    ],
    "quick": [
        Spec(4096, 4096, 4096, epilogue="bias_gelu_tanh_residual"),
        Spec(8192, 14336, 4096, epilogue="bias_gelu_tanh"),
        Spec(2048, 4096, 14336, epilogue="residual"),
        Spec(2048, 4096, 4096, epilogue="bias_residual"),
        Spec(128, 4096, 4096, epilogue="bias_gelu_tanh_residual"),
        Spec(16, 4096, 4096, epilogue="bias"),
        Spec(1024, 1024, 1024),
        Spec(512, 512, 512, dtype="float16", layout="NN", epilogue="bias_relu"),
        Spec(512, 512, 512, batch=8, layout="NN"),
        Spec(3000, 1000, 777, dtype="float16", epilogue="bias_gelu"),
    ],
    "llm": [Spec(m, n, k, epilogue=ep) for m in (1, 16, 128, 2048, 8192) for n, k, ep in _LLM_PROJECTIONS],
    "square": [Spec(s, s, s, layout="NN") for s in (512, 1024, 2048, 4096, 8192)],
    "midm": [Spec(m, n, k, dtype=dt, epilogue=ep) for m in (128, 256, 512) for n, k, dt, ep in _MID_M],
    "gemv": [
        Spec(m, n, k, template="gemv")
        for m in (1, 4, 8, 16)
        for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (128256, 4096))
    ],
    "mlp": [  # gated MLPs' gate and up projections in one dual GEMM, at decode and prefill M
        Spec(m, f, d, epilogue=ep) for d, f, ep in _GATED_MLPS for m in (1, 8, 128, 2048, 8192)
    ],
    "fp8": [  # rowwise-scaled e4m3 -> bf16 with bias + gelu(tanh): cubes, and M x Llama-3-8B's projections
        *(Spec(s, s, s, dtype="float8_e4m3fn", epilogue="bias_gelu_tanh") for s in (1024, 2048, 4096, 8192)),
        *(
            Spec(m, n, k, dtype="float8_e4m3fn", epilogue="bias_gelu_tanh")
            for m in (16, 128, 512, 2048, 8192)
            for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))
        ),
    ],
    "fp8-block": [
        *(
            Spec(m, n, k, dtype="float8_e4m3fn", scales="block")
            for m in (16, 128, 2048, 8192)
            for n, k in (*_LLAMA3_8B_FP8, *_DEEPSEEK_V3_DENSE)
        ),
        *(Spec(4096, n, k, dtype="float8_e4m3fn", scales="block") for n, k in _DEEPSEEK_V3_DENSE),
    ],
    "fp8-weight": [  # weight-only e4m3 with bf16 activations: Llama-3-8B's projections, decode to prefill
        *(Spec(m, n, k, weight="float8_e4m3fn") for m in (1, 16, 128, 2048) for n, k in _LLAMA3_8B_FP8),
        *(  # and its gate and up projections as one dual GEMM
            Spec(m, 14336, 4096, weight="float8_e4m3fn", epilogue="silu(acc) * acc2")
            for m in (1, 16, 128, 2048)
        ),
    ],
    "mlp-quant": [  # gate and up as one dual GEMM whose output a block-scaled down projection reads
        Spec(m, f, d, epilogue="silu(acc) * acc2", quantize=128)
        for m in (128, 2048, 8192)
        for d, f in ((7168, 18432), (4096, 14336))  # DeepSeek-V3's dense MLP, Llama-3-8B's
    ],
    "gemv-fused": [
        *(
            Spec(m, n, k, epilogue=ep, template="gemv")
            for m in (1, 4, 8, 16)
            for n, k, ep in _DECODE_PROJECTIONS
        ),
        *(Spec(m, 8, 4096, template="gemv") for m in (2048, 8192)),
    ],
}


FORMAT = SpecFormat(
    what="a matmul problem",
    keys=KEYS,
    required=frozenset({"m", "n", "k"}),
    marks=frozenset(),
    make=Spec,
    suites=SUITES,
)
