"""The quantize-activation step in the epilogue (issue 44): an output quantized to fp8 per row
and group of columns, with its scales, as DeepSeek-V3 quantizes the activations its
block-scaled GEMMs read (``ir.quantize``: ``group_max`` nodes and group outputs).

Every kernel is checked against the float64 reference (``verify.checked_launch``) on awkward
shapes (a partial last group, partial tiles, several groups a tile), on the interpreter's
main loops; the quantized values are also checked bitwise against torch quantizing the
kernel's own unquantized output with the kernel's scales. The ``gpu`` tests add real sizes,
the TMA loops and the block-scaled GEMM reading what the gated GEMM quantized.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from typer.testing import CliRunner
from zoo.quantized import Fp8BlockLinear

import epilab
from epilab.cli import app
from epilab.db import INTERPRETER_DEVICE, TuningDB
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.ir.epilogue import GROUP_REDUCE, Epilogue, acc, acc2, group_max, operand, ops
from epilab.ir.quantize import quantized_groups
from epilab.policy.suites import suite
from epilab.templates import registry
from epilab.templates.gemm.dual_matmul import make_dual_problem
from epilab.templates.gemm.gemm_spec import FORMAT, Spec
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.verify import checked_launch

E4M3 = torch.float8_e4m3fn
LOOPS = {
    "default": Config(16, 32, 16, num_warps=4, num_stages=1),
    "one_group": Config(32, 16, 16, num_warps=4, num_stages=1),  # a tile one group wide: row maxima
    "subtile2": Config(16, 64, 16, num_warps=4, num_stages=1, EPILOGUE_SUBTILE=2),
    "split_k": Config(16, 32, 16, SPLIT_K=2, num_warps=4, num_stages=1),
    "persistent": Config(32, 64, 16, num_warps=4, num_stages=1, variant="persistent"),
}


def torch_quantized(y: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What the unfused graph computes (Fp8BlockLinear's activation step), any N: the last
    group over the columns it has."""
    n = y.shape[-1]
    padded = torch.nn.functional.pad(y.float(), (0, -n % size))
    groups = padded.unflatten(-1, (-1, size))
    scale = groups.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448
    q = (groups / scale).to(E4M3).flatten(-2)[..., :n]
    return q, scale.squeeze(-1)


def bias_gelu(dtype: str = "bfloat16") -> Epilogue:
    return Epilogue.build([(ops.gelu(acc() + operand("bias", "row")), dtype)])


# ------------------------------------------------------------------ the IR


def test_the_quantized_epilogue_round_trips_and_its_reference_is_torchs():
    ep = quantized_groups(bias_gelu(), 16)
    assert ep.group_size == 16 and ep.reductions == ()
    assert [(o.dtype, o.reduce, o.group) for o in ep.outputs] == [
        ("float8_e4m3fn", "", 0),
        ("float32", GROUP_REDUCE, 16),
    ]
    assert Epilogue.from_json(ep.to_json()) == ep and "group_max[16]" in ep.text()
    assert ep.outputs[1].shape((3, 40)) == (3, 3)  # 40 columns: two groups and a partial one
    acc64, bias = torch.randn(3, 40, dtype=torch.float64), torch.randn(40, dtype=torch.float64)
    q, scale = ep.evaluate(acc64, {"bias": bias})
    y = torch.nn.functional.gelu(acc64 + bias).to(torch.bfloat16)
    want_q, want_scale = torch_quantized(y, 16)
    torch.testing.assert_close(scale.float(), want_scale, rtol=1e-6, atol=0)
    assert (q.to(E4M3).float() - want_q.float()).abs().max() <= 0.0625 * want_q.float().abs().max()


def test_group_widths_and_outputs_are_validated():
    x = acc()
    for bad in (3, 0, 2048, 12.5, True):
        with pytest.raises(ValueError, match="group"):
            Epilogue.build([(x / group_max(abs(x), bad), "float32")])
    with pytest.raises(ValueError, match="one way"):
        Epilogue.build([(x / group_max(x, 16), "float32"), (group_max(x, 32), "float32", GROUP_REDUCE, 32)])
    with pytest.raises(ValueError, match="float32"):
        Epilogue.build([(group_max(x, 16), "bfloat16", GROUP_REDUCE, 16)])
    with pytest.raises(ValueError, match="group width"):
        Epilogue.build([(x, "float32", GROUP_REDUCE)])
    with pytest.raises(ValueError, match="group width"):
        Epilogue.build([(x, "float32", "row_max", 16)])
    with pytest.raises(ValueError, match="not a valid epilogue"):
        Epilogue.from_json('{"nodes": [["acc", [], {}]], "outputs": [[0, "float32", "group_max", "x"]]}')
    with pytest.raises(ValueError, match="one tile output"):
        quantized_groups(Epilogue.build([(x, "float32"), (x, "float32", "row_max")]))
    with pytest.raises(ValueError, match="quantize to one of"):
        quantized_groups(Epilogue.identity("bfloat16"), 128, "int8")


# ------------------------------------------------------------------ the kernels (interpreter)


@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("shape", [(20, 40, 24), (33, 64, 40), (5, 96, 16)], ids=str)
def test_a_matmul_quantizes_its_output_in_the_epilogue(shape, loop):
    m, n, k = shape
    torch.manual_seed(m * n)
    a, b = torch.randn(m, k).to(torch.bfloat16), torch.randn(k, n).to(torch.bfloat16)
    bias = torch.randn(n).to(torch.bfloat16)
    problem = make_problem(a, b, quantized_groups(bias_gelu(), 16), {"bias": bias}, op="addmm")
    q, scale = checked_launch(problem, LOOPS[loop], a, b, {"bias": bias}).outs
    plain = make_problem(a, b, bias_gelu(), {"bias": bias}, op="addmm")
    (y,) = checked_launch(plain, LOOPS[loop], a, b, {"bias": bias}).outs
    want_q, want_scale = torch_quantized(y, 16)
    assert torch.equal(scale, want_scale)  # the same fp32 ops on the same rounded values
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))


@pytest.mark.parametrize("loop", ["default", "one_group", "subtile2"])
def test_a_group_output_of_any_value_is_its_max_over_the_group(loop):
    """A group output of a value that varies along the group (not a scale): the kernel takes
    its max over each group first; a column operand is constant along the groups."""
    m, n, k = 21, 72, 24
    torch.manual_seed(k)
    a, b = torch.randn(m, k).to(torch.bfloat16), torch.randn(k, n).to(torch.bfloat16)
    col, row = torch.randn(m, 1), torch.randn(n)
    x = acc() + operand("row", "row")
    ep = Epilogue.build([(x, "bfloat16"), (x * operand("col", "col"), "float32", GROUP_REDUCE, 16)])
    names = {n.attr.get("name"): i for i, n in enumerate(ep.nodes) if n.op == "operand"}
    assert names["col"] in ep.group_constant and names["row"] not in ep.group_constant
    assert ep.outputs[1].node not in ep.group_constant
    checked_launch(
        make_problem(a, b, ep, {"row": row, "col": col}), LOOPS[loop], a, b, {"row": row, "col": col}
    )


def test_the_api_quantizes_and_its_config_must_hold_whole_groups():
    torch.manual_seed(1)
    a, b = torch.randn(24, 32).to(torch.bfloat16), torch.randn(32, 64).to(torch.bfloat16)
    with torch.no_grad():
        q, scale = epilab.matmul(a, b, activation="silu", quantize=32)
        y = epilab.matmul(a, b, activation="silu")
    assert q.dtype == E4M3 and q.shape == (24, 64) and scale.shape == (24, 2)
    want_q, want_scale = torch_quantized(y, 32)
    assert torch.equal(scale, want_scale) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    problem = make_problem(a, b, quantized_groups(Epilogue.identity("bfloat16"), 32), {})
    kind = registry.kind_of(problem)
    assert "multiple of 32" in kind.config_error(problem, Config(16, 16, 16))
    assert "multiple of 32" in kind.config_error(problem, Config(16, 32, 16, EPILOGUE_SUBTILE=2))
    assert "TMA_STORE" in kind.config_error(problem, Config(64, 64, 64, variant="tma", TMA_STORE=1))
    assert "BLOCK_N = 32" in kind.config_error(problem, Config(64, 64, 64, variant="sm90_pingpong"))
    assert kind.config_error(problem, Config(64, 32, 64, variant="sm90_pingpong", TMA_STORE=1)) is None
    assert registry.default_config(problem, "interpreter").BLOCK_N % 32 == 0
    with pytest.raises(TypeError, match="group width"):
        epilab.matmul(a, b, quantize=True)


def test_a_gated_gemm_quantizes_for_a_block_scaled_down_projection():
    """SwiGLU's gate and up in one kernel, quantized per 128 columns; the block-scaled GEMM
    reads its (q, scale) as DeepSeek-V3's down projection does. At M = 4 the dual GEMV would
    run: it has no column groups, so the twin is not taken and the dual matmul runs."""
    m, f, d, n = 4, 256, 32, 48
    torch.manual_seed(3)
    x = torch.randn(m, d).to(torch.bfloat16)
    gate, up = (torch.randn(f, d).to(torch.bfloat16) / 4 for _ in range(2))
    problem = make_dual_problem(x, gate.t(), up.t(), quantized_groups(_swiglu(), 128), {})
    assert registry.twins(problem) == [problem]
    with torch.no_grad():
        q, scale = epilab.gated_matmul(x, gate.t(), up.t(), quantize=128)
        h = epilab.gated_matmul(x, gate.t(), up.t())
    want_q, want_scale = torch_quantized(h, 128)
    assert torch.equal(scale, want_scale) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    w = (torch.randn(n, f) * 4).to(E4M3)
    w_scale = torch.rand(math.ceil(n / 128), f // 128) + 0.1  # [N/128, K/128], as a weight stores it
    with torch.no_grad():
        out = epilab.matmul(q, w.t(), scale_a=scale, scale_b=w_scale)
    deq_h = q.double() * scale.double().repeat_interleave(128, 1)
    deq_w = w.double() * w_scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:n]
    ref = deq_h @ deq_w.t()
    assert (out.double() - ref).norm() / ref.norm() < 1e-2


def _swiglu() -> Epilogue:
    return Epilogue.build([(ops.silu(acc()) * acc2(), "bfloat16")])


def test_kinds_without_column_groups_refuse_them():
    a, b = torch.randn(4, 32).to(torch.bfloat16), torch.randn(32, 64).to(torch.bfloat16)
    problem = make_problem(a, b, quantized_groups(Epilogue.identity("bfloat16"), 32), {})
    gemv = registry.for_template(make_problem(a, b, Epilogue.identity("bfloat16"), {}), "gemv")
    grouped = dataclasses.replace(gemv, epilogue=problem.epilogue)
    assert "no column groups" in registry.kind_of(grouped).config_error(grouped, Config(16, 64, 32))
    assert registry.twins(problem) == [problem]  # no gemv twin at M = 4
    assert registry.untuned_choice(problem) == problem


# ------------------------------------------------------------------ GPU

GPU_LOOPS = {
    "default": Config(128, 128, 64, 8, num_warps=8, num_stages=3),
    "subtile2": Config(128, 256, 64, 8, num_warps=8, num_stages=3, EPILOGUE_SUBTILE=2),
    "tma": Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="tma"),
    "tma_persistent": Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="tma_persistent", FLATTEN=1),
    "split_k": Config(64, 128, 64, 8, SPLIT_K=4, num_warps=4, num_stages=3),
    # the Gluon kernels (Hopper): one group a tile, q staged for TMA stores, the scales by pointers
    "sm90_pingpong": Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="sm90_pingpong", TMA_STORE=1),
    "sm90_persistent": Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="sm90_persistent"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("loop", list(GPU_LOOPS))
@pytest.mark.parametrize("shape", [(1000, 1536, 512), (4096, 2048, 1024), (40, 640, 4096)], ids=str)
def test_quantized_matmul_on_gpu(shape, loop):
    if loop.startswith("sm90") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"{loop} is a Gluon kernel for sm_90")
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(m)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16).t()
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    problem = make_problem(a, b, quantized_groups(bias_gelu(), 128), {"bias": bias}, op="addmm")
    q, scale = checked_launch(problem, GPU_LOOPS[loop], a, b, {"bias": bias}).outs
    (y,) = checked_launch(
        make_problem(a, b, bias_gelu(), {"bias": bias}, op="addmm"), GPU_LOOPS[loop], a, b, {"bias": bias}
    ).outs
    want_q, want_scale = torch_quantized(y, 128)
    torch.testing.assert_close(scale, want_scale, rtol=2e-7, atol=0)  # the division may round once more
    # fp8 codes: equal but where the scale's last bit moved a value across a rounding boundary
    differ = (q.view(torch.uint8) != want_q.view(torch.uint8)).float().mean().item()
    assert differ < 1e-4, differ


@pytest.mark.gpu
def test_deepseek_mlp_quantizes_on_gpu():
    """DeepSeek-V3's dense MLP at M 2048: gate/up quantized in the epilogue, the block-scaled
    down projection reading them; against float64 of the dequantized tensors."""
    m, f, d = 2048, 18432 // 8, 7168 // 4
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, d, device="cuda", generator=gen).to(torch.bfloat16)
    gate, up = (
        torch.randn(f, d, device="cuda", generator=gen).div(d**0.5).to(torch.bfloat16) for _ in range(2)
    )
    with torch.no_grad():
        q, scale = epilab.gated_matmul(x, gate.t(), up.t(), quantize=128)
        h = epilab.gated_matmul(x, gate.t(), up.t())
    want_q, want_scale = torch_quantized(h, 128)
    torch.testing.assert_close(scale, want_scale, rtol=2e-7, atol=0)
    assert (q.view(torch.uint8) != want_q.view(torch.uint8)).float().mean().item() < 1e-4
    assert math.isfinite(q.float().abs().max().item()) and q.float().abs().max().item() <= 448


# ------------------------------------------------------------------ the compiler


class BlockScaledMlp(nn.Module):
    """A SwiGLU MLP of DeepSeek-V3's fp8 projections (zoo/quantized.py: each input quantized
    per token and ``group`` channels, then dequantized and multiplied in torch ops)."""

    def __init__(self, d: int, f: int, group: int = 128) -> None:
        super().__init__()
        layers = [Fp8BlockLinear(nn.Linear(i, o, bias=False)) for i, o in ((d, f), (d, f), (f, d))]
        for layer in layers:
            layer.BLOCK = group
        self.gate, self.up, self.down = layers

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def _compiled(model, tmp_path):
    return torch.compile(model, backend="epilab", options={"policy": "always", "db": str(tmp_path / "t.db")})


def test_the_quantization_for_the_next_gemm_joins_the_gemm_that_produces_it(tmp_path, fresh_compiler):
    """silu(gate(x)) * up(x) quantized per 128 channels for the block-scaled down projection:
    the gate's kernel stores the fp8 values and their scales (h never stored), the down
    projection reads them as its block-scaled A; the output as the eager model's."""
    torch.manual_seed(0)
    model = BlockScaledMlp(256, 512).to(torch.bfloat16)
    x = torch.randn(2, 16, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        out, eager = _compiled(model, tmp_path)(x), model(x)
    assert rel_error(out, eager) < 3e-2  # both quantize h to e4m3: each rounding a few ulps apart
    producer, *rest = [d for d in epilab.explain() if d.template]
    assert producer.template == "block_scaled_matmul" and "group_max[size=128" in producer.epilogue_ir
    assert "float8_e4m3fn group_max" not in producer.epilogue_ir  # the scales are fp32
    assert "-> group_max[128]" in producer.epilogue  # as users read it
    assert "out %" in producer.epilogue_ir and "float32 group_max[128]" in producer.epilogue_ir
    assert [d.template for d in rest] == ["block_scaled_matmul", "block_scaled_matmul"]


@pytest.mark.parametrize("width", [64, 96])
def test_a_quantization_of_any_power_of_two_groups_joins(tmp_path, fresh_compiler, width):
    """relu(x @ w) quantized per ``width`` channels, its q and scales the graph's outputs: one
    kernel stores both (the scales viewed [M, N / width, 1]); groups of 96 (not a power of
    two) stay Inductor's. Bitwise the graph's values either way."""
    torch.manual_seed(1)
    x = torch.randn(24, 192, dtype=torch.bfloat16)
    w = torch.randn(192, 192, dtype=torch.bfloat16) / 16

    def f(x, w):
        groups = torch.relu(x @ w).unflatten(-1, (-1, width)).float()
        scale = groups.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448
        return (groups / scale).to(E4M3), scale

    with torch.no_grad():
        q, scale = _compiled(f, tmp_path)(x, w)
    want_q, want_scale = f(x, w)
    assert torch.equal(scale, want_scale) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    (decision,) = [d for d in epilab.explain() if d.template]
    assert ("group_max" in decision.epilogue) == (width == 64)


# ------------------------------------------------------------------ specs and the tuner


def test_a_spec_quantizes_as_the_api_does_and_names_what_is_wrong():
    spec = Spec(20, 256, 48, epilogue="silu(acc) * acc2", quantize=128)
    x = torch.randn(20, 48).to(torch.bfloat16)
    gate, up = torch.randn(256, 48).to(torch.bfloat16), torch.randn(256, 48).to(torch.bfloat16)
    made = make_dual_problem(x, gate.t(), up.t(), quantized_groups(_swiglu(), 128), {})
    assert spec.problem() == made and "quantized per 128" in spec.label()
    assert len(suite("mlp-quant")) == 6 and all(
        s.problem().epilogue.group_size == 128 for s in suite("mlp-quant")
    )
    for bad, why in (
        ({"quantize": 96}, "power of two"),
        ({"quantize": "128"}, "must be an int"),
        ({"quantize": 128, "epilogue": "two_outputs"}, "one tile output"),
    ):
        with pytest.raises(ValueError, match=why):
            FORMAT.parse({"m": 20, "n": 256, "k": 48, **bad})


def test_tune_checks_and_records_a_quantized_problem(tmp_path):
    """``epilab tune --shapes`` on a quantized GEMM: every trial is checked against the
    float64 reference (q and the scales), the record's config holds whole groups."""
    shapes = tmp_path / "q.json"
    shapes.write_text(json.dumps([{"m": 24, "n": 64, "k": 32, "epilogue": "bias_silu", "quantize": 32}]))
    db = str(tmp_path / "t.db")
    args = ["tune", "--shapes", str(shapes), "--interpret", "--trials", "3", "--patience", "100", "--db", db]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    problem = FORMAT.parse({"m": 24, "n": 64, "k": 32, "epilogue": "bias_silu", "quantize": 32}).problem()
    with TuningDB.open(db) as store:
        best = store.best(problem.key, INTERPRETER_DEVICE)
    assert best is not None and best.record.config is not None
    assert registry.kind_of(problem).config_error(problem, Config.from_dict(best.record.config)) is None
