"""Stream-K on the matmul template (and its dual kind), against a float64 reference.

NUM_SMS programs take whole waves of tiles first, then share the remaining tiles' K
iterations evenly across tile boundaries; a tile split over programs is finished by the one
that ends it, which adds the others' partial sums from a workspace in program order. On the
CPU the interpreter runs 4 programs, one after the other (a program waits only on lower ids,
which have finished), over small awkward shapes: all-stream-K, data-parallel waves plus a
stream-K tail, tiles shared by three programs, one K block a tile, batches, every layout,
dtype and epilogue. The ``gpu`` tests check real sizes, hundreds of launches bitwise equal,
and the replayed and CUDA-graph launches that keep the workspace between calls.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_matmul import DTYPES, EPILOGUES, run_case
from test_split_k import bf16_problem

import epilab
from epilab.api.matmul import simple_epilogue
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.ir.problem import Shape
from epilab.policy.space import HOPPER, infeasible
from epilab.templates import bound
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.gemm.matmul_reference import reference
from epilab.templates.registry import bind, for_template

# (batch, M, N, K) for 16x32 tiles and 16-deep K blocks on the interpreter's 4 programs:
#   37x45x100: 6 tiles x 7 K blocks, all stream-K (42 iterations, 10 or 11 a program)
#   7x9x100: 1 tile x 7 K blocks: 3 programs share it (shares of 3 K blocks at least)
#   3x20x33x70: 12 tiles: 8 data-parallel (2 waves) + 4 stream-K (one wave: whole tiles)
#   1x41x129: 2 tiles x 9 K blocks
#   130x70x40: 27 tiles: 20 data-parallel + 7 stream-K x 3 K blocks (21 iterations)
#   64x64x16: 8 tiles of a single K block
SHAPES = [(None, 37, 45, 100), (None, 7, 9, 100), (3, 20, 33, 70), (None, 1, 41, 129), (None, 130, 70, 40)]
SHAPES_ALIGNED = [(None, 40, 48, 72), (None, 64, 64, 16), (None, 130, 72, 40)]  # for TMA: rows of 16 B


def _stream_k(variant: str = "stream_k", **kw) -> Config:
    return Config(16, 32, 16, 4, num_warps=4, num_stages=1, variant=variant, **kw)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", ["NN", "TT", "NT"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_stream_k_matches_float64(shape, layout, dtype):
    run_case(*shape, layout=layout, dtype=DTYPES[dtype], epilogue="bias_relu", config=_stream_k())


@pytest.mark.parametrize("shape", SHAPES_ALIGNED, ids=str)
def test_stream_k_on_the_tma_loop(shape):
    run_case(*shape, "NT", torch.bfloat16, "bias_gelu_tanh_residual", config=_stream_k("tma_stream_k"))


@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_stream_k_runs_every_epilogue_once_on_the_full_sum(epilogue):
    # a residual or a scale applied per partial would be counted 3 times: the reference sees it
    run_case(None, 33, 40, 90, "NT", torch.float16, epilogue, config=_stream_k())


@pytest.mark.parametrize("subtile", [2, 4])
def test_stream_k_with_epilogue_slices(subtile):
    config = dataclasses.replace(_stream_k(), BLOCK_N=64, EPILOGUE_SUBTILE=subtile)
    run_case(None, 37, 70, 100, "NN", torch.bfloat16, "two_outputs", config=config)


def test_stream_k_of_a_dual_gemm():
    gen = torch.Generator().manual_seed(1)
    a, b, b2 = (torch.randn(s, generator=gen).half() for s in ((21, 70), (70, 40), (70, 40)))
    bias = torch.randn(40, generator=gen).half()
    out = epilab.gated_matmul(a, b, b2, activation="silu", bias=bias, config=_stream_k())
    g, u = a.double() @ b.double() + bias.double(), a.double() @ b2.double()
    assert rel_error(out, torch.nn.functional.silu(g) * u) <= 2e-3


def test_the_workspace_is_kept_between_calls_with_every_flag_back_at_zero():
    """The flags are zeroed once; each launch takes back every flag it raised, so the next
    call (another problem, other tiles) starts clean, and equal inputs give equal bits."""
    gen = torch.Generator().manual_seed(2)
    x, y, w = (torch.randn(s, generator=gen) for s in ((19, 90), (19, 90), (90, 33)))
    first = epilab.matmul(x, w, activation="gelu", config=_stream_k())
    (_, flags) = bound._scratch[(torch.device("cpu"), None)]
    assert int(flags.count_nonzero()) == 0
    other = epilab.matmul(y, w, activation="gelu", config=_stream_k())
    wide = epilab.matmul(
        torch.randn(50, 90, generator=gen), torch.randn(90, 70, generator=gen), config=_stream_k()
    )
    again = epilab.matmul(x, w, activation="gelu", config=_stream_k())
    assert bound._scratch[(torch.device("cpu"), None)][1] is flags and int(flags.count_nonzero()) == 0
    assert torch.equal(first, again) and not torch.equal(first, other) and wide.shape == (50, 70)
    assert rel_error(other, torch.nn.functional.gelu(y.double() @ w.double())) <= 1e-5


def test_a_larger_workspace_replaces_the_kept_one_without_freeing_it():
    small = bound.Workspace(4, 16).tensors(torch.device("cpu"))
    large = bound.Workspace(8, 4096).tensors(torch.device("cpu"))
    assert large["ws_ptr"].numel() >= 8 * 4096 and large["flags_ptr"].numel() >= 8
    assert bound.Workspace(4, 16).tensors(torch.device("cpu"))["ws_ptr"] is large["ws_ptr"]
    assert any(kept[0] is small["ws_ptr"] for kept in bound._retired) or small["ws_ptr"] is large["ws_ptr"]


def test_call_scratch_is_made_anew_and_zeroed_each_call_and_empty_scratch_is_kept():
    """The cooperative kernel's split tails take scratch made per call (a CUDA-graph tree's
    warm-up allocates everything to the graph's pool, where kept scratch is a live tensor)."""
    cpu = torch.device("cpu")
    first = bound.CallScratch(6, 32).tensors(cpu)
    first["flags_ptr"].fill_(1)
    second = bound.CallScratch(6, 32).tensors(cpu)
    assert second["ws_ptr"].numel() == 6 * 32 and second["flags_ptr"].dtype == torch.int32
    assert second["flags_ptr"] is not first["flags_ptr"] and not second["flags_ptr"].any()
    empty = bound.CallScratch(0, 32).tensors(cpu)
    assert empty["ws_ptr"].numel() == 0 and empty["flags_ptr"].numel() == 0
    assert bound.CallScratch(0, 8).tensors(cpu)["flags_ptr"] is empty["flags_ptr"]


@pytest.mark.parametrize(
    "config,match",
    [
        (_stream_k(SPLIT_K=2), "split-K runs on the default and tma loops"),
        (_stream_k(PROGRAMS_PER_SM=2), "persistent variants only"),
        (_stream_k(FLATTEN=1), "persistent variants only"),
    ],
    ids=["split-k", "programs-per-sm", "flatten"],
)
def test_stream_k_refusals_say_what_is_accepted(config, match):
    with pytest.raises(ValueError, match=match):
        epilab.matmul(torch.randn(32, 48), torch.randn(48, 32), config=config)


@pytest.mark.parametrize(
    "shape,why",
    [
        ((1024, 1024, 1024), None),  # 64 tiles of 128x128 on 132 SMs: half the SMs idle
        ((512, 11008, 4096), None),  # 4 x 86 = 344 tiles in 3 waves (396 slots): 13% idle
        ((2048, 2048, 2048), "fill their waves"),  # 256 tiles in 2 waves (264 slots): 3% idle
        ((4096, 4096, 4096), "fill their waves"),  # 1024 tiles in 8 waves (1056 slots)
        ((256, 256, 4096, 33), "fill their waves"),  # a batch of 33 x 4 tiles: one full wave
        ((1024, 1024, 64), "single K block"),
    ],
    ids=["cube-1024", "mid-m", "cube-2048", "cube-4096", "batched-full", "short-k"],
)
def test_the_tuner_tries_stream_k_only_where_a_wave_would_idle(shape, why):
    config = Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="stream_k")
    found = infeasible(bf16_problem(*shape), config, HOPPER)
    assert (found is None) if why is None else (why in (found or "")), found


def test_symbolic_sizes_never_stream_k():
    import sympy

    dynamic = dataclasses.replace(
        bf16_problem(1024, 1024, 1024), shape=Shape(1, sympy.Symbol("s0"), 1024, 1024)
    )
    config = Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="stream_k")
    assert "symbolic" in infeasible(dynamic, config, HOPPER)


# ------------------------------------------------------------------ GPU


def _gpu(bm: int, bn: int, bk: int, warps: int, stages: int, variant: str) -> Config:
    return Config(bm, bn, bk, 8, num_warps=warps, num_stages=stages, variant=variant)


GPU_CASES = [  # (M, N, K, dtype, config)
    (1024, 1024, 1024, torch.bfloat16, _gpu(128, 128, 64, 8, 4, "tma_stream_k")),
    (1024, 1024, 1024, torch.bfloat16, _gpu(128, 256, 64, 8, 3, "stream_k")),
    (512, 11008, 4096, torch.float16, _gpu(128, 256, 64, 8, 3, "tma_stream_k")),
    (127, 4096, 1025, torch.bfloat16, _gpu(64, 128, 64, 4, 4, "stream_k")),  # ragged K
    (2000, 1000, 777, torch.float32, _gpu(64, 64, 32, 4, 3, "stream_k")),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[4].short()}")
def test_gpu_stream_k(case):
    m, n, k, dtype, config = case
    run_case(None, m, n, k, "NT", dtype, "bias_gelu_tanh_residual", device="cuda", config=config)
    batched = dataclasses.replace(config, variant="stream_k")  # the tma loop is 2-D only
    run_case(3, m, n, k, "NN", dtype, "two_outputs", device="cuda", config=batched)


def _llm_problem(m: int = 1024, n: int = 1024, k: int = 8192):
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
    ep, ops = simple_epilogue(a, w.t(), activation="gelu")
    return for_template(make_problem(a, w.t(), ep, ops), "matmul"), a, w.t(), ep, ops


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["stream_k", "tma_stream_k"])
def test_gpu_stream_k_is_bitwise_reproducible_over_many_launches(variant):
    problem, a, b, ep, ops = _llm_problem()
    config = Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant=variant)
    ref = reference(ep, a, b, ops)[0]
    first = bind(problem, config, a, b, ops)
    first.run()
    assert rel_error(first.outs[0], ref) <= 1e-2
    differ = 0
    for _ in range(300):
        bound = bind(problem, config, a, b, ops)
        bound.run()
        differ += not torch.equal(bound.outs[0], first.outs[0])
    assert differ == 0, f"{differ} of 300 launches differ from the first"


@pytest.mark.gpu
def test_gpu_stream_k_replays_and_runs_in_a_cuda_graph():
    """The compiled op's Replay looks the workspace up per call and stream; a CUDA graph
    captured on its own stream keeps the workspace it was captured with."""
    from epilab.templates.runtime.replay import Replay

    problem, a, b, ep, ops = _llm_problem(777, 1000, 4096)
    config = Config(128, 128, 64, 8, num_warps=8, num_stages=4, variant="stream_k")
    bound = bind(problem, config, a, b, ops)
    compiled = bound.run()
    names = ["a_ptr", "b_ptr", *(f"op_{n}_ptr" for n in ops)]
    replay = Replay(bound, compiled, names)
    tensors = [a, b, *ops.values()]
    ref = reference(ep, a, b, ops)[0]
    outs = [replay(tensors)[0] for _ in range(50)]
    assert all(torch.equal(o, bound.outs[0]) for o in outs) and rel_error(outs[0], ref) <= 1e-2
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        replay(tensors)  # warm up on the capture stream: its workspace is made outside the graph
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph, stream=side):
        captured = replay(tensors)[0]
    for _ in range(100):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, bound.outs[0])
