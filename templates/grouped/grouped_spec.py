"""The grouped GEMM kinds' spec format: a mixture of experts' projection written as
``{"experts", "tokens", "n", "k"}`` plus optional ``topk`` (experts per token: the GEMM's rows
are tokens x topk), ``dtype``, ``layout`` (of each expert's B: ``col``, the default, for
weights stored [E, N, K] as ``nn.Linear`` stores them, or ``row``) and ``epilogue``
(``ir/spec.py``: ``bias[n]`` is one bias per expert, ``w[m]`` one value per row, as a routing
weight; an epilogue that reads ``acc2`` is the dual grouped GEMM of a gate and an up
projection), ``gather`` (true: A's rows are gathered from the tokens' activations in the
kernel) and ``scatter`` (``"add"``: the output rows are added back to their tokens, the
top-k combine; ``"store"``: written to their token-major rows). Its built-in suites:

- ``moe``: the expert projections of Mixtral-8x7B (8 experts, top-2, d 4096, F 14336), a
  Qwen-MoE-like (60 experts, top-4, d 2048, F 1408) and a DeepSeek-like (64 experts, top-6,
  d 2048, F 1408) layer at 16, 512, 4096 and 16384 tokens, bf16: the gate and up projections
  with SwiGLU (``silu(acc) * acc2``, dual) and the down projection scaled by each row's
  routing weight (``acc * w[m]``).
- ``moe-routed``: the same layers at 512, 4096 and 16384 tokens with their routing fused:
  the gate and up projections gathering their rows from the tokens, the down projection
  adding its weighted rows back to them in fp32 (as the zoo's ``GroupedMoE`` and serving code
  combine them).
"""

from __future__ import annotations

from dataclasses import dataclass

from epilab.ir.dtypes import WIDE_INPUT_DTYPES
from epilab.ir.patterns import canonical_order, swap_accumulators
from epilab.ir.problem import OperandSpec, Problem, Shape
from epilab.ir.spec import OPERAND_LAYOUTS, EpilogueSpec, SpecFormat, epilogue_label, int_in, spec_epilogue
from epilab.templates.grouped.grouped_geometry import MAX_EXPERTS, SCATTERS, GroupedGeometry
from epilab.templates.registry import default_template, template_hash

OP, DUAL_OP = "grouped_mm", "dual_grouped_mm"
LAYOUTS = ("col", "row")  # of each expert's B [K, N]: col is B = w.transpose(-1, -2), w [E, N, K]


@dataclass(frozen=True)
class GroupedSpec:
    """E experts' GEMMs over tokens x topk rows: A [tokens * topk, k], B [experts, k, n]."""

    experts: int
    tokens: int
    n: int
    k: int
    topk: int = 1
    dtype: str = "bfloat16"
    layout: str = "col"
    epilogue: EpilogueSpec = "none"
    gather: bool = False
    scatter: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.gather, bool) or self.scatter not in SCATTERS:
            raise ValueError(
                f"gather is true or false and scatter one of {SCATTERS[1:]}, got {self.gather!r:.20}, "
                f"{self.scatter!r:.20}"
            )
        int_in("experts", self.experts, 1, MAX_EXPERTS)
        int_in("topk", self.topk, 1, self.experts)
        for name in ("tokens", "n", "k"):
            int_in(name, getattr(self, name), 1, 1 << 20)
        if self.dtype not in WIDE_INPUT_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {WIDE_INPUT_DTYPES}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} is not one of {LAYOUTS} (of each expert's B)")
        self.problem()  # the epilogue and its operands are checked here

    @property
    def rows(self) -> int:
        return self.tokens * self.topk

    def problem(self) -> Problem:
        ep = spec_epilogue(self.epilogue, self.dtype)
        op = OP
        if ep.accumulators == 2:  # in the order the dual GEMM's records are kept
            op, ep = DUAL_OP, ep if canonical_order(ep) else swap_accumulators(ep)
        operands = tuple(
            OperandSpec(name, self.dtype, OPERAND_LAYOUTS.get(broadcast, "row"))
            for name, broadcast in ep.operands
        )
        template = default_template(op)
        return Problem(
            op=op,
            template=template,
            template_hash=template_hash(template, ep),
            dtype=self.dtype,
            layout_a="row",
            layout_b=self.layout,
            operands=operands,
            epilogue=ep,
            shape=Shape(1, self.rows, self.n, self.k),
            geometry=GroupedGeometry(self.experts, *self.routing()),
        )

    def routing(self) -> tuple[int, bool, str]:
        routed = self.gather or bool(self.scatter)
        return (self.topk if routed else 1), self.gather, self.scatter

    def label(self) -> str:
        return (
            f"moe {self.tokens} tokens x top{self.topk} / {self.experts} experts -> {self.n}x{self.k} "
            f"{self.dtype} {epilogue_label(self.epilogue, self.dtype)}"
            + (" gathered" if self.gather else "")
            + (f" {self.scatter}ed back" if self.scatter else "")
        )

    def flops(self) -> int:
        return self.problem().shape.flops() * (2 if self.problem().op == DUAL_OP else 1)


SWIGLU = "silu(acc) * acc2"
ROUTED = "acc * w[m]"  # the down projection's rows scaled by their routing weights
_MODELS = (  # (experts, topk, d, F): Mixtral-8x7B, a Qwen-MoE-like and a DeepSeek-like layer
    (8, 2, 4096, 14336),
    (60, 4, 2048, 1408),
    (64, 6, 2048, 1408),
)
TOKENS = (16, 512, 4096, 16384)
COMBINED = ((ROUTED, "float32"),)  # the weighted rows added back to their tokens in fp32
SUITES = {
    "moe": [
        spec
        for e, topk, d, f in _MODELS
        for tokens in TOKENS
        for spec in (
            GroupedSpec(e, tokens, f, d, topk, epilogue=SWIGLU),
            GroupedSpec(e, tokens, d, f, topk, epilogue=ROUTED),
        )
    ],
    "moe-routed": [
        spec
        for e, topk, d, f in _MODELS
        for tokens in TOKENS[1:]
        for spec in (
            GroupedSpec(e, tokens, f, d, topk, epilogue=SWIGLU, gather=True),
            GroupedSpec(e, tokens, d, f, topk, epilogue=COMBINED, scatter="add"),
        )
    ],
}

FORMAT = SpecFormat(
    what="a grouped (mixture of experts) problem",
    keys=frozenset(
        {"experts", "tokens", "n", "k", "topk", "dtype", "layout", "epilogue", "gather", "scatter"}
    ),
    required=frozenset({"experts", "tokens", "n", "k"}),
    marks=frozenset({"experts", "tokens", "topk"}),
    make=GroupedSpec,
    suites=SUITES,
)
