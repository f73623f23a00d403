"""The depthwise template (a direct kernel: strips of output rows, the taps in registers; lanes
along the channels or, the w_vector variant, along W)
against torch's conv2d in float64 with the epilogue after it, on awkward geometries, both
memory formats, every input dtype and epilogues with operands, casts, several outputs and
statistics; outputs poisoned with NaN first so that an unwritten element shows."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, Expr, acc, operand
from epilab.ir.problem import Problem
from epilab.templates.conv import depthwise
from epilab.templates.conv.conv_spec import ConvSpec
from epilab.templates.registry import default_config, kind_of, row_error, twins, untuned_choice
from epilab.templates.verify import checked_launch, random_inputs

SMALL = Config(16, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=2)  # 2 rows of an 8-pixel strip
# lanes along W: 2 rows of an 8-pixel strip as [16 channels, 8 pixels] tiles
W_VECTOR = Config(16, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=2, variant="w_vector")
# the channel lanes with the output rows in flight rolling (the default slides the input window)
IN_FLIGHT = dataclasses.replace(SMALL, variant="in_flight")


def problem_of(spec: ConvSpec) -> Problem:
    """The spec's depthwise twin (the conv2d problem on this template)."""
    found = [t for t in twins(spec.problem()) if t.template == "depthwise"]
    assert len(found) == 1, f"no depthwise twin for {spec.label()}"
    return found[0]


def run(spec: ConvSpec, config: Config = SMALL, device: str = "cpu", seed: int = 0) -> tuple[Problem, object]:
    problem = problem_of(spec)
    x, w, ops = random_inputs(problem, device, seed)
    return problem, checked_launch(problem, config, x, w, ops)


def dw(n, c, h, w, r, *, mult=1, stride=1, padding=None, dilation=1, **kw) -> ConvSpec:
    pad = (r // 2) * dilation if padding is None else padding
    return ConvSpec(n, c, h, w, mult * c, r, r, stride, pad, dilation, groups=c, **kw)


GEOMETRIES = {
    "3x3": dw(2, 8, 7, 9, 3),
    "5x5 stride 2, odd sizes": dw(1, 6, 9, 11, 5, stride=2),
    "7x7 unpadded": dw(1, 5, 10, 12, 7, padding=0),
    "3x3 dilation 2": dw(1, 4, 9, 8, 3, dilation=2),
    "multiplier 2": dw(1, 6, 6, 7, 3, mult=2),
    "multiplier 2, stride 2": dw(2, 3, 8, 8, 5, mult=2, stride=2),
    "5x5 stride 2, three strips wide": dw(1, 4, 5, 35, 5, stride=2),
    "3x3 stride 2 unpadded": dw(1, 4, 9, 16, 3, stride=2, padding=0),
    "3x3 stride 3": dw(1, 4, 10, 16, 3, stride=3),
    "3x3 stride 4 (no window row kept)": dw(1, 4, 11, 13, 3, stride=4),
    "channels over one block": dw(1, 40, 4, 5, 3),
    "1x1 output": dw(1, 8, 3, 3, 3, padding=0),
}


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_depthwise_geometries_and_layouts(geometry, layout):
    run(dataclasses.replace(GEOMETRIES[geometry], dtype="float32", layout=layout, epilogue="bias"))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_depthwise_w_vector_geometries(geometry, layout):
    """Lanes along W: written for NCHW, correct (if slow) on any strides."""
    run(dataclasses.replace(GEOMETRIES[geometry], dtype="float32", layout=layout, epilogue="bias"), W_VECTOR)


@pytest.mark.parametrize("geometry", [g for g in GEOMETRIES if "dilation" not in g])
def test_depthwise_rows_in_flight_geometries(geometry):
    """The in_flight variant (the output rows in flight roll; the default's form where rows are
    dilated) on the channel lanes."""
    run(dataclasses.replace(GEOMETRIES[geometry], dtype="float32", layout="nhwc", epilogue="bias"), IN_FLIGHT)


@pytest.mark.parametrize("geometry", ["7x7 unpadded", "5x5 stride 2, odd sizes", "multiplier 2, stride 2"])
def test_the_window_and_the_rows_in_flight_add_the_taps_in_one_order(geometry):
    """Both forms add each output pixel's taps filter row by row, column by column, in fp32:
    their outputs are equal bit for bit (also on an H100: ``benchmarks/RESULTS.md``)."""
    spec = dataclasses.replace(GEOMETRIES[geometry], dtype="bfloat16", layout="nhwc", epilogue="bn_silu")
    window = run(spec, SMALL)[1].outs[0]
    in_flight = run(spec, IN_FLIGHT)[1].outs[0]
    assert torch.equal(window, in_flight)


def test_rows_in_flight_are_the_default_where_rows_are_dilated():
    problem = problem_of(GEOMETRIES["3x3 dilation 2"])
    assert not depthwise.render_vars(problem, SMALL)["rolled"]
    assert "dilated rows" in depthwise.depthwise_search_error(problem, IN_FLIGHT)
    plain = problem_of(GEOMETRIES["3x3"])
    assert (
        depthwise.render_vars(plain, SMALL)["rolled"]
        and not depthwise.render_vars(plain, IN_FLIGHT)["rolled"]
    )


@pytest.mark.parametrize(
    "epilogue",
    ["none", "bn_relu6", "bn_hardswish", "bn_silu", "bias_residual_relu", "silu_two_outputs", "scalar"],
)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_depthwise_epilogues_and_dtypes(epilogue, dtype):
    run(dw(2, 16, 5, 6, 3, dtype=dtype, epilogue=epilogue))


@pytest.mark.parametrize("epilogue", ["bn_hardswish", "bias_residual_relu", "silu_two_outputs"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("stride", [1, 2], ids=["stride 1", "stride 2 (pair loads)"])
def test_depthwise_w_vector_epilogues_and_dtypes(epilogue, dtype, stride):
    run(dw(2, 20, 5, 13, 3, stride=stride, dtype=dtype, epilogue=epilogue, layout="nchw"), W_VECTOR)


def with_statistic(problem: Problem, value: Expr, reduce: str) -> Problem:
    """``problem`` with the bias output and a statistic of ``value`` (fp32) after it."""
    ep = Epilogue.build([(acc() + operand("bias", "row"), problem.dtype), (value, "float32", reduce)])
    return dataclasses.replace(problem, epilogue=ep, template_hash=depthwise.kernel_hash(depthwise.FILES, ep))


@pytest.mark.parametrize(
    "statistic,reduce",
    [
        (lambda: acc(), "row_sum"),  # per pixel over the channels: a LayerNorm's mean
        (lambda: acc() * acc(), "row_sum"),  # ... and its second moment
        (lambda: acc() + operand("bias", "row"), "col_sum"),  # per image and channel: an SE pool
        (lambda: acc(), "col_max"),
    ],
)
@pytest.mark.parametrize("variant", ["default", "w_vector", "in_flight"])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_statistics(statistic, reduce, variant, stride):
    """The SE pool after a stride-2 depthwise convolution (MBConv) included."""
    layout = "nchw" if variant == "w_vector" else "nhwc"
    spec = dw(
        2, 24, 6 * stride, 7 * stride, 3, stride=stride, dtype="float32", epilogue="bias", layout=layout
    )
    problem = with_statistic(problem_of(spec), statistic(), reduce)
    x, w, ops = random_inputs(problem, "cpu", 0)
    config = Config(16, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=4, variant=variant)
    bound = checked_launch(problem, config, x, w, ops)
    want = (2, 6, 7) if reduce.startswith("row") else (2, 24)
    assert tuple(bound.outs[1].shape) == want


@pytest.mark.parametrize(
    "config",
    [
        Config(16, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=1),  # one row of 16 a program
        Config(16, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=8),  # strips of 2
        Config(64, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=16),  # taller than the output
    ],
)
def test_depthwise_strips(config):
    run(dw(1, 24, 6, 10, 5, dtype="float32", epilogue="bias"), config)
    run(dw(1, 24, 9, 7, 3, stride=2, dtype="float32", epilogue="bias"), config)


@pytest.mark.parametrize("variant,layout", [("default", "nhwc"), ("w_vector", "nchw"), ("in_flight", "nhwc")])
@pytest.mark.parametrize("geometry", ["5x5 stride 2, odd sizes", "3x3 dilation 2", "multiplier 2, stride 2"])
def test_input_rows_loaded_two_steps_ahead(geometry, variant, layout):
    """num_stages 2: each step loads the input rows of the step after next."""
    if variant == "in_flight" and "dilation" in geometry:
        pytest.skip("dilated rows: the default variant is the rows in flight")
    config = Config(16, 16, 16, 1, num_warps=1, num_stages=2, TILE_H=4, variant=variant)
    run(dataclasses.replace(GEOMETRIES[geometry], dtype="float32", layout=layout, epilogue="bias"), config)


@pytest.mark.parametrize(
    "config",
    [
        Config(16, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=4, variant="w_vector"),  # 4 wide
        Config(64, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=2, variant="w_vector"),  # wider than it
        Config(64, 32, 16, 1, num_warps=2, num_stages=1, TILE_H=4, variant="w_vector"),
    ],
)
def test_depthwise_w_vector_strips(config):
    run(dw(1, 24, 6, 10, 5, dtype="float32", epilogue="bias", layout="nchw"), config)
    run(dw(1, 24, 9, 7, 3, stride=2, dtype="float32", epilogue="bias", layout="nchw"), config)


def test_depthwise_is_the_conv2d_problems_twin_and_its_heuristic_is_preferred():
    conv = dw(1, 8, 6, 6, 3).problem()
    twin = problem_of(dw(1, 8, 6, 6, 3))
    assert conv.template == "conv2d" and untuned_choice(conv) == twin
    assert twin.shape == conv.shape and twin.geometry == conv.geometry and twin.key != conv.key
    assert Problem.from_json(twin.to_json()) == twin
    grouped = ConvSpec(1, 8, 6, 6, 8, 3, 3, padding=1, groups=4).problem()  # 2 channels per group
    tripled = ConvSpec(1, 8, 6, 6, 24, 3, 3, padding=1, groups=8).problem()  # multiplier 3
    assert [t.template for t in twins(grouped)] == ["conv2d"]
    assert [t.template for t in twins(tripled)] == ["conv2d"]


def test_a_model_tunes_a_depthwise_convolution_on_its_twin_only(tmp_path):
    """``tune --model`` leaves the implicit GEMM of a depthwise convolution untuned (4-30x
    slower than the direct kernel on every layer measured): its trials were a third of a
    MobileNet's tuning time. A grouped convolution with no depthwise twin is still tuned."""
    from epilab.db import INTERPRETER_DEVICE, TuningDB
    from epilab.templates.registry import superseded
    from epilab.tuner.work import unserved

    conv = dw(2, 8, 6, 6, 5, stride=2).problem()
    twin = problem_of(dw(2, 8, 6, 6, 5, stride=2))
    grouped = ConvSpec(1, 8, 6, 6, 8, 3, 3, padding=1, groups=4).problem()
    assert superseded(conv) and not superseded(twin) and not superseded(grouped)
    with TuningDB.open(str(tmp_path / "t.db")) as db:
        assert unserved(db, INTERPRETER_DEVICE, [conv, twin, grouped]) == [twin, grouped]


def test_the_default_config_fits_every_suite_layer():
    """... in both formats: NCHW takes the w_vector variant (the channel lanes for kernels
    over 3x3 on outputs up to 8 pixels wide, but for a W stride of 2), NHWC the channel lanes,
    and no default is one the tuner would pass over."""
    from epilab.policy.suites import suite

    for spec in suite("depthwise"):
        channel_lanes = spec.r * spec.s > 9 and spec.problem().geometry.q <= 8 and spec.stride != 2
        for layout, variant in (("nhwc", "default"), ("nchw", "default" if channel_lanes else "w_vector")):
            problem = problem_of(dataclasses.replace(spec, layout=layout))
            config = default_config(problem)
            assert config.variant == variant, spec.label()
            assert kind_of(problem).config_error(problem, config) is None, spec.label()
            assert depthwise.depthwise_search_error(problem, config) is None, (spec.label(), config)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_the_default_config_is_a_legal_one_on_tiny_outputs(geometry, layout):
    """A 1x1 or 2x2 output still gets a strip of at least 16 pixels (taller than the output)."""
    spec = dataclasses.replace(GEOMETRIES[geometry], layout=layout)
    problem = problem_of(spec)
    config = default_config(problem)
    assert kind_of(problem).config_error(problem, config) is None
    if problem.geometry.p * problem.geometry.q < 4:  # and it runs, correctly
        run(dataclasses.replace(spec, dtype="float32", epilogue="bias"), config)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_the_narrowed_space_holds_every_feasible_config(layout):
    """NHWC draws from the channel lanes' dimensions only (4% of the whole space is feasible
    there), and the narrowing drops no config the search could run."""
    from epilab.policy.space import HOPPER, configs, space_for

    problem = problem_of(dw(32, 144, 56, 56, 3, layout=layout))
    space = space_for(problem, HOPPER)
    feasible = configs(problem, HOPPER)
    assert feasible and all(getattr(c, n) in values for c in feasible for n, values in space.items())
    assert ("w_vector" in space["variant"]) == (layout == "nchw")
    assert any(c.variant == "w_vector" for c in feasible) == (layout == "nchw")


def test_w_vector_is_searched_where_w_is_contiguous_only():
    config = Config(256, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=16, variant="w_vector")
    nchw, nhwc = (problem_of(dw(8, 32, 28, 28, 3, layout=layout)) for layout in ("nchw", "nhwc"))
    assert depthwise.depthwise_search_error(nchw, config) is None
    assert "NHWC" in depthwise.depthwise_search_error(nhwc, config)
    idle = dataclasses.replace(config, BLOCK_M=64, TILE_H=16, num_warps=4)  # 16x4 elements, 128 lanes
    assert "idle" in depthwise.depthwise_search_error(nchw, idle)


@pytest.mark.parametrize(
    "config,match",
    [
        (Config(16, 16, 32, 1, num_warps=1, num_stages=1), "no K blocks"),
        (Config(64, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=2), "one of (2, 4, 8, 16)"),
        (Config(16, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=16), "one of (2, 4, 8, 16)"),
        (Config(128, 32, 16, 1, num_warps=1, num_stages=1, TILE_H=64), None),
        (
            Config(16, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=8, variant="w_vector"),
            "(4, 8, 16, 32, 64, 128)",
        ),
        (Config(1024, 16, 16, 1, num_warps=4, num_stages=1, TILE_H=8, variant="w_vector"), None),
        (Config(16, 16, 16, 1, num_warps=1, num_stages=1, TILE_H=2, variant="tma"), "no variant 'tma'"),
        (Config(16, 16, 16, 1, num_warps=1, num_stages=3, TILE_H=2), "1 to 2 steps ahead"),
    ],
)
def test_depthwise_config_errors_say_what_is_accepted(config, match):
    problem = problem_of(dw(1, 8, 6, 6, 3))
    why = depthwise.config_error(problem, config)
    assert (why is None) if match is None else (match in why)


def test_a_convolution_it_does_not_run_is_refused_clearly():
    conv = ConvSpec(1, 8, 6, 6, 8, 3, 3, padding=1, groups=4).problem()
    with pytest.raises(ValueError, match="groups = C with"):
        dataclasses.replace(
            conv, template="depthwise", template_hash=depthwise.kernel_hash(depthwise.FILES, conv.epilogue)
        )
    big = ConvSpec(1, 8, 20, 20, 8, 11, 11, padding=5, groups=8).problem()
    assert [t.template for t in twins(big)] == ["conv2d"]


def test_a_contiguous_layouts_input_strides_are_compiled_in():
    spec = dw(2, 6, 9, 11, 3)
    nchw, nhwc = (problem_of(dataclasses.replace(spec, layout=layout)) for layout in ("nchw", "nhwc"))
    assert depthwise.input_strides(nchw, nchw.geometry) == {"n": "594", "c": "99", "h": "11", "w": "1"}
    assert depthwise.input_strides(nhwc, nhwc.geometry) == {"n": "594", "h": "66", "w": "6", "c": "1"}
    strided = dataclasses.replace(nchw, layout_a="strided")
    assert depthwise.input_strides(strided, strided.geometry) == {d: f"stride_x{d}" for d in "nchw"}
    s3 = problem_of(dw(2, 6, 9, 11, 3, stride=3, layout="nchw"))  # w_vector gathers: arguments
    assert depthwise.input_strides(s3, s3.geometry, "w_vector") == {d: f"stride_x{d}" for d in "nchw"}
    assert depthwise.input_strides(s3, s3.geometry)["h"] == "11"  # the channel lanes' numbers
    s2 = problem_of(dw(2, 6, 9, 11, 3, stride=2, layout="nchw"))  # w_vector's contiguous pair loads
    assert depthwise.input_strides(s2, s2.geometry, "w_vector")["w"] == "1"


def test_a_w_stride_of_2_reads_each_tap_column_from_a_contiguous_pair_load():
    """5 taps, padding 2: columns 2q - 2 .. 2q + 2 are the even and odd halves of the loads
    from 2 (q - 1), 2 q and 2 (q + 1); every tap once."""
    pairs = depthwise.pair_loads(problem_of(dw(1, 8, 14, 14, 5, stride=2)).geometry)
    assert pairs == [(-1, [(0, 0), (1, 1)]), (0, [(0, 2), (1, 3)]), (1, [(0, 4)])]
    unpadded = depthwise.pair_loads(problem_of(dw(1, 8, 14, 14, 3, stride=2, padding=0)).geometry)
    assert unpadded == [(0, [(0, 0), (1, 1)]), (1, [(0, 2)])]
    for other in (
        dw(1, 8, 14, 14, 3),
        dw(1, 8, 14, 14, 3, stride=3),
        dw(1, 8, 14, 14, 3, stride=2, dilation=2),
    ):
        assert depthwise.pair_loads(problem_of(other).geometry) is None


@pytest.mark.parametrize("config", [SMALL, W_VECTOR], ids=["channel lanes", "w_vector"])
def test_an_input_of_another_layout_than_its_problems_is_refused(config):
    problem = problem_of(dw(2, 6, 9, 11, 3, dtype="float32", epilogue="bias", layout="nchw"))
    x, w, ops = random_inputs(problem, "cpu", 0)
    x = x.contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="do not match the problem"):  # the checked call
        checked_launch(problem, config, x, w, ops)
    with pytest.raises(ValueError, match="contiguous NCHW input"):  # and the bare bind (a replay's)
        depthwise.bind_depthwise(problem, config, x, w, ops)


@pytest.mark.parametrize("config", [SMALL, W_VECTOR], ids=["channel lanes", "w_vector"])
def test_a_strided_input_runs_on_its_stride_arguments(config):
    """A layout the problem does not fix (every other row of a taller image) is read
    through the stride arguments."""
    nchw = problem_of(dw(2, 6, 9, 11, 3, dtype="float32", epilogue="bias", layout="nchw"))
    problem = dataclasses.replace(nchw, layout_a="strided")
    x, w, ops = random_inputs(nchw, "cpu", 0)
    x = torch.cat([x, torch.full_like(x, float("nan"))], dim=3).view(2, 6, 18, 11)[:, :, ::2]
    assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    checked_launch(problem, config, x, w, ops)


def test_the_unrolling_plan_loads_each_input_row_once_and_uses_every_tap():
    plan = depthwise.plan(problem_of(dw(1, 8, 14, 14, 7)).geometry, 8)
    assert plan["in_flight"] == 7 and plan["cols"] == list(range(8 + 7 - 1))
    assert plan["steps"] == [(0, [(f, 6 - f) for f in range(7)])]  # one new row a step, every filter row
    assert len(plan["joins"]) == 3 and plan["joined"] == "j3_0"
    strided = depthwise.plan(problem_of(dw(1, 8, 14, 14, 5, stride=2)).geometry, 4)
    assert strided["in_flight"] == 3 and strided["first_row"] == 3
    assert sorted(r for _, uses in strided["steps"] for _, r in uses) == [0, 1, 2, 3, 4]  # each once
    dilated = depthwise.plan(problem_of(dw(1, 8, 14, 14, 3, dilation=2)).geometry, 4)
    assert dilated["in_flight"] == 5 and dilated["steps"] == [(0, [(0, 2), (2, 1), (4, 0)])]
    # the window: R - stride rows carried, stride rows loaded a step (all R where the stride is larger)
    assert plan["rolled"] and plan["carried"] == 6 and plan["loaded"] == [6]
    assert strided["rolled"] and strided["carried"] == 3 and strided["loaded"] == [3, 4]
    apart = depthwise.plan(problem_of(dw(1, 8, 14, 14, 3, stride=4)).geometry, 4)
    assert apart["carried"] == 0 and apart["loaded"] == [0, 1, 2]
    assert (
        not dilated["rolled"]
        and not depthwise.plan(problem_of(dw(1, 8, 14, 14, 7)).geometry, 8, False)["rolled"]
    )


# ------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "spec",
    [
        dw(32, 384, 14, 14, 7, epilogue="bias"),
        dw(8, 240, 28, 28, 5, epilogue="bn_silu"),
        dw(8, 144, 56, 56, 3, stride=2, epilogue="bn_relu6"),
        dw(4, 672, 14, 14, 5, mult=2, epilogue="bn_hardswish"),
        dw(3, 100, 17, 23, 3, dilation=2, epilogue="bias_residual_relu"),
        dw(8, 960, 7, 7, 5, epilogue="bn_hardswish"),  # NCHW's default: the channel lanes
    ],
    ids=lambda s: s.label(),
)
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_gpu_depthwise(spec, layout):
    check_every_seed(problem_of(dataclasses.replace(spec, layout=layout)))


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", ["row_sum", "col_sum"])
def test_gpu_depthwise_statistics(reduce):
    check_every_seed(with_statistic(problem_of(dw(4, 96, 20, 20, 7, epilogue="bias")), acc(), reduce))


def check_every_seed(problem: Problem) -> None:
    for config in {default_config(problem), *depthwise.SEEDS}:
        if kind_of(problem).config_error(problem, config) is None:
            x, w, ops = random_inputs(problem, "cuda", 0)
            checked_launch(problem, config, x, w, ops)


def test_the_tuner_searches_the_depthwise_twin_with_its_rows(tmp_path):
    """`tune --shapes` on a depthwise convolution tunes its conv2d problem and its depthwise
    twin; the twin's records keep TILE_H (a config field only this kind searches)."""
    import json

    from typer.testing import CliRunner

    from epilab.cli import app
    from epilab.db import INTERPRETER_DEVICE, TuningDB

    shapes = tmp_path / "dw.json"
    spec = {"n": 1, "c": 8, "h": 6, "w": 7, "k": 8, "r": 3, "s": 3, "padding": 1, "groups": 8}
    shapes.write_text(json.dumps([{**spec, "epilogue": "bn_relu6"}]))
    db = str(tmp_path / "t.db")
    args = ["tune", "--shapes", str(shapes), "--interpret", "--trials", "3", "--patience", "100", "--db", db]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    twin = problem_of(dw(1, 8, 6, 7, 3, epilogue="bn_relu6"))
    with TuningDB.open(db) as store:
        best = store.best(twin.key, INTERPRETER_DEVICE)
    assert best is not None and best.record.config is not None
    config = Config.from_dict(best.record.config)
    assert depthwise.config_error(twin, config) is None
    assert config.BLOCK_M // config.TILE_H in depthwise.WIDTHS[config.variant]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_the_tuner_checks_and_times_the_output_layout_a_call_allocates(layout):
    """The tuner's worker checks and times a candidate on ``kind.empty_outputs`` (NaN-poisoned),
    the compile pool and a compiled model's call on the outputs ``bind`` allocates: one layout,
    or an NCHW candidate is timed on stores it never runs and compiled a second time."""
    from epilab.templates.registry import kind_of, output_specs
    from epilab.templates.verify import poisoned_outputs

    spec = dw(2, 6, 9, 11, 5, stride=2, dtype="float32", epilogue="bias", layout=layout)
    for problem in (spec.problem(), problem_of(spec)):  # the conv2d kind's and its depthwise twin
        x, w, ops = random_inputs(problem, "cpu", 0)
        config = default_config(problem, "interpreter")
        allocated = kind_of(problem).bind(problem, config, x, w, ops).outs
        poisoned = poisoned_outputs(problem, "cpu")
        assert [o.stride() for o in poisoned] == [o.stride() for o in allocated], problem.template
        assert [tuple(s) for _, s in output_specs(problem, x, w)] == [o.stride() for o in allocated]
        assert allocated[0].is_contiguous(
            memory_format=torch.channels_last if layout == "nhwc" else torch.contiguous_format
        )


# ------------------------------------------------------------------ a LayerNorm in the epilogue


@pytest.mark.parametrize(
    "spec",
    [
        dw(2, 24, 5, 6, 7, dtype="bfloat16"),  # 24 channels in a block of 32: masked lanes add nothing
        dw(1, 40, 6, 7, 3, stride=2, dtype="float16"),
        dw(1, 8, 4, 5, 5, mult=2, dtype="float32"),
    ],
    ids=["7x7, 24 of 32 lanes, bf16", "3x3 stride 2, 40 of 64 lanes, fp16", "5x5 multiplier 2, fp32"],
)
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_a_layer_norm_over_the_channels_is_normalised_in_the_epilogue(spec, layout):
    """``bias_layer_norm``: mean and variance per pixel over every channel (``row_total``),
    so one program holds a pixel's channels; checked against float64 (the reference sums on
    the [N, P*Q, K] view)."""
    spec = dataclasses.replace(spec, layout=layout, epilogue="bias_layer_norm")
    problem = problem_of(spec)
    assert problem.epilogue.row_totals
    config = default_config(problem, "interpreter")
    assert config.BLOCK_N == depthwise.row_channels(problem) >= int(problem.shape.n)
    x, w, ops = random_inputs(problem, "cpu", 0)
    checked_launch(problem, config, x, w, ops)
    checked_launch(problem, dataclasses.replace(config, variant="in_flight"), x, w, ops)


def test_row_totals_need_every_channel_in_one_program():
    problem = problem_of(dw(1, 40, 6, 6, 3, epilogue="bias_layer_norm"))
    why = kind_of(problem).config_error(problem, SMALL)
    assert "BLOCK_N >= 40" in why and "row_total" in why
    wide = dw(1, 520, 4, 4, 3, epilogue="bias_layer_norm").problem()
    assert [t.template for t in twins(wide)] == ["conv2d"]
    assert "depthwise: a depthwise program holds at most 512 channels" in row_error(wide)
    assert row_error(problem) is None and row_error(problem_of(dw(1, 8, 4, 4, 3))) is None
    # the conv2d kind's implicit GEMM does not hold rows: only the depthwise twin runs it
    conv = dw(1, 40, 6, 6, 3, epilogue="bias_layer_norm").problem()
    assert "cannot sum over whole output rows" in kind_of(conv).config_error(conv, SMALL)
    assert [t.template for t in twins(conv)] == ["conv2d", "depthwise"]
    assert untuned_choice(conv).template == "depthwise"


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_the_space_of_a_layer_norm_holds_a_pixels_channels(layout):
    """The narrowed space draws only channel blocks that hold every channel, on the channel
    lanes, one or two a lane; every config it yields passes the checks."""
    from epilab.policy.space import HOPPER, configs, space_for

    problem = problem_of(dw(32, 192, 56, 56, 7, layout=layout, epilogue="bias_layer_norm"))
    space = space_for(problem, HOPPER)
    assert space["BLOCK_N"] == (256,) and space["variant"] == ("default", "in_flight")
    assert set(space["num_warps"]) == {4, 8}
    feasible = configs(problem, HOPPER)
    assert feasible and all(kind_of(problem).config_error(problem, c) is None for c in feasible)
    plain = problem_of(dw(32, 192, 56, 56, 7, layout=layout, epilogue="bias"))
    assert all(c.BLOCK_N <= depthwise.PLAIN_CHANNELS for c in configs(plain, HOPPER))
