"""The matmul template against a float64 reference.

CPU runs use Triton's interpreter on small awkward shapes; the ``gpu`` tests run
the same matrix compiled on a CUDA device at real sizes. Outputs are poisoned
with NaN before every launch, so an unwritten element fails.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import epilab
from epilab.api.matmul import ACTIVATIONS
from epilab.ir import catalog, dtypes
from epilab.ir.check import poisoned_like, rel_error, tolerance
from epilab.ir.config import Config
from epilab.ir.epilogue import Epilogue, acc, operand, ops
from epilab.templates.gemm.matmul import make_problem
from epilab.templates.registry import default_config, for_template, launch
from epilab.templates.verify import checked_launch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


# ------------------------------------------------------------------ the cases


# the catalog's epilogues these tests run, and operand shapes other than the plain ones
EPILOGUES = [
    "none",
    "bias",
    "bias_relu",
    "bias_gelu",
    "gelu_tanh",
    "silu",
    "residual",
    "alpha_beta",
    "col_vector",
    "scalar",
    "cast_fp32",
    "two_outputs",
    "bias_gelu_tanh_residual",
]
OPERAND_SHAPES: dict[str, Callable[[int, int, int], tuple[int, ...]]] = {
    "row": lambda b, m, n: (n,),
    "col": lambda b, m, n: (m, 1),
    "tile": lambda b, m, n: (b, m, n),
    "scalar": lambda b, m, n: (1,),
}
UNUSUAL_SHAPES = {("alpha_beta", "bias"): lambda b, m, n: (1, 1, n)}  # a 3-D row vector broadcasts


def _make(
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    transposed: bool,
    batch: int | None,
    device: str,
    gen: torch.Generator,
) -> torch.Tensor:
    """A random [batch?, rows, cols] tensor, stored transposed when asked."""
    rows, cols = shape[-2], shape[-1]
    lead = () if batch is None else (batch,)
    stored = (*lead, cols, rows) if transposed else (*lead, rows, cols)
    t = torch.randn(stored, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return t.transpose(-1, -2) if transposed else t


def run_case(
    batch: int | None,
    m: int,
    n: int,
    k: int,
    layout: str,
    dtype: torch.dtype,
    epilogue: str,
    device: str = "cpu",
    config: Config | None = None,
    seed: int = 0,
    template: str = "matmul",
) -> None:
    """Build inputs, launch into poisoned outputs, and check every output."""
    gen = torch.Generator().manual_seed(seed)
    a = _make((m, k), dtype, layout[0] == "T", batch, device, gen)
    b = _make((k, n), dtype, layout[1] == "T", batch, device, gen)
    ep = catalog.epilogue(epilogue, dtypes.name_of(dtype))
    bsz = batch or 1
    operands = {
        name: torch.randn(
            UNUSUAL_SHAPES.get((epilogue, name), OPERAND_SHAPES[kind])(bsz, m, n), generator=gen
        ).to(device=device, dtype=dtype)
        for name, kind in ep.operands
    }
    if batch is None:  # 2-D problem: operands have no batch dim
        operands = {name: (v[0] if v.dim() == 3 else v) for name, v in operands.items()}
    problem = for_template(make_problem(a, b, ep, operands), template)
    config = config or default_config(problem, "cuda" if device == "cuda" else "interpreter")
    out_shape = (m, n) if batch is None else (batch, m, n)
    outs = tuple(torch.empty(out_shape, dtype=getattr(torch, o.dtype), device=device) for o in ep.outputs)
    checked_launch(problem, config, a, b, operands, out=outs)  # AssertionError names the worst output


# ------------------------------------------------------------ CPU interpreter

SHAPES = [  # (batch, M, N, K); None = 2-D
    (None, 1, 1, 1),
    (None, 7, 9, 41),
    (None, 41, 7, 9),
    (None, 127, 129, 7),
    (None, 129, 127, 129),
    (None, 9, 1, 127),
    (None, 1, 41, 129),
    (3, 9, 41, 7),
    (3, 129, 7, 41),
]


def _shape_id(s: tuple) -> str:
    b, m, n, k = s
    return f"{'' if b is None else f'b{b}-'}{m}x{n}x{k}"


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=[_shape_id(s) for s in SHAPES])
def test_shapes(shape, dtype):
    run_case(*shape, layout="NN", dtype=DTYPES[dtype], epilogue="bias_gelu")


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("batch", [None, 3], ids=["2d", "b3"])
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_layouts(layout, batch, dtype):
    run_case(batch, 41, 9, 127, layout=layout, dtype=DTYPES[dtype], epilogue="residual")


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_epilogues(epilogue, dtype):
    run_case(3, 41, 129, 9, layout="NT", dtype=DTYPES[dtype], epilogue=epilogue)


CONFIGS = [
    Config(16, 16, 16, GROUP_M=1),  # many tiles, EVEN_K false for K=41
    Config(32, 16, 16, GROUP_M=2),
    Config(16, 64, 32, GROUP_M=8),  # grouping with a ragged last group
    Config(64, 32, 64, GROUP_M=4),
]


@pytest.mark.parametrize("k", [41, 64], ids=["k41", "k64-even"])
@pytest.mark.parametrize("config", CONFIGS, ids=[c.short().replace(" ", "-") for c in CONFIGS])
def test_configs(config, k):
    run_case(None, 127, 129, k, layout="TN", dtype=torch.float32, epilogue="bias_relu", config=config)


def test_broadcast_batch_sides():
    """A 2-D B shared by a batched A (stride-0 batch), and a batch-1 A."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(3, 9, 41, generator=gen)
    b = torch.randn(41, 7, generator=gen)
    torch.testing.assert_close(epilab.matmul(a, b), (a.double() @ b.double()).float(), rtol=1e-5, atol=1e-5)
    a1 = torch.randn(1, 9, 41, generator=gen)
    b3 = torch.randn(3, 41, 7, generator=gen)
    torch.testing.assert_close(
        epilab.matmul(a1, b3), (a1.double() @ b3.double()).float(), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("where", ["store", "cast"])
def test_bf16_results_round_to_nearest_even(where):
    """Products of small integers are exact in fp32; from 257 up many are halfway between two
    bfloat16 values. The kernel must round them to even as a GPU (and torch) does, also in
    Triton's interpreter, whose own cast truncates."""
    a = torch.arange(1, 65, dtype=torch.float32).bfloat16()[:, None]
    b = torch.arange(1, 65, dtype=torch.float32).bfloat16()[None, :]
    want = (a.float() @ b.float()).bfloat16()
    if where == "store":  # the output's rounding
        out = epilab.matmul(a, b)
    else:  # a rounding cast inside the epilogue, stored as fp32
        ep = Epilogue.build([(ops.cast(acc(), dtype="bfloat16"), "float32")])
        out = epilab.matmul(a, b, epilogue=ep, operands={}).bfloat16()
    assert torch.equal(out, want), f"{(out != want).sum().item()} of {want.numel()} rounded otherwise"


def test_output_with_any_strides():
    """A preallocated, transposed (column-major) output is written correctly."""
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(41, 9, generator=gen), torch.randn(9, 7, generator=gen)
    ep = Epilogue.identity("float32")
    problem = make_problem(a, b, ep, {})
    out = poisoned_like(torch.empty(7, 41)).t()  # [41, 7] with strides (1, 41)
    launch(problem, default_config(problem, "interpreter"), a, b, {}, out=(out,))
    assert rel_error(out, a.double() @ b.double()) < 1e-5


def test_public_matmul_epilogue_arguments():
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(7, 41, generator=gen), torch.randn(41, 9, generator=gen)
    bias, res = torch.randn(9, generator=gen), torch.randn(7, 9, generator=gen)
    out = epilab.matmul(a, b, bias=bias, activation="silu", residual=res, alpha=0.5, beta=2.0)
    ref = torch.nn.functional.silu(0.5 * (a.double() @ b.double()) + 2.0 * bias.double()) + res.double()
    assert rel_error(out, ref) < 1e-5
    col_bias = torch.randn(7, 1, generator=gen)
    out16 = epilab.matmul(
        a.half(), b.half(), bias=col_bias.half(), activation="tanh", out_dtype=torch.float32
    )
    assert out16.dtype == torch.float32
    ref16 = torch.tanh(a.half().double() @ b.half().double() + col_bias.half().double())
    assert rel_error(out16, ref16) < 1e-2
    F = torch.nn.functional
    expected = {
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
    }
    assert set(expected) == set(ACTIVATIONS)
    for act, fn in expected.items():
        assert rel_error(epilab.matmul(a, b, activation=act), fn(a.double() @ b.double())) < 1e-5, act


def test_public_matmul_custom_epilogue_two_outputs():
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(9, 7, generator=gen), torch.randn(7, 41, generator=gen)
    scale = torch.randn(9, 1, generator=gen)
    pre = acc() * operand("scale", "col")
    ep = Epilogue.build(
        [(pre, "float32"), (ops.clamp(pre, min=-0.5, max=0.5), "float16"), (ops.gt(pre, 0.0), "bool")]
    )
    o_pre, o_clamped, o_mask = epilab.matmul(a, b, epilogue=ep, operands={"scale": scale})
    ref = (a.double() @ b.double()) * scale.double()
    assert rel_error(o_pre, ref) < 1e-5
    assert o_clamped.dtype == torch.float16 and rel_error(o_clamped, ref.clamp(-0.5, 0.5)) < 1e-2
    assert o_mask.dtype == torch.bool
    # comparisons near zero may flip with rounding; everywhere else they must agree
    settled = ref.abs() > 1e-4
    assert torch.equal(o_mask[settled], (ref > 0)[settled])


@pytest.mark.parametrize(
    "m,n,k,batch",
    [(0, 7, 9, None), (7, 0, 9, None), (0, 0, 0, None), (9, 7, 0, None), (9, 7, 0, 3), (9, 7, 5, 0)],
)
def test_zero_sizes(m, n, k, batch):
    lead = () if batch is None else (batch,)
    a, b = torch.randn(*lead, m, k), torch.randn(*lead, k, n)
    bias = torch.randn(n)
    out = epilab.matmul(a, b, bias=bias, activation="sigmoid")
    assert out.shape == (*lead, m, n)
    if out.numel():  # K == 0: the epilogue of a zero accumulator
        assert rel_error(out, torch.sigmoid(bias.double()).expand(*lead, m, n)) < 1e-6


# ------------------------------------------------------------------ bad input


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: epilab.matmul(_t(4, 5), _t(6, 7)), ValueError, r"a's last dim \(5\) must equal"),
        (lambda: epilab.matmul(_t(4), _t(4, 7)), ValueError, "must be 2-D or 3-D"),
        (
            lambda: epilab.matmul(_t(4, 5, dtype=torch.float64), _t(5, 7, dtype=torch.float64)),
            TypeError,
            "supported input dtypes",
        ),
        (lambda: epilab.matmul(_t(4, 5).to(torch.int32), _t(5, 7).to(torch.int32)), TypeError, "dtype"),
        (lambda: epilab.matmul(_t(4, 5), _t(5, 7).half()), TypeError, "same dtype"),
        (lambda: epilab.matmul(_t(2, 4, 5), _t(3, 5, 7)), ValueError, "do not broadcast"),
        (lambda: epilab.matmul(_t(4, 5), _t(5, 7), bias=_t(6)), ValueError, "does not broadcast"),
        (
            lambda: epilab.matmul(_t(4, 5), _t(5, 7), residual=_t(2, 4, 7)),
            ValueError,
            "may not have more dims",
        ),
        (lambda: epilab.matmul(_t(4, 5), _t(5, 7), activation="swish"), ValueError, "not one of"),
        (lambda: epilab.matmul(_t(4, 5), _t(5, 7), bias=_t(7).to(torch.int64)), TypeError, "supported"),
        (
            lambda: epilab.matmul(_t(4, 5), _t(5, 7), epilogue=Epilogue.identity("float32"), bias=_t(7)),
            ValueError,
            "not both",
        ),
        (
            lambda: epilab.matmul(
                _t(4, 5),
                _t(5, 7),
                epilogue=Epilogue.build([(acc() + operand("x", "row"), "float32")]),
                operands={},
            ),
            ValueError,
            r"missing \['x'\]",
        ),
        (
            lambda: epilab.matmul(
                _t(4, 5),
                _t(5, 7),
                epilogue=Epilogue.build([(acc() + operand("x", "row"), "float32")]),
                operands={"x": _t(4, 7)},
            ),
            ValueError,
            "declared row",
        ),
        (lambda: epilab.matmul(_t(4, 5), _t(5, 7), config={"BLOCK_M": 16}), TypeError, "epilab.Config"),
        (
            lambda: epilab.matmul(
                _t(4, 5), _t(5, 7), config=Config(16, 16, 16, SPLIT_K=2, variant="persistent")
            ),
            ValueError,
            "split-K runs on the default and tma loops",
        ),
        (lambda: Config(48, 16, 16), ValueError, r"BLOCK_M=48 is not allowed"),
        (lambda: Config(16, 16, 16, num_warps=3), ValueError, "num_warps=3"),
        (
            lambda: Config.from_dict({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "evil": 1}),
            ValueError,
            "unknown",
        ),
    ],
    ids=[
        "k-mismatch",
        "1d",
        "fp64",
        "int",
        "mixed-dtype",
        "batch",
        "bias-shape",
        "residual-too-big",
        "activation",
        "int-bias",
        "epilogue-and-bias",
        "operand-missing",
        "operand-kind",
        "config-type",
        "split-k",
        "config-block",
        "config-warps",
        "config-field",
    ],
)
def test_bad_input_says_what_is_wrong(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_cpu_tensors_need_interpreter_mode():
    with epilab.config.patch(interpret=False), pytest.raises(ValueError, match="EPILAB_INTERPRET=1"):
        epilab.matmul(_t(4, 5), _t(5, 7))


# ------------------------------------------------------------------------ GPU

GPU_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
GPU_SHAPES = [
    (None, 4096, 4096, 4096),
    (None, 1023, 4097, 511),
    (None, 127, 4096, 1025),
    (None, 1, 4096, 4096),
    (4, 513, 768, 1000),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(GPU_DTYPES))
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[_shape_id(s) for s in GPU_SHAPES])
def test_gpu_shapes(shape, dtype):
    run_case(*shape, layout="NN", dtype=GPU_DTYPES[dtype], epilogue="bias_gelu_tanh_residual", device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(GPU_DTYPES))
@pytest.mark.parametrize("batch", [None, 3], ids=["2d", "b3"])
@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_gpu_layouts(layout, batch, dtype):
    run_case(
        batch, 1000, 2048, 1536, layout=layout, dtype=GPU_DTYPES[dtype], epilogue="residual", device="cuda"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(GPU_DTYPES))
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_gpu_epilogues(epilogue, dtype):
    run_case(None, 4096, 4096, 4096, layout="NT", dtype=GPU_DTYPES[dtype], epilogue=epilogue, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_gpu_fp32(precision):
    a, b = torch.randn(1024, 777, device="cuda"), torch.randn(777, 2048, device="cuda")
    out = epilab.matmul(a, b, activation="relu", allow_tf32=precision == "tf32")
    ref = torch.relu(a.double() @ b.double())
    assert rel_error(out, ref) <= tolerance("float32", precision, "float32")
