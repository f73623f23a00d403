"""Problem suites: built-in ones and shapes files.

A problem is written as a small spec: ``{"m": 2048, "n": 4096, "k": 4096}``
plus optional ``batch`` (a batched bmm), ``dtype`` (float16, bfloat16, float32,
float8_e4m3fn, float8_e5m2; default bfloat16), ``scales`` (fp8 only: ``row``, the default,
scales per row of A and per column of B, ``tensor`` one each, ``none``: the epilogue starts
with ``acc * scale_a * scale_b``, float32 operands, as ``torch._scaled_mm`` applies them; an
fp8 spec's other operands and its outputs default to bfloat16), ``layout`` (NN, NT, TN, TT:
whether A and B are stored transposed; default NT, the layout of ``x @ W.T`` in a linear layer) and
``epilogue``: a name of the catalog (``ir/catalog.py``: none, bias, bias_relu,
...), an expression (``"gelu_tanh(acc + bias[n]) + residual"``, ``"silu(acc) * up"``,
``"acc * scale[m] + s[]"``: ``ir/epilogue_text.py``), or a list of outputs, each
an expression or ``{"expr": ..., "dtype": "float32"}``; default none. A convolution is
``{"n", "c", "h", "w", "k", "r", "s"}`` (input [n, c, h, w], weight [k, c / groups, r, s])
plus optional ``stride``, ``padding``, ``dilation``, ``groups``, ``dtype``, ``layout``
(nhwc, the default, or nchw) and ``epilogue`` (per-channel operands are ``x[n]``). A
shapes file is a JSON list of such objects, or JSON Lines (one object per line); its
errors name the line, and for an epilogue's syntax the line and column.

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
- ``gemv``: decode-sized bf16 matmuls for the gemv template, M in {1, 4, 8, 16} x
  (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (128256, 4096)},
  nn.Linear layout, no epilogue;
- ``gemv-fused``: the same 20 shapes with the epilogue of that projection in a
  decoder layer — (4096, 4096) bias + residual, (14336, 4096) bias + gelu(tanh),
  (4096, 14336) residual, (8192, 8192) bias + gelu(tanh) + residual, (128256, 4096)
  bias — plus the transposed case, a router with N = 8 experts over M = 2048 and
  8192 tokens (K = 4096);
- ``mlp``: gated MLPs' gate and up projections as one dual GEMM (``silu(acc) * acc2``; the
  dual_matmul template, and dual_gemv for M <= 16), bf16, nn.Linear layout, M in {1, 8,
  128, 2048, 8192} x (d, F) of Llama-2-7B (4096, 11008), Llama-3-8B (4096, 14336),
  Llama-3-70B (8192, 28672), Qwen2-7B (3584, 18944) and Gemma-7B (3072, 24576, GeGLU:
  ``gelu_tanh(acc) * acc2``);
- ``conv``: ResNet-50's convolutions at batch 32, bf16 channels_last: the 7x7 stride-2
  stem, the 3x3 layers at 56/28/14/7 with C = K = 64/128/256/512, and the 1x1
  expansions (with the block's residual add) and reductions, each with its folded
  batch norm as a per-channel bias and ReLU.

An epilogue that reads ``acc2`` makes a dual GEMM (``ep(A @ B, A @ B2)``, 2-D): its template
is dual_matmul, or dual_gemv for M <= 16.
A spec may name its ``template`` (matmul, default, or gemv for M or N <= 16); matmul
specs with M or N <= 16, and 1x1 NHWC conv specs, are tuned with both templates
(``kinds.twins``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epilab.files import read_text_bounded
from epilab.ir.catalog import EPILOGUES, epilogue
from epilab.ir.dtypes import FP8_DTYPES, INPUT_DTYPES
from epilab.ir.epilogue import LEAVES, Epilogue, Expr, acc, operand
from epilab.ir.epilogue_text import EpilogueSyntaxError, parse_epilogue
from epilab.ir.patterns import canonical_order, swap_accumulators
from epilab.ir.problem import DUAL_OP, OperandSpec, Problem, Shape
from epilab.templates.conv_geometry import ConvGeometry, layout_for
from epilab.templates.kinds import (
    KINDS,
    default_config,
    default_template,
    for_template,
    kind_of,
    template_hash,
    twins,
)
from epilab.templates.runtime import layout_of


def _layout(sizes: tuple[int, int], letter: str) -> str:
    """The layout a tensor of ``sizes`` stored as ``letter`` says it has (``layout_of``): a
    matrix with a dimension of 1 is both, and the problem must be the one its inputs make."""
    rows, cols = sizes
    return layout_of(sizes, (1, rows) if letter == "T" else (cols, 1))


def problem_label(problem: Problem) -> str:
    """A short label of any problem (one the compiler recorded, say): op, shape, dtype,
    layouts of A and B, and the epilogue's ops."""
    ops_ = [n.op for n in problem.epilogue.nodes if n.op not in LEAVES]
    epilogue = "+".join(ops_) if ops_ else "none"
    if len(epilogue) > 40:
        epilogue = epilogue[:37] + "..."
    suffix = "" if problem.template == default_template(problem.op) else f" [{problem.template}]"
    layouts = f"{problem.layout_a}/{problem.layout_b}"
    return f"{problem.op} {shape_label(problem)} {problem.dtype} {layouts} {epilogue}{suffix}"


def shape_label(problem: Problem) -> str:
    """A problem's shape as every table shows it, in its kind's terms (``TemplateKind.label``:
    MxNxK, BxMxNxK batched, a convolution as N x C x H x W -> K x P x Q)."""
    return kind_of(problem).label(problem)


SPEC_KEYS = {"m", "n", "k", "batch", "dtype", "layout", "epilogue", "template", "scales"}
CONV_KEYS = {
    "n",
    "c",
    "h",
    "w",
    "k",
    "r",
    "s",
    "stride",
    "padding",
    "dilation",
    "groups",
    "dtype",
    "layout",
    "epilogue",
}
LAYOUTS = ("NN", "NT", "TN", "TT")
CONV_MEMORY = ("nhwc", "nchw")
# a spec's epilogue: a catalog name, one expression (epilogue_text), or outputs as
# (expression, dtype or None for the input dtype) pairs
EpilogueSpec = str | tuple[tuple[str, str | None], ...]
_OPERAND_LAYOUTS = {"row": "vector", "col": "vector", "scalar": "scalar"}  # a tile: contiguous


SCALINGS = {  # an fp8 spec's scales, as torch._scaled_mm takes them: (scale_a, scale_b) kinds
    "row": ("col", "row"),  # per row of A and per column of B (rowwise)
    "tensor": ("scalar", "scalar"),  # one each (tensorwise)
    "none": None,  # the epilogue as written (it may read scales of its own)
}


def scaled(ep: Epilogue, scaling: str) -> Epilogue:
    """``ep`` with its accumulator scaled first: ``acc * scale_a * scale_b`` (``SCALINGS``)."""
    kinds = SCALINGS[scaling]
    if kinds is None:
        return ep
    built: list[Expr] = []
    for node in ep.nodes:
        if node.op == "acc":
            built.append(acc() * operand("scale_a", kinds[0]) * operand("scale_b", kinds[1]))
        else:
            built.append(Expr(node.op, tuple(built[i] for i in node.args), node.attrs))
    return ep.rebuilt([built[o.node] for o in ep.outputs])


def spec_epilogue(value: EpilogueSpec, dtype: str) -> Epilogue:
    """The epilogue a spec names or writes out (see ``EpilogueSpec``): for fp8 inputs its
    outputs default to bfloat16."""
    dtype = "bfloat16" if dtype in FP8_DTYPES else dtype
    if isinstance(value, str):
        return epilogue(value, dtype) if value in EPILOGUES else parse_epilogue([(value, None)], dtype)
    return parse_epilogue(list(value), dtype)


def epilogue_value(v: Any) -> EpilogueSpec:
    """A spec's ``epilogue`` from JSON: a string, or a list of outputs, each a string or
    ``{"expr": ..., "dtype": ...}``."""
    if isinstance(v, str):
        return v
    if not isinstance(v, list) or not v:
        raise ValueError(f"epilogue must be a string or a non-empty list of outputs, got {v!r:.60}")
    outputs = []
    for item in v:
        if isinstance(item, str):
            outputs.append((item, None))
        elif isinstance(item, dict) and set(item) <= {"expr", "dtype"} and isinstance(item.get("expr"), str):
            dt = item.get("dtype")
            if dt is not None and not isinstance(dt, str):
                raise ValueError(f"an output's dtype must be a string, got {dt!r:.40}")
            outputs.append((item["expr"], dt))
        else:
            raise ValueError(
                f'an epilogue output is a string or {{"expr": ..., "dtype": ...}}, got {item!r:.60}'
            )
    return tuple(outputs)


def epilogue_label(value: EpilogueSpec) -> str:
    text = value if isinstance(value, str) else " ; ".join(e if d is None else f"{e} : {d}" for e, d in value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_in(name: str, v: Any, lo: int, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {v!r:.40}")


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

    def __post_init__(self) -> None:
        if self.scales not in SCALINGS:
            raise ValueError(f"scales {self.scales!r} is not one of {sorted(SCALINGS)}")
        if self.scales != "row" and self.dtype not in FP8_DTYPES:
            raise ValueError(f"scales apply to fp8 inputs ({', '.join(FP8_DTYPES)}), not {self.dtype}")
        for name in ("m", "n", "k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 1 << 20:
                raise ValueError(f"{name} must be an int in 1..{1 << 20}, got {v!r}")
        if self.batch is not None and (
            isinstance(self.batch, bool) or not isinstance(self.batch, int) or not 0 < self.batch <= 65535
        ):
            raise ValueError(f"batch must be an int in 1..65535, got {self.batch!r}")
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
        if fp8:  # the compiler's scaled mm: an mm whose scales (float32) start the epilogue
            op, ep = ("bmm" if self.batch else "mm"), scaled(ep, self.scales)
        operands = tuple(
            OperandSpec(name, _operand_dtype(name, self.dtype), _OPERAND_LAYOUTS.get(kind, "row"))
            for name, kind in ep.operands
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
        )

    def label(self) -> str:
        shape = (
            f"{self.m}x{self.n}x{self.k}"
            if self.batch is None
            else f"{self.batch}x{self.m}x{self.n}x{self.k}"
        )
        dual = spec_epilogue(self.epilogue, self.dtype).accumulators == 2
        suffix = "" if self.template == default_template(DUAL_OP if dual else "mm") else f" [{self.template}]"
        scales = {"row": " row-scaled", "tensor": " tensor-scaled", "none": " unscaled"}[self.scales]
        scales = scales if self.dtype in FP8_DTYPES else ""
        return f"{shape} {self.dtype}{scales} {self.layout} {epilogue_label(self.epilogue)}{suffix}"

    def flops(self) -> int:
        return 2 * (self.batch or 1) * self.m * self.n * self.k


def _operand_dtype(name: str, dtype: str) -> str:
    """An operand's dtype in a spec of ``dtype`` inputs: theirs; with fp8 inputs float32 for
    scales (``scale*``), else bfloat16."""
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

SUITES: dict[str, list[Spec | ConvSpec]] = {
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
    "gemv-fused": [
        *(
            Spec(m, n, k, epilogue=ep, template="gemv")
            for m in (1, 4, 8, 16)
            for n, k, ep in _DECODE_PROJECTIONS
        ),
        *(Spec(m, 8, 4096, template="gemv") for m in (2048, 8192)),
    ],
}


@dataclass(frozen=True)
class ConvSpec:
    """A conv2d problem: input [n, c, h, w], weight [k, c / groups, r, s], bf16 channels_last
    by default; the epilogue's bias is per output channel (a folded batch norm's shift)."""

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1
    dtype: str = "bfloat16"
    layout: str = "nhwc"
    epilogue: EpilogueSpec = "bias_relu"

    def __post_init__(self) -> None:
        for name in ("n", "c", "h", "w", "k", "r", "s"):
            _int_in(name, getattr(self, name), 1, 1 << 16)
        _int_in("stride", self.stride, 1, 64)
        _int_in("padding", self.padding, 0, 64)
        _int_in("dilation", self.dilation, 1, 64)
        _int_in("groups", self.groups, 1, 1 << 16)
        if self.dtype not in INPUT_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {INPUT_DTYPES}")
        if self.layout not in CONV_MEMORY:
            raise ValueError(
                f"layout {self.layout!r} is not one of {CONV_MEMORY} (memory of input and weight)"
            )
        self.problem()  # the geometry and the epilogue's operands are checked here

    def geometry(self) -> ConvGeometry:
        return ConvGeometry(
            self.h,
            self.w,
            self.c,
            self.r,
            self.s,
            (self.stride,) * 2,
            (self.padding,) * 2,
            (self.dilation,) * 2,
            self.groups,
        )

    def problem(self) -> Problem:
        g = self.geometry()
        ep = spec_epilogue(self.epilogue, self.dtype)
        if any(kind == "col" for _, kind in ep.operands):
            raise ValueError("a convolution's operands are per channel ([n]), scalars ([]) or whole tensors")
        out = (self.n, self.k, g.p, g.q)
        operands = tuple(
            OperandSpec(name, self.dtype, _OPERAND_LAYOUTS.get(kind) or layout_for(out, self.layout))
            for name, kind in ep.operands
        )
        return Problem(
            op="conv2d",
            template=default_template("conv2d"),
            template_hash=template_hash(default_template("conv2d"), ep),
            dtype=self.dtype,
            layout_a=layout_for((self.n, self.c, self.h, self.w), self.layout),
            layout_b=layout_for((self.k, g.c_per_group, self.r, self.s), self.layout),
            operands=operands,
            epilogue=ep,
            shape=Shape(self.n, g.p * g.q, self.k, self.r * self.s * g.c_per_group),
            geometry=g,
        )

    def label(self) -> str:
        g = self.geometry()
        extra = "".join(
            f" {name}{v}"
            for name, v, default in (("s", self.stride, 1), ("d", self.dilation, 1), ("g", self.groups, 1))
            if v != default
        )
        return (
            f"conv {self.n}x{self.c}x{self.h}x{self.w} -> {self.k}x{g.p}x{g.q} {self.r}x{self.s}{extra} "
            f"{self.dtype} {self.layout} {epilogue_label(self.epilogue)}"
        )

    def flops(self) -> int:
        return self.problem().shape.flops()


_RESNET50 = [  # (c, hw, k, r, stride, padding, epilogue): the distinct layers of ResNet-50 at batch 32
    (3, 224, 64, 7, 2, 3, "bias_relu"),  # the stem
    *((ch, hw, ch, 3, 1, 1, "bias_relu") for ch, hw in ((64, 56), (128, 28), (256, 14), (512, 7))),
    *(
        (ch, hw, 4 * ch, 1, 1, 0, "bias_residual_relu")
        for ch, hw in ((64, 56), (128, 28), (256, 14), (512, 7))
    ),
    *((4 * ch, hw, ch, 1, 1, 0, "bias_relu") for ch, hw in ((64, 56), (128, 28), (256, 14), (512, 7))),
]
SUITES["conv"] = [
    ConvSpec(32, c, hw, hw, k, r, r, stride, pad, epilogue=ep) for c, hw, k, r, stride, pad, ep in _RESNET50
]


def spec_from_dict(d: Any) -> Spec | ConvSpec:
    """A matmul spec (m, n, k, ...) or, with any of c, h, w, r, s, a conv2d spec."""
    if not isinstance(d, dict):
        raise ValueError(
            f'a problem must be an object like {{"m": 128, "n": 4096, "k": 4096}}, got {d!r:.60}'
        )
    conv = bool({"c", "h", "w", "r", "s"} & set(d))
    keys, required = (
        (CONV_KEYS, {"n", "c", "h", "w", "k", "r", "s"}) if conv else (SPEC_KEYS, {"m", "n", "k"})
    )
    unknown = set(d) - keys
    if unknown:
        what = "a conv2d problem" if conv else "a matmul problem"
        raise ValueError(f"unknown keys {sorted(unknown)} for {what}; known: {sorted(keys)}")
    missing = required - set(d)
    if missing:
        raise ValueError(f"missing {sorted(missing)}")
    if "epilogue" in d:
        d = {**d, "epilogue": epilogue_value(d["epilogue"])}
    return ConvSpec(**d) if conv else Spec(**d)


def load_shapes(path: str | Path) -> list[Spec | ConvSpec]:
    """Specs from a JSON list or a JSON Lines file (``#`` comments and blank lines allowed);
    a ValueError names the file, the line and what is wrong. Linear in the file's size."""
    path = Path(path)
    text = read_text_bounded(path, "shapes")
    specs = _json_list(path, text) if text.lstrip().startswith("[") else _json_lines(path, text)
    if not specs:
        raise ValueError(f"{path}: no problems in the file")
    return specs


def _spec_at(path: Path, line: int, parse: Any, locate: Any) -> Spec | ConvSpec:
    """The spec ``parse()`` reads, or a ValueError naming the file and line (and, for an
    epilogue's syntax, the line and column of the fault in the file: ``locate(needle)``)."""
    try:
        return spec_from_dict(parse())
    except EpilogueSyntaxError as e:
        found = locate(json.dumps(e.text)[1:-1])
        if found is None:
            raise ValueError(f"{path}:{line}: {e}") from None
        at_line, at_col = found
        raise ValueError(f"{path}:{at_line}:{at_col + e.col - 1}: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}:{line}: nested too deeply to be a problem") from None
    except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{path}:{line}: {e}") from None


def _json_list(path: Path, text: str) -> list[Spec | ConvSpec]:
    decoder = json.JSONDecoder()
    specs: list[Spec | ConvSpec] = []
    pos = text.index("[") + 1
    line, counted = 1, 0  # the line of `pos`, counted up to `counted` (each character once)
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise ValueError(f"{path}: the list is not closed with ']'")
        line, counted = line + text.count("\n", counted, pos), pos
        if text[pos] == "]":
            break
        start = pos

        def parse(start: int = start) -> Any:
            nonlocal pos
            obj, pos = decoder.raw_decode(text, start)
            return obj

        def locate(needle: str, start: int = start) -> tuple[int, int] | None:
            return _position(text, text.find(needle, start))  # this spec's text comes first

        specs.append(_spec_at(path, line, parse, locate))
    rest = text[pos + 1 :].strip()
    if rest:
        line += text.count("\n", counted, pos)
        raise ValueError(f"{path}:{line}: text after the list's closing ']': {rest[:40]!r}")
    return specs


def _json_lines(path: Path, text: str) -> list[Spec | ConvSpec]:
    specs = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            specs.append(
                _spec_at(
                    path,
                    line_no,
                    lambda line=line: json.loads(line),
                    lambda needle, line=line, line_no=line_no: (
                        (line_no, line.find(needle) + 1) if needle in line else None
                    ),
                )
            )
    return specs


def _position(text: str, index: int) -> tuple[int, int] | None:
    """Line and column (1-based) of ``text[index]``; None for index -1 (not found)."""
    if index < 0:
        return None
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1


def suite(name: str) -> list[Spec | ConvSpec]:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; built-in suites: {sorted(SUITES)}")
    return SUITES[name]


__all__ = ["EPILOGUES", "SUITES", "Spec", "load_shapes", "suite"]
