"""The matmul's Gluon kernels for Hopper (variants sm90_persistent and sm90_pingpong,
``templates/gemm/matmul_sm90.py``).

CPU: what they take and refuse; the tuner's feasibility (never in the interpreter, shared memory
with a staging buffer per consumer); and that they compile for sm_90a through Triton and ptxas
(``templates/tools/cross.py``, in a process that does not interpret) with no spills, wgmma in the
SASS and a warp-specialized ping-pong of 12 warps. GPU (``-m gpu``): every output against
float64 over ragged shapes, all four layouts, many tiles per program and long K (the ping-pong's
ring wraps many times), short K, epilogues with several outputs, statistics and bool outputs;
replays and CUDA graphs.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_matmul import run_case

from epilab.ir import catalog
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.policy.space import HOPPER, DeviceLimits, infeasible
from epilab.templates.gemm.gemm_spec import Spec
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.registry import bind, kind_of

PINGPONG = Config(128, 128, 64, 8, num_warps=4, num_stages=4, variant="sm90_pingpong", TMA_STORE=1)
PERSISTENT = Config(128, 128, 64, 8, num_warps=8, num_stages=3, variant="sm90_persistent", TMA_STORE=1)
H100 = DeviceLimits("NVIDIA H100 80GB HBM3", "9.0", 132, 232_448)


def _error(problem, config):
    return kind_of(problem).config_error(problem, config)


# ------------------------------------------------------------------ rules (CPU)


@pytest.mark.parametrize("config", [PINGPONG, PERSISTENT], ids=["pingpong", "persistent"])
def test_what_the_sm90_variants_refuse(config):
    ok = Spec(256, 256, 128, epilogue="bias_gelu").problem()
    assert _error(ok, config) is None
    assert "bfloat16 or float16" in _error(Spec(256, 256, 128, dtype="float32").problem(), config)
    assert "2-D" in _error(Spec(256, 256, 128, batch=2).problem(), config)
    assert "16-byte aligned" in _error(Spec(256, 256, 100).problem(), config)  # K = 100: A's rows
    assert "SPLIT_K=1" in _error(ok, dataclasses.replace(config, SPLIT_K=2))
    assert "2 stages" in _error(ok, dataclasses.replace(config, num_stages=1))
    assert "BLOCK_M" in _error(ok, dataclasses.replace(config, BLOCK_M=32))
    assert "persistent variants" in _error(ok, dataclasses.replace(config, FLATTEN=1))
    stats = Epilogue.build([(acc(), "float32", "row_sum")])
    only_stats = dataclasses.replace(ok, epilogue=stats, operands=())
    assert "TMA can store" in _error(only_stats, config)
    assert _error(only_stats, dataclasses.replace(config, TMA_STORE=0)) is None
    # a dual GEMM (two accumulators) runs on the Triton loops
    dual = Spec(256, 256, 128, epilogue="silu(acc) * acc2").problem()
    assert "one accumulator" in _error(dual, config)


def test_pingpong_consumers_are_warp_groups():
    p = Spec(256, 256, 128).problem()
    assert "num_warps=4" in _error(p, dataclasses.replace(PINGPONG, num_warps=8))


def test_feasibility_keeps_them_off_the_interpreter_and_counts_two_staging_buffers():
    p = Spec(4096, 4096, 512, epilogue="bias_gelu").problem()
    assert "interpreter" in infeasible(p, PINGPONG, HOPPER)
    assert infeasible(p, PINGPONG, H100) is None
    ampere = DeviceLimits("NVIDIA A100", "8.0", 108, 166_912)
    assert "sm_90" in infeasible(p, PINGPONG, ampere)
    # 5 stages of 128x128x64 bf16 (160 KiB) + two 128x128 bf16 staging buffers (64 KiB) > 227 KiB
    assert "shared memory" in infeasible(p, dataclasses.replace(PINGPONG, num_stages=6), H100)
    assert infeasible(p, dataclasses.replace(PINGPONG, num_stages=5), H100) is None


def test_interpreter_binding_says_what_to_use_instead():
    a = torch.randn(64, 64).to(torch.bfloat16)
    b = torch.randn(64, 64).to(torch.bfloat16)
    ep = catalog.epilogue("none", "bfloat16")
    problem = make_problem(a, b, ep, {})
    with pytest.raises(ValueError, match="interpreter cannot run it"):
        bind(problem, dataclasses.replace(PINGPONG, BLOCK_N=64), a, b, {})


# --------------------------------------------------- compiled for sm_90a (CPU)

COMPILED = [
    ("NT bias_gelu", Spec(1024, 1536, 384, epilogue="bias_gelu"), PINGPONG),
    ("NT bias_gelu_tanh, pointer stores", Spec(1024, 1536, 384, epilogue="bias_gelu_tanh"), dataclasses.replace(PINGPONG, TMA_STORE=0)),
    ("TT residual 64x256", Spec(512, 768, 3072, layout="TT", epilogue="bias_residual"), Config(64, 256, 64, 8, num_warps=4, num_stages=4, variant="sm90_pingpong", TMA_STORE=1)),
    ("NN fp16 silu", Spec(512, 512, 256, layout="NN", dtype="float16", epilogue="bias_silu"), PINGPONG),
    ("two outputs", Spec(512, 512, 256, epilogue=(("acc + bias[n]", "float32"), ("gelu(acc + bias[n])", None))), PINGPONG),
    ("bool output", Spec(512, 512, 256, epilogue=(("acc", None), ("acc > 0.0", "bool"))), PINGPONG),
    ("persistent 128x256", Spec(2048, 4096, 512, epilogue="bias_gelu"), Config(128, 256, 64, 8, num_warps=8, num_stages=3, variant="sm90_persistent", TMA_STORE=1)),
    ("persistent TN", Spec(512, 768, 768, layout="TN", epilogue="bias_residual"), PERSISTENT),
]  # fmt: skip


def compile_cases(cases):
    """Each (what, spec, config) of ``cases`` compiled for sm_90a in a process that does not
    interpret."""
    from epilab.templates.tools.cross import compile_in_subprocess

    return compile_in_subprocess([(spec.problem(), config) for _, spec, config in cases])


def checked_kernel(answer, what, config, mma="HGMMA"):
    """The one kernel of a compiled case: no spills, wgmma (``mma``: QGMMA for fp8) and TMA
    loads in the SASS, TMA stores with TMA_STORE."""
    assert "error" not in answer, answer.get("error")
    (kernel,) = answer["kernels"]
    assert kernel["local_bytes"] == 0 and kernel["stack_bytes"] <= 16, f"{what}: spills {kernel}"
    assert kernel["opcodes"].get(mma, 0) > 0, f"no wgmma ({mma}) in the SASS"
    assert kernel["opcodes"].get("UTMALDG", 0) > 0, "operands are not loaded by TMA"
    if config.TMA_STORE:
        assert kernel["opcodes"].get("UTMASTG", 0) > 0, "outputs are not stored by TMA"
    return kernel


@pytest.fixture(scope="module")
def compiled():
    return compile_cases(COMPILED)


@pytest.mark.parametrize("index", range(len(COMPILED)), ids=[c[0] for c in COMPILED])
def test_compiles_for_sm90_without_spills(compiled, index):
    what, spec, config = COMPILED[index]
    kernel = checked_kernel(compiled[index], what, config)
    if config.variant == "sm90_pingpong":
        assert kernel["num_warps"] == 12  # two consumer warp groups and the producer's
    # the fast epilogue forms reach the Gluon kernels too
    fast = any(n.op in ("gelu", "silu", "gelu_tanh") for n in spec.problem().epilogue.nodes)
    if fast and spec.dtype == "bfloat16":
        assert kernel["opcodes"].get("MUFU", 0) > 0


# ------------------------------------------------------------------ GPU

VARIANT_CONFIGS = {
    "pingpong": PINGPONG,
    "pingpong-ptr": dataclasses.replace(PINGPONG, TMA_STORE=0),
    "pingpong-64x256": Config(
        64, 256, 64, 8, num_warps=4, num_stages=3, variant="sm90_pingpong", TMA_STORE=1
    ),
    "pingpong-2st": Config(128, 64, 32, 4, num_warps=4, num_stages=2, variant="sm90_pingpong", TMA_STORE=1),
    "persistent": PERSISTENT,
    "persistent-w4": Config(
        64, 128, 64, 8, num_warps=4, num_stages=2, variant="sm90_persistent", TMA_STORE=0
    ),
}
# (M, N, K), rows 16-byte aligned in every layout (M, N, K multiples of 8): ragged against every
# tile; many tiles per program (the ring wraps many times); K of many stages (ping-pong order), of
# one block, shorter than a block
GPU_SHAPES = [
    (296, 264, 200),
    (8, 8, 8),
    (4096, 2048, 1024),
    (520, 1032, 4104),
    (2048, 512, 24),
    (136, 136, 64),
]


def feasible(problem, config):
    """``config`` with fewer stages (then without TMA stores) until an H100's shared memory holds
    it (blocks larger than a small problem are fine to run: the tuner only skips them)."""

    def too_large(c):
        return "shared memory" in (infeasible(problem, c, H100) or "")

    while too_large(config) and config.num_stages > 2:
        config = dataclasses.replace(config, num_stages=config.num_stages - 1)
    if too_large(config):
        config = dataclasses.replace(config, TMA_STORE=0)
    assert not too_large(config), infeasible(problem, config, H100)
    return config


def run_feasible(m, n, k, layout, dtype, epilogue, config):
    spec = Spec(m, n, k, dtype=str(dtype).split(".")[-1], layout=layout, epilogue=epilogue)
    run_case(None, m, n, k, layout, dtype, epilogue, "cuda", feasible(spec.problem(), config))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(VARIANT_CONFIGS))
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["NT", "TN"])
def test_gpu_sm90_shapes(name, shape, layout):
    m, n, k = shape
    run_feasible(m, n, k, layout, torch.bfloat16, "bias_gelu_tanh_residual", VARIANT_CONFIGS[name])


@pytest.mark.gpu
def test_gpu_sm90_views_tma_cannot_read_take_the_classic_loop():
    """M = 1 as a transposed view (a row stride of one element: the problem's rows are aligned,
    the tensor's are not): the same results through the default loop."""
    run_case(None, 1, 8, 8, "TN", torch.bfloat16, "bias_gelu_tanh_residual", "cuda", PINGPONG)
    run_case(None, 1, 64, 256, "TN", torch.bfloat16, "bias_gelu", "cuda", PERSISTENT)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["pingpong", "pingpong-ptr", "persistent"])
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
@pytest.mark.parametrize(
    "epilogue",
    ["none", "bias_gelu", "bias_silu", "residual", "two_outputs", "cast_fp32", "col_vector", "scalar"],
)
def test_gpu_sm90_epilogues_and_layouts(name, layout, epilogue):
    run_feasible(1000, 776, 520, layout, torch.bfloat16, epilogue, VARIANT_CONFIGS[name])
    run_feasible(264, 136, 72, layout, torch.float16, epilogue, VARIANT_CONFIGS[name])


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["pingpong", "persistent"])
def test_gpu_sm90_statistics_and_bool_outputs(name):
    from epilab.templates.verify import checked_launch

    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(700, 512, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(256, 512, device="cuda", generator=gen).to(torch.bfloat16).t()
    res = torch.randn(700, 256, device="cuda", generator=gen).to(torch.bfloat16)
    x = acc() + operand("res", "tile")
    ep = Epilogue.build(
        [
            (ops.silu(x), "bfloat16"),
            (x * x, "float32", "row_sum"),
            (ops.gt(x, 0.0), "bool"),
            (x, "float32", "col_max"),
        ]
    )
    problem = make_problem(a, b, ep, {"res": res})
    checked_launch(problem, VARIANT_CONFIGS[name], a, b, {"res": res})


@pytest.mark.gpu
def test_gpu_sm90_replays_and_graphs():
    """A replayed launch (the compiler's op) and a CUDA graph of it remake the descriptors
    for new tensors and give the same results as a fresh launch."""
    from epilab.templates.runtime.replay import Replay

    gen = torch.Generator(device="cuda").manual_seed(5)

    def tensors():
        a = torch.randn(1024, 384, device="cuda", generator=gen).to(torch.bfloat16)
        w = torch.randn(1536, 384, device="cuda", generator=gen).to(torch.bfloat16)
        bias = torch.randn(1536, device="cuda", generator=gen).to(torch.bfloat16)
        return a, w.t(), bias

    ep = catalog.epilogue("bias_gelu", "bfloat16")
    a, b, bias = tensors()
    problem = make_problem(a, b, ep, {"bias": bias}, op="addmm")
    bound = bind(problem, PINGPONG, a, b, {"bias": bias})
    compiled = bound.run()
    replay = Replay(bound, compiled, ["a_ptr", "b_ptr", "op_bias_ptr"])
    a2, b2, bias2 = tensors()
    (out,) = replay([a2, b2, bias2])
    fresh = bind(problem, PINGPONG, a2, b2, {"bias": bias2})
    fresh.run()
    assert torch.equal(out, fresh.outs[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (captured,) = replay([a2, b2, bias2])
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, fresh.outs[0])
