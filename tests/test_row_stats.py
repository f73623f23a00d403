"""Reduction outputs (row and column statistics) in the matmul epilogue, and the compiler's
uses of them: RMSNorm folded between two GEMMs, a row amax for dynamic fp8 quantization.

Every kernel output is checked against the float64 reference (``verify.checked_launch``) on
awkward shapes, in both summation modes (fp32 atomics; per-tile partials summed in order,
``EPILAB_DETERMINISTIC``), on every main loop the interpreter runs; the ``gpu`` tests add the
TMA loops, real sizes, bitwise reproducibility of the ordered mode, and a Llama block.
"""

from __future__ import annotations

import math

import pytest
import torch
from zoo.convnets import ConvNeXtBlock
from zoo.transformers import GPT2, Bert, LlamaBlock

import epilab
from epilab import config as epilab_config
from epilab.db import INTERPRETER_DEVICE, TuningDB
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, acc2, operand, ops
from epilab.ir.problem import Problem
from epilab.templates import registry
from epilab.templates.conv.conv2d import make_conv_problem
from epilab.templates.gemm.dual_matmul import make_dual_problem
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.verify import checked_launch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
SHAPES = [(None, 41, 67, 33), (None, 1, 9, 7), (2, 20, 33, 17), (None, 129, 16, 40)]
LOOPS = {
    "default": Config(16, 32, 16, num_warps=4, num_stages=1),
    "subtile2": Config(16, 32, 16, num_warps=4, num_stages=1, EPILOGUE_SUBTILE=2),
    "split_k": Config(16, 32, 16, SPLIT_K=2, num_warps=4, num_stages=1),
    "persistent": Config(16, 32, 16, num_warps=4, num_stages=1, variant="persistent"),
    "stream_k": Config(16, 32, 16, num_warps=4, num_stages=1, variant="stream_k"),
}


def statistics_epilogue(dtype: str) -> Epilogue:
    """A residual add stored at ``dtype``, with every kind of statistic of it and of the
    unrounded sum: what a norm (sum of squares), a quantizer (max |x|) or a LayerNorm reads."""
    h = acc() + operand("res", "tile")
    stored = ops.cast(h, dtype=dtype) if dtype != "float32" else h
    return Epilogue.build(
        [
            (stored, dtype),
            (stored * stored, "float32", "row_sum"),
            (abs(stored), "float32", "row_max"),
            (h, "float32", "col_sum"),
            (h * 0.5, "float32", "col_max"),
        ]
    )


def _tensors(batch, m, n, k, dtype, gen, transposed_b=False):
    lead = () if batch is None else (batch,)
    a = torch.randn(*lead, m, k, generator=gen).to(dtype)
    b = torch.randn(*lead, n, k, generator=gen).to(dtype).transpose(-1, -2) if transposed_b else None
    if b is None:
        b = torch.randn(*lead, k, n, generator=gen).to(dtype)
    res = torch.randn(*lead, m, n, generator=gen).to(dtype)
    return a, b, res


@pytest.mark.parametrize("ordered", [False, True], ids=["atomic", "ordered"])
@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_statistics_match_float64(shape, dtype, loop, ordered):
    if shape[0] is not None and loop in ("persistent", "stream_k") and dtype != "bf16":
        pytest.skip("batched persistent loops: one dtype is enough in the interpreter")
    gen = torch.Generator().manual_seed(1)
    a, b, res = _tensors(*shape, DTYPES[dtype], gen, transposed_b=dtype == "fp16")
    dt = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[dtype]
    problem = make_problem(a, b, statistics_epilogue(dt), {"res": res})
    with epilab_config.patch(deterministic=ordered):
        bound = checked_launch(problem, LOOPS[loop], a, b, {"res": res})
    lead = () if shape[0] is None else (shape[0],)
    assert [tuple(o.shape) for o in bound.outs] == [
        (*lead, shape[1], shape[2]),
        (*lead, shape[1]),
        (*lead, shape[1]),
        (*lead, shape[2]),
        (*lead, shape[2]),
    ]


def test_ordered_statistics_are_bitwise_reproducible():
    gen = torch.Generator().manual_seed(2)
    a, b, res = _tensors(None, 37, 100, 24, torch.float32, gen)
    problem = make_problem(a, b, statistics_epilogue("float32"), {"res": res})
    with epilab_config.patch(deterministic=True):
        first = registry.launch(problem, LOOPS["default"], a, b, {"res": res})
        second = registry.launch(problem, LOOPS["default"], a, b, {"res": res})
    for x, y in zip(first, second, strict=True):
        assert torch.equal(x, y)


def test_statistics_of_a_dual_gemm():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(19, 24, generator=gen).to(torch.bfloat16)
    w, w2 = (torch.randn(24, 40, generator=gen).to(torch.bfloat16) for _ in range(2))
    y = ops.cast(ops.silu(acc()) * acc2(), dtype="bfloat16")
    ep = Epilogue.build([(y, "bfloat16"), (abs(y), "float32", "row_max")])
    problem = make_dual_problem(x, w, w2, ep, {})
    checked_launch(problem, Config(16, 16, 16, num_warps=4, num_stages=1), x, w, {"b2": w2})


def test_statistics_edge_cases():
    # N = 0: the sum over no columns is 0 and the max -inf; K = 0: statistics of the epilogue of 0
    ep = Epilogue.build(
        [(acc(), "float32"), (acc() + 1.0, "float32", "row_sum"), (acc(), "float32", "row_max")]
    )
    for m, n, k in ((5, 0, 3), (5, 4, 0)):
        a, b = torch.randn(m, k), torch.randn(k, n)
        outs = epilab.matmul(a, b, epilogue=ep)
        assert torch.equal(outs[1], torch.full((m,), float(n)))
        assert torch.equal(outs[2], torch.full((m,), -math.inf if n == 0 else 0.0))


def test_reduction_outputs_are_validated_and_round_trip():
    x = acc() * 2.0
    ep = Epilogue.build([(x, "bfloat16"), (x, "float32", "row_sum")])
    assert ep.text().endswith("out %2 bfloat16; out %2 float32 row_sum")
    assert Epilogue.from_json(ep.to_json()) == ep
    assert ep.reductions == (1,)
    with pytest.raises(ValueError, match="stored as float32"):
        Epilogue.build([(x, "bfloat16", "row_sum")])
    with pytest.raises(ValueError, match="row_max"):
        Epilogue.build([(x, "float32", "row_mean")])
    with pytest.raises(ValueError, match="float node"):
        Epilogue.build([(x, "float32"), (ops.gt(x, 0.0), "float32", "row_max")])
    with pytest.raises(ValueError, match=r"\(expr, dtype\)"):
        Epilogue.build([(x,)])  # type: ignore[list-item]


def test_tma_store_refuses_statistics():
    a, b = torch.randn(4, 32), torch.randn(32, 48)
    ep = Epilogue.build([(acc(), "float32"), (acc() * acc(), "float32", "row_sum")])
    problem = make_problem(a, b, ep, {})
    tma = Config(16, 32, 16, variant="tma", TMA_STORE=1)
    assert "TMA_STORE" in registry.kind_of(problem).config_error(problem, tma)


# ------------------------------------------------------------------ gemv and conv2d

GEMV_LOOPS = {
    "default": Config(16, 32, 32, num_warps=4, num_stages=1),
    "two_pass": Config(16, 32, 16, 1, 2, num_warps=4, num_stages=1, variant="two_pass"),
    "atomic": Config(16, 16, 16, 1, 2, num_warps=4, num_stages=1, variant="atomic"),
}


@pytest.mark.parametrize("ordered", [False, True], ids=["atomic", "ordered"])
@pytest.mark.parametrize("loop", list(GEMV_LOOPS))
@pytest.mark.parametrize("shape", [(4, 67, 40), (1, 9, 33), (41, 7, 24)], ids=str)  # last: N <= 16
def test_gemv_statistics_match_float64(shape, loop, ordered):
    gen = torch.Generator().manual_seed(4)
    a, b, res = _tensors(None, *shape, torch.bfloat16, gen)
    problem = make_problem(a, b, statistics_epilogue("bfloat16"), {"res": res})
    assert "gemv" in [t.template for t in registry.twins(problem)]
    gemv = registry.for_template(problem, "gemv")
    with epilab_config.patch(deterministic=ordered):
        bound = checked_launch(gemv, GEMV_LOOPS[loop], a, b, {"res": res})
    m, n, _ = shape
    assert [tuple(o.shape) for o in bound.outs] == [(m, n), (m,), (m,), (n,), (n,)]


@pytest.mark.parametrize("loop", ["default", "two_pass"])
def test_dual_gemv_statistics(loop):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 40, generator=gen).to(torch.bfloat16)
    w, w2 = (torch.randn(40, 70, generator=gen).to(torch.bfloat16) for _ in range(2))
    y = ops.cast(ops.silu(acc()) * acc2(), dtype="bfloat16")
    ep = Epilogue.build([(y, "bfloat16"), (y * y, "float32", "row_sum"), (abs(y), "float32", "col_max")])
    problem = registry.for_template(make_dual_problem(x, w, w2, ep, {}), "dual_gemv")
    checked_launch(problem, GEMV_LOOPS[loop], x, w, {"b2": w2})


CONV_CASES = {  # (n, c, h, w, k, r, s, stride, padding, groups), layout, config
    "3x3-nhwc": ((2, 16, 7, 9, 24, 3, 3, 1, 1, 1), "nhwc", Config(16, 16, 16, 1, num_warps=4, num_stages=1)),
    "3x3-nchw-s2": (
        (1, 16, 9, 8, 20, 3, 3, 2, 1, 1),
        "nchw",
        Config(32, 16, 16, 1, num_warps=4, num_stages=1),
    ),
    "groups2": ((1, 32, 6, 6, 32, 3, 3, 1, 1, 2), "nhwc", Config(16, 16, 16, 1, num_warps=4, num_stages=1)),
    "depthwise": (
        (2, 24, 7, 6, 24, 3, 3, 1, 1, 24),
        "nhwc",
        Config(16, 16, 16, 1, num_warps=4, num_stages=1),
    ),
    "split_k": (
        (1, 32, 5, 5, 16, 3, 3, 1, 1, 1),
        "nhwc",
        Config(16, 16, 16, 1, 2, num_warps=4, num_stages=1),
    ),
    "1x1": ((2, 32, 5, 5, 48, 1, 1, 1, 0, 1), "nhwc", Config(16, 16, 16, 1, num_warps=4, num_stages=1)),
}


def _conv_statistics(case, ordered: bool, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    """A conv2d launch of ``statistics_epilogue`` (a case of ``CONV_CASES``, or a case's
    tuple), checked against float64; its outputs and tensors."""
    (n, c, h, w, k, r, s, stride, padding, groups), layout, config = CONV_CASES.get(case, case)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(n, c, h, w, generator=gen).to(dtype).to(device)
    weight = (torch.randn(k, c // groups, r, s, generator=gen) / (r * s * c / groups) ** 0.5).to(dtype)
    weight = weight.to(device)
    p, q = (h + 2 * padding - r) // stride + 1, (w + 2 * padding - s) // stride + 1
    res = torch.randn(n, k, p, q, generator=gen).to(dtype).to(device)
    if layout == "nhwc":
        x, weight, res = (t.contiguous(memory_format=torch.channels_last) for t in (x, weight, res))
    dt = {torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]
    problem = make_conv_problem(
        x, weight, statistics_epilogue(dt), {"res": res}, stride=stride, padding=padding, groups=groups
    )
    with epilab_config.patch(deterministic=ordered):
        bound = checked_launch(problem, config, x, weight, {"res": res})
    return bound.outs, (x, weight, res, stride, padding, groups)


@pytest.mark.parametrize("ordered", [False, True], ids=["atomic", "ordered"])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_statistics_match_float64(case, ordered):
    outs, (*_, res, _, _, _) = _conv_statistics(case, ordered)
    n, k, p, q = res.shape
    assert [tuple(o.shape) for o in outs] == [(n, k, p, q), (n, p, q), (n, p, q), (n, k), (n, k)]


def test_conv_statistics_mean_pixels_per_channel_and_channels_per_pixel():
    # independent of the reference's GEMM view: torch's conv2d, then sums over named dims
    outs, (x, weight, res, stride, padding, groups) = _conv_statistics("groups2", False, torch.float32)
    h = (
        torch.nn.functional.conv2d(x.double(), weight.double(), None, stride, padding, 1, groups)
        + res.double()
    )
    torch.testing.assert_close(outs[1].double(), (h * h).sum(1), rtol=1e-4, atol=1e-3)  # per pixel
    torch.testing.assert_close(outs[3].double(), h.sum((2, 3)), rtol=1e-4, atol=1e-3)  # per channel
    torch.testing.assert_close(outs[4].double(), (h * 0.5).amax((2, 3)), rtol=1e-4, atol=1e-3)


def test_conv_statistics_into_given_outputs():
    # a one-column output (Q = 1): the per-pixel statistic's Q stride is meaningless (here 7)
    x, w = torch.randn(2, 16, 7, 1), torch.randn(8, 16, 3, 1)
    ep = Epilogue.build(
        [(acc(), "float32"), (acc() * acc(), "float32", "row_sum"), (acc(), "float32", "col_max")]
    )
    problem = make_conv_problem(x, w, ep, {}, padding=(1, 0))
    outs = (torch.empty(2, 8, 7, 1), torch.empty(2, 1, 7).transpose(1, 2), torch.empty(2, 8))
    checked_launch(problem, Config(16, 16, 16, 1, num_warps=4, num_stages=1), x, w, {}, out=outs)
    with pytest.raises(ValueError, match="shapes"):
        checked_launch(problem, Config(16, 16, 16, 1), x, w, {}, out=(outs[0], torch.empty(2, 7), outs[2]))


def test_a_convolution_with_statistics_has_no_matmul_twin():
    x = torch.randn(2, 32, 5, 5).contiguous(memory_format=torch.channels_last)
    w = torch.randn(48, 32, 1, 1).contiguous(memory_format=torch.channels_last)
    ep = Epilogue.build([(acc(), "float32"), (acc(), "float32", "col_sum")])
    problem = make_conv_problem(x, w, ep, {})
    assert [t.template for t in registry.twins(problem)] == ["conv2d"]  # a 1x1 conv's twin sums over images


# ------------------------------------------------------------------ the compiler


def _llama(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model = LlamaBlock(d=32, heads=4, kv_heads=2, f=48, max_seq=8).to(torch.bfloat16).eval()
    for norm in (model.norm1, model.norm2):
        norm.weight.data.uniform_(0.5, 1.5)
    return model, torch.randn(3, 8, 32).to(torch.bfloat16)


def _compiled_error(model, x, want, freezing: bool = True, **options) -> float:
    # freezing is read when Dynamo traces (parameters become constants): a global setting
    torch._dynamo.reset()
    with torch.no_grad(), torch._inductor.config.patch({"cpp.weight_prepack": False, "freezing": freezing}):
        got = torch.compile(model, **options)(x)
    return ((got.double() - want).norm() / want.norm()).item()


def _fold_errors(model, x, want, db: str) -> tuple[float, float, list]:
    """Errors vs ``want`` of Inductor and of epilab (policy always) compiling ``model`` with
    freezing, and epilab's decisions that chose a template."""
    inductor = _compiled_error(model, x, want)
    epilab.explain(clear=True)
    ours = _compiled_error(model, x, want, backend="epilab", options={"policy": "always", "db": db})
    return ours, inductor, [d for d in epilab.explain() if d.template]


def test_rms_norm_folds_into_the_gemms_around_it(fresh_compiler, tmp_path):
    model, x = _llama()
    want = model.double()(x.double())
    model = model.to(torch.bfloat16)
    ours, inductor, decisions = _fold_errors(model, x, want, str(tmp_path / "t.db"))
    producers = [d for d in decisions if "row_sum" in d.epilogue_ir]
    consumers = [d for d in decisions if "broadcast=col" in d.epilogue_ir]
    assert len(producers) == 1  # o_proj + residual: the second norm's statistics
    # q, k, v read the first norm; the dual gate/up GEMM the second: each scales by rstd[m]
    assert len(consumers) == 4 and any(d.template == "dual_matmul" for d in consumers)
    assert ours <= 2 * inductor + 1e-3, (ours, inductor)


def test_a_norm_is_folded_only_where_its_projections_get_templates(fresh_compiler, tmp_path):
    # policy auto on an empty database keeps every aten op: the fold alone would be a GEMM and
    # more pointwise work than Inductor's norm, so nothing is folded and the result is Inductor's
    model, x = _llama()
    want = model.double()(x.double())
    model = model.to(torch.bfloat16)
    db = str(tmp_path / "t.db")
    inductor = _compiled_error(model, x, want)
    epilab.explain(clear=True)
    ours = _compiled_error(model, x, want, backend="epilab", options={"policy": "auto", "db": db})
    decisions = epilab.explain()
    assert not any(d.template for d in decisions)
    assert ours == inductor
    # the folded projections' problems were tried and recorded: tuning finds them
    tried = [d for d in decisions if d.tried]
    assert all("tried with its norm folded in" in d.reason for d in tried)
    assert len(tried) == 6  # q, k, v; gate and up as a dual GEMM, then each alone
    assert all("broadcast=col" in d.epilogue_ir and d.candidates for d in tried)
    with TuningDB.open(db) as store:
        seen = {Problem.from_json(t).key for t in store.untuned(INTERPRETER_DEVICE, registry.is_current)}
    assert all(d.problem_key in seen for d in tried)


def test_rms_norm_is_not_folded_without_constant_weights(fresh_compiler, tmp_path):
    model, x = _llama()
    want = model.double()(x.double())
    model = model.to(torch.bfloat16)
    options = {"policy": "always", "db": str(tmp_path / "t.db")}
    assert _compiled_error(model, x, want, freezing=False, backend="epilab", options=options) < 1e-2
    assert not any("broadcast=col" in d.epilogue_ir for d in epilab.explain() if d.template)


def _with_affine_norms(model: torch.nn.Module) -> torch.nn.Module:
    for mod in model.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return model


def test_layer_norm_folds_into_the_gemms_around_it(fresh_compiler, tmp_path):
    torch.manual_seed(0)
    model = _with_affine_norms(GPT2(d=32, heads=2, layers=2, vocab=40).eval())
    x = torch.randn(3, 8, 32)
    want = model.double()(x.double())
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    ours, inductor, decisions = _fold_errors(model, x, want, str(tmp_path / "t.db"))
    # proj and out (+ residual) of both blocks: sum and sum of squares of the next norm's input
    producers = [d for d in decisions if d.epilogue_ir.count("row_sum") == 2]
    # qkv, fc1 and the head: rstd[m] * (acc - mean[m] * c[n]) + (beta @ W + b)[n], acc unrounded
    consumers = [
        d for d in decisions if "broadcast=col" in d.epilogue_ir and "broadcast=row" in d.epilogue_ir
    ]
    assert len(producers) == 4 and len(consumers) == 5
    assert all(not d.epilogue_ir.startswith("%0 = acc; %1 = cast") for d in consumers)
    assert ours <= 2 * inductor, (ours, inductor)


def _convnext(c: int, size: int, batch: int, memory: torch.memory_format, device: str = "cpu"):
    """A ConvNeXt block (7x7 depthwise, permute, channel LayerNorm, MLP, layer scale,
    residual) with affine norms, its bf16 input in ``memory``, and the float64 answer."""
    torch.manual_seed(0)
    model = _with_affine_norms(ConvNeXtBlock(c).to(device).eval())
    x = torch.randn(batch, c, size, size, device=device)
    want = model.double()(x.double())
    model = model.to(torch.bfloat16, memory_format=memory)
    return model, x.to(torch.bfloat16).contiguous(memory_format=memory), want


@pytest.mark.parametrize("memory", [torch.channels_last, torch.contiguous_format], ids=["nhwc", "nchw"])
def test_channel_layer_norm_after_a_depthwise_conv_folds_through_the_permute(
    memory, fresh_compiler, tmp_path
):
    # ConvNeXt: LayerNorm(depthwise(x).permute(0, 2, 3, 1)) @ W_up. The depthwise kernel takes the
    # permute into its group: the norm's two statistics per pixel over the channels (mapped back
    # from the permuted value's last dim to the conv's channels) and its output, permuted after
    model, x, want = _convnext(16, 6, 2, memory)
    ours, inductor, decisions = _fold_errors(model, x, want, str(tmp_path / "t.db"))
    (conv,) = [d for d in decisions if d.anchor == "aten.conv2d"]
    assert conv.template == "depthwise" and conv.epilogue_ir.count("row_sum") == 2, conv.epilogue_ir
    (up,) = [d for d in decisions if "broadcast=col" in d.epilogue_ir and "sub" in d.epilogue_ir]
    assert up.anchor == "aten.mm"  # rstd[m] * (acc - mean[m] * c[n]) + (beta @ W + b)[n]
    assert ours <= 2 * inductor, (ours, inductor)


class _ChannelNorm(torch.nn.Module):
    """A conv (depthwise, or a full one), permuted to channels last, a LayerNorm over the
    channels; with ``stats`` it is written out by hand and returns its mean too."""

    def __init__(self, c: int, groups: int, stats: bool = False) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 7, padding=3, groups=groups)
        self.norm = torch.nn.LayerNorm(c, eps=1e-6)
        self.stats = stats

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(x).permute(0, 2, 3, 1)
        if not self.stats:
            return self.norm(y)
        var, mean = torch.var_mean(y.float(), dim=-1, keepdim=True, correction=0)
        return ((y.float() - mean) * torch.rsqrt(var + 1e-6) * self.norm.weight.float()).to(y.dtype), mean


def _channel_norm(c: int, groups: int, memory: torch.memory_format, stats: bool = False, device: str = "cpu"):
    torch.manual_seed(0)
    model = _with_affine_norms(_ChannelNorm(c, groups, stats).to(device).eval())
    x = torch.randn(2, c, 6, 5, device=device)
    want = model.double()(x.double())
    return (
        model.to(torch.bfloat16, memory_format=memory),
        x.to(torch.bfloat16).contiguous(memory_format=memory),
        want,
    )


def _errors(got, want) -> list[float]:
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    return [((g.double() - w).norm() / w.norm()).item() for g, w in zip(got, want, strict=True)]


@pytest.mark.parametrize("memory", [torch.channels_last, torch.contiguous_format], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("stats", [False, True], ids=["layer_norm", "its mean used too"])
def test_a_channel_layer_norm_is_normalised_in_the_depthwise_epilogue(
    memory, stats, fresh_compiler, tmp_path
):
    # No freezing: the norm is not folded forward; its var_mean over the permuted last dim (the
    # conv's channels) becomes two row_totals of the depthwise epilogue, the norm is computed
    # there, and a mean used outside is the kernel's row_max output (its one value per pixel)
    model, x, want = _channel_norm(24, 24, memory, stats)
    with torch.no_grad():
        torch._dynamo.reset()
        inductor = _errors(torch.compile(model)(x), want)
        epilab.explain(clear=True)
        torch._dynamo.reset()
        options = {"policy": "always", "db": str(tmp_path / "t.db")}
        got = torch.compile(model, backend="epilab", options=options)(x)
    (conv,) = [d for d in epilab.explain() if d.anchor == "aten.conv2d"]
    assert conv.template == "depthwise" and conv.epilogue_ir.count("row_total") == 2, conv.epilogue_ir
    assert conv.epilogue_ir.count("row_max") == int(stats), conv.epilogue_ir
    outputs, wanted = (got, want) if stats else ((got,), (want,))
    assert [o.dtype for o in outputs] == [torch.bfloat16, torch.float32][: len(outputs)]
    assert [o.shape for o in outputs] == [w.shape for w in wanted]
    for ours, theirs in zip(_errors(got, want), inductor, strict=True):
        assert ours <= 2 * theirs, (ours, theirs)


def test_without_a_template_for_the_norms_group_the_conv_gets_the_group_without_it(fresh_compiler, tmp_path):
    # Both groupings are recorded (tuning weighs them); where the one with the norm gets no
    # template (here excluded, as tune --model's check excludes a rejected problem), the conv
    # is decided without the norm, and Inductor computes the norm after the template's output
    model, x, want = _channel_norm(24, 24, torch.channels_last)
    db = str(tmp_path / "t.db")
    with torch.no_grad():
        epilab.explain(clear=True)
        torch._dynamo.reset()
        torch.compile(model, backend="epilab", options={"policy": "always", "db": db})(x)
        (first,) = [d for d in epilab.explain() if d.anchor == "aten.conv2d"]
        epilab.explain(clear=True)
        torch._dynamo.reset()
        options = {"policy": "always", "db": db, "exclude": [first.problem_key]}
        got = torch.compile(model, backend="epilab", options=options)(x)
    (conv,) = [d for d in epilab.explain() if d.anchor == "aten.conv2d"]
    assert (
        "row_total" in first.epilogue_ir
        and conv.template == "depthwise"
        and "row_total" not in conv.epilogue_ir
    )
    with TuningDB.open(db) as store:
        seen = [Problem.from_json(p) for p in store.untuned(INTERPRETER_DEVICE, registry.is_current)]
    convs = {p.epilogue.row_totals for p in seen if p.op == "conv2d"}
    assert convs == {True, False}, "both groupings of the conv are recorded for tuning"
    assert _errors(got, want)[0] < 1e-2


@pytest.mark.parametrize("fused_ms", [1.0, 3.0], ids=["fused faster", "fused slower"])
def test_auto_runs_the_norms_group_only_where_its_record_beats_the_plain_groups(
    fused_ms, fresh_compiler, tmp_path
):
    # The norm's group's own baseline (cuDNN plus the norm in eager torch) hides the plain kernel
    # plus Inductor's norm: under auto it runs only where its record is no slower than the plain
    # group's (or a model measured it in context), else the plain group runs
    from records import record

    model, x, want = _channel_norm(24, 24, torch.channels_last)
    db = str(tmp_path / "t.db")
    with torch.no_grad():
        torch._dynamo.reset()
        torch.compile(model, backend="epilab", options={"policy": "auto", "db": db})(x)  # records both
        with TuningDB.open(db) as store:
            seen = [Problem.from_json(p) for p in store.untuned(INTERPRETER_DEVICE, registry.is_current)]
        for problem in (p for p in seen if p.template == "depthwise"):
            config = registry.default_config(problem, "interpreter")
            ms = fused_ms if problem.epilogue.row_totals else 2.0
            record(db, problem, config.to_dict(), ms, baseline_ms=10.0)
        epilab.explain(clear=True)
        torch._dynamo.reset()
        got = torch.compile(model, backend="epilab", options={"policy": "auto", "db": db})(x)
    (conv,) = [d for d in epilab.explain() if d.anchor == "aten.conv2d"]
    assert conv.template == "depthwise"
    assert ("row_total" in conv.epilogue_ir) == (fused_ms < 2.0), conv.epilogue_ir
    assert ("is slower than the group without it" in conv.reason) == (fused_ms > 2.0), conv.reason
    assert _errors(got, want)[0] < 1e-2


def test_a_norm_no_template_holds_the_rows_of_stays_outside(fresh_compiler, tmp_path):
    # a full 7x7 conv: the implicit GEMM's programs do not hold a pixel's channels, and there
    # is no depthwise twin; the group is grown again without the norm, which Inductor computes
    model, x, want = _channel_norm(8, 1, torch.channels_last)
    epilab.explain(clear=True)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(
            model, backend="epilab", options={"policy": "always", "db": str(tmp_path / "t.db")}
        )(x)
    (conv,) = [d for d in epilab.explain() if d.anchor == "aten.conv2d"]
    assert conv.template == "conv2d" and "row_total" not in conv.epilogue_ir
    assert _errors(got, want)[0] < 1e-2


@pytest.mark.parametrize("memory", [torch.channels_last, torch.contiguous_format], ids=["nhwc", "nchw"])
def test_a_convnext_block_normalises_in_the_depthwise_epilogue_without_freezing(
    memory, fresh_compiler, tmp_path
):
    _check_normalised_convnext(_convnext(16, 6, 2, memory), str(tmp_path / "t.db"))


def _check_normalised_convnext(built: tuple, db: str) -> None:
    """A ConvNeXt block compiled without freezing (policy always): its LayerNorm is in the
    depthwise epilogue (two row totals), as accurate as Inductor's within 2x."""
    model, x, want = built
    inductor = _compiled_error(model, x, want, freezing=False)
    epilab.explain(clear=True)
    ours = _compiled_error(
        model, x, want, freezing=False, backend="epilab", options={"policy": "always", "db": db}
    )
    (conv,) = [d for d in epilab.explain() if d.anchor == "aten.conv2d"]
    assert conv.template == "depthwise" and conv.epilogue_ir.count("row_total") == 2, conv.epilogue_ir
    assert ours <= 2 * inductor, (ours, inductor)


class _PermutedEpilogue(torch.nn.Module):
    """A conv whose output is permuted to channels last, then scaled per channel and
    activated, with a residual of the permuted shape added last."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, c))

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.conv(x).permute(0, 2, 3, 1) * self.scale)
        return y, y + r


def test_a_permuted_conv_output_takes_channel_operands_but_no_whole_tensor(fresh_compiler, tmp_path):
    torch.manual_seed(0)
    model = _PermutedEpilogue(8).eval()
    x, r = torch.randn(2, 8, 5, 5), torch.randn(2, 5, 5, 8)
    want = model.double()(x.double(), r.double())
    model, x, r = model.to(torch.bfloat16), x.to(torch.bfloat16), r.to(torch.bfloat16)
    epilab.explain(clear=True)
    torch._dynamo.reset()
    options = {"policy": "always", "db": str(tmp_path / "t.db")}
    with torch.no_grad():
        got = torch.compile(model, backend="epilab", options=options)(x, r)
    (conv,) = [d for d in epilab.explain() if d.anchor == "aten.conv2d"]
    # the per-channel scale (a [C] operand on the permuted last dim) and the ReLU join; the
    # residual, a whole tensor in the permuted order, does not: Inductor adds it
    assert conv.template and "broadcast=row,name=op0" in conv.epilogue_ir and "relu" in conv.epilogue_ir
    assert "broadcast=tile" not in conv.epilogue_ir and conv.epilogue_ir.count("out ") == 1
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert ((g.double() - w).norm() / w.norm()).item() < 1e-2


def test_post_norm_blocks_keep_their_norms(fresh_compiler, tmp_path):
    # BERT's LayerNorm output is the residual stream too: it must be written, nothing to fold
    torch.manual_seed(0)
    model = Bert(d=32, heads=2, f=64, layers=1).eval().to(torch.bfloat16)
    x = torch.randn(3, 8, 32).to(torch.bfloat16)
    want = model.double()(x.double())
    model = model.to(torch.bfloat16)
    options = {"policy": "always", "db": str(tmp_path / "t.db")}
    assert _compiled_error(model, x, want, backend="epilab", options=options) < 2e-2
    assert not any("broadcast=col" in d.epilogue_ir for d in epilab.explain() if d.template)


def test_row_amax_for_dynamic_fp8_quantization(fresh_compiler, tmp_path):
    # per-row amax of a GEMM output, then quantization to e4m3: the amax comes from the epilogue
    def quantize(x, w):
        y = x @ w
        scale = y.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / 448.0
        return (y.float() / scale).to(torch.float8_e4m3fn), scale

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(21, 40, generator=gen).to(torch.bfloat16)
    w = torch.randn(40, 24, generator=gen).to(torch.bfloat16)
    options = {"policy": "always", "db": str(tmp_path / "t.db")}
    q, scale = torch.compile(quantize, backend="epilab", options=options)(x, w)
    q_ref, scale_ref = quantize(x, w)
    assert any("row_max" in d.epilogue_ir for d in epilab.explain() if d.template)
    assert torch.equal(scale, scale_ref)  # a max is exact
    assert (q.float() - q_ref.float()).abs().max() <= 32.0  # at most one e4m3 step near 448


class PooledConv(torch.nn.Module):
    """conv -> relu -> global average pool -> linear, and a mean over the channels: both
    statistics of the conv's output, which nothing else reads."""

    def __init__(self, c: int = 16, k: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c, k, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(k, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        return torch.cat([self.fc(torch.flatten(self.pool(y), 1)), y.mean(1).flatten(1)], 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_pooling_of_a_conv_is_its_epilogue_statistic(dtype, fresh_compiler, tmp_path):
    torch.manual_seed(0)
    model = PooledConv().eval()
    x = torch.randn(2, 16, 8, 8).contiguous(memory_format=torch.channels_last)
    want = model.double()(x.double())
    model, x = model.to(dtype), x.to(dtype)
    ours, inductor, decisions = _fold_errors(model, x, want, str(tmp_path / "t.db"))
    conv = [d for d in decisions if d.template == "conv2d"]
    assert len(conv) == 1 and "col_sum" in conv[0].epilogue_ir and "row_sum" in conv[0].epilogue_ir
    outputs = [part for part in conv[0].epilogue_ir.split("; ") if part.startswith("out ")]
    assert len(outputs) == 2 and all(o.endswith("_sum") for o in outputs)  # the activation is never stored
    assert ours <= 2 * inductor + 1e-6, (ours, inductor)


# ------------------------------------------------------------------ on the GPU

GPU_LOOPS = {
    **{name: c for name, c in LOOPS.items()},
    "tma": Config(128, 128, 64, num_warps=8, num_stages=3, variant="tma"),
    "tma_persistent": Config(128, 128, 64, num_warps=8, num_stages=3, variant="tma_persistent"),
    "big_subtile": Config(128, 256, 64, num_warps=8, num_stages=3, EPILOGUE_SUBTILE=4),
}


@pytest.mark.gpu
@pytest.mark.parametrize("ordered", [False, True], ids=["atomic", "ordered"])
@pytest.mark.parametrize("loop", list(GPU_LOOPS))
@pytest.mark.parametrize("shape", [(None, 1000, 1536, 512), (None, 4096, 2048, 1024)], ids=str)
def test_statistics_on_gpu(shape, loop, ordered):
    gen = torch.Generator().manual_seed(5)
    a, b, res = (t.cuda() for t in _tensors(*shape, torch.bfloat16, gen, transposed_b=True))
    problem = make_problem(a, b, statistics_epilogue("bfloat16"), {"res": res})
    with epilab_config.patch(deterministic=ordered):
        checked_launch(problem, GPU_LOOPS[loop], a, b, {"res": res})


@pytest.mark.gpu
@pytest.mark.parametrize("ordered", [False, True], ids=["atomic", "ordered"])
@pytest.mark.parametrize(
    "config",
    [
        Config(16, 64, 128, num_warps=4, num_stages=3),
        Config(16, 128, 128, 1, 4, num_warps=4, num_stages=3, variant="two_pass"),
        Config(16, 64, 256, 1, 8, num_warps=4, num_stages=3, variant="atomic"),
    ],
    ids=lambda c: c.short(),
)
@pytest.mark.parametrize("shape", [(8, 4096, 4096), (1, 11008, 4096), (2048, 4, 1024)], ids=str)
def test_gemv_statistics_on_gpu(shape, config, ordered):
    gen = torch.Generator().manual_seed(7)
    a, b, res = (t.cuda() for t in _tensors(None, *shape, torch.bfloat16, gen, transposed_b=True))
    problem = registry.for_template(make_problem(a, b, statistics_epilogue("bfloat16"), {"res": res}), "gemv")
    with epilab_config.patch(deterministic=ordered):
        checked_launch(problem, config, a, b, {"res": res})


GPU_CONV_CASES = {  # ResNet-50's stages at batch 8, its stem, a depthwise and a split-K case
    "3x3-56x56-c64": (
        (8, 64, 56, 56, 64, 3, 3, 1, 1, 1),
        "nhwc",
        Config(128, 64, 64, 8, num_warps=4, num_stages=3),
    ),
    "1x1-28x28-c512": (
        (8, 128, 28, 28, 512, 1, 1, 1, 0, 1),
        "nhwc",
        Config(128, 128, 64, 8, num_warps=8, num_stages=3),
    ),
    "stem-7x7-s2": (
        (8, 3, 224, 224, 64, 7, 7, 2, 3, 1),
        "nchw",
        Config(128, 64, 16, 8, num_warps=4, num_stages=3),
    ),
    "depthwise": (
        (8, 96, 28, 28, 96, 3, 3, 1, 1, 96),
        "nhwc",
        Config(64, 64, 16, 8, num_warps=4, num_stages=2),
    ),
    "3x3-7x7-split4": (
        (8, 512, 7, 7, 512, 3, 3, 1, 1, 1),
        "nhwc",
        Config(64, 64, 64, 8, 4, num_warps=4, num_stages=3),
    ),
}


@pytest.mark.gpu
@pytest.mark.parametrize("ordered", [False, True], ids=["atomic", "ordered"])
@pytest.mark.parametrize("case", list(GPU_CONV_CASES))
def test_conv_statistics_on_gpu(case, ordered):
    _conv_statistics(GPU_CONV_CASES[case], ordered, device="cuda")


@pytest.mark.gpu
def test_ordered_statistics_are_reproducible_on_gpu():
    gen = torch.Generator().manual_seed(6)
    a, b, res = (t.cuda() for t in _tensors(None, 2048, 4096, 512, torch.bfloat16, gen))
    problem = make_problem(a, b, statistics_epilogue("bfloat16"), {"res": res})
    config = Config(128, 128, 64, num_warps=8, num_stages=3)
    with epilab_config.patch(deterministic=True):
        first = registry.launch(problem, config, a, b, {"res": res})
        for _ in range(50):
            again = registry.launch(problem, config, a, b, {"res": res})
            assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))


@pytest.mark.gpu
def test_rms_norm_fold_on_gpu(fresh_compiler, tmp_path):
    torch.manual_seed(0)
    model = LlamaBlock(d=512, heads=8, kv_heads=4, f=1408, max_seq=256).cuda().to(torch.bfloat16).eval()
    for norm in (model.norm1, model.norm2):
        norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(2, 256, 512, device="cuda").to(torch.bfloat16)
    want = model.double()(x.double())
    model = model.to(torch.bfloat16)
    ours, inductor, decisions = _fold_errors(model, x, want, str(tmp_path / "t.db"))
    assert sum("row_sum" in d.epilogue_ir for d in decisions) == 1
    assert sum("broadcast=col" in d.epilogue_ir for d in decisions) == 4
    assert ours <= 2 * inductor, (ours, inductor)


@pytest.mark.gpu
def test_layer_norm_fold_on_gpu(fresh_compiler, tmp_path):
    torch.manual_seed(0)
    model = _with_affine_norms(GPT2(d=256, heads=4, layers=2, vocab=512).cuda().eval())
    x = torch.randn(4, 128, 256, device="cuda")
    want = model.double()(x.double())
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    ours, inductor, decisions = _fold_errors(model, x, want, str(tmp_path / "t.db"))
    assert sum(d.epilogue_ir.count("row_sum") == 2 for d in decisions) == 4
    assert sum("broadcast=col" in d.epilogue_ir for d in decisions) == 5
    assert ours <= 2 * inductor, (ours, inductor)


@pytest.mark.gpu
def test_convnext_layer_norm_fold_on_gpu(fresh_compiler, tmp_path):
    model, x, want = _convnext(96, 28, 8, torch.channels_last, "cuda")
    ours, inductor, decisions = _fold_errors(model, x, want, str(tmp_path / "t.db"))
    assert sum(d.epilogue_ir.count("row_sum") == 2 for d in decisions if d.anchor == "aten.conv2d") == 1
    assert sum("broadcast=col" in d.epilogue_ir and "sub" in d.epilogue_ir for d in decisions) == 1
    assert ours <= 2 * inductor, (ours, inductor)


@pytest.mark.gpu
@pytest.mark.parametrize("memory", [torch.channels_last, torch.contiguous_format], ids=["nhwc", "nchw"])
def test_convnext_layer_norm_in_the_depthwise_epilogue_on_gpu(memory, fresh_compiler, tmp_path):
    _check_normalised_convnext(_convnext(192, 14, 8, memory, "cuda"), str(tmp_path / "t.db"))


# ------------------------------------------------------------------ the zoo's transformers

TRANSFORMERS = ("gpt2", "llama", "bert", "vit", "moe")


def _zoo_errors(size: str, name: str, device: str, db: str) -> tuple[float, float, int]:
    """(epilab's error, Inductor's error) vs float64 of a zoo model compiled with freezing,
    and how many projections epilab folded a norm into."""
    from zoo import ZOO

    spec = ZOO[size][name]
    torch.manual_seed(0)
    model = spec.build().to(device).eval()
    for mod in model.modules():  # norms that are not the identity, so that folding them shows
        if isinstance(mod, torch.nn.LayerNorm) or type(mod).__name__ == "RMSNorm":
            mod.weight.data.uniform_(0.5, 1.5)
            if getattr(mod, "bias", None) is not None:
                mod.bias.data.uniform_(-0.5, 0.5)
    x = torch.randn(spec.input_shape, device=device)
    want = model.double()(x.double())
    model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    if spec.image:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    ours, inductor, decisions = _fold_errors(model, x, want, db)
    folded = sum(
        "broadcast=col" in d.epilogue_ir and "%0 = acc; %1 = cast" not in d.epilogue_ir for d in decisions
    )
    return ours, inductor, folded


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_folded_zoo_transformers_are_as_accurate_as_inductor(name, fresh_compiler, tmp_path):
    ours, inductor, folded = _zoo_errors("tiny", name, "cpu", str(tmp_path / "t.db"))
    assert ours <= 2 * inductor + 1e-3, (ours, inductor)
    assert (folded > 0) == (name in ("gpt2", "llama", "vit")), folded  # pre-norm blocks only


@pytest.mark.gpu
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_folded_zoo_transformers_on_gpu(name, fresh_compiler, tmp_path):
    ours, inductor, folded = _zoo_errors("real", name, "cuda", str(tmp_path / "t.db"))
    assert ours <= 2 * inductor, (ours, inductor)
    assert (folded > 0) == (name in ("gpt2", "llama", "vit")), folded
