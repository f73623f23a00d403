"""Weight-only fp8 matmuls (a float16 / bfloat16 A, an fp8 weight converted in the K loop, its
scales in the epilogue): the weight_only_matmul kind on every Triton loop against float64, the
API, the config rules and the problem's identity, the compiler's rewrite of dequantize-then-mm
graphs (torchao's weight-only fp8), and on the GPU against the baseline."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._inductor.custom_graph_pass import CustomGraphPass

import epilab
from epilab.compiler.aten_ops import ANCHORS
from epilab.compiler.match import match, match_dual
from epilab.ir.check import rel_error, tolerance
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, acc2, operand, ops
from epilab.ir.problem import Problem
from epilab.policy.space import HOPPER, infeasible, smem_bytes
from epilab.policy.suites import suite
from epilab.templates.gemm.dual_weight_only import make_dual_weight_only_problem
from epilab.templates.gemm.gemm_spec import Spec
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.gemm.matmul_config import STREAM_K_VARIANTS, TRITON_VARIANTS
from epilab.templates.gemm.weight_geometry import WeightGeometry
from epilab.templates.gemm.weight_only import KIND, make_weight_only_problem
from epilab.templates.grouped import grouped_matmul
from epilab.templates.registry import for_template, kind_of, twins
from epilab.templates.verify import checked_launch
from epilab.tuner.tune import input_bytes

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
WIDE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def weight(n: int, k: int, fp8: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """A linear layer's fp8 weight [N, K] (values of a few units: every exponent of e4m3 used)."""
    return (torch.randn(n, k, device=device) * 4).to(fp8)


def tensors(m, n, k, wide, fp8, layout_b="col", device="cpu"):
    """A [M, K], B [K, N] (the weight transposed, or a row-major [K, N]), per-column scales
    float32 [N] and a bias of A's dtype."""
    a = torch.randn(m, k, device=device).to(wide)
    b = weight(n, k, fp8, device).t() if layout_b == "col" else weight(k, n, fp8, device)
    scale = torch.rand(n, device=device) / 8 + 0.01
    bias = torch.randn(n, device=device).to(wide)
    return a, b, scale, bias


def scaled_gelu(dtype: str, extra: bool = False) -> Epilogue:
    x = ops.gelu_tanh(acc() * operand("scale", "row") + operand("bias", "row"))
    outs = [(x, dtype)] + ([(x * 2.0, "float32")] if extra else [])
    return Epilogue.build(outs)


# ------------------------------------------------------------------ CPU (interpreter)


@pytest.mark.parametrize("swap", [0, 1], ids=["a-left", "swapped"])
@pytest.mark.parametrize("variant", TRITON_VARIANTS)
def test_every_loop_matches_float64(variant, swap):
    """Partial tiles in M, N and K (37 x 72 x 80), a bf16 and an fp32 output of the scaled,
    biased GELU: each loop reads the fp8 tile and converts it, as the dot's right operand or
    (SWAP_AB) its left, the accumulator transposed back for the epilogue."""
    m, n, k = 37, 72, 80
    torch.manual_seed(5)
    a, b, scale, bias = tensors(m, n, k, torch.bfloat16, FP8["e4m3"])
    ops_ = {"scale": scale, "bias": bias}
    problem = make_weight_only_problem(a, b, scaled_gelu("bfloat16", extra=True), ops_)
    assert (problem.op, problem.template, problem.dtype) == (
        "weight_only_mm",
        "weight_only_matmul",
        "bfloat16",
    )
    assert problem.geometry == WeightGeometry("float8_e4m3fn") and problem.layout_b == "col"
    config = Config(32, 32, 32, 4, num_warps=4, num_stages=2, variant=variant, SWAP_AB=swap)
    if swap and variant in STREAM_K_VARIANTS:  # wrong sums on an H200: refused by name
        with pytest.raises(ValueError, match="not stream-K"):
            checked_launch(problem, config, a, b, ops_)
        return
    checked_launch(problem, config, a, b, ops_)


@pytest.mark.parametrize("wide", list(WIDE))
@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("layout_b", ["col", "row"])
def test_dtypes_layouts_and_split_k(wide, fp8, layout_b):
    m, n, k = 9, 48, 96
    torch.manual_seed(11)
    a, b, scale, bias = tensors(m, n, k, WIDE[wide], FP8[fp8], layout_b)
    ops_ = {"scale": scale, "bias": bias}
    problem = make_weight_only_problem(a, b, scaled_gelu(str(WIDE[wide]).split(".")[1]), ops_)
    for config in (
        Config(16, 32, 32, 1, num_warps=4, num_stages=2),
        Config(16, 16, 16, 1, 4, num_warps=2, num_stages=2),  # split-K: four uneven shares of K
        Config(16, 32, 32, 1, num_warps=4, num_stages=2, SWAP_AB=1),
        Config(16, 16, 16, 1, 4, num_warps=2, num_stages=2, SWAP_AB=1),
    ):
        checked_launch(problem, config, a, b, ops_)


def every_fp8_code(fp8: str, device: str) -> torch.Tensor:
    """A 16x16 fp8 tensor holding each of the 256 codes once, NaN and infinities made zero (an
    identity's zeros would turn them into NaN), and on the CPU e5m2's subnormals too (the
    interpreter flushes them: numpy's conversion, not the GPU's)."""
    codes = torch.arange(256, dtype=torch.uint8, device=device).view(FP8[fp8]).reshape(16, 16)
    values = codes.float()
    dropped = ~values.isfinite()
    if device == "cpu" and fp8 == "e5m2":
        dropped |= values.abs() < torch.finfo(FP8[fp8]).tiny
    return torch.where(dropped, torch.zeros((), device=device), values).to(FP8[fp8])


@pytest.mark.parametrize("wide", list(WIDE))
@pytest.mark.parametrize("fp8", list(FP8))
def test_every_fp8_code_is_read_exactly(wide, fp8, device="cpu"):
    """B holds each of the 256 codes once (zeros, subnormals, the largest values; NaN and
    infinities made zero, as the identity's zeros would turn them into NaN), A is the identity:
    the fp32 output is B's values, so the tile's conversion (through fp16 for a bf16 A) loses
    nothing. The interpreter flushes e5m2's subnormals (numpy's conversion, not the GPU's): on
    the CPU they are left out too."""
    b = every_fp8_code(fp8, device)
    a = torch.eye(16, device=device).to(WIDE[wide])
    ops_ = {"scale": torch.ones(16, device=device)}
    ep = Epilogue.build([(acc() * operand("scale", "row"), "float32")])
    problem = make_weight_only_problem(a, b, ep, ops_)
    for variant in ("default", "tma") if device == "cuda" else ("default",):
        for swap in (0, 1):
            config = Config(32, 16, 32, 1, num_warps=4, num_stages=2, variant=variant, SWAP_AB=swap)
            (out,) = checked_launch(problem, config, a, b, ops_).outs
            assert torch.equal(out, b.float()), config.short()


def swiglu_of_scaled(dtype: str = "bfloat16") -> Epilogue:
    gate = acc() * operand("weight_scale", "row")
    up = acc2() * operand("weight_scale2", "row")
    return Epilogue.build([(ops.silu(gate) * up, dtype)])


@pytest.mark.parametrize("swap", [0, 1], ids=["a-left", "swapped"])
@pytest.mark.parametrize("variant", TRITON_VARIANTS)
def test_dual_weight_only_every_loop_matches_float64(variant, swap):
    """A SwiGLU of two fp8 weights in one kernel: both tiles converted after their loads (the
    dots' left operands with SWAP_AB)."""
    m, n, k = 37, 72, 80
    torch.manual_seed(9)
    a = torch.randn(m, k, dtype=torch.bfloat16)
    w1, w3 = weight(n, k, FP8["e4m3"]), weight(n, k, FP8["e4m3"])
    ops_ = {"weight_scale": torch.rand(n) / 8 + 0.01, "weight_scale2": torch.rand(n) / 8 + 0.01}
    problem = make_dual_weight_only_problem(a, w1.t(), w3.t(), swiglu_of_scaled(), ops_)
    assert (problem.op, problem.template) == ("dual_weight_only_mm", "dual_weight_only_matmul")
    assert Problem.from_json(problem.to_json()) == problem and twins(problem) == [problem]
    assert input_bytes(problem) == 2 * m * k + 2 * k * n
    config = Config(32, 32, 32, 4, num_warps=4, num_stages=2, variant=variant, SWAP_AB=swap)
    if swap and variant in STREAM_K_VARIANTS:
        assert "not stream-K" in kind_of(problem).config_error(problem, config)
    else:
        checked_launch(problem, config, a, w1.t(), {"b2": w3.t(), **ops_})
    with pytest.raises(ValueError, match="b2 is"):
        make_dual_weight_only_problem(a, w1.t(), w3.to(FP8["e5m2"]).t(), swiglu_of_scaled(), ops_)


def test_the_weight_is_read_not_its_rounding():
    """The check sees the weight: one changed element moves the result past the tolerance."""
    m, n, k = 16, 32, 64
    torch.manual_seed(2)
    a, b, _, _ = tensors(m, n, k, torch.bfloat16, FP8["e4m3"])
    problem = make_weight_only_problem(a, b, Epilogue.build([(acc(), "float32")]), {})
    (out,) = checked_launch(problem, Config(16, 32, 32, 1, num_warps=4, num_stages=1), a, b, {}).outs
    other = b.float().clone()
    other[:, 3] += 64
    assert rel_error(out, a.double() @ other.double()) > 0.05


def test_api_reads_an_fp8_weight_with_per_column_or_tensor_scales():
    """``epilab.matmul(x, w8.t(), scale_b=s, bias=b, activation="silu")``: x bf16, w8 fp8."""
    m, n, k = 33, 40, 64
    torch.manual_seed(3)
    x, w = torch.randn(m, k, dtype=torch.bfloat16), weight(n, k, FP8["e4m3"])
    bias = torch.randn(n, dtype=torch.bfloat16)
    for scale in (torch.rand(n) / 8, torch.tensor(0.05)):
        out = epilab.matmul(x, w.t(), scale_b=scale, bias=bias, activation="silu")
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        ref = F.silu(x.double() @ w.double().t() * scale.double() + bias.double())
        assert rel_error(out, ref) <= tolerance("bfloat16", "ieee", "bfloat16")


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"scale_a": torch.ones(8, 1)}, ValueError, "scale_a does not apply"),
        ({"use_fast_accum": True}, ValueError, "use_fast_accum and allow_tf32 do not apply"),
        ({"allow_tf32": True}, ValueError, "use_fast_accum and allow_tf32 do not apply"),
        ({"scale_b": torch.ones(64, dtype=torch.float64)}, TypeError, "float32"),
    ],
)
def test_bad_weight_only_calls_are_refused_clearly(kwargs, error, message):
    x, w = torch.randn(8, 64, dtype=torch.bfloat16), weight(32, 64, FP8["e4m3"])
    with pytest.raises(error, match=message):
        epilab.matmul(x, w.t(), **kwargs)


def test_inputs_that_are_not_weight_only_are_refused_clearly():
    w = weight(32, 64, FP8["e4m3"])
    with pytest.raises(TypeError, match="weight-only matmul"):
        epilab.matmul(torch.randn(8, 64), w.t())  # float32 A
    with pytest.raises(TypeError, match="takes a 2-D"):
        epilab.matmul(torch.randn(2, 8, 64, dtype=torch.bfloat16), w.t())  # batched A


def test_config_rules_and_the_problems_identity():
    m, n, k = 16, 48, 24  # B's rows (the weight's) of 24 bytes: not 16-byte aligned for TMA
    a, b, scale, bias = tensors(m, n, k, torch.bfloat16, FP8["e4m3"])
    problem = make_weight_only_problem(a, b, scaled_gelu("bfloat16"), {"scale": scale, "bias": bias})
    assert "Triton loops" in KIND.config_error(problem, Config(64, 64, 64, 8, variant="sm90_pingpong"))
    assert "fp8 elements" in KIND.config_error(problem, Config(16, 16, 16, 1, variant="tma"))
    assert KIND.config_error(problem, Config(16, 16, 16, 1)) is None
    assert KIND.config_error(problem, Config(16, 16, 16, 1, SWAP_AB=1)) is None
    assert "swap" in Config(16, 16, 16, 1, SWAP_AB=1).short()
    assert Problem.from_json(problem.to_json()) == problem and '"weight"' in problem.to_json()
    e5m2 = make_weight_only_problem(a, b.to(FP8["e5m2"]), problem.epilogue, {"scale": scale, "bias": bias})
    assert e5m2.key != problem.key  # the weight's dtype is part of the problem
    assert [t.template for t in twins(problem)] == ["weight_only_matmul", "weight_only_gemv"]  # M <= 16
    assert KIND.seeds_for(problem)[0].BLOCK_M == 16  # decode tiles first
    assert input_bytes(problem) == 2 * m * k + k * n  # B: one byte an element
    assert smem_bytes(problem, Config(16, 32, 64, 1, num_stages=2)) == 2 * (16 * 64 * 2 + 64 * 32)
    a100 = dataclasses.replace(HOPPER, capability="8.0", name="A100")
    assert "compute capability 8.9" in infeasible(problem, Config(16, 16, 16, 1), a100)
    with pytest.raises(ValueError, match="weight-only problem's A"):
        Problem.from_json(problem.to_json().replace('"bfloat16"', '"float32"'))
    with pytest.raises(ValueError, match="weight is one of"):
        Problem.from_json(problem.to_json().replace('"float8_e4m3fn"', '"bfloat16"'))


def test_swap_ab_is_the_weight_only_kinds_knob():
    """Every other kind refuses SWAP_AB=1 by name: the matmul's loops (a 16-bit B is read from
    shared memory either way), the GEMV and the grouped template."""
    a, w = torch.randn(16, 32, dtype=torch.bfloat16), torch.randn(32, 48, dtype=torch.bfloat16)
    mm = make_problem(a, w, Epilogue.identity("bfloat16"), {})
    swapped = Config(16, 16, 16, 1, SWAP_AB=1)
    assert "SWAP_AB" in kind_of(mm).config_error(mm, swapped)
    assert kind_of(mm).config_error(mm, Config(16, 16, 16, 1)) is None
    gemv = for_template(mm, "gemv")
    assert "SWAP_AB" in kind_of(gemv).config_error(gemv, swapped)
    assert "SWAP_AB" in grouped_matmul.config_error(gemv, swapped)


# ------------------------------------------------------------------ the compiler's rewrite


class DequantLinear(nn.Module):
    """torchao's weight-only fp8 (``Float8WeightOnlyConfig``): the weight dequantized in
    float32 with a per-channel scale, rounded to the activations' dtype, then ``linear``."""

    def __init__(self, n: int, k: int, *, bias: bool = True, per_tensor: bool = False) -> None:
        super().__init__()
        self.register_buffer("weight", weight(n, k, FP8["e4m3"]))
        self.register_buffer("scale", torch.rand(1 if per_tensor else n, 1) / 8 + 0.01)
        self.register_buffer("bias", torch.randn(n).bfloat16() if bias else None)

    def dequantized(self) -> torch.Tensor:
        return (self.weight.to(torch.float32) * self.scale).to(torch.bfloat16)

    def forward(self, x):
        return F.gelu(F.linear(x, self.dequantized(), self.bias))

    def reference(self, x):
        w = self.weight.double() * self.scale.double()
        y = x.double() @ w.t() + (0 if self.bias is None else self.bias.double())
        return F.gelu(y)


def _groups(f, *args, pairs: bool = False) -> list:
    """The groups ``match`` makes of each anchor of ``f``'s post-grad graph (Inductor compiles
    it); with ``pairs``, the dual group of its first two anchors first."""
    found = []

    class Capture(CustomGraphPass):
        def __call__(self, graph):
            nodes = list(graph.nodes)
            anchors = [i for i, n in enumerate(nodes) if n.op == "call_function" and n.target in ANCHORS]
            if pairs:
                first, second = anchors[:2]
                found.append(match_dual(nodes[first], nodes[second], nodes[first + 1 :], precision="ieee"))
            for i in anchors:
                found.append(match(nodes[i], nodes[i + 1 :], precision="ieee"))

        def uuid(self):
            return None

    with torch._inductor.config.patch(post_grad_custom_post_pass=Capture(), force_disable_caches=True):
        torch.compile(f)(*args)
    return found


def _compiled(model, tmp_path):
    return torch.compile(model, backend="epilab", options={"policy": "always", "db": str(tmp_path / "t.db")})


@pytest.mark.parametrize("per_tensor", [False, True])
def test_compiler_reads_a_dequantized_weight_as_fp8(tmp_path, fresh_compiler, per_tensor):
    """linear(x, (w8.float() * s).bf16()) with its bias and a GELU: one weight-only group whose
    epilogue scales, adds the bias and runs the GELU; the dequantized weight is never made."""
    model = DequantLinear(40, 64, per_tensor=per_tensor)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out = _compiled(model, tmp_path)(x)
    assert rel_error(out, model.reference(x)) <= tolerance("bfloat16", "ieee", "bfloat16")
    (decision,) = [d for d in epilab.explain() if d.template]
    assert decision.template == "weight_only_gemv" and decision.anchor == "aten.addmm"  # M 15: decode
    broadcast = "scalar" if per_tensor else "row"
    assert f"operand[broadcast={broadcast},name=weight_scale]" in decision.epilogue_ir
    assert "erf" in decision.epilogue_ir


def test_compiler_reads_a_bf16_dequantization_without_a_transpose(tmp_path, fresh_compiler):
    """x @ (w8.bf16() * s.bf16()) of a [K, N] weight with a [N] scale (rounded to bf16 first,
    which the kernel reads as the graph rounded it)."""
    k, n = 48, 32
    w, s = weight(k, n, FP8["e5m2"]), torch.rand(n) / 8 + 0.01

    def f(x, w, s):
        return torch.relu(x @ (w.to(torch.bfloat16) * s.to(torch.bfloat16)))

    x = torch.randn(20, k, dtype=torch.bfloat16)
    out = _compiled(f, tmp_path)(x, w, s)
    ref = torch.relu(x.double() @ (w.double() * s.bfloat16().double()))
    assert rel_error(out, ref) <= tolerance("bfloat16", "ieee", "bfloat16")
    (decision,) = [d for d in epilab.explain() if d.template]
    assert decision.template == "weight_only_matmul" and "weight_scale" in decision.epilogue_ir


@pytest.mark.parametrize("epilogue", ["none", "bias"])
def test_compiled_problem_is_the_specs_so_offline_records_serve_it(tmp_path, fresh_compiler, epilogue):
    """``Spec(M, N, K, weight="float8_e4m3fn")`` is the problem the compiler makes of torchao's
    weight-only linear (float32 scales), so ``epilab tune --suite fp8-weight`` tunes for models."""
    m, n, k = 20, 40, 64
    w, s = weight(n, k, FP8["e4m3"]), torch.rand(n, 1) / 8 + 0.01
    bias = torch.randn(n, dtype=torch.bfloat16) if epilogue == "bias" else None

    def f(x, w, s):
        return F.linear(x, (w.to(torch.float32) * s).to(torch.bfloat16), bias)

    (group,) = _groups(f, torch.randn(m, k, dtype=torch.bfloat16), w, s)
    spec = Spec(m, n, k, weight="float8_e4m3fn", epilogue=epilogue)
    assert group.problem.identity_key == spec.problem().identity_key
    text = {"none": "acc", "bias": "acc + bias[n]"}[epilogue]  # as every table prints it
    assert spec.label() == f"{m}x{n}x{k} bfloat16 x float8_e4m3fn weight row/col {text}"


@pytest.mark.parametrize(
    "dequantize, template",
    [
        (lambda w, s: (s.float() * w.float()).bfloat16().t(), "weight_only_matmul"),  # scale first
        (lambda w, s: w.bfloat16().t(), "weight_only_matmul"),  # no scale
        (lambda w, s: (w.float() * s.float().t()).bfloat16().t(), "matmul"),  # per input channel
        (lambda w, s: (w.float() * w.float()).bfloat16().t(), "matmul"),  # not a scale
    ],
)
def test_which_dequantizations_are_read_as_fp8(dequantize, template):
    n, k = 32, 32  # square: a scale along the wrong dim has the right length
    w, s = weight(n, k, FP8["e4m3"]), torch.rand(n, 1, dtype=torch.bfloat16)
    (group,) = _groups(lambda x, w, s: x @ dequantize(w, s), torch.randn(8, k, dtype=torch.bfloat16), w, s)
    assert group.problem.template == template


def _quantized_rows(x: torch.Tensor, fp8: torch.dtype = FP8["e4m3"]) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-row quantization: x8 and its float32 scale [..., 1]."""
    sx = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / 448
    return (x / sx).to(fp8), sx


def _dequantized_mm(x, w8, sw, fp8=FP8["e4m3"]):
    """The dynamic-activation graph written out: x quantized per row, both dequantized, mm."""
    x8, sx = _quantized_rows(x, fp8)
    return F.linear((x8.float() * sx).bfloat16(), (w8.float() * sw).bfloat16())


def test_an_mm_of_two_dequantized_fp8_tensors_is_the_fp8_scaled_mm(tmp_path, fresh_compiler):
    """``linear(dequant(x8, sx), dequant(w8, sw))`` of a 3-D x quantized per row in the graph:
    one fp8 group on the matmul template (A the rows of x8, ``acc * scale_a * scale_b``), the
    problem the fp8 suite's rowwise spec names; against float64 of the dequantized inputs."""
    n, k = 40, 64
    w8, sw = weight(n, k, FP8["e4m3"]), torch.rand(n, 1) / 8 + 0.01
    x = torch.randn(3, 5, k, dtype=torch.bfloat16)
    (group,) = _groups(_dequantized_mm, x, w8, sw)
    assert (group.problem.template, group.problem.dtype) == ("matmul", "float8_e4m3fn")
    assert group.a_reshape is not None and group.b_permute == (1, 0)
    spec = Spec(15, n, k, dtype="float8_e4m3fn", scales="row", epilogue="none")
    assert group.problem.identity_key == spec.problem().identity_key
    torch._dynamo.reset()
    out = _compiled(lambda x: torch.relu(_dequantized_mm(x, w8, sw)), tmp_path)(x)
    x8, sx = _quantized_rows(x)
    ref = torch.relu((x8.double() * sx.double()) @ (w8.double() * sw.double()).t())
    assert rel_error(out, ref) <= tolerance("float8_e4m3fn", "ieee", "bfloat16")
    (decision,) = [d for d in epilab.explain() if d.template]
    assert decision.template == "matmul" and "broadcast=col,name=scale_a" in decision.epilogue_ir


def test_dequantized_inputs_of_two_fp8_dtypes_read_only_the_weight():
    """An e5m2 activation with an e4m3 weight: no fp8 dot takes both, so the weight alone is
    read as fp8 (weight-only), the activation as the graph dequantized it."""
    n, k = 32, 64
    w8, sw = weight(n, k, FP8["e4m3"]), torch.rand(n, 1) / 8 + 0.01
    x = torch.randn(8, k, dtype=torch.bfloat16)
    (group,) = _groups(lambda x, w8, sw: _dequantized_mm(x, w8, sw, FP8["e5m2"]), x, w8, sw)
    assert group.problem.template == "weight_only_matmul" and group.a_reshape is None


class GatedMlp(nn.Module):
    """Llama's MLP of torchao weight-only fp8 linears (``zoo.quantized.Fp8WeightLinear``)."""

    def __init__(self, d: int = 64, f: int = 48, up_dtype: torch.dtype = FP8["e4m3"]) -> None:
        from zoo.quantized import Fp8WeightLinear

        super().__init__()
        self.gate = Fp8WeightLinear(nn.Linear(d, f, bias=False))
        self.up = Fp8WeightLinear(nn.Linear(d, f, bias=False))
        self.up.weight_bytes = self.up.weight_bytes.view(FP8["e4m3"]).float().to(up_dtype).view(torch.uint8)
        self.up_dtype = up_dtype
        self.down = Fp8WeightLinear(nn.Linear(f, d, bias=False))

    def forward(self, x):
        up = self.up
        w_up = (up.weight_bytes.view(self.up_dtype).to(torch.float32) * up.scale).to(x.dtype)
        return self.down(F.silu(self.gate(x)) * F.linear(x, w_up))

    def reference(self, x):
        def dq(layer, dtype=FP8["e4m3"]):
            return layer.weight_bytes.view(dtype).double() * layer.scale.double()

        x = x.double()
        return (F.silu(x @ dq(self.gate).t()) * (x @ dq(self.up, self.up_dtype).t())) @ dq(self.down).t()


def test_a_gated_pairs_spec_is_the_compilers_problem():
    """``Spec(M, F, d, weight=..., epilogue="silu(acc) * acc2")`` is the dual group the compiler
    makes of two torchao weight-only linears (float32 scales) joined by SwiGLU."""
    m, f, d = 8, 48, 64
    gate, up = weight(f, d, FP8["e4m3"]), weight(f, d, FP8["e4m3"])
    s1, s2 = torch.rand(f, 1) / 8 + 0.01, torch.rand(f, 1) / 8 + 0.01

    def swiglu(x, gate, up, s1, s2):
        dq = lambda w, s: (w.to(torch.float32) * s).to(torch.bfloat16)  # noqa: E731
        return F.silu(F.linear(x, dq(gate, s1))) * F.linear(x, dq(up, s2))

    x = torch.randn(m, d, dtype=torch.bfloat16)
    dual = _groups(swiglu, x, gate, up, s1, s2, pairs=True)[0]
    spec = Spec(m, f, d, weight="float8_e4m3fn", epilogue="silu(acc) * acc2")
    assert dual.problem.identity_key == spec.problem().identity_key
    assert spec.problem().template == "dual_weight_only_matmul"


def test_compiler_reads_a_gated_mlps_two_fp8_weights_in_one_kernel(tmp_path, fresh_compiler):
    """gate and up of weight-only linears: one dual weight-only group (each weight's scale in
    the epilogue), the down projection weight-only; against float64 of the dequantized weights."""
    model = GatedMlp().to(torch.bfloat16)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        out = _compiled(model, tmp_path)(x)
    assert rel_error(out, model.reference(x)) <= tolerance("bfloat16", "ieee", "bfloat16")
    templates = [d.template for d in epilab.explain() if d.template]
    assert templates == ["dual_weight_only_gemv", "weight_only_gemv"]  # M 15: the GEMVs, untuned
    (dual,) = [d for d in epilab.explain() if d.template == "dual_weight_only_gemv"]
    assert "name=weight_scale]" in dual.epilogue_ir and "name=weight_scale2]" in dual.epilogue_ir


def test_a_gated_pair_of_two_fp8_dtypes_reads_its_16_bit_weights():
    """An e5m2 up weight beside an e4m3 gate: no kernel reads the two dtypes, so the pair is the
    dual GEMM of the dequantized 16-bit weights, as before; each alone is weight-only."""
    model = GatedMlp(up_dtype=FP8["e5m2"]).to(torch.bfloat16)
    groups = _groups(model, torch.randn(8, 64, dtype=torch.bfloat16), pairs=True)
    assert [g.problem.template for g in groups] == ["dual_matmul", *["weight_only_matmul"] * 3]


def test_fp8_weight_suite_and_bad_specs():
    problems = suite("fp8-weight")
    templates = {p.problem().template for p in problems}
    assert len(problems) == 20 and templates == {"weight_only_matmul", "dual_weight_only_matmul"}
    with pytest.raises(ValueError, match="weight-only fp8"):
        Spec(16, 64, 64, dtype="float32", weight="float8_e4m3fn")
    with pytest.raises(ValueError, match="weight-only fp8"):
        Spec(16, 64, 64, weight="bfloat16")
    with pytest.raises(ValueError, match="2-D"):
        Spec(16, 64, 64, batch=2, weight="float8_e5m2")


def test_compiler_leaves_scales_along_k_to_the_graph(tmp_path, fresh_compiler):
    """A scale per input channel (along K) is not an epilogue scale: the mm reads the
    dequantized 16-bit weight as before (the matmul template)."""
    n, k = 32, 48
    w, s = weight(n, k, FP8["e4m3"]), torch.rand(1, k) / 8 + 0.01

    def f(x, w, s):
        return torch.relu(x @ (w.to(torch.float32) * s).to(torch.bfloat16).t())

    x = torch.randn(20, k, dtype=torch.bfloat16)
    out = _compiled(f, tmp_path)(x, w, s)
    ref = torch.relu(x.double() @ (w.double() * s.double()).t())
    assert rel_error(out, ref) <= tolerance("bfloat16", "ieee", "bfloat16")
    (decision,) = [d for d in epilab.explain() if d.template]
    assert decision.template == "matmul" and "weight_scale" not in decision.epilogue_ir


# ------------------------------------------------------------------ compiled for sm_90a (CPU)

SWAP_COMPILED = [  # Llama-3-8B's gate projection at prefill, and its gate and up pair
    (Spec(2048, 14336, 4096, weight="float8_e4m3fn"), Config(256, 128, 128, 8, num_warps=8, num_stages=3, variant="tma", SWAP_AB=1)),
    (Spec(2048, 14336, 4096, weight="float8_e4m3fn"), Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma")),
    (Spec(2048, 14336, 4096, weight="float8_e4m3fn", epilogue="silu(acc) * acc2"), Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma", SWAP_AB=1)),
]  # fmt: skip


def test_swapped_loops_read_the_converted_weight_from_registers():
    """Compiled for sm_90a: with SWAP_AB every wgmma of the K loop takes the converted weight
    tile as its register operand (no copy of it through shared memory), without spills; with
    the weight on the right every wgmma reads both operands from shared memory."""
    from epilab.templates.tools.cross import compile_in_subprocess

    answers = compile_in_subprocess([(spec.problem(), config) for spec, config in SWAP_COMPILED])
    for (_, config), answer in zip(SWAP_COMPILED, answers, strict=True):
        assert "error" not in answer, answer.get("error")
        (kernel,) = answer["kernels"]
        assert kernel["local_bytes"] == 0, f"{config.short()}: spills"
        (loop,) = kernel["loops"]
        mmas = loop["opcodes"]["HGMMA"]
        assert mmas > 0 and loop["register_a_mmas"] == (mmas if config.SWAP_AB else 0), (config.short(), loop)


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("layout_b", ["col", "row"])
@pytest.mark.parametrize("variant", TRITON_VARIANTS)
def test_gpu_every_loop_matches_float64_and_the_baseline(variant, layout_b):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 weights need compute capability 8.9 or newer")
    m, n, k = 300, 520, 1040
    configs = (
        Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant=variant),
        Config(16, 64, 256, 1, num_warps=4, num_stages=4, variant=variant),
        Config(256, 128, 128, 8, num_warps=8, num_stages=3, variant=variant, SWAP_AB=1),
        Config(16, 64, 256, 1, num_warps=4, num_stages=4, variant=variant, SWAP_AB=1),
    )
    torch.manual_seed(1)
    if layout_b == "row" and variant.startswith("tma"):  # rows of 520 fp8 bytes: refused, not misread
        a, b, scale, bias = tensors(m, n, k, torch.bfloat16, FP8["e4m3"], layout_b, "cuda")
        ops_ = {"scale": scale, "bias": bias}
        with pytest.raises(ValueError, match="16-byte aligned rows"):
            checked_launch(
                make_weight_only_problem(a, b, scaled_gelu("bfloat16"), ops_), configs[0], a, b, ops_
            )
        n = 528
    a, b, scale, bias = tensors(m, n, k, torch.bfloat16, FP8["e4m3"], layout_b, "cuda")
    ops_ = {"scale": scale, "bias": bias}
    problem = make_weight_only_problem(a, b, scaled_gelu("bfloat16"), ops_)
    for config in configs:
        if config.SWAP_AB and variant in STREAM_K_VARIANTS:
            assert "not stream-K" in KIND.config_error(problem, config)
            continue
        (out,) = checked_launch(problem, config, a, b, ops_).outs
        (base,) = KIND.baseline(problem, a, b, ops_)
        assert rel_error(out, base.to(out.dtype)) <= 2 * tolerance("bfloat16", "ieee", "bfloat16")


def dual_swiglu(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> tuple:
    """A gated MLP's gate and up on the GPU: 16-bit activations (bf16 unless ``dtype``), two
    e4m3 weights with their scales, ``silu(gate) * up``: (problem, a, w1, w3, operands)."""
    a = torch.randn(m, k, dtype=dtype, device="cuda")
    w1, w3 = weight(n, k, FP8["e4m3"], "cuda"), weight(n, k, FP8["e4m3"], "cuda")
    scales = [torch.rand(n, device="cuda") / 8 + 0.01 for _ in range(2)]
    ops_ = {"weight_scale": scales[0], "weight_scale2": scales[1]}
    epilogue = swiglu_of_scaled(str(dtype).split(".")[1])
    return make_dual_weight_only_problem(a, w1.t(), w3.t(), epilogue, ops_), a, w1, w3, ops_


@pytest.mark.gpu
@pytest.mark.parametrize("variant", TRITON_VARIANTS)
def test_gpu_dual_weight_only_every_loop(variant):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 weights need compute capability 8.9 or newer")
    torch.manual_seed(2)
    problem, a, w1, w3, ops_ = dual_swiglu(300, 520, 1040)
    for config in (
        Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant=variant),
        Config(16, 64, 256, 1, num_warps=4, num_stages=4, variant=variant),
        Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant=variant, SWAP_AB=1),
    ):
        if config.SWAP_AB and variant in STREAM_K_VARIANTS:
            assert "not stream-K" in kind_of(problem).config_error(problem, config)
            continue
        checked_launch(problem, config, a, w1.t(), {"b2": w3.t(), **ops_})


@pytest.mark.gpu
@pytest.mark.parametrize("wide", list(WIDE))
@pytest.mark.parametrize("fp8", list(FP8))
def test_gpu_every_fp8_code_is_read_exactly(wide, fp8):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 weights need compute capability 8.9 or newer")
    test_every_fp8_code_is_read_exactly(wide, fp8, device="cuda")


@pytest.mark.gpu
def test_gpu_compiler_reads_a_dequantized_weight_as_fp8(tmp_path, fresh_compiler):
    model = DequantLinear(1024, 512).cuda()
    x = torch.randn(4, 16, 512, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        out = _compiled(model, tmp_path)(x)
    assert rel_error(out, model.reference(x)) <= tolerance("bfloat16", "ieee", "bfloat16")
    (decision,) = [d for d in epilab.explain() if d.template]
    assert decision.template == "weight_only_matmul"


def test_tuner_searches_a_weight_only_spec_in_the_interpreter(tmp_path):
    """A shapes-file spec with ``weight`` tuned end to end: fp8 B made, every trial checked
    against float64 and recorded under the spec's problem."""
    from epilab.db import TuningDB
    from epilab.tuner.search import Budget
    from epilab.tuner.tune import TuneOptions, Tuner

    spec = Spec(24, 48, 64, weight="float8_e5m2", epilogue="bias_gelu_tanh")
    with TuningDB.open(tmp_path / "t.db") as db:
        options = TuneOptions(
            budget=Budget(trials=3, seconds=600, batch=3), interpret=True, jobs=0, baselines=()
        )
        with Tuner(db, options) as tuner:
            result = tuner.tune(spec)
        assert result.evaluated == 3 and result.best_ms is not None
        records = db.records(spec.problem().key)
        assert [r.status for r in records] == ["ok"] * 3
        assert Problem.from_json(db.problem_json(spec.problem().key)[1]).geometry == WeightGeometry(
            "float8_e5m2"
        )


def test_tune_model_finds_tunes_and_checks_the_weight_only_gemms(tmp_path, monkeypatch, fresh_compiler):
    """``epilab tune --model`` of an MLP of weight-only fp8 linears: both GEMMs found as
    weight-only problems, tuned with their GEMV twins and checked in the compiled model."""
    import json
    import sys
    import textwrap

    from typer.testing import CliRunner

    from epilab.cli import app

    (tmp_path / "fp8w_zoo_for_test.py").write_text(
        textwrap.dedent(
            """
            import torch
            import torch.nn as nn
            import torch.nn.functional as F
            from zoo.quantized import Fp8WeightLinear

            class Mlp(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.up = Fp8WeightLinear(nn.Linear(32, 64))
                    self.down = Fp8WeightLinear(nn.Linear(64, 32))

                def forward(self, x):
                    return self.down(F.gelu(self.up(x)))

            def build():
                return Mlp(), (torch.randn(16, 32).to(torch.bfloat16),)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out_file = tmp_path / "report.json"
    args = ["tune", "--model", "fp8w_zoo_for_test:build", "--interpret", "--db", str(tmp_path / "t.db")]
    args += ["--trials", "1", "--rounds", "6", "--max-rounds", "6", "--out", str(out_file)]
    out = CliRunner().invoke(app, args)
    sys.modules.pop("fp8w_zoo_for_test", None)
    assert out.exit_code == 0, out.output
    report = json.loads(out_file.read_text())
    assert len(report["tuned"]) == 4, report["tuned"]  # each GEMM and its GEMV twin (16 rows)
    with epilab.db.TuningDB.open(tmp_path / "t.db") as db:
        problems = [Problem.from_json(db.problem_json(r["key"])[1]) for r in report["tuned"]]
    assert sorted(p.template for p in problems) == ["weight_only_gemv"] * 2 + ["weight_only_matmul"] * 2
    assert len(report["verdicts"]) == 2


@pytest.mark.parametrize("per_tensor", [False, True])
def test_backward_through_a_dequantized_weight(tmp_path, fresh_compiler, per_tensor):
    """Training through a frozen fp8 weight: the forward reads it as fp8; the input's gradient
    (grad_y @ dequant(w8), where a per-channel scale runs along K and is no epilogue scale) reads
    the 16-bit weight the graph keeps. The gradient matches float64."""
    model = DequantLinear(40, 64, per_tensor=per_tensor)
    x = torch.randn(12, 64, dtype=torch.bfloat16, requires_grad=True)
    out = _compiled(model, tmp_path)(x)
    out.float().square().sum().backward()
    x64 = x.detach().double().requires_grad_()
    model.reference(x64).square().sum().backward()
    assert rel_error(x.grad, x64.grad) <= 4 * tolerance("bfloat16", "ieee", "bfloat16")
    forward, backward = [d for d in epilab.explain() if d.template]
    assert forward.template == "weight_only_gemv" and "weight_only" not in backward.template  # M 12
