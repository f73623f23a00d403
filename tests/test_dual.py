"""The dual GEMM (``ep(A @ B, A @ B2)``: a gated MLP's gate and up projections in one kernel):
the dual_matmul and dual_gemv templates against the float64 reference over awkward shapes,
layouts, dtypes, epilogues and main loops, in Triton's interpreter (and on the GPU with
``-m gpu``); their refusals; feasibility with two accumulators; the mlp suite; and the
compiler finding the pattern in forward and training graphs."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import epilab
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, acc2, operand, ops
from epilab.ir.epilogue_text import parse_epilogue
from epilab.policy import suites
from epilab.policy.space import HOPPER, infeasible
from epilab.templates import registry
from epilab.templates.gemm import dual_matmul, gemm_spec
from epilab.templates.gemm.dual_matmul import B2, halves, make_dual_problem
from epilab.templates.gemm.matmul_reference import random_tensor
from epilab.templates.gemv import dual_gemv
from epilab.templates.registry import default_config, for_template, launch, twins
from epilab.templates.verify import failure, output_errors, random_inputs

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EPILOGUES = {
    "swiglu": "silu(acc) * acc2",
    "geglu_bias": "gelu_tanh(acc + bias[n]) * (acc2 + bias2[n])",
    "swiglu_residual_scale": "silu(acc) * acc2 * s[] + residual",
    "two_outputs": [("silu(acc) * acc2", None), ("acc2", "float32")],  # the up half kept (backward)
}


def _tensors(m, n, k, layout, dtype, epilogue, gen):
    """A, B, B2 and the epilogue's operands; ``layout`` is A's then B's (N, T, or S: strided)."""
    stored = {"N": "row", "T": "col", "S": "strided"}
    a = random_tensor(m, k, None, stored[layout[0]], dtype, DEVICE, gen)
    b = random_tensor(k, n, None, stored[layout[1]], dtype, DEVICE, gen)
    b2 = random_tensor(k, n, None, stored[layout[1]], dtype, DEVICE, gen)
    ops_ = {
        "bias": random_tensor(1, n, None, "row", dtype, DEVICE, gen)[0],
        "bias2": random_tensor(1, n, None, "row", dtype, DEVICE, gen)[0],
        "s": random_tensor(1, 1, None, "row", torch.float32, DEVICE, gen)[0],
        "residual": random_tensor(m, n, None, "row", dtype, DEVICE, gen),
    }
    return a, b, b2, ops_


def _epilogue(name, dtype):
    value = EPILOGUES[name]
    outputs = [(value, None)] if isinstance(value, str) else value
    return parse_epilogue(outputs, str(dtype).removeprefix("torch."))


def run_dual(m, n, k, layout, dtype, name, config=None, template="dual_matmul", seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    a, b, b2, pool = _tensors(m, n, k, layout, dtype, name, gen)
    ep = _epilogue(name, dtype)
    operands = {n_: pool[n_] for n_, _ in ep.operands}
    problem = make_dual_problem(a, b, b2, ep, operands)
    if template != problem.template:
        problem = for_template(problem, template)
    config = config or default_config(problem, "cuda" if GPU else "interpreter")
    call = {B2: b2, **operands}
    outs = launch(problem, config, a, b, call)
    refs = registry.kind_of(problem).reference(problem, a, b, call)
    why = failure(output_errors(problem, outs, refs))
    assert why is None, f"{problem.template} {config.short()}: {why}"
    return problem


@pytest.mark.parametrize("name", list(EPILOGUES))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", ["NT", "NN", "TN", "SS"])
def test_dual_matmul_shapes_layouts_dtypes_epilogues(layout, dtype, name):
    run_dual(37, 45, 29, layout, DTYPES[dtype], name)


def test_an_fp16_swiglu_that_passes_65504_is_verified_with_its_overflow():
    """Gate times up in fp16 overflows where the float64 value passes 65504 (as a Llama-sized
    K = 4096 does on random data): the kernel's inf there is what rounding gives, so the check
    passes (it failed every config before: no such problem could be tuned)."""
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    a, b, b2, _ = _tensors(37, 45, 29, "NT", torch.float16, "swiglu", gen)
    a = (a.float() * 40).to(torch.float16)
    ep = _epilogue("swiglu", torch.float16)
    problem = make_dual_problem(a, b, b2, ep, {})
    outs = launch(problem, default_config(problem, "cuda" if GPU else "interpreter"), a, b, {B2: b2})
    refs = registry.kind_of(problem).reference(problem, a, b, {B2: b2})
    over = refs[0].abs() > torch.finfo(torch.float16).max
    assert over.sum() > 20, "the test must overflow"
    assert torch.isinf(outs[0][over]).all() and torch.isfinite(outs[0][~over]).all()
    assert failure(output_errors(problem, outs, refs)) is None


@pytest.mark.parametrize(
    "config",
    [
        Config(16, 32, 32, 1, num_warps=4, num_stages=1, EPILOGUE_SUBTILE=2),
        Config(32, 32, 16, 2, num_warps=4, num_stages=2, variant="persistent", FLATTEN=1),
        Config(16, 32, 16, 1, num_warps=4, num_stages=1, variant="tma"),
        Config(16, 32, 16, 1, num_warps=4, num_stages=1, variant="tma_persistent", EPILOGUE_SUBTILE=2),
    ],
    ids=lambda c: c.short(),
)
@pytest.mark.parametrize("layout", ["NT", "NN"])
def test_dual_matmul_main_loops(layout, config):
    # dims multiples of 8 (TMA's 16-byte rows) but ragged against the tiles
    run_dual(40, 48, 72, layout, torch.bfloat16, "geglu_bias", config=config)


@pytest.mark.parametrize(
    "config",
    [
        Config(16, 32, 32, 1, num_warps=4, num_stages=1),
        Config(16, 16, 16, 1, 4, num_warps=4, num_stages=1, variant="two_pass"),
        Config(16, 32, 16, 1, 2, num_warps=4, num_stages=1, variant="atomic"),
    ],
    ids=lambda c: c.short(),
)
@pytest.mark.parametrize("m", [1, 5, 16])
def test_dual_gemv_split_k_variants(m, config):
    run_dual(m, 45, 70, "NT", torch.bfloat16, "two_outputs", config=config, template="dual_gemv")


def test_a_concatenated_weight_serves_as_its_two_halves():
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    x = torch.randn(9, 24, generator=gen, device=DEVICE)
    w = torch.randn(80, 24, generator=gen, device=DEVICE)  # gate and up stacked: [2F, K]
    b, b2 = halves(w.t())
    ep = Epilogue.build([(ops.silu(acc()) * acc2(), "float32")])
    problem = make_dual_problem(x, b, b2, ep, {})
    (out,) = launch(problem, default_config(problem, "cuda" if GPU else "interpreter"), x, b, {B2: b2})
    gate, up = (x.double() @ w.double().t()).chunk(2, dim=-1)
    assert rel_error(out, F.silu(gate) * up) < 1e-5


def test_bad_calls_are_refused_with_clear_errors():
    x, w = torch.randn(4, 8), torch.randn(16, 8)
    ep = Epilogue.build([(ops.silu(acc()) * acc2(), "float32")])
    with pytest.raises(ValueError, match="b's shape and strides"):
        make_dual_problem(x, w.t(), w.t().contiguous(), ep, {})
    with pytest.raises(ValueError, match="b's shape and strides"):
        make_dual_problem(x, w.t(), w[:8].t(), ep, {})
    with pytest.raises(ValueError, match="may not be named 'b2'"):
        make_dual_problem(
            x, w.t(), w.t(), Epilogue.build([(acc() * operand("b2", "row"), "float32")]), {"b2": w[0]}
        )
    with pytest.raises(ValueError, match="2-D A and B"):
        make_dual_problem(x[None], w.t(), w.t(), ep, {})
    with pytest.raises(ValueError, match="even 2N"):
        halves(torch.randn(8, 15))
    problem = make_dual_problem(x, w.t(), w.t(), ep, {})
    with pytest.raises(ValueError, match="second weight as operands"):
        launch(problem, Config(16, 16, 16), x, w.t(), {})
    for name in ("matmul", "gemv"):  # one accumulator: no dual problem is made for them
        with pytest.raises(ValueError, match=f"the {name} template does not run dual_mm problems"):
            for_template(problem, name)
    with pytest.raises(ValueError, match="has no acc2"):
        Epilogue.build([(acc2(), "float32")]).triton_lines({"acc": "acc"})


def test_two_accumulators_halve_the_tiles_that_fit():
    problem = gemm_spec.Spec(2048, 14336, 4096, epilogue="silu(acc) * acc2").problem()
    single = gemm_spec.Spec(2048, 14336, 4096).problem()
    big = Config(128, 256, 64, 8, num_warps=8, num_stages=2)
    assert infeasible(single, big, HOPPER) is None
    assert "2 accumulators need 256 registers" in infeasible(problem, big, HOPPER)
    deep = Config(128, 128, 64, 8, num_warps=8, num_stages=6)  # 6 x (16 + 2 x 16) KiB of tiles
    assert infeasible(single, deep, HOPPER) is None and "shared memory" in infeasible(problem, deep, HOPPER)
    config = default_config(problem)
    assert infeasible(problem, config, HOPPER) is None, config
    # every seed fits two accumulators; the stream-K seed waits for a last wave that idles SMs
    whys = [infeasible(problem, c, HOPPER) for c in dual_matmul.KIND.seeds]
    assert all(why is None or why.startswith("stream-K:") for why in whys), whys
    short_wave = gemm_spec.Spec(512, 11008, 4096, epilogue="silu(acc) * acc2").problem()  # 172 tiles
    assert all(infeasible(short_wave, c, HOPPER) is None for c in dual_matmul.KIND.seeds)


def test_the_mlp_suite_and_shapes_files_name_the_dual_kinds(tmp_path):
    specs = suites.suite("mlp")
    assert len(specs) == 25 and {s.problem().op for s in specs} == {"dual_mm"}
    decode = [s for s in specs if s.m <= 16]
    assert all([p.template for p in twins(s.problem())] == ["dual_matmul", "dual_gemv"] for s in decode)
    path = tmp_path / "mlp.json"
    path.write_text(
        '[{"m": 8, "n": 64, "k": 32, "epilogue": "acc2 * silu(acc)"},'
        ' {"m": 8, "n": 64, "k": 32, "epilogue": "silu(acc) * acc2", "template": "dual_gemv"}]'
    )
    first, second = suites.load_shapes(path)
    # one problem whichever way round the join is written (the compiler's canonical order)
    assert first.problem().identity_key == for_template(second.problem(), "dual_matmul").identity_key
    assert second.problem().template == "dual_gemv"
    with pytest.raises(ValueError, match="is 2-D"):
        gemm_spec.Spec(8, 64, 32, batch=2, epilogue="silu(acc) * acc2")


def test_random_inputs_make_the_problem():
    for spec in (
        gemm_spec.Spec(3, 40, 24, epilogue="silu(acc) * acc2"),
        gemm_spec.Spec(3, 40, 24, dtype="float32", layout="TT", epilogue="acc * acc2"),
    ):
        for problem in twins(spec.problem()):
            a, b, operands = random_inputs(problem, "cpu", 0)
            assert registry.problem_of(problem, a, b, operands) == problem


# ------------------------------------------------------------------ the compiler


class GatedMLP(nn.Module):
    def __init__(self, d=24, f=40, bias=False, act="silu", up_first=False):
        super().__init__()
        self.gate = nn.Linear(d, f, bias=bias)
        self.up = nn.Linear(d, f, bias=bias)
        self.down = nn.Linear(f, d, bias=bias)
        self.act = F.silu if act == "silu" else lambda t: F.gelu(t, approximate="tanh")
        self.up_first = up_first

    def forward(self, x):
        if self.up_first:  # the up projection comes first in the graph
            up = self.up(x)
            return self.down(up * self.act(self.gate(x)))
        return self.down(self.act(self.gate(x)) * self.up(x))


def _compile(model, db_path, policy="always"):
    return torch.compile(model, backend="epilab", options={"policy": policy, "db": db_path})


def _dual_decisions():
    return [d for d in epilab.explain() if "+" in d.anchor]


@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize("up_first", [False, True], ids=["gate-first", "up-first"])
def test_the_compiler_fuses_gate_and_up_into_one_dual_call(tmp_path, up_first):
    torch.manual_seed(0)
    model = GatedMLP(up_first=up_first).to(DEVICE)
    x = torch.randn(3, 7, 24, device=DEVICE)
    with torch.no_grad():
        out = _compile(model, str(tmp_path / "t.db"))(x)
        ref = copy.deepcopy(model).double()(x.double())
    assert rel_error(out, ref) < 1e-5
    (d,) = _dual_decisions()
    assert d.anchor == "aten.mm+aten.mm" and d.template == "dual_matmul" and d.shape == "21x40x24"
    # one problem whichever projection comes first: the suite's form, silu(acc) * acc2
    spec = gemm_spec.Spec(21, 40, 24, dtype="float32", epilogue="silu(acc) * acc2").problem()
    assert _recorded(tmp_path, d).identity_key == spec.identity_key


def _recorded(tmp_path, d):
    """The problem the compiler recorded for decision ``d``."""
    from epilab.db import TuningDB
    from epilab.ir.problem import Problem

    with TuningDB.open(str(tmp_path / "t.db")) as db:
        text = db.problem_json(d.problem_key)
    return Problem.from_json(text[1] if isinstance(text, tuple) else text)


@pytest.mark.usefixtures("fresh_compiler")
def test_training_keeps_the_halves_for_the_backward_and_gradients_match(tmp_path):
    torch.manual_seed(0)
    model = GatedMLP(bias=True, act="gelu_tanh").to(DEVICE)
    ref = copy.deepcopy(model).double()
    x = torch.randn(2, 5, 24, device=DEVICE)
    out = _compile(model, str(tmp_path / "t.db"))(x)
    out.square().sum().backward()
    ref(x.double()).square().sum().backward()
    assert rel_error(out, ref(x.double())) < 1e-5
    for (name, p), p64 in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert rel_error(p.grad, p64.grad) < 1e-5, name
    (d,) = _dual_decisions()
    assert d.anchor == "aten.addmm+aten.addmm" and d.template is not None
    assert "bias2" in d.epilogue_ir and d.epilogue_ir.count("out %") >= 2, "the halves the backward needs"


@pytest.mark.usefixtures("fresh_compiler")
def test_projections_that_never_meet_stay_apart(tmp_path):
    class QKV(nn.Module):  # three projections of one x that meet only in attention
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False)

        def forward(self, x):
            return torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1)

    torch.manual_seed(0)
    model = QKV().to(DEVICE)
    x = torch.randn(2, 5, 16, device=DEVICE)
    with torch.no_grad():
        out = _compile(model, str(tmp_path / "t.db"))(x)
    assert rel_error(out, copy.deepcopy(model).double()(x.double())) < 1e-5
    assert not _dual_decisions()


ROW_STATISTIC_BESIDE_A_PROJECTION = {  # two GEMMs of one x, one of them reduced over its row
    "router softmax": lambda x, w1, w2: (torch.softmax(x @ w1, -1), F.silu(x @ w2)),
    "mean times": lambda x, w1, w2: (x @ w1).mean(-1, keepdim=True) * (x @ w2),
}


@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize("form", sorted(ROW_STATISTIC_BESIDE_A_PROJECTION))
def test_a_row_statistic_of_one_projection_beside_another_compiles(tmp_path, form):
    """The dual matcher asked of a reduction's node a value it never held (KeyError: amax, and
    the compile failed under the default policy): a statistic is no meeting of the halves."""
    f = ROW_STATISTIC_BESIDE_A_PROJECTION[form]
    torch.manual_seed(0)
    args = [
        torch.randn(12, 16, device=DEVICE),
        torch.randn(16, 24, device=DEVICE),
        torch.randn(16, 24, device=DEVICE),
    ]
    got = torch.compile(f, backend="epilab", options={"policy": "auto", "db": str(tmp_path / "t.db")})(*args)
    want = f(*(t.double() for t in args))
    for g, w in zip(*(o if isinstance(o, tuple) else (o,) for o in (got, want)), strict=True):
        assert rel_error(g, w) < 1e-5
    assert not _dual_decisions()


@pytest.mark.usefixtures("fresh_compiler")
def test_auto_keeps_two_aten_gemms_without_a_record_and_takes_the_dual_with_one(tmp_path):
    from records import record

    db_path = str(tmp_path / "t.db")
    torch.manual_seed(0)
    model = GatedMLP().to(DEVICE)
    x = torch.randn(21, 24, device=DEVICE)
    with torch.no_grad():
        _compile(model, db_path, policy="auto")(x)
    (d,) = _dual_decisions()
    assert d.template is None and "nothing recorded" in d.reason
    problem = _recorded(tmp_path, d)
    assert problem.template == "dual_matmul", "the compiler recorded the dual problem for `tune --seen`"
    record(db_path, problem, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1}, 1.0, 2.0)
    torch._dynamo.reset()
    epilab.explain(clear=True)
    with torch.no_grad():
        out = _compile(model, db_path, policy="auto")(x)
    assert rel_error(out, copy.deepcopy(model).double()(x.double())) < 1e-5
    (d,) = _dual_decisions()
    assert d.template == "dual_matmul" and d.source == "exact record", d.reason


# ------------------------------------------------------------------ the GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    "variant", ["default", "tma", "persistent", "tma_persistent", "stream_k", "tma_stream_k"]
)
@pytest.mark.parametrize("shape", [(2048, 1408, 512), (300, 1000, 776), (128, 4096, 1024)], ids=str)
def test_gpu_dual_matmul_main_loops(shape, variant):
    m, n, k = shape
    config = Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant=variant)
    if variant.startswith("tma") and (n * 2 % 16 or k * 2 % 16):
        pytest.skip("TMA needs 16-byte rows")
    run_dual(m, n, k, "NT", torch.bfloat16, "geglu_bias", config=config)
    run_dual(m, n, k, "NT", torch.bfloat16, "two_outputs", config=dual_matmul.KIND.seeds[0])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 16])
def test_gpu_dual_gemv_default_and_split_k(m):
    for config in dual_gemv.KIND.seeds:
        run_dual(m, 4096, 4096, "NT", torch.bfloat16, "swiglu", config=config, template="dual_gemv")
    problem = run_dual(m, 1000, 777, "NT", torch.bfloat16, "two_outputs", template="dual_gemv")
    assert problem.template == "dual_gemv"


@pytest.mark.parametrize("m", [3, 40])
def test_epilab_gated_matmul(m):
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    x = torch.randn(m, 24, generator=gen, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(80, 24, generator=gen, device=DEVICE).to(torch.bfloat16)  # gate and up stacked
    bias, bias2 = (torch.randn(40, generator=gen, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        out = epilab.gated_matmul(x, *halves(w.t()), activation="gelu_tanh", bias=bias, bias2=bias2)
        custom = epilab.gated_matmul(
            x,
            *halves(w.t()),
            epilogue=Epilogue.build([(acc() * acc2() + operand("s", "scalar"), "float32")]),
            operands={"s": torch.tensor(0.5, device=DEVICE)},
        )
    gate, up = (x.double() @ w.double().t()).chunk(2, dim=-1)
    want = F.gelu(gate + bias.double(), approximate="tanh") * (up + bias2.double())
    assert out.dtype == torch.bfloat16 and rel_error(out, want) < 2e-2
    assert custom.dtype == torch.float32 and rel_error(custom, gate * up + 0.5) < 2e-2
    with pytest.raises(ValueError, match="activation 'swish' is not one of"):
        epilab.gated_matmul(x, *halves(w.t()), activation="swish")
    with pytest.raises(NotImplementedError, match="no backward"):
        epilab.gated_matmul(x.requires_grad_(), *halves(w.t()))


class FusedGateUp(nn.Module):
    """gate and up as one [2F, K] linear whose output is chunked (Phi-3's gate_up_proj)."""

    def __init__(self, d=24, f=40, bias=False):
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * f, bias=bias)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize("bias", [False, True], ids=["mm", "addmm"])
def test_a_concatenated_gate_up_projection_runs_as_its_two_halves(tmp_path, bias):
    torch.manual_seed(0)
    model = FusedGateUp(bias=bias).to(DEVICE)
    x = torch.randn(3, 7, 24, device=DEVICE)
    ref = copy.deepcopy(model).double()(x.double())
    with torch.no_grad():
        out = _compile(model, str(tmp_path / "t.db"))(x)
    assert rel_error(out, ref) < 1e-5
    (d,) = [d for d in epilab.explain() if "concatenated" in d.anchor]
    assert d.template == "dual_matmul" and d.shape == "21x40x24"
    spec = gemm_spec.Spec(
        21,
        40,
        24,
        dtype="float32",
        epilogue="silu(acc + bias[n]) * (acc2 + bias2[n])" if bias else "silu(acc) * acc2",
    )
    assert _recorded(tmp_path, d).identity_key == spec.problem().identity_key
    # without a record, auto leaves the graph as it was: one GEMM of the concatenated weight
    torch._dynamo.reset()
    epilab.explain(clear=True)
    with torch.no_grad():
        out = _compile(model, str(tmp_path / "t.db"), policy="auto")(x)
    assert rel_error(out, ref) < 1e-5
    shapes = [d.shape for d in epilab.explain() if d.template is None and "concatenated" not in d.anchor]
    assert "21x80x24" in shapes


class TwoMLPs(nn.Module):
    """A concatenated gated MLP, then one of two linears: both dual forms in one graph."""

    def __init__(self, d=24, f=40):
        super().__init__()
        self.first, self.second = FusedGateUp(d, f), GatedMLP(d, f)

    def forward(self, x):
        y = self.first(x)
        return y + self.second(y)


@pytest.mark.usefixtures("fresh_compiler")
def test_both_forms_with_a_dynamic_batch(tmp_path):
    torch.manual_seed(0)
    model = TwoMLPs().to(DEVICE)
    ref = copy.deepcopy(model).double()
    fn = _compile(model, str(tmp_path / "t.db"))
    for batch in (3, 4, 7):
        x = torch.randn(batch, 5, 24, device=DEVICE)
        if batch == 3:
            torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad():
            out = fn(x)
        assert rel_error(out, ref(x.double())) < 1e-5, batch
    duals = [d for d in epilab.explain() if d.template == "dual_matmul"]
    assert len(duals) == 2 and all("x40x24" in d.shape and "s" in d.shape for d in duals), duals


@pytest.mark.gpu
@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("m", [4, 512], ids=["decode", "prefill"])
def test_gpu_both_dual_forms_through_the_backend(tmp_path, mode, m):
    torch.manual_seed(0)
    model = TwoMLPs(256, 512).to("cuda", torch.bfloat16)
    ref = copy.deepcopy(model).double()
    options = {
        "policy": "always",
        "db": str(tmp_path / "t.db"),
        **({"mode": mode} if mode != "default" else {}),
    }
    fn = torch.compile(model, backend="epilab", options=options)
    for _ in range(3):  # CUDA graphs record on the first calls, then replay
        x = torch.randn(m, 256, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            out = fn(x).clone()
        assert rel_error(out, ref(x.double())) < 2e-2
    want = "dual_gemv" if m <= 16 else "dual_matmul"
    assert [d.template for d in epilab.explain() if d.template and d.template.startswith("dual")] == [
        want,
        want,
    ]
