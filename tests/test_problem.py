"""Problem: validation, canonical JSON and keys, symbolic shapes,
rendering decisions (EVEN_K through sympy), the template hash and the build cache."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import sympy
import torch

from epilab import config as epilab_config
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.ir.problem import OperandSpec, Problem, Shape, symbol
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.registry import kind_of, source, template_hash
from epilab.templates.runtime import build as build_mod
from epilab.templates.runtime import render as render_mod


def _problem(shape: Shape | None = None, **changes) -> Problem:
    ep = Epilogue.build([(ops.gelu(acc() + operand("bias", "row")), "bfloat16")])
    fields = dict(
        op="addmm",
        template="matmul",
        template_hash=template_hash("matmul", ep),
        dtype="bfloat16",
        layout_a="row",
        layout_b="col",
        operands=(OperandSpec("bias", "bfloat16", "vector"),),
        epilogue=ep,
        shape=shape or Shape(1, 4096, 4096, 4096),
    )
    fields.update(changes)
    return Problem(**fields)


# ------------------------------------------------------------------ Problem


def test_problem_key_is_canonical_and_round_trips():
    p = _problem()
    again = Problem.from_json(p.to_json())
    assert again == p and again.key == p.key and len(p.key) == 64
    assert _problem(shape=Shape(1, 4096, 4096, 2048)).key != p.key
    assert _problem(layout_b="row").key != p.key


def test_problem_with_symbolic_shape_round_trips():
    s0, s1 = symbol("s0"), symbol("s1")
    p = _problem(shape=Shape(1, 2 * s0 * s1 + 3, 4096, 64 * s1))
    again = Problem.from_json(p.to_json())
    assert again.shape == p.shape and again.key == p.key
    assert not p.shape.is_static()


def test_static_problems_are_tuned_and_rendered_without_sympy():
    """sympy is imported only where a symbolic dim is: 0.4-0.7 s of every ``epilab tune``'s
    start-up and of each compile process's, which import the tuner's modules and render static
    problems (issue 45: a fleet's start-up is its imports)."""
    code = (
        "import sys\n"
        "import epilab.cli, epilab.tuner.tune, epilab.tuner.evaluate, epilab.tuner.worker\n"
        "from epilab.ir.config import Config\n"
        "from epilab.ir.problem import Problem\n"
        "from epilab.templates.gemm.gemm_spec import Spec\n"
        "from epilab.templates.registry import source\n"
        "p = Problem.from_json(Spec(1000, 328, 72, epilogue='bias_gelu').problem().to_json())\n"
        "source(p, Config(64, 64, 32))\n"
        "assert 'sympy' not in sys.modules, 'sympy imported'\n"
        "Problem.from_json(_SYMBOLIC)\n"
        "assert 'sympy' in sys.modules\n"
    )
    symbolic = _problem(shape=Shape(1, 2 * symbol("s0") + 3, 4096, 64)).to_json()
    done = subprocess.run(
        [sys.executable, "-c", code.replace("_SYMBOLIC", repr(symbolic))], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("dim", ["__import__('os').system('true')", "s0**2", "s0 / 2", "lambda: 1", "", "-"])
def test_symbolic_dims_are_parsed_never_evaluated(dim):
    d = _problem().to_dict()
    d["shape"]["m"] = dim
    with pytest.raises(ValueError):
        Problem.from_dict(d)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"op": "conv"}, "does not run conv problems"),
        ({"dtype": "float64"}, "input dtype"),
        ({"layout_a": "diag"}, "layout of A"),
        ({"precision": "fp8"}, "precision"),
        ({"operands": ()}, "do not match"),
    ],
)
def test_problem_validation(change, match):
    with pytest.raises(ValueError, match=match):
        _problem(**change)


def test_make_problem_reads_layouts_and_operands():
    a = torch.randn(5, 7).t()  # [7, 5] column-major
    b = torch.randn(5, 9)
    ep = Epilogue.build([(acc() + operand("bias", "row"), "float32")])
    p = make_problem(a, b, ep, {"bias": torch.randn(9, dtype=torch.bfloat16)})
    assert (p.layout_a, p.layout_b, p.dtype) == ("col", "row", "float32")
    assert p.operands == (OperandSpec("bias", "bfloat16", "vector"),)
    assert p.shape == Shape(1, 7, 9, 5)


# ------------------------------------------------------------------ render


@pytest.mark.parametrize(
    "k,block_k,even",
    [
        (4096, 64, True),
        (4095, 64, False),
        (64 * symbol("s0"), 64, True),
        (64 * symbol("s0"), 128, False),
        (symbol("s0"), 16, False),
    ],
)
def test_even_k_is_decided_with_sympy(k, block_k, even):
    assert render_mod.divides(block_k, k) is even
    src = source(_problem(shape=Shape(1, 128, 128, k)), Config(64, 64, block_k))
    assert ("k_left = K - k * BLOCK_K" not in src) is even


def test_rendered_source_reads_like_a_kernel():
    src = source(_problem(), Config(128, 128, 64, num_warps=8))
    compile(src, "<rendered>", "exec")  # valid Python
    assert "def epilab_matmul_add_gelu(" in src
    assert "def tile_order(" in src and "def to_bf16(" in src
    # a bf16 output: gelu takes its fast form, and the module has fast_math.py.jinja's helpers
    assert "fast_gelu(" in src.split("def epilab_matmul_add_gelu(")[1] and src.count("@triton.jit") == 3 + 7
    assert "to_bf16(" in src.split("def epilab_matmul_add_gelu(")[1]  # bf16 rounding goes through it
    assert "0x7FFF" not in src  # on a GPU to_bf16 is the hardware cast
    assert "op_bias = tl.load(" in src and "tl.store(out0_ptr" in src
    assert ".to(tl.float32)\n        b = b.to" not in src  # bf16 upcast is for the interpreter only
    interp = source(_problem(), Config(128, 128, 64), target="interpreter")
    assert "a = a.to(tl.float32)" in interp and "0x7FFF" in interp


def test_render_refuses_stale_problems_and_unknown_targets():
    with pytest.raises(ValueError, match="another version of template"):
        source(_problem(template_hash="0" * 64), Config(64, 64, 64))
    with pytest.raises(ValueError, match="target"):
        source(_problem(), Config(64, 64, 64), target="rocm")


def test_template_hash_changes_when_a_template_file_changes(tmp_path, monkeypatch):
    for name in kind_of("matmul").files:
        shutil.copy(render_mod.template_path(name), tmp_path / name)
    monkeypatch.setattr(render_mod, "TEMPLATE_DIRS", (tmp_path,))
    render_mod.files_hash.cache_clear()
    try:
        ep = _problem().epilogue
        before = template_hash("matmul", ep)
        (tmp_path / "matmul.py.jinja").write_text((tmp_path / "matmul.py.jinja").read_text() + "\n# edited\n")
        render_mod.files_hash.cache_clear()
        render_mod.kernel_hash.cache_clear()
        assert template_hash("matmul", ep) != before
    finally:
        render_mod.files_hash.cache_clear()
        render_mod.kernel_hash.cache_clear()


# ------------------------------------------------------------------- build


def test_build_writes_source_under_the_cache_dir_once(tmp_path):
    src = "import triton\nimport triton.language as tl\n\nVALUE = 41 + 1\n"
    with epilab_config.patch(cache_dir=tmp_path / "cache", debug_dir=tmp_path / "debug"):
        m1 = build_mod.build(src, target="interpreter")
        m2 = build_mod.build(src, target="interpreter")
        files = list((tmp_path / "cache" / "kernels").rglob("*.py"))
    assert m1 is m2 and m1.VALUE == 42
    assert len(files) == 1 and files[0].read_text() == src
    assert files[0].stem == build_mod.source_key(src, "interpreter")
    assert len(list((tmp_path / "debug").glob("*.py"))) == 1
    assert build_mod.source_key(src, "cuda") != build_mod.source_key(src, "interpreter")


# ------------------------------------------------------------------ settings


def test_settings_from_environment(tmp_path):
    s = epilab_config.from_env(
        {"XDG_CACHE_HOME": str(tmp_path), "EPILAB_INTERPRET": "yes", "EPILAB_LOG": "info"}
    )
    assert s.cache_dir == tmp_path / "epilab" and s.db == str(tmp_path / "epilab" / "tuning.db")
    assert s.interpret and s.log_level == "INFO" and s.debug_dir is None
    s = epilab_config.from_env({"EPILAB_CACHE_DIR": str(tmp_path / "c"), "EPILAB_DB": "postgresql://h/db"})
    assert s.cache_dir == tmp_path / "c" and s.db == "postgresql://h/db" and not s.interpret
    assert epilab_config.from_env({"TRITON_INTERPRET": "1"}).interpret
    s = epilab_config.from_env({"EPILAB_POLICY": "Always", "EPILAB_LOG": "1"})
    assert s.policy == "always" and s.log_level == "INFO"
    assert epilab_config.from_env({}).policy == "auto"


@pytest.mark.parametrize(
    "env,match",
    [
        ({"EPILAB_INTERPRET": "maybe"}, "EPILAB_INTERPRET"),
        ({"EPILAB_LOG": "LOUD"}, "EPILAB_LOG"),
        ({"EPILAB_POLICY": "sometimes"}, "EPILAB_POLICY"),
    ],
)
def test_settings_reject_bad_values(env, match):
    with pytest.raises(ValueError, match=match):
        epilab_config.from_env(env)


def test_patch_restores_and_rejects_unknown_names(tmp_path):
    before = epilab_config.settings()
    with epilab_config.patch(cache_dir=tmp_path):
        assert epilab_config.settings().cache_dir == tmp_path
    assert epilab_config.settings() == before
    with pytest.raises(TypeError, match="unknown setting"), epilab_config.patch(colour="blue"):
        pass


def test_symbols_carry_inductor_assumptions():
    assert symbol("s0") == sympy.Symbol("s0", integer=True, positive=True)
