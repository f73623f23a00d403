"""The template kinds' registry: every kind is a complete, consistent TemplateKind, and a
new kind is one object and one registry entry (the toy kind below), with the tuner, the
checks, the suites and the launch path asking it and nothing else changed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from epilab.ir import dtypes
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.ir.problem import Problem
from epilab.policy import space, suites
from epilab.policy.space import HOPPER, configs, infeasible
from epilab.templates import registry
from epilab.templates.gemm import gemm_spec, matmul, matmul_config, matmul_reference
from epilab.templates.kind import TemplateKind
from epilab.templates.runtime.render import kernel_hash, template_path
from epilab.templates.verify import checked_launch, random_inputs
from epilab.tuner import evaluate
from epilab.tuner.baselines import KIND_LIBRARIES


@pytest.mark.parametrize("name", sorted(registry.KINDS))
def test_every_kind_is_complete_and_consistent(name):
    kind = registry.KINDS[name]
    assert isinstance(kind, TemplateKind) and kind.name == name
    # its own Jinja file, beside its module in its family's folder, or one it shares with a
    # kind of its family (the dual GEMM's, matmul's)
    assert kind.files[0].endswith(".py.jinja") and template_path(kind.files[0]).is_file()
    if kind.files[0] == f"{name}.py.jinja":
        assert template_path(kind.files[0]).with_name(f"{name}.py").is_file()
    assert kind.library in KIND_LIBRARIES
    assert all(registry.default_template(op) == name for op in kind.ops)
    for c in kind.seeds:  # seeds lie in the kind's own space
        assert all(getattr(c, dim) in values for dim, values in kind.space.items()), (name, c)


def test_the_one_dtype_table():
    assert dtypes.INPUT_DTYPES == ("float16", "bfloat16", "float32", "float8_e4m3fn", "float8_e5m2")
    assert dtypes.WIDE_INPUT_DTYPES == ("float16", "bfloat16", "float32")  # every kind's
    assert dtypes.FP8_DTYPES == ("float8_e4m3fn", "float8_e5m2")  # the matmul's too
    assert dtypes.OPERAND_DTYPES == ("float16", "bfloat16", "float32", "bool")  # scales are float32
    assert dtypes.OUTPUT_DTYPES == ("float16", "bfloat16", "float32", "bool", "float8_e4m3fn", "float8_e5m2")
    for name, d in dtypes.TABLE.items():
        assert dtypes.name_of(d.torch) == name and d.itemsize == torch.empty((), dtype=d.torch).element_size()
    assert dtypes.name_or_none(torch.int8) is None
    with pytest.raises(TypeError, match="not supported"):
        dtypes.name_of(torch.float64)


# ------------------------------------------------------------------ a toy kind


def _small_tile_check(problem, config):
    if config.BLOCK_M > 32 or config.BLOCK_N > 32:
        return "the small_tile template takes tiles of at most 32x32"
    if config.variant != "default":
        return "the small_tile template has the default loop only"
    return matmul_config.config_error(problem, config)


def _on_small_tile(problem):
    return dataclasses.replace(
        problem, template="small_tile", template_hash=kernel_hash(matmul.FILES, problem.epilogue)
    )


# A toy kind: the matmul Jinja file under its own name, with a search space of small tiles
# only, the default loop, and twins of the matmul problems it can take; built as a new
# kind of the matmul family would be, from matmul's parts.
TOY = dataclasses.replace(
    matmul.KIND,
    name="small_tile",
    ops=(),
    takes=matmul.KIND.ops,  # the matmul problems it runs (its twins)
    space={
        "BLOCK_M": (16, 32),
        "BLOCK_N": (16, 32),
        "BLOCK_K": (16, 32),
        "GROUP_M": (1, 4),
        "num_warps": (2, 4),
        "num_stages": (1, 2),
    },
    seeds=(Config(32, 32, 32, 4, num_warps=4, num_stages=2),),
    check=_small_tile_check,
    default_config=lambda problem, target, *, sm_count: Config(32, 32, 32, 4, num_warps=4, num_stages=2),
    problem_of=lambda problem, a, b, operands: _on_small_tile(
        matmul.matmul_problem_of(problem, a, b, operands)
    ),
    bind=lambda problem, config, a, b, operands, out=None: matmul.bind_matmul(
        problem, config, a, b, operands, out, kind=TOY
    ),
    applies=lambda name, chosen: True,
    twins=lambda p: (_on_small_tile(p),) if p.template == "matmul" and p.shape.batch == 1 else (),
)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(registry.KINDS, TOY.name, TOY)  # the one registry line
    return TOY


def _problem(m=20, n=41, k=20) -> Problem:
    return gemm_spec.Spec(m, n, k, epilogue="bias_gelu_tanh").problem()


def test_a_new_kind_is_one_object_and_one_registry_line(toy):
    base = _problem()
    twin = registry.twins(base)[-1]
    assert [p.template for p in registry.twins(base)] == ["matmul", "small_tile"]
    assert (
        registry.kind_of(twin) is toy
        and registry.template_hash("small_tile", twin.epilogue) == twin.template_hash
    )
    assert registry.is_current(twin.to_json())
    # the tuner's space and rules come from the kind
    found = configs(twin, HOPPER)
    assert found and all(c.BLOCK_M <= 32 and c.BLOCK_N <= 32 for c in found)
    assert "outside the small_tile search space" in infeasible(twin, Config(64, 32, 32), HOPPER)
    assert space.applies(twin)("TMA_STORE", {"variant": "default"})
    # suites and labels ask the registry
    assert gemm_spec.Spec(20, 41, 20, epilogue="bias_gelu_tanh", template="small_tile").problem() == twin
    assert suites.problem_label(twin).endswith("[small_tile]")
    # launch, check and the tuner's candidate evaluation, in the interpreter
    a, b, operands = random_inputs(twin, "cpu", seed=1)
    bound = checked_launch(twin, Config(16, 32, 16, 1, num_warps=4, num_stages=1), a, b, operands)
    assert bound.outs[0].shape == (20, 41)
    assert "def epilab_small_tile_" in registry.source(twin, Config(16, 16, 16), target="interpreter")
    result = evaluate.evaluate_candidate(twin.to_json(), Config(32, 16, 32).to_dict(), seed=3)
    assert result["status"] == "ok", result
    with pytest.raises(ValueError, match="at most 32x32"):
        registry.launch(twin, Config(64, 64, 32), a, b, operands)


def test_a_kind_that_is_not_registered_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown template 'small_tile'"):
        dataclasses.replace(_problem(), template="small_tile")  # a Problem names a known template
    with pytest.raises(ValueError, match="unknown template 'small_tile'"):
        registry.kind_of("small_tile")
    with pytest.raises(ValueError, match="template 'small_tile' is not one of"):
        gemm_spec.Spec(9, 41, 20, template="small_tile")


def test_checked_launch_fails_on_a_wrong_kernel(toy, monkeypatch):
    """The one check is not a formality: a kind whose reference disagrees with its kernel fails."""
    twin = registry.twins(_problem())[-1]
    a, b, operands = random_inputs(twin, "cpu", seed=2)
    wrong = dataclasses.replace(
        TOY,
        reference=lambda p, a, b, o: tuple(r * 1.5 for r in matmul_reference.reference(p.epilogue, a, b, o)),
    )
    monkeypatch.setitem(registry.KINDS, TOY.name, wrong)
    with pytest.raises(AssertionError, match=r"output 0: \|\|out-ref\|\|/\|\|ref\|\| = .* > 1e-02"):
        checked_launch(twin, Config(16, 16, 16, 1, num_warps=4, num_stages=1), a, b, operands)


def test_output_specs_serve_fake_and_real_calls_alike():
    ep = Epilogue.build([(ops.relu(acc() + operand("bias", "row")), "bfloat16"), (acc(), "float32")])
    a, b = torch.randn(3, 5, 7), torch.randn(7, 4)
    problem = dataclasses.replace(_problem(), epilogue=ep)
    specs = registry.output_specs(problem, a, b)
    assert specs == [((3, 5, 4), (20, 4, 1))] * 2
    assert registry.twin_call(problem, a, b) is None  # a matmul called with its own tensors


def test_tile_h_is_the_depthwise_knob_only():
    """A config's TILE_H (the depthwise strip's output rows) is refused by name elsewhere, not
    ignored: a tuned record with it would say a kernel ran that did not."""
    from epilab.templates.conv.conv_spec import ConvSpec

    problems = [
        gemm_spec.Spec(64, 64, 64).problem(),
        gemm_spec.Spec(1, 256, 256).problem(),
        gemm_spec.Spec(64, 128, 256, weight="float8_e4m3fn").problem(),
        ConvSpec(2, 16, 8, 8, 16, 3, 3, stride=1, padding=1).problem(),
    ]
    for p in problems:
        kind = registry.kind_of(p)
        config = dataclasses.replace(registry.default_config(p), TILE_H=4)
        assert "TILE_H=4 is the depthwise template's knob" in (kind.config_error(p, config) or ""), p.template
        assert kind.config_error(p, dataclasses.replace(config, TILE_H=1)) is None, p.template
    grouped = ConvSpec(2, 16, 8, 8, 16, 3, 3, stride=1, padding=1, groups=16).problem()
    depthwise = registry.for_template(grouped, "depthwise")
    config = dataclasses.replace(registry.default_config(depthwise), TILE_H=4)
    assert "TILE_H" not in (registry.kind_of(depthwise).config_error(depthwise, config) or "")
