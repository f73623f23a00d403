"""The grouped GEMM kinds (a mixture of experts' projections, ``grouped_matmul`` and the
gated ``dual_grouped_matmul``): every main loop against the float64 reference over awkward
expert splits (empty experts, one expert, rows left unrouted, tiles that straddle experts),
layouts, dtypes and epilogues (per-expert biases, per-row routing weights, tiles, several
outputs), in Triton's interpreter (and on the GPU with ``-m gpu``); the offsets' clamping;
refusals; the tuner's draw of offsets; the spec format and the moe suite; ``epilab.grouped_matmul``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import epilab
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.ir.epilogue_text import parse_epilogue
from epilab.ir.problem import Problem
from epilab.policy import nearest, suites
from epilab.policy.space import HOPPER, infeasible
from epilab.templates import registry
from epilab.templates.gemm.matmul_reference import random_tensor
from epilab.templates.grouped import grouped_matmul, grouped_reference
from epilab.templates.grouped.dual_grouped_matmul import B2, make_dual_grouped_problem
from epilab.templates.grouped.grouped_geometry import GroupedGeometry
from epilab.templates.grouped.grouped_matmul import OFFS, make_grouped_problem
from epilab.templates.grouped.grouped_reference import draw_offsets, row_ranges
from epilab.templates.grouped.grouped_spec import GroupedSpec
from epilab.templates.registry import default_config
from epilab.templates.verify import checked_launch, random_inputs
from epilab.tuner import evaluate

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
TARGET = "cuda" if GPU else "interpreter"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (rows per expert): empty experts, a lone expert, tiles that straddle experts, rows unrouted
SPLITS = {
    "uneven": [9, 0, 23, 1, 8],
    "one_expert": [41],
    "empty_ends": [0, 0, 17, 24, 0],
    "unrouted_tail": [5, 11, 3],  # 19 of 41 rows routed: the rest are left as they were
}
EPILOGUES = {
    "none": "acc",
    "expert_bias_relu_routed": "relu(acc + bias[n]) * w[m]",
    "residual_scalar": "acc * s[] + residual",
    "two_outputs": [("gelu_tanh(acc + bias[n])", None), ("acc", "float32")],
}
DUAL_EPILOGUES = {
    "swiglu": "silu(acc) * acc2",
    "swiglu_bias_routed": "silu(acc + bias[n]) * (acc2 + bias2[n]) * w[m]",
}
ROWS, K, N = 41, 24, 40


def _offsets(split: list[int]) -> torch.Tensor:
    return torch.tensor(split, device=DEVICE).cumsum(0).to(torch.int32)


def _operands(ep, experts, rows, n, dtype, gen):
    """Per-expert row vectors ([E, 1, N]), per-row column vectors ([T, 1]), tiles, scalars."""
    shapes = {"row": (experts, 1, n), "col": (rows, 1), "tile": (rows, n), "scalar": ()}
    return {
        name: torch.randn(shapes[broadcast], generator=gen, device=DEVICE).to(
            dtype if broadcast != "scalar" else torch.float32
        )
        for name, broadcast in ep.operands
    }


def _tensors(split, layout, dtype, gen, n=N, k=K):
    """A [T, K] and B [E, K, N] (``layout``: A's then B's, N row-major, T column-major)."""
    stored = {"N": "row", "T": "col", "S": "strided"}
    a = random_tensor(ROWS, k, None, stored[layout[0]], dtype, DEVICE, gen)
    b = random_tensor(k, n, len(split), stored[layout[1]], dtype, DEVICE, gen)
    return a, b


def run_grouped(split, layout, dtype, name, config=None, seed=0, dual=False):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    a, b = _tensors(SPLITS[split], layout, dtype, gen)
    value = (DUAL_EPILOGUES if dual else EPILOGUES)[name]
    outputs = [(value, None)] if isinstance(value, str) else value
    ep = parse_epilogue(outputs, str(dtype).removeprefix("torch."))
    operands = _operands(ep, len(SPLITS[split]), ROWS, N, dtype, gen)
    offs = _offsets(SPLITS[split])
    call = {OFFS: offs, **operands}
    if dual:
        b2 = torch.empty_strided(b.shape, b.stride(), dtype=dtype, device=DEVICE).copy_(
            torch.randn(b.shape, generator=gen, device=DEVICE)
        )
        problem = make_dual_grouped_problem(a, b, b2, offs, ep, operands)
        call[B2] = b2
    else:
        problem = make_grouped_problem(a, b, offs, ep, operands)
    config = config or default_config(problem, TARGET)
    routed = int(offs[-1])
    # unrouted rows are left as they were: a sentinel there must survive the launch
    outs = registry.kind_of(problem).empty_outputs(problem, torch.device(DEVICE))
    if routed < ROWS:
        refs = registry.kind_of(problem).reference(problem, a, b, call)
        for o in outs:
            o.fill_(7.0)
        bound = registry.bind(problem, config, a, b, call, outs)
        bound.run()
        for o, r in zip(outs, refs, strict=True):
            assert (o[routed:] == 7.0).all(), "an unrouted row was written"
            assert rel_error(o[:routed], r[:routed].to(o.dtype)) < 2e-2
        return problem
    checked_launch(problem, config, a, b, call, outs)
    return problem


@pytest.mark.parametrize("name", list(EPILOGUES))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("split", list(SPLITS))
def test_grouped_splits_dtypes_epilogues(split, dtype, name):
    run_grouped(split, "NT", DTYPES[dtype], name)


LOOPS = [Config(16, 16, 16, 4, num_warps=4, num_stages=1, variant=v) for v in grouped_matmul.VARIANTS]


@pytest.mark.parametrize("config", LOOPS, ids=lambda c: c.variant)
@pytest.mark.parametrize("layout", ["NT", "NN", "TN", "SS"])
def test_grouped_main_loops_and_layouts(layout, config):
    tma = config.variant in grouped_matmul.TMA_VARIANTS
    if tma and layout == "SS":
        with pytest.raises(ValueError, match="the tma variants take row- or column-major A and B"):
            run_grouped("uneven", layout, torch.bfloat16, "expert_bias_relu_routed", config)
    elif tma and layout[0] == "T":  # a column-major A of 41 rows: 82-byte rows
        with pytest.raises(ValueError, match="TMA needs A's rows 16-byte aligned"):
            run_grouped("uneven", layout, torch.bfloat16, "expert_bias_relu_routed", config)
    else:
        run_grouped("uneven", layout, torch.bfloat16, "expert_bias_relu_routed", config)


@pytest.mark.parametrize("config", LOOPS, ids=lambda c: c.variant)
@pytest.mark.parametrize("name", list(DUAL_EPILOGUES))
def test_dual_grouped_main_loops(name, config):
    run_grouped("uneven", "NT", torch.bfloat16, name, config, dual=True)


def test_tiles_wider_than_an_expert_and_k_blocks_past_k():
    config = Config(32, 32, 32, 1, num_warps=4, num_stages=1, variant="tma")
    run_grouped("uneven", "NN", torch.float16, "expert_bias_relu_routed", config)  # K = 24 < 32


def test_offsets_past_the_rows_or_going_back_are_clamped_not_read_out_of_bounds():
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    a, b = _tensors([0, 0, 0, 0], "NT", torch.float32, gen)
    offs = torch.tensor([30, 12, 35, 999], dtype=torch.int32, device=DEVICE)  # back to 12, then past T
    out = epilab.grouped_matmul(a, b, offs)
    want = torch.empty(ROWS, N, dtype=torch.float64, device=DEVICE)
    for e, (lo, hi) in enumerate([(0, 30), (30, 30), (30, 35), (35, ROWS)]):  # expert 1 is empty
        want[lo:hi] = a[lo:hi].double() @ b[e].double()
    assert grouped_reference.row_ranges(offs, ROWS) == [(0, 30), (30, 30), (30, 35), (35, ROWS)]
    assert rel_error(out, want) < 1e-5


def test_random_inputs_make_the_problem_and_the_draw_is_skewed_with_empty_experts():
    problem = GroupedSpec(6, 20, 16, 16, topk=2, epilogue="silu(acc) * acc2").problem()
    _, _, call = random_inputs(problem, DEVICE, 1)
    assert call[OFFS][-1] == 40 and set(call) == {OFFS, B2}
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    draws = [
        torch.diff(draw_offsets(64, 16, torch.device(DEVICE), gen), prepend=torch.zeros(1, device=DEVICE))
        for _ in range(20)
    ]
    assert all(int(d.sum()) == 64 for d in draws)
    assert any((d == 0).any() for d in draws), "some draws leave experts empty"
    assert sum(float(d.max()) for d in draws) / 20 > 2 * 64 / 16, (
        "the busiest expert gets over twice its share"
    )


def test_the_tuner_checks_a_candidate_on_its_own_inputs():
    problem = GroupedSpec(3, 16, 16, 16, epilogue="acc * w[m]").problem()
    config = Config(16, 16, 16, 4, num_warps=4, num_stages=1)
    result = evaluate.evaluate_candidate(problem.to_json(), config.to_dict(), seed=2)
    assert result["status"] == "ok", result


def test_its_library_is_torch_grouped_mm_and_the_tuner_times_it_by_default():
    from epilab.tuner.tune import TuneOptions

    problem = GroupedSpec(3, 16, 16, 16).problem()
    assert registry.kind_of(problem).library == "grouped_mm" and "grouped_mm" in TuneOptions().baselines
    assert evaluate.baseline_fn(problem, "cublas") is None  # cuBLAS does not run it
    skipped = evaluate.evaluate_baseline(problem.to_json(), "cudnn", seed=0)
    assert skipped["status"] == "skipped" and "does not apply" in skipped["detail"]
    (eager,) = evaluate.baseline_fn(problem, "grouped_mm")(*random_inputs(problem, DEVICE, 1))
    (want,) = registry.kind_of(problem).reference(problem, *random_inputs(problem, DEVICE, 1))
    assert rel_error(eager, want) < 1e-2


def test_bad_calls_are_refused_with_clear_errors():
    a = torch.randn(8, 16, device=DEVICE)
    b = torch.randn(2, 16, 4, device=DEVICE)
    offs = _offsets([3, 5])
    with pytest.raises(ValueError, match=r"offs must be int32 \[2\]"):
        epilab.grouped_matmul(a, b, offs.long())
    with pytest.raises(ValueError, match=r"A \[T, K\] .* and B \[E, K, N\] .* differ in K"):
        epilab.grouped_matmul(a, b[:, :8], offs)
    with pytest.raises(ValueError, match="takes A"):
        epilab.grouped_matmul(a, b[0], offs)
    with pytest.raises(ValueError, match=r"bias must be \[4\] \(shared\) or \[2, 4\]"):
        epilab.grouped_matmul(a, b, offs, bias=torch.zeros(3, device=DEVICE))
    with pytest.raises(ValueError, match="b2 must have b's shape"):
        epilab.grouped_matmul(a, b, offs, b2=b.transpose(-1, -2).contiguous().transpose(-1, -2))
    problem = GroupedSpec(2, 8, 16, 16).problem()
    assert "no variant" in grouped_matmul.config_error(problem, Config(16, 16, 16, variant="w_vector"))
    assert "no splits" in grouped_matmul.config_error(problem, Config(16, 16, 16, SPLIT_K=2))
    with pytest.raises(ValueError, match=r"experts must be an int in 1\.\.1024"):
        GroupedSpec(0, 8, 16, 16)


def test_two_accumulators_take_half_the_tile_and_the_space_is_feasible_on_hopper():
    single = GroupedSpec(8, 4096, 1024, 512, topk=2).problem()
    dual = GroupedSpec(8, 4096, 1024, 512, topk=2, epilogue="silu(acc) * acc2").problem()
    one, two = default_config(single), default_config(dual)
    assert (one.BLOCK_M, one.BLOCK_N, one.num_warps) == (128, 256, 8)
    assert (two.BLOCK_M, two.BLOCK_N, two.num_warps) == (128, 128, 8)  # 2 x 128 x 128 accumulators
    assert infeasible(dual, Config(128, 256, 64, 8, num_warps=8, num_stages=3), HOPPER) is not None
    for problem in (single, dual):
        seeds = [c for c in registry.kind_of(problem).seeds if infeasible(problem, c, HOPPER) is None]
        assert len(seeds) >= 4, problem.op


def test_the_moe_suite_and_shapes_files(tmp_path):
    specs = suites.suite("moe")
    assert len(specs) == 24 and {s.problem().template for s in specs} == {
        "grouped_matmul",
        "dual_grouped_matmul",
    }
    mixtral = specs[6].problem()
    assert mixtral.shape.m == 32768 and mixtral.geometry.experts == 8 and mixtral.layout_b == "col"
    assert suites.shape_label(mixtral) == "32768 rows / 8 experts -> 14336x4096"
    path = tmp_path / "moe.jsonl"
    path.write_text(
        '{"m": 16, "n": 16, "k": 16}\n{"experts": 4, "tokens": 8, "topk": 2, "n": 32, "k": 16, "epilogue": "acc2 * silu(acc)"}\n'
    )
    _, gated = suites.load_shapes(path)
    assert gated.problem().op == "dual_grouped_mm"
    assert gated.problem() == GroupedSpec(4, 8, 32, 16, topk=2, epilogue="silu(acc) * acc2").problem()
    with pytest.raises(ValueError, match="missing"):
        suites.spec_from_dict({"experts": 4, "tokens": 8, "n": 32})


def test_configs_carry_between_token_counts_of_one_expert_count():
    small, large = (GroupedSpec(8, t, 64, 64).problem() for t in (16, 64))
    assert nearest.distance(small, large) == pytest.approx(2.0)
    assert nearest.distance(small, GroupedSpec(4, 16, 64, 64).problem()) is None
    assert Problem.from_json(small.to_json()) == small


@pytest.mark.parametrize("gated", [False, True])
def test_epilab_grouped_matmul(gated):
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    a = torch.randn(ROWS, K, generator=gen, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(3, N, K, generator=gen, device=DEVICE).to(torch.bfloat16)
    w2 = torch.randn(3, N, K, generator=gen, device=DEVICE).to(torch.bfloat16)
    bias = torch.randn(3, N, generator=gen, device=DEVICE).to(torch.bfloat16)
    scale = torch.rand(ROWS, generator=gen, device=DEVICE).to(torch.bfloat16)
    offs = _offsets([10, 0, 31])
    b, b2 = w.transpose(-1, -2), w2.transpose(-1, -2)
    out = epilab.grouped_matmul(
        a, b, offs, b2=b2 if gated else None, bias=bias, scale=scale, activation="gelu"
    )
    want = torch.empty(ROWS, N, dtype=torch.float64, device=DEVICE)
    for e, (lo, hi) in enumerate([(0, 10), (10, 10), (10, 41)]):
        x = a[lo:hi].double()
        y = torch.nn.functional.gelu(x @ b[e].double() + bias[e].double())
        if gated:
            y = y * (x @ b2[e].double())
        want[lo:hi] = y * scale[lo:hi, None].double()
    assert out.dtype == torch.bfloat16 and rel_error(out, want) < 1e-2


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("variant", grouped_matmul.VARIANTS)
@pytest.mark.parametrize("dual", [False, True], ids=["grouped", "dual"])
@pytest.mark.parametrize("experts, tokens", [(8, 16), (8, 1000), (60, 512)])
def test_gpu_grouped_main_loops(experts, tokens, dual, variant):
    ep = "silu(acc) * acc2 * w[m]" if dual else "relu(acc + bias[n]) * w[m]"
    problem = GroupedSpec(experts, tokens, 384, 256, topk=2, epilogue=ep).problem()
    config = default_config(problem)
    seeds = [
        c
        for c in registry.kind_of(problem).seeds
        if c.variant == variant and infeasible(problem, c, HOPPER) is None
    ]
    for c in [*seeds[:2], Config(64, 64, 64, 8, num_warps=4, num_stages=3, variant=variant)]:
        checked_launch(problem, c, *random_inputs(problem, "cuda", 7))
    assert config.variant in grouped_matmul.VARIANTS


@pytest.mark.gpu
def test_gpu_offsets_change_between_replays_of_one_bound_launch():
    problem = GroupedSpec(4, 64, 128, 64, epilogue="acc").problem()
    a, b, call = random_inputs(problem, "cuda", 1)
    bound = registry.bind(problem, default_config(problem), a, b, call)
    for split in ([64, 0, 0, 0], [0, 0, 0, 64], [10, 20, 30, 4]):
        call[OFFS].copy_(torch.tensor(split, device="cuda").cumsum(0))
        bound.run()
        (ref,) = registry.kind_of(problem).reference(problem, a, b, call)
        assert rel_error(bound.outs[0], ref) < 1e-2, split


# ------------------------------------------------------------------ the compiler


class Experts(torch.nn.Module):
    """torch._grouped_mm projections of rows grouped by expert: a gated pair (``gated``) or one
    projection, each output row scaled by its routing weight; ``offs2``: the up projection
    reads other offsets (no dual group)."""

    def __init__(self, gated: bool = True, offs2: bool = False) -> None:
        super().__init__()
        self.gated, self.offs2 = gated, offs2
        self.w = torch.nn.Parameter(torch.randn(3, 32, 16) / 4)  # [E, N, K] as nn.Linear stores it
        self.w2 = torch.nn.Parameter(torch.randn(3, 32, 16) / 4)

    def forward(self, x: torch.Tensor, offs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = torch._grouped_mm(x, self.w.transpose(-2, -1), offs=offs)
        if self.gated:
            up = torch._grouped_mm(x, self.w2.transpose(-2, -1), offs=offs.flip(0) if self.offs2 else offs)
            y = torch.nn.functional.silu(y) * up
        return y * weight.unsqueeze(-1)


def _experts_run(tmp_path, model: Experts) -> list:
    torch._dynamo.reset()
    epilab.explain(clear=True)
    x = torch.randn(40, 16, device=DEVICE).to(torch.bfloat16)
    offs = _offsets([12, 0, 28])
    weight = torch.rand(40, device=DEVICE).to(torch.bfloat16)
    model = model.to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        compiled = torch.compile(
            model, backend="epilab", options={"policy": "always", "db": str(tmp_path / "t.db")}
        )
        out = compiled(x, offs, weight)
        want = model(x, offs, weight)
    assert rel_error(out, want) < 2e-2
    return [d for d in epilab.explain() if "grouped_mm" in d.anchor]


@pytest.mark.usefixtures("fresh_compiler")
def test_the_compiler_fuses_a_gated_pair_of_grouped_mms_and_the_routing_weight(tmp_path):
    (d,) = _experts_run(tmp_path, Experts())
    assert d.anchor == "aten.grouped_mm+aten.grouped_mm" and d.template == "dual_grouped_matmul"
    assert "broadcast=col" in d.epilogue_ir, d.epilogue_ir  # the routing weight, one per row
    want = GroupedSpec(3, 40, 32, 16, epilogue="silu(acc) * acc2 * w[m]").problem()
    from epilab.db import TuningDB

    with TuningDB.open(str(tmp_path / "t.db")) as db:
        recorded = Problem.from_json(db.problem_json(d.problem_key)[1])
    assert recorded.identity_key == want.identity_key, "the compiled problem is the suite's"


class ConcatenatedExperts(torch.nn.Module):
    """gate and up as one [E, 2F, K] weight whose grouped product is chunked (the widely used
    model library's experts by default), each row scaled by its routing weight."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 64, 16) / 4)

    def forward(self, x: torch.Tensor, offs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        gate, up = torch._grouped_mm(x, self.w.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up * weight.unsqueeze(-1)


@pytest.mark.usefixtures("fresh_compiler")
def test_a_concatenated_gate_up_of_experts_runs_as_its_two_halves(tmp_path):
    (d,) = _experts_run(tmp_path, ConcatenatedExperts())
    assert d.anchor == "aten.grouped_mm (concatenated, in halves)" and d.template == "dual_grouped_matmul"
    want = GroupedSpec(3, 40, 32, 16, epilogue="silu(acc) * acc2 * w[m]").problem()
    from epilab.db import TuningDB

    with TuningDB.open(str(tmp_path / "t.db")) as db:
        recorded = Problem.from_json(db.problem_json(d.problem_key)[1])
    assert recorded.identity_key == want.identity_key, "the halves make the two-weight problem"


@pytest.mark.usefixtures("fresh_compiler")
def test_one_grouped_mm_takes_its_epilogue_and_other_offsets_make_no_pair(tmp_path):
    (d,) = _experts_run(tmp_path, Experts(gated=False))
    assert d.anchor == "aten.grouped_mm" and d.template == "grouped_matmul" and d.shape == "40x32x16"
    found = _experts_run(tmp_path, Experts(offs2=True))
    assert {d.template for d in found} == {"grouped_matmul"} and len(found) == 2


# ------------------------------------------------------------------ routing in the kernel

ROUTINGS = {  # (gather, scatter)
    "gather": (True, ""),
    "store": (False, "store"),
    "add": (False, "add"),
    "gather_add": (True, "add"),
}


@pytest.mark.parametrize("config", LOOPS, ids=lambda c: c.variant)
@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("dual", [False, True], ids=["grouped", "dual"])
def test_routed_rows_are_gathered_and_scattered_by_every_main_loop(dual, routing, config):
    gather, scatter = ROUTINGS[routing]
    ep = "silu(acc) * acc2 * w[m]" if dual else "relu(acc + bias[n]) * w[m]"
    outputs = ((ep, "float32"),) if scatter == "add" else ep
    spec = GroupedSpec(
        4, 11, 24, 40, topk=3, dtype="float32", epilogue=outputs, gather=gather, scatter=scatter
    )
    problem = spec.problem()
    a, b, call = random_inputs(problem, DEVICE, 3)
    assert a.shape[0] == (11 if gather else 33) and set(grouped_matmul.routing_inputs(problem)) <= set(call)
    (out,) = checked_launch(problem, config, a, b, call).outs
    assert out.shape == ((11 if scatter == "add" else 33), 24)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_routed_layer_matches_torch_gather_grouped_mm_and_index_add(dtype):
    """epilab.grouped_matmul with the routing in the kernel against torch's own routing: a
    router's top-2 of 5 experts for 13 tokens, rows sorted by expert."""
    dt = DTYPES[dtype]
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    tokens, experts, topk = 13, 5, 2
    x = torch.randn(tokens, K, generator=gen, device=DEVICE).to(dt)
    w_up = torch.randn(experts, N, K, generator=gen, device=DEVICE).to(dt).transpose(-1, -2)
    w_gate = torch.randn(experts, N, K, generator=gen, device=DEVICE).to(dt).transpose(-1, -2)
    w_down = torch.randn(experts, K, N, generator=gen, device=DEVICE).to(dt).transpose(-1, -2)
    chosen = torch.randn(tokens, experts, generator=gen, device=DEVICE).topk(topk, dim=1).indices.flatten()
    order = torch.argsort(chosen, stable=True)
    token = order // topk
    offs = torch.cumsum(torch.bincount(chosen, minlength=experts), 0).to(torch.int32)
    weight = torch.rand(tokens * topk, generator=gen, device=DEVICE).to(dt)
    h = epilab.grouped_matmul(x, w_gate, offs, b2=w_up, gather=token)
    y = epilab.grouped_matmul(
        h, w_down, offs, scatter=token, topk=topk, scale=weight, out_dtype=torch.float32
    )
    rows = x[token].double()
    ranges = row_ranges(offs, tokens * topk)
    want_h = torch.cat(
        [
            torch.nn.functional.silu(rows[lo:hi] @ w_gate[e].double()) * (rows[lo:hi] @ w_up[e].double())
            for e, (lo, hi) in enumerate(ranges)
        ]
    )
    assert h.shape == (tokens * topk, N) and rel_error(h, want_h) < 2e-2
    down = torch.cat([h[lo:hi].double() @ w_down[e].double() for e, (lo, hi) in enumerate(ranges)])
    want = torch.zeros(tokens, K, dtype=torch.float64, device=DEVICE).index_add_(
        0, token, down * weight[:, None].double()
    )
    assert y.shape == (tokens, K) and y.dtype == torch.float32 and rel_error(y, want) < 2e-2
    stored = epilab.grouped_matmul(h, w_down, offs, scatter=order, combine="store")  # token-major rows
    unweighted = torch.zeros_like(want).index_add_(0, token, down)
    assert rel_error(stored.view(tokens, topk, K).double().sum(1), unweighted) < 2e-2


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_16_bit_combine_adds_every_row_a_token_has_in_one_tile(dtype):
    """The combine "add" into a 16-bit output (atomics on a GPU; in the interpreter, which has
    no 16-bit atomics, the rows one at a time): tokens 0..2 have two rows in each expert's
    tile (12 rows, top-2: six output rows, three of them no row's), so rows of one tile add
    into one output row."""
    dt = DTYPES[dtype]
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    rows = torch.randn(12, K, generator=gen, device=DEVICE).to(dt)
    w = torch.randn(2, N, K, generator=gen, device=DEVICE).to(dt).transpose(-1, -2)
    offs = torch.tensor([6, 12], dtype=torch.int32, device=DEVICE)
    token = torch.tensor([0, 0, 1, 1, 2, 2] * 2, device=DEVICE)
    got = epilab.grouped_matmul(rows, w, offs, scatter=token, topk=2, out_dtype=dt)
    products = torch.cat([rows[6 * e : 6 * (e + 1)].double() @ w[e].double() for e in range(2)])
    want = torch.zeros(6, N, dtype=torch.float64, device=DEVICE).index_add_(0, token, products)
    assert got.dtype == dt and rel_error(got, want) < 1e-2


def test_routing_indices_out_of_range_read_zeros_and_are_dropped():
    problem = GroupedSpec(
        3, 8, 16, 24, topk=2, dtype="float32", epilogue=(("acc", "float32"),), gather=True, scatter="add"
    ).problem()
    a, b, call = random_inputs(problem, DEVICE, 4)
    call[grouped_matmul.GATHER][[0, 5]] = torch.tensor([-1, 8], dtype=torch.int32, device=DEVICE)
    call[grouped_matmul.SCATTER][[2, 7]] = torch.tensor([8, -3], dtype=torch.int32, device=DEVICE)
    (ref,) = registry.kind_of(problem).reference(problem, a, b, call)
    bound = registry.bind(problem, default_config(problem, TARGET), a, b, call)
    bound.run()
    assert rel_error(bound.outs[0], ref) < 1e-4
    bound.run()  # the combine's output is zeroed before each launch
    assert rel_error(bound.outs[0], ref) < 1e-4


def test_routed_problems_are_their_own_records_and_bad_routing_is_refused():
    plain = GroupedSpec(8, 64, 32, 16, topk=2).problem()
    routed = GroupedSpec(8, 64, 32, 16, topk=2, gather=True).problem()
    assert plain.to_dict()["grouped"] == {"experts": 8}, "unrouted problems keep their old identity"
    assert routed.key != plain.key and Problem.from_json(routed.to_json()) == routed
    assert "gathered" in registry.kind_of(routed).label(routed)
    x, b = torch.randn(6, 16, device=DEVICE), torch.randn(2, 16, 8, device=DEVICE)
    offs = _offsets([5, 7])
    token = torch.arange(12, device=DEVICE) // 2
    with pytest.raises(ValueError, match="tokens x topk: 11 gather indices over 6 tokens"):
        epilab.grouped_matmul(x, b, _offsets([5, 6]), gather=token[:11])
    with pytest.raises(ValueError, match="needs topk"):
        epilab.grouped_matmul(x[token], b, offs, scatter=token)
    with pytest.raises(ValueError, match="scatter has 6 indices; the grouped rows are 12"):
        epilab.grouped_matmul(x, b, offs, gather=token, scatter=token[:6])
    with pytest.raises(ValueError, match="1-D int32 or int64"):
        epilab.grouped_matmul(x, b, offs, gather=token.float())
    with pytest.raises(ValueError, match="combine is 'add' or 'store'"):
        epilab.grouped_matmul(x, b, offs, gather=token, scatter=token, combine="mean")
    with pytest.raises(ValueError, match="pass scatter too"):
        epilab.grouped_matmul(x, b, offs, gather=token, combine="add")
    with pytest.raises(ValueError, match="topk is the rows per token of a routed problem"):
        GroupedGeometry(8, topk=2)
    with pytest.raises(ValueError, match="scatter one of"):
        GroupedSpec(8, 64, 32, 16, scatter="sum")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", grouped_matmul.VARIANTS)
@pytest.mark.parametrize(
    "spec", [s for s in suites.suite("moe-routed") if s.tokens == 512][:4], ids=lambda s: s.label()[:40]
)
def test_gpu_routed_main_loops(spec, variant):
    spec = dataclasses.replace(spec, n=min(spec.n, 1024), k=min(spec.k, 1024))
    problem = spec.problem()
    configs = [
        c
        for c in registry.kind_of(problem).seeds
        if c.variant == variant and infeasible(problem, c, HOPPER) is None
    ]
    for c in [*configs[:2], Config(64, 64, 64, 8, num_warps=4, num_stages=3, variant=variant)]:
        checked_launch(problem, c, *random_inputs(problem, "cuda", 7))
    bf16 = dataclasses.replace(
        spec, epilogue=("acc * w[m]" if problem.op == "grouped_mm" else spec.epilogue)
    ).problem()
    checked_launch(bf16, default_config(bf16), *random_inputs(bf16, "cuda", 8))  # bf16 atomics where added


class RoutedMoE(torch.nn.Module):
    """A routed layer as serving code writes it: rows gathered by token, two grouped
    projections, the rows' weighted outputs added back to their tokens (index_add)."""

    def __init__(self, topk: int) -> None:
        super().__init__()
        self.topk = topk
        self.w = torch.nn.Parameter(torch.randn(4, 32, 16) / 4)
        self.w2 = torch.nn.Parameter(torch.randn(4, 16, 32) / 4)

    def forward(self, x: torch.Tensor, chosen: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(chosen.flatten(), stable=True)
        token = order // self.topk
        offs = torch.cumsum(torch.bincount(chosen.flatten(), minlength=4), 0).to(torch.int32)
        h = torch.relu(torch._grouped_mm(x[token], self.w.transpose(-2, -1), offs=offs))
        y = torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offs) * weight.flatten()[order].unsqueeze(-1)
        return torch.zeros(x.shape[0], 16, dtype=torch.float32, device=x.device).index_add(
            0, token, y.float()
        )


@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize("topk", [2, 3])
@pytest.mark.parametrize("deterministic", [False, True])
def test_the_compiler_fuses_the_gather_and_the_combine(tmp_path, topk, deterministic):
    torch._dynamo.reset()
    epilab.explain(clear=True)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(10, 16, generator=gen, device=DEVICE).to(torch.bfloat16)
    chosen = torch.rand(10, 4, generator=gen, device=DEVICE).topk(topk, dim=1).indices
    weight = torch.rand(10, topk, generator=gen, device=DEVICE).to(torch.bfloat16)
    model = RoutedMoE(topk).to(DEVICE, torch.bfloat16)
    db = str(tmp_path / "t.db")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        with torch.no_grad():
            out = torch.compile(model, backend="epilab", options={"policy": "always", "db": db})(
                x, chosen, weight
            )
            want = model(x, chosen, weight)
    finally:
        torch.use_deterministic_algorithms(before)
    assert rel_error(out, want) < 2e-2
    found = [d for d in epilab.explain() if "grouped_mm" in d.anchor]
    assert len(found) == 2 and all(d.template for d in found)
    from epilab.db import TuningDB

    with TuningDB.open(db) as opened:
        geometries = [Problem.from_json(opened.problem_json(d.problem_key)[1]).geometry for d in found]
    combined = not deterministic  # atomics add a token's rows in no fixed order
    assert geometries == [
        GroupedGeometry(4, topk, gather=True),
        GroupedGeometry(4, topk if combined else 1, scatter="add" if combined else ""),
    ]


@pytest.mark.usefixtures("fresh_compiler")
def test_the_gathered_pair_is_weighed_against_the_plain_one_by_their_records(tmp_path):
    """Under auto, the gated pair over ``x[token]`` is a candidate in two forms: gathering its
    rows in the kernel, or reading Inductor's copy. Both are named by the decision (so tune
    --model tunes both); with records, the faster runs."""
    from records import record

    db = str(tmp_path / "t.db")
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    x = torch.randn(10, 16, generator=gen, device=DEVICE).to(torch.bfloat16)
    chosen = torch.rand(10, 4, generator=gen, device=DEVICE).topk(2, dim=1).indices
    weight = torch.rand(10, 2, generator=gen, device=DEVICE).to(torch.bfloat16)

    class Gated(RoutedMoE):
        def forward(self, x, chosen, weight):
            order = torch.argsort(chosen.flatten(), stable=True)
            offs = torch.cumsum(torch.bincount(chosen.flatten(), minlength=4), 0).to(torch.int32)
            rows = x[order // self.topk]
            gate = torch._grouped_mm(rows, self.w.transpose(-2, -1), offs=offs)
            return torch.nn.functional.silu(gate) * torch._grouped_mm(
                rows, self.w.transpose(-2, -1), offs=offs
            )

    model = Gated(2).to(DEVICE, torch.bfloat16)

    def dual() -> tuple:
        torch._dynamo.reset()
        epilab.explain(clear=True)
        with torch.no_grad():
            out = torch.compile(model, backend="epilab", options={"policy": "auto", "db": db})(
                x, chosen, weight
            )
            assert rel_error(out, model(x, chosen, weight)) < 2e-2
        (d,) = [d for d in epilab.explain() if d.anchor == "aten.grouped_mm+aten.grouped_mm"]
        from epilab.db import TuningDB

        with TuningDB.open(db) as store:
            named = {k: Problem.from_json(store.problem_json(k)[1]) for k in d.candidates}
        return d, named

    d, named = dual()
    assert d.template is None, "nothing recorded: torch runs it"
    gathered = [p for p in named.values() if p.geometry.gather]
    plain = [p for p in named.values() if not p.geometry.gather]
    assert len(gathered) == 1 and len(plain) == 1, named
    config = default_config(gathered[0], TARGET).to_dict()
    for fast, slow in ((gathered[0], plain[0]), (plain[0], gathered[0])):
        record(db, fast, config, 1.0, 3.0)
        record(db, slow, config, 2.0, 3.0)
        d, _ = dual()
        assert d.template == "dual_grouped_matmul" and d.problem_key == fast.key, d
        if fast is plain[0]:
            assert "rows gathered in the kernel" in d.reason and "slower" in d.reason, d.reason


class RoutedConcatenatedMoE(RoutedMoE):
    """The routed layer with gate and up as one [E, 2F, K] weight, chunked, SwiGLU between
    the grouped projections (the widely used model library's experts)."""

    def __init__(self, topk: int) -> None:
        super().__init__(topk)
        self.w = torch.nn.Parameter(torch.randn(4, 64, 16) / 4)

    def forward(self, x: torch.Tensor, chosen: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(chosen.flatten(), stable=True)
        token = order // self.topk
        offs = torch.cumsum(torch.bincount(chosen.flatten(), minlength=4), 0).to(torch.int32)
        gate, up = torch._grouped_mm(x[token], self.w.transpose(-2, -1), offs=offs).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        y = torch._grouped_mm(h, self.w2.transpose(-2, -1), offs=offs) * weight.flatten()[order].unsqueeze(-1)
        return torch.zeros(x.shape[0], 16, dtype=torch.float32, device=x.device).index_add(
            0, token, y.float()
        )


@pytest.mark.usefixtures("fresh_compiler")
def test_routed_concatenated_experts_gather_into_the_dual_halves_and_combine_after(tmp_path):
    torch._dynamo.reset()
    epilab.explain(clear=True)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(10, 16, generator=gen, device=DEVICE).to(torch.bfloat16)
    chosen = torch.rand(10, 4, generator=gen, device=DEVICE).topk(2, dim=1).indices
    weight = torch.rand(10, 2, generator=gen, device=DEVICE).to(torch.bfloat16)
    model = RoutedConcatenatedMoE(2).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        options = {"policy": "always", "db": str(tmp_path / "t.db")}
        out = torch.compile(model, backend="epilab", options=options)(x, chosen, weight)
        assert rel_error(out, model(x, chosen, weight)) < 2e-2
    found = [(d.anchor, d.template, d.shape) for d in epilab.explain() if "grouped_mm" in d.anchor]
    assert found == [
        ("aten.grouped_mm (concatenated, in halves)", "dual_grouped_matmul", "20x32x16 gathered"),
        ("aten.grouped_mm", "grouped_matmul", "20x16x32 top-2 added back"),
    ]


def test_dropped_scatter_rows_leave_every_output_of_the_reference_alike():
    """Two outputs, scatter indices out of range: the reference drops the same rows of each
    (it once filtered the index twice and failed on the second output)."""
    ep = (("acc", "float32"), ("relu(acc)", "float32"))
    problem = GroupedSpec(3, 8, 16, 24, topk=2, dtype="float32", epilogue=ep, scatter="add").problem()
    a, b, call = random_inputs(problem, DEVICE, 4)
    call[grouped_matmul.SCATTER][[2, 7]] = torch.tensor([8, -3], dtype=torch.int32, device=DEVICE)
    refs = registry.kind_of(problem).reference(problem, a, b, call)
    bound = registry.bind(problem, default_config(problem, TARGET), a, b, call)
    bound.run()
    assert len(refs) == 2 and all(rel_error(o, r) < 1e-4 for o, r in zip(bound.outs, refs, strict=True))
