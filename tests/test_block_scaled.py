"""Block-scaled fp8 matmuls (DeepSeek-V3's scales: A's per row and 128 of K, B's per 128x128
block): the block_scaled_matmul kind on every Triton loop against float64, the API, the
config rules, the spec and suite, the compiler's anchor, and on the GPU against
torch._scaled_mm's block scaling (cuBLASLt)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import triton
from records import record
from zoo.quantized import Fp8BlockLinear

import epilab
from epilab.api.matmul import block_scales
from epilab.compiler.decide import Context, Decision, decide
from epilab.db import INTERPRETER_DEVICE, TuningDB, Versions
from epilab.ir.check import rel_error, tolerance
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.ir.problem import Problem
from epilab.policy.space import HOPPER, infeasible, space_for
from epilab.policy.suites import suite
from epilab.templates.gemm.block_scaled import (
    A_SCALES,
    B_SCALES,
    KIND,
    cublaslt_layouts,
    dequantized,
    make_block_problem,
    scale_shapes,
)
from epilab.templates.gemm.gemm_spec import Spec
from epilab.templates.gemm.matmul_config import TRITON_VARIANTS
from epilab.templates.gemm.ops import BLOCK_SCALED_OP
from epilab.templates.registry import default_config, kind_of
from epilab.templates.verify import checked_launch

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8_tensor(rows: int, cols: int, dtype: torch.dtype, transposed: bool = False, device: str = "cpu"):
    t = (torch.randn((cols, rows) if transposed else (rows, cols), device=device) * 4).to(dtype)
    return t.t() if transposed else t


def block_tensors(m: int, n: int, k: int, dtype: torch.dtype, layout_b: str = "col", device: str = "cpu"):
    """A [M, K], B [K, N] (column-major: a weight's [N, K] transposed, or row-major) and their
    scales, positive and different per group."""
    a = fp8_tensor(m, k, dtype, device=device)
    b = fp8_tensor(k, n, dtype, layout_b == "col", device)
    scales = {name: torch.rand(shape, device=device) + 0.1 for name, shape in scale_shapes(m, n, k).items()}
    return a, b, scales


def reference(a, b, scales, bias=None, act=None):
    a64, b64 = dequantized(a, b, scales, torch.float64)
    y = a64 @ b64
    y = y if bias is None else y + bias.double()
    return y if act is None else act(y)


# ------------------------------------------------------------------ CPU (interpreter)


@pytest.mark.parametrize("variant", TRITON_VARIANTS)
def test_every_loop_matches_float64_with_partial_groups(variant):
    """N = 200 and K = 304 leave a partial block of B's scales and a partial group of K; a
    tile of 256 columns spans two of B's groups; bf16 and fp8 outputs of bias + GELU."""
    m, n, k = 37, 200, 304
    torch.manual_seed(k)
    a, b, scales = block_tensors(m, n, k, FP8["e4m3"])
    bias = torch.randn(n, dtype=torch.bfloat16)
    x = ops.gelu_tanh(acc() + operand("bias", "row"))
    ep = Epilogue.build([(x, "bfloat16"), (x * 0.5, "float8_e4m3fn")])  # within e4m3's range
    tensors = {**scales, "bias": bias}
    problem = make_block_problem(a, b, ep, tensors)
    assert (problem.op, problem.template) == ("block_scaled_mm", "block_scaled_matmul")
    for config in (
        Config(32, 64, 64, 4, num_warps=4, num_stages=2, variant=variant),
        Config(16, 256, 32, 4, num_warps=4, num_stages=2, variant=variant),
    ):
        checked_launch(problem, config, a, b, tensors)


@pytest.mark.parametrize("fp8", list(FP8))
@pytest.mark.parametrize("layout_b", ["col", "row"])
def test_promotion_and_split_k_keep_each_group_scaled(fp8, layout_b):
    m, n, k = 20, 144, 512  # N: a partial block of B's scales, rows 16-byte aligned for TMA
    torch.manual_seed(7)
    a, b, scales = block_tensors(m, n, k, FP8[fp8], layout_b)
    problem = make_block_problem(a, b, Epilogue.build([(acc(), "float32")]), scales)
    for config in (
        Config(16, 32, 32, 4, num_warps=4, num_stages=2, variant="tma", PROMOTE=4),
        Config(16, 32, 64, 4, 4, num_warps=4, num_stages=2),  # split-K: four shares of K
    ):
        (out,) = checked_launch(problem, config, a, b, scales).outs
        assert rel_error(out, reference(a, b, scales)) <= tolerance(problem.dtype, "ieee", "float32")


def test_a_wrong_scale_is_seen():
    """The check is not blind to the scales: one group's scale changed moves the result."""
    m, n, k = 16, 128, 256
    a, b, scales = block_tensors(m, n, k, FP8["e4m3"])
    problem = make_block_problem(a, b, Epilogue.build([(acc(), "float32")]), scales)
    (out,) = checked_launch(problem, Config(16, 32, 64, 4, num_warps=4, num_stages=1), a, b, scales).outs
    other = dict(scales, b_scales=scales[B_SCALES].clone())
    other[B_SCALES][1, 0] *= 2
    assert rel_error(out, reference(a, b, other)) > 0.05


def test_api_takes_block_scales_as_a_weight_stores_them():
    """``epilab.matmul(x8, w8.t(), scale_a=[M, K/128], scale_b=[N/128, K/128])``."""
    m, n, k = 33, 160, 384
    torch.manual_seed(3)
    x, w = fp8_tensor(m, k, FP8["e4m3"]), fp8_tensor(n, k, FP8["e4m3"])
    sx, sw = torch.rand(m, 3) + 0.1, torch.rand(2, 3) + 0.1
    bias = torch.randn(n, dtype=torch.bfloat16)
    out = epilab.matmul(x, w.t(), scale_a=sx, scale_b=sw, bias=bias, activation="silu")
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    ref = reference(x, w.t(), {A_SCALES: sx, B_SCALES: sw.t()}, bias, F.silu)
    assert rel_error(out, ref) <= tolerance("float8_e4m3fn", "ieee", "bfloat16")
    assert block_scales(x, w.t(), sx, sw)


def test_untuned_on_sm90_is_the_cooperative_kernel_where_its_tiles_fill_the_gpu():
    """An untuned call on an sm_90 GPU runs the cooperative kernel where it has a tile for every
    SM (4-6x the heuristic's Triton loop at M = 4096); fewer tiles, other GPUs and the
    interpreter keep the heuristic."""
    big = Spec(4096, 7168, 2048, dtype="float8_e4m3fn", scales="block").problem()
    hopper = default_config(big, "cuda", sm_count=132, capability="9.0")
    assert hopper == KIND.seeds[0] and hopper.variant == "sm90_cooperative"
    assert infeasible(big, hopper, dataclasses.replace(HOPPER, interpreter=False)) is None
    heuristic = default_config(big, "cuda", sm_count=132)
    assert heuristic.variant in TRITON_VARIANTS
    assert default_config(big, "cuda", sm_count=132, capability="8.9") == heuristic
    assert default_config(big, "interpreter", capability="9.0").variant in TRITON_VARIANTS
    for m, n in ((16, 7168), (128, 6144), (640, 2112)):  # 56, 48 and 85 tiles of 128 x 128
        few = Spec(m, n, 2048, dtype="float8_e4m3fn", scales="block").problem()
        assert default_config(few, "cuda", capability="9.0").variant in TRITON_VARIANTS, (m, n)
    # 384 x 5632: 2 x 44 tiles of 192 rows, 3 x 44 of 128
    mid = default_config(Spec(384, 5632, 7168, dtype="float8_e4m3fn", scales="block").problem(), "cuda", capability="9.0")  # fmt: skip
    assert mid.variant == "sm90_cooperative" and mid.BLOCK_M == 128
    # the quantize step (groups one a tile) and an fp8 output take it too
    quant = Spec(2048, 14336, 4096, dtype="float8_e4m3fn", scales="block", epilogue="silu", quantize=128)
    config = default_config(quant.problem(), "cuda", capability="9.0")
    assert config.variant == "sm90_cooperative" and KIND.config_error(quant.problem(), config) is None


def test_the_baseline_gets_cublaslts_layouts_made_once():
    """The tuner times cuBLASLt on the scales laid out as it takes them (A's M-major, B's
    K-major), made before its timing (``baseline_layouts``); other kinds' operands pass as given."""
    *_, scales = block_tensors(200, 384, 1024, FP8["e4m3"])
    laid = KIND.baseline_layouts({**scales, "bias": torch.ones(384)})
    assert laid[A_SCALES].stride() == (1, 200) and laid[B_SCALES].stride() == (1, 8)
    assert all(torch.equal(laid[n], scales[n]) for n in scales) and "bias" in laid
    assert cublaslt_layouts(laid)[A_SCALES].data_ptr() == laid[A_SCALES].data_ptr()  # no copy twice
    given = {"bias": torch.ones(8)}
    assert kind_of("matmul").baseline_layouts(given) is given


def test_rowwise_reading_wins_where_both_mean_the_same():
    """K, N <= 128: [M, 1] and [1, 1] are rowwise and tensorwise scales, the same product as
    a single block's; [M, 1] with [1, N] stays rowwise."""
    x, w = fp8_tensor(8, 128, FP8["e4m3"]), fp8_tensor(96, 128, FP8["e4m3"])
    assert not block_scales(x, w.t(), torch.ones(8, 1), torch.ones(1, 1))
    assert not block_scales(x, w.t(), torch.ones(8, 1), torch.ones(1, 96))
    wide = fp8_tensor(256, 128, FP8["e4m3"])
    assert block_scales(x, wide.t(), torch.ones(8, 1), torch.ones(2, 1))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"scale_b": torch.ones(2, 2)}, ValueError, "ceil(N/128), ceil(K/128)"),
        ({"use_fast_accum": True}, ValueError, "use_fast_accum does not apply"),
        ({"scale_a": torch.ones(8, 3, dtype=torch.float64)}, TypeError, "float32"),
    ],
)
def test_bad_block_scales_are_refused_clearly(kwargs, error, message):
    x, w = fp8_tensor(8, 384, FP8["e4m3"]), fp8_tensor(256, 384, FP8["e4m3"])
    given = {"scale_a": torch.ones(8, 3), "scale_b": torch.ones(2, 3), **kwargs}
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        epilab.matmul(x, w.t(), **given)


def test_problem_rules_and_config_rules():
    a, b, scales = block_tensors(64, 256, 512, FP8["e4m3"])
    problem = make_block_problem(a, b, Epilogue.identity("bfloat16"), scales)
    assert Problem.from_json(problem.to_json()) == problem
    with pytest.raises(ValueError, match="exact accumulation"):
        Problem.from_dict({**problem.to_dict(), "precision": "fast"})
    with pytest.raises(TypeError, match="fp8 inputs"):
        make_block_problem(
            a.float().to(torch.bfloat16), b.float().to(torch.bfloat16), problem.epilogue, scales
        )
    with pytest.raises(ValueError, match=r"b_scales must be float32 of shape \[4, 2\]"):
        make_block_problem(a, b, problem.epilogue, {**scales, B_SCALES: torch.ones(2, 4)})
    fits = Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma")
    assert KIND.config_error(problem, fits) is None
    too_long = Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant="tma", PROMOTE=2)
    assert "must divide 128" in KIND.config_error(problem, too_long)
    assert "must divide 128" in KIND.config_error(problem, Config(64, 64, 256, 8, num_warps=4))
    gluon = Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="sm90_pingpong")
    assert "Triton loops" in KIND.config_error(problem, gluon)


def test_fp8_block_suite_specs_make_block_problems_the_tuner_can_search():
    specs = suite("fp8-block")
    assert len(specs) == 46 and all(s.scales == "block" for s in specs)
    assert {(s.n, s.k) for s in specs if s.m == 4096} == {
        (2112, 7168),
        (24576, 1536),
        (32768, 512),
        (7168, 16384),
        (4096, 7168),
        (7168, 2048),
    }
    problem = specs[0].problem()
    assert problem.template == "block_scaled_matmul" and "block-scaled" in specs[0].label()
    assert kind_of(problem) is KIND and problem.operands == ()
    feasible = [
        c
        for c in KIND.seeds_for(problem)
        if infeasible(problem, c, HOPPER) is None and KIND.config_error(problem, c) is None
    ]
    assert feasible and space_for(problem)["PROMOTE"] == (1, 2, 4)
    with pytest.raises(ValueError, match="2-D"):
        Spec(64, 256, 256, batch=2, dtype="float8_e4m3fn", scales="block")


def test_compiler_anchors_a_block_scaled_mm(tmp_path, fresh_compiler):
    """torch._scaled_mm with block scales (its own shapes: [M, K/128], [K/128, N/128]) and a
    GELU after it: one block-scaled group."""
    torch._inductor.config.force_disable_caches = True

    def f(x, w, sx, sw):
        y = torch._scaled_mm(x, w.t(), sx, sw, out_dtype=torch.bfloat16)
        return F.gelu(y, approximate="tanh")

    m, n, k = 24, 256, 384
    x, w = fp8_tensor(m, k, FP8["e4m3"]), fp8_tensor(n, k, FP8["e4m3"])
    sx = (torch.rand(3, m) + 0.5).t()  # M-major, as cuBLASLt takes it
    sw = (torch.rand(2, 3) + 0.5).t()  # [K/128, N/128] with stride (1, K/128)
    g = torch.compile(f, backend="epilab", options={"policy": "always", "db": str(tmp_path / "t.db")})
    out = g(x, w, sx, sw)
    ref = F.gelu(reference(x, w.t(), {A_SCALES: sx, B_SCALES: sw}), approximate="tanh")
    assert rel_error(out, ref) <= tolerance("float8_e4m3fn", "ieee", "bfloat16")
    (decision,) = [d for d in epilab.explain() if d.template]
    assert decision.anchor == "aten.scaled_mm" and decision.template == "block_scaled_matmul"
    assert "scale_a" not in decision.epilogue and "tanh" in decision.epilogue


class BlockLinear(torch.nn.Module):
    """A linear layer in DeepSeek-V3's fp8 written in torch ops (the zoo's ``Fp8BlockLinear``),
    with a bias and a GELU after it."""

    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        self.linear = Fp8BlockLinear(torch.nn.Linear(k, n)).to(torch.bfloat16)  # the scales too, as a model's

    def forward(self, x):
        return F.gelu(self.linear(x), approximate="tanh")

    def reference(self, x):
        """float64 of what the layer means: x quantized per token group as forward does, both
        dequantized exactly, the bias, the GELU."""
        groups = x.unflatten(-1, (-1, 128)).float()
        sx = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448
        xd = ((groups / sx).to(FP8["e4m3"]).double() * sx.double()).flatten(-2)
        w8, s = self.linear.weight_bytes.view(FP8["e4m3"]), self.linear.scale
        (n, k) = w8.shape
        w = (w8.double().view(n // 128, 128, k // 128, 128) * s.double()[:, None, :, None]).view(n, k)
        return F.gelu(xd @ w.t() + self.linear.bias.double(), approximate="tanh")


def test_compiler_reads_block_dequantized_inputs_as_a_block_scaled_mm(tmp_path, fresh_compiler):
    """linear(dequant(x8, sx), dequant(w8, sw)) of a 3-D activation quantized per token group
    and a weight per 128x128 block (both in torch ops, the form a model without a block-scaled
    GEMM takes), with its bias and a GELU: one block-scaled group reading the fp8 tensors, their
    scales viewed as the kind takes them; neither 16-bit tensor is made for the GEMM."""
    torch._inductor.config.force_disable_caches = True
    torch.manual_seed(3)
    model = BlockLinear(256, 384)
    x = torch.randn(2, 5, 384, dtype=torch.bfloat16)
    g = torch.compile(model, backend="epilab", options={"policy": "always", "db": str(tmp_path / "t.db")})
    with torch.no_grad():
        out = g(x)
    assert rel_error(out, model.reference(x)) <= tolerance("float8_e4m3fn", "ieee", "bfloat16")
    (decision,) = [d for d in epilab.explain() if d.template]
    assert decision.anchor == "aten.addmm" and decision.template == "block_scaled_matmul"
    assert "tanh" in decision.epilogue and "scale" not in decision.epilogue


def test_a_dequantize_then_mm_is_not_held_to_cublaslts_fp8_baseline(tmp_path, fresh_compiler):
    """A block-dequantized layer's problem recorded with a cuBLASLt baseline (0.5 ms) faster
    than its tuned kernel (1.0 ms). The layer still takes the template: without it the graph
    dequantizes both inputs and runs a 16-bit GEMM, which the baseline does not time. The
    same problem from a ``_scaled_mm`` anchor (``aten_dequantizes`` False: the aten op is that
    cuBLASLt GEMM) keeps the aten op."""
    torch._inductor.config.force_disable_caches = True
    torch.manual_seed(5)
    model = BlockLinear(256, 384)
    x = torch.randn(24, 384, dtype=torch.bfloat16)
    db = str(tmp_path / "t.db")

    def compiled() -> tuple[torch.Tensor, Decision]:
        epilab.explain(clear=True)
        with torch.no_grad():
            out = torch.compile(model, backend="epilab", options={"db": db})(x)
        torch._dynamo.reset()
        (d,) = [d for d in epilab.explain() if d.problem_key]
        return out, d

    _, seen = compiled()
    assert seen.template is None and "nothing recorded" in seen.reason
    with TuningDB.open(db) as tuning:
        text = tuning.problem_json(seen.problem_key)
    problem = Problem.from_json(text[1] if isinstance(text, tuple) else text)
    assert problem.op == BLOCK_SCALED_OP
    record(db, problem, default_config(problem, "interpreter").to_dict(), trial_ms=1.0, baseline_ms=0.5)
    out, d = compiled()
    assert d.template == "block_scaled_matmul", d.reason
    assert "dequantizes the fp8 inputs" in d.reason and "cublas" in d.reason, d.reason
    assert rel_error(out, model.reference(x)) <= tolerance("float8_e4m3fn", "ieee", "bfloat16")
    with TuningDB.open(db) as tuning:
        ctx = Context(
            "auto", INTERPRETER_DEVICE, "interpreter", Versions(torch.__version__, triton.__version__), tuning
        )
        anchored, _, _ = decide(problem, ctx, "aten.scaled_mm", seen.shape)
    assert anchored.template is None and "cublas 0.5 ms is faster than the tuned 1 ms" in anchored.reason


def test_block_dequantized_mm_needs_both_inputs_in_blocks(tmp_path, fresh_compiler):
    """A block-dequantized weight under a 16-bit activation, blocks of 64, and an e5m2 activation
    with an e4m3 weight: the mm reads the dequantized 16-bit tensors, as the graph has them (the
    matmul template)."""
    torch._inductor.config.force_disable_caches = True
    torch.manual_seed(4)
    w8 = fp8_tensor(256, 256, FP8["e4m3"])
    sw = torch.rand(2, 2) + 0.5
    sw64 = torch.rand(4, 4) + 0.5

    def weight_only(x):
        return x @ (w8.float().view(2, 128, 2, 128) * sw[:, None, :, None]).view(256, 256).bfloat16().t()

    def blocks_of_64(x):
        groups = x.unflatten(-1, (-1, 64)).float()
        sx = groups.abs().amax(dim=-1, keepdim=True) / 448
        xd = ((groups / sx).to(FP8["e4m3"]).float() * sx).flatten(-2).bfloat16()
        return xd @ (w8.float().view(4, 64, 4, 64) * sw64[:, None, :, None]).view(256, 256).bfloat16().t()

    def two_dtypes(x):  # e5m2 activations, e4m3 weights: the kind reads one fp8 dtype
        groups = x.unflatten(-1, (-1, 128)).float()
        sx = groups.abs().amax(dim=-1, keepdim=True) / 57344
        xd = ((groups / sx).to(FP8["e5m2"]).float() * sx).flatten(-2).bfloat16()
        return xd @ (w8.float().view(2, 128, 2, 128) * sw[:, None, :, None]).view(256, 256).bfloat16().t()

    x = torch.randn(40, 256, dtype=torch.bfloat16)
    for f in (weight_only, blocks_of_64, two_dtypes):
        epilab.explain(clear=True)
        g = torch.compile(f, backend="epilab", options={"policy": "always", "db": str(tmp_path / "t.db")})
        assert rel_error(g(x), f(x)) <= tolerance("bfloat16", "ieee", "bfloat16")
        templates = {d.template for d in epilab.explain() if d.template}
        assert "block_scaled_matmul" not in templates and "matmul" in templates, (f.__name__, templates)


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
def test_gpu_untuned_call_runs_the_cooperative_kernel_and_matches_float64():
    """The API without a config on an sm_90 GPU: the cooperative kernel (ragged M and N, K of
    13 groups: 6 x 33 tiles), bias and SiLU, against float64 of the dequantized inputs."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the cooperative kernel is sm_90's")
    m, n, k = 1000, 4160, 1664
    torch.manual_seed(k)
    x, w = fp8_tensor(m, k, FP8["e4m3"], device="cuda"), fp8_tensor(n, k, FP8["e4m3"], device="cuda")
    sx = torch.rand(m, 13, device="cuda") + 0.1
    sw = torch.rand(33, 13, device="cuda") + 0.1
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        out = epilab.matmul(x, w.t(), scale_a=sx, scale_b=sw, bias=bias, activation="silu")
    problem = make_block_problem(x, w.t(), Epilogue.identity("bfloat16"), {A_SCALES: sx, B_SCALES: sw.t()})
    facts = torch.cuda.get_device_properties(0)
    assert default_config(
        problem, "cuda", sm_count=facts.multi_processor_count, capability="9.0"
    ).variant == ("sm90_cooperative")
    ref = reference(x, w.t(), {A_SCALES: sx, B_SCALES: sw.t()}, bias, F.silu)
    assert rel_error(out, ref) <= tolerance("float8_e4m3fn", "ieee", "bfloat16")


@pytest.mark.gpu
def test_gpu_the_tuners_cublaslt_baseline_matches_float64():
    """``evaluate_baseline`` on a block-scaled problem (16 K groups: cuBLASLt's block scaling):
    timed, on the layouts made beforehand, and as close to float64 as the kind's kernels."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuBLASLt's block scaling (torch._scaled_mm) needs sm_90")
    from epilab.tuner.evaluate import evaluate_baseline

    problem = Spec(1000, 2112, 2048, dtype="float8_e4m3fn", scales="block").problem()
    result = evaluate_baseline(problem.to_json(), "cublas", seed=0)
    assert result["status"] == "ok", result
    assert result["max_rel_error"] <= tolerance("float8_e4m3fn", "ieee", "bfloat16")
    assert 0 < result["median_ms"] < 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("variant", TRITON_VARIANTS)
def test_gpu_every_loop_matches_float64_and_the_baseline(variant):
    """N = 2112 (16.5 blocks of B's scales), K of 16 groups (cuBLASLt's block scaling) and of 13
    (where torch 2.11's is wrong and the baseline dequantizes to bf16 instead)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuBLASLt's block scaling (torch._scaled_mm) needs sm_90")
    for k in (2048, 1664):
        torch.manual_seed(k)
        a, b, scales = block_tensors(1000, 2112, k, FP8["e4m3"], device="cuda")
        problem = make_block_problem(a, b, Epilogue.identity("bfloat16"), scales)
        ref = reference(a, b, scales)
        baseline = rel_error(KIND.baseline(problem, a, b, scales)[0], ref)
        assert baseline <= tolerance("float8_e4m3fn", "ieee", "bfloat16"), (k, baseline)
        for config in (
            Config(128, 128, 128, 8, num_warps=8, num_stages=3, variant=variant),
            Config(64, 256, 64, 8, num_warps=8, num_stages=3, variant=variant),
        ):
            (out,) = checked_launch(problem, config, a, b, scales).outs
            assert rel_error(out, ref) <= 1.5 * max(baseline, 1e-3), (k, config.short())
