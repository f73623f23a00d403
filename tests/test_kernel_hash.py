"""Records are keyed by what their kernels are made of (``render.kernel_hash``): a change
that leaves a problem's kernels as they were leaves its records current; one that changes
them makes them stale. The cases are the changes the IR sees most: a new epilogue op (a rule
row), a new operand broadcast (a branch of ``store_output.py.jinja``), a new template kind, and
edits to one template's own files."""

from __future__ import annotations

import dataclasses
import shutil

import jinja2
import pytest
import torch

from epilab.ir import rules
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.policy import suites
from epilab.templates import registry
from epilab.templates.gemm import gemm_spec
from epilab.templates.runtime import render as render_mod

EPILOGUES = ("bias_gelu_tanh", "bias_relu", "bias_gelu_tanh_residual", "residual")


def _problems():
    """Stored problems of every template: matmul with a few epilogues, gemv, conv2d, dual."""
    found = [gemm_spec.Spec(64, 96, 32, epilogue=e).problem() for e in EPILOGUES]
    found.append(gemm_spec.Spec(1, 256, 128, template="gemv").problem())
    found += [s.problem() for s in suites.SUITES["conv"][:1]]
    found += [s.problem() for s in suites.SUITES["mlp"][:1]]
    return found


def _fresh_caches():
    render_mod.kernel_hash.cache_clear()
    render_mod.files_hash.cache_clear()
    registry.is_current.cache_clear()


@pytest.fixture
def templates_copy(tmp_path, monkeypatch):
    """The template files in a folder of their own, which the test may edit."""
    for path in render_mod.TEMPLATE_ROOT.rglob("*.py.jinja"):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.setattr(render_mod, "TEMPLATE_DIRS", (tmp_path,))
    env = jinja2.Environment(**{**_env_options(), "loader": jinja2.FileSystemLoader(tmp_path)})
    monkeypatch.setattr(render_mod, "_ENV", env)
    _fresh_caches()
    yield tmp_path
    _fresh_caches()


def _env_options():
    e = render_mod._ENV
    return dict(
        undefined=e.undefined,
        trim_blocks=e.trim_blocks,
        lstrip_blocks=e.lstrip_blocks,
        keep_trailing_newline=e.keep_trailing_newline,
        autoescape=False,
    )


def _add_softcap(monkeypatch):
    """A new epilogue op, as one row of the rule table (for the test's duration)."""
    tanh = "tl.extra.cuda.libdevice.tanh"
    softcap = rules.Rule("softcap", 1, f"{{cap}} * {tanh}({{0}} / {{cap}})", torch.tanh, attrs=("cap",))
    monkeypatch.setitem(rules.RULES, "softcap", softcap)
    _fresh_caches()


def _stored():
    return [p.to_json() for p in _problems()]


def test_every_stored_problem_is_current_and_hashes_differ_by_epilogue():
    stored = _problems()
    assert all(registry.is_current(p.to_json()) for p in stored)
    matmuls = [p for p in stored if p.template == "matmul"]
    assert len({p.template_hash for p in matmuls}) == len(matmuls)  # four epilogues, four hashes
    same_epilogue = gemm_spec.Spec(256, 512, 1024, epilogue="bias_relu").problem()
    assert same_epilogue.template_hash == matmuls[1].template_hash  # shape is not in it
    assert not registry.is_current(dataclasses.replace(matmuls[0], template_hash="0" * 64).to_json())
    assert not registry.is_current("{not json")


def test_a_new_epilogue_op_leaves_every_record_current(monkeypatch):
    stored = _stored()
    _add_softcap(monkeypatch)
    try:
        assert all(registry.is_current(text) for text in stored)
    finally:
        _fresh_caches()


def test_a_new_operand_broadcast_leaves_every_record_current_and_an_edit_they_use_does_not(templates_copy):
    stored = _stored()
    path = templates_copy / "store_output.py.jinja"
    text = path.read_text()
    branch = '{% elif op.broadcast == "diagonal" %}\n{{ p }} = tl.load({{ p }}_ptr + {{ rm }} * {{ p }}_stride_m)[:, None]\n'
    path.write_text(
        text.replace("{% else %}\n{{ p }} = tl.load", branch + "{% else %}\n{{ p }} = tl.load", 1)
    )
    _fresh_caches()
    assert path.read_text() != text
    assert all(registry.is_current(t) for t in stored)
    # an edit to the store every kernel makes: every record goes stale
    edited = text.replace("mask={{ out_mask }})", "mask={{ out_mask }}, cache_modifier='.cs')")
    assert edited != text, "the pointer store this test edits is not in store_output.py.jinja"
    path.write_text(edited)
    _fresh_caches()
    assert not any(registry.is_current(t) for t in stored)


def test_an_edit_to_one_templates_file_makes_only_its_records_stale(templates_copy):
    stored = _problems()
    path = templates_copy / "conv2d.py.jinja"
    path.write_text(path.read_text() + "\n# edited\n")
    _fresh_caches()
    current = {p.template: registry.is_current(p.to_json()) for p in stored}
    assert current.pop("conv2d") is False
    assert all(current.values()) and "matmul" in current and "gemv" in current


def test_a_fast_math_helper_changes_only_the_problems_that_call_one(templates_copy):
    stored = _problems()
    uses = {p.key: bool(p.epilogue.fast_nodes) for p in stored}
    assert any(uses.values()) and not all(uses.values())
    path = templates_copy / "fast_math.py.jinja"
    path.write_text(path.read_text() + "\n\n@triton.jit\ndef fast_softcap(x, cap):\n    return x\n")
    _fresh_caches()
    assert {p.key: not registry.is_current(p.to_json()) for p in stored} == uses


def test_a_new_template_kind_leaves_every_record_current(monkeypatch):
    from test_kinds import TOY

    stored = _stored()
    monkeypatch.setitem(registry.KINDS, TOY.name, TOY)
    _fresh_caches()
    try:
        assert all(registry.is_current(text) for text in stored)
    finally:
        _fresh_caches()


def test_a_problem_made_for_the_new_op_gets_its_own_hash(monkeypatch):
    _add_softcap(monkeypatch)
    try:
        plain = Epilogue.build([(acc() + operand("bias", "row"), "bfloat16")])
        capped = Epilogue.build([(ops.softcap(acc() + operand("bias", "row"), cap=30.0), "bfloat16")])
        assert registry.template_hash("matmul", plain) != registry.template_hash("matmul", capped)
    finally:
        _fresh_caches()


def test_a_transposed_gemv_renders_under_its_problems_hash():
    """A gemv of small N runs C.T = B.T @ A.T: its kernel renders the epilogue with row and
    column vectors swapped, which the problem's hash covers too (``kernel_epilogues``)."""
    from epilab.templates.gemv.gemv import KIND, is_transposed, kernel_problem
    from epilab.templates.runtime.render import render

    problem = gemm_spec.Spec(96, 8, 64, epilogue="bias_gelu_tanh", template="gemv").problem()
    assert is_transposed(problem) and registry.is_current(problem.to_json())
    flipped = kernel_problem(problem)
    assert flipped.epilogue != problem.epilogue and flipped.template_hash == problem.template_hash
    assert "def " in render(KIND, flipped, registry.default_config(problem), target="interpreter")
