"""The conv2d template (implicit GEMM, NHWC or NCHW, groups, depthwise) against
torch's conv2d in float64, with the epilogue computed after it; outputs poisoned
with NaN first so that an unwritten element shows."""

from __future__ import annotations

import pytest
import torch

from epilab.ir import catalog
from epilab.ir.check import rel_error, tolerance
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand
from epilab.ir.problem import Problem
from epilab.templates.conv.conv2d import conv_reference, default_conv_config, make_conv_problem
from epilab.templates.conv.conv_geometry import ConvGeometry
from epilab.templates.verify import checked_launch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _operands(ep: Epilogue, k: int, out_shape, dtype, device, gen, layout) -> dict[str, torch.Tensor]:
    made = {}
    for name, kind in ep.operands:
        if kind == "row":
            made[name] = torch.randn(k, generator=gen).to(dtype).to(device)
        elif kind == "scalar":
            made[name] = torch.randn((), generator=gen).to(dtype).to(device)
        else:
            t = torch.randn(out_shape, generator=gen).to(dtype).to(device)
            made[name] = t.contiguous(memory_format=torch.channels_last) if layout == "nhwc" else t
    return made


def run_conv(
    n,
    c,
    h,
    w,
    k,
    r,
    s,
    *,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    dtype=torch.bfloat16,
    epilogue="bias_relu",
    layout="nhwc",
    config=None,
    device="cpu",
    out_layout=None,
    seed=0,
):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=gen).to(dtype).to(device)
    weight = (
        (torch.randn(k, c // groups, r, s, generator=gen) / (r * s * c / groups) ** 0.5).to(dtype).to(device)
    )
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
        weight = weight.contiguous(memory_format=torch.channels_last)
    name = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]
    ep = catalog.epilogue(epilogue, name)
    geo = ConvGeometry(h, w, c, r, s, (stride,) * 2, (padding,) * 2, (dilation,) * 2, groups)
    out_shape = (n, k, geo.p, geo.q)
    operands = _operands(ep, k, out_shape, dtype, device, gen, layout)
    problem = make_conv_problem(
        x, weight, ep, operands, stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    config = config or default_conv_config(problem, "interpreter" if device == "cpu" else "cuda")
    outs = tuple(torch.empty(out_shape, dtype=dtype, device=device) for _ in ep.outputs)
    if out_layout == "nhwc":
        outs = tuple(o.contiguous(memory_format=torch.channels_last) for o in outs)
    bound = checked_launch(problem, config, x, weight, operands, out=outs if out_layout else None)
    return problem, bound


SMALL = Config(16, 16, 16, 1, num_warps=4, num_stages=1)

GEOMETRIES = {  # (n, c, h, w, k, r, s, stride, padding, dilation, groups)
    "3x3-pad1-odd": (2, 16, 7, 9, 16, 3, 3, 1, 1, 1, 1),
    "3x3-stride2": (1, 16, 9, 8, 32, 3, 3, 2, 1, 1, 1),
    "stem-7x7-s2-p3-c3": (1, 3, 13, 11, 16, 7, 7, 2, 3, 1, 1),
    "1x1": (2, 32, 5, 5, 48, 1, 1, 1, 0, 1, 1),
    "1x1-stride2": (1, 32, 7, 7, 16, 1, 1, 2, 0, 1, 1),
    "dilation2": (1, 16, 9, 9, 16, 3, 3, 1, 2, 2, 1),
    "c24-ragged": (1, 24, 6, 7, 20, 3, 3, 1, 1, 1, 1),  # C and K not multiples of the blocks
    "groups2": (1, 32, 6, 6, 32, 3, 3, 1, 1, 1, 2),
    "depthwise": (2, 24, 7, 6, 24, 3, 3, 1, 1, 1, 24),
    "depthwise-s2-x2": (1, 16, 9, 9, 32, 3, 3, 2, 1, 1, 16),  # channel multiplier 2
    "pad0-5x3": (1, 16, 8, 6, 16, 5, 3, 1, 0, 1, 1),
}


def run_geometry(geometry, **kw):
    """``run_conv`` of a (n, c, h, w, k, r, s, stride, padding, dilation, groups) tuple."""
    *sizes, stride, padding, dilation, groups = geometry
    return run_conv(*sizes, stride=stride, padding=padding, dilation=dilation, groups=groups, **kw)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_conv_geometries_and_layouts(geometry, layout):
    run_geometry(GEOMETRIES[geometry], layout=layout, config=SMALL)


@pytest.mark.parametrize(
    "epilogue", ["none", "bias", "bn_relu", "bias_residual_relu", "silu_two_outputs", "scalar"]
)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_conv_epilogues_and_dtypes(epilogue, dtype):
    run_conv(2, 16, 5, 6, 24, 3, 3, padding=1, dtype=DTYPES[dtype], epilogue=epilogue, config=SMALL)


@pytest.mark.parametrize(
    "config",
    [Config(32, 32, 32, 4, num_warps=4, num_stages=2), Config(16, 64, 16, 1, num_warps=2, num_stages=1)],
)
def test_conv_configs_with_even_and_ragged_channel_blocks(config):
    run_conv(1, 64, 6, 6, 40, 3, 3, padding=1, config=config)  # 64 channels: whole 32/16 blocks
    run_conv(1, 48, 5, 5, 40, 3, 3, padding=1, config=config)  # 48 channels: ragged for BLOCK_K=32


@pytest.mark.parametrize("out_layout", ["nhwc", "nchw"])
def test_conv_writes_into_given_outputs(out_layout):
    _, bound = run_conv(1, 16, 6, 5, 16, 3, 3, padding=1, config=SMALL, out_layout=out_layout)
    want = torch.channels_last if out_layout == "nhwc" else torch.contiguous_format
    assert bound.outs[0].is_contiguous(memory_format=want)


def test_conv_problem_keys_round_trip_and_differ_by_geometry():
    p1, _ = run_conv(1, 16, 6, 6, 16, 3, 3, padding=1, config=SMALL)
    assert Problem.from_json(p1.to_json()) == p1 and p1.geometry.p == 6
    x = torch.randn(1, 16, 6, 6).contiguous(memory_format=torch.channels_last)
    w = torch.randn(16, 16, 3, 3).contiguous(memory_format=torch.channels_last)
    other = make_conv_problem(x, w, p1.epilogue, {"bias": torch.randn(16)}, padding=1, dilation=1, stride=2)
    assert other.key != p1.key and other.shape.m == 9


@pytest.mark.parametrize(
    "case,match",
    [
        ("weight-channels", "does not fit 16 input channels"),
        ("groups", "do not split into 3 groups"),
        ("col-operand", "not col"),
        ("bias-size", "per output channel"),
        ("too-small", "does not fit the padded"),
        ("dtype", "share a float16/bfloat16/float32 dtype"),
        ("3d", "must be a 4-D tensor"),
    ],
)
def test_bad_conv_inputs_are_refused_clearly(case, match):
    x = torch.randn(1, 16, 5, 5)
    w = torch.randn(8, 16, 3, 3)
    ep = catalog.epilogue("bias", "float32")
    ops_ = {"bias": torch.randn(8)}
    kw: dict = {}
    if case == "weight-channels":
        w = torch.randn(8, 8, 3, 3)
    elif case == "groups":
        kw["groups"] = 3
    elif case == "col-operand":
        ep = Epilogue.build([(acc() + operand("v", "col"), "float32")])
        ops_ = {"v": torch.randn(25, 1)}
    elif case == "bias-size":
        ops_ = {"bias": torch.randn(9)}
    elif case == "too-small":
        w = torch.randn(8, 16, 7, 7)
    elif case == "dtype":
        w = w.half()
    elif case == "3d":
        x = x[0]
    with pytest.raises((ValueError, TypeError), match=match):
        make_conv_problem(x, w, ep, ops_, **kw)


# ------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "geometry",
    [
        (32, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1),  # ResNet-50 layer1 3x3
        (32, 256, 56, 56, 64, 1, 1, 1, 0, 1, 1),  # a 1x1 reduction
        (32, 3, 224, 224, 64, 7, 7, 2, 3, 1, 1),  # the stem
        (32, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1),  # layer4 3x3
        (8, 96, 28, 28, 96, 3, 3, 1, 1, 1, 96),  # depthwise
        (4, 64, 15, 17, 128, 3, 3, 2, 1, 1, 2),  # groups, odd sizes, stride 2
    ],
)
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_gpu_conv(geometry, layout):
    run_geometry(geometry, layout=layout, epilogue="bias_residual_relu", device="cuda")


def test_a_1x1_convolution_has_a_matmul_twin_that_computes_the_same():
    from epilab.templates.conv.conv2d import as_conv_outputs, as_matmul, matmul_twin
    from epilab.templates.registry import launch, twins

    gen = torch.Generator().manual_seed(0)
    x = (
        torch.randn(2, 32, 5, 3, generator=gen)
        .to(torch.bfloat16)
        .contiguous(memory_format=torch.channels_last)
    )
    w = torch.randn(24, 32, 1, 1, generator=gen).to(torch.bfloat16)
    ops_ = {
        "bias": torch.randn(24, generator=gen).to(torch.bfloat16),
        "residual": torch.randn(2, 24, 5, 3, generator=gen)
        .to(torch.bfloat16)
        .contiguous(memory_format=torch.channels_last),
    }
    ep = catalog.epilogue("bias_residual_relu", "bfloat16")
    problem = make_conv_problem(x, w, ep, ops_)
    twin = matmul_twin(problem)
    assert [p.template for p in twins(problem)] == ["conv2d", "matmul"] and twin.shape.m == 30
    a, b, (bias, residual) = as_matmul(x, w, [ops_["bias"], ops_["residual"]])
    assert a.data_ptr() == x.data_ptr() and residual.data_ptr() == ops_["residual"].data_ptr()  # views
    (out,) = as_conv_outputs(list(launch(twin, SMALL, a, b, {"bias": bias, "residual": residual})), x)
    (ref,) = conv_reference(problem, x, w, ops_)
    assert out.shape == ref.shape and rel_error(out, ref) <= tolerance("bfloat16", "ieee", "bfloat16")
    assert out.is_contiguous(memory_format=torch.channels_last)
    nchw = make_conv_problem(x.contiguous(), w, ep, {**ops_, "residual": ops_["residual"].contiguous()})
    three = make_conv_problem(x, torch.randn(24, 32, 3, 3).to(torch.bfloat16), ep, ops_, padding=1)
    assert matmul_twin(nchw) is None and matmul_twin(three) is None  # only NHWC 1x1 convolutions


def test_fp32_convolutions_use_tf32_only_when_asked():
    from epilab.templates.registry import source

    x, w = torch.randn(1, 16, 5, 5), torch.randn(16, 16, 3, 3)
    ep = catalog.epilogue("none", "float32")
    for precision in ("ieee", "tf32"):
        problem = make_conv_problem(x, w, ep, {}, padding=1, precision=precision)
        assert problem.precision == precision
        assert f'input_precision="{precision}"' in source(problem, SMALL)
    half = make_conv_problem(x.half(), w.half(), catalog.epilogue("none", "float16"), {}, precision="tf32")
    assert half.precision == "ieee"  # tf32 is a float32 matter


def test_launch_checks_conv_tensors_against_their_problem():
    from epilab.templates.registry import launch

    x = torch.randn(1, 16, 6, 5)
    w = torch.randn(8, 16, 3, 3)
    ep = catalog.epilogue("bias", "float32")
    ops_ = {"bias": torch.randn(8)}
    problem = make_conv_problem(x, w, ep, ops_, padding=1)
    (out,) = launch(problem, SMALL, x, w, ops_)
    assert rel_error(out, conv_reference(problem, x, w, ops_)[0]) <= tolerance("float32", "ieee", "float32")
    with pytest.raises(ValueError, match="do not match the problem"):
        launch(
            problem, SMALL, x, torch.randn(8, 16, 3, 3).contiguous(memory_format=torch.channels_last), ops_
        )
