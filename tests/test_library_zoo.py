"""Models from the libraries users run (``zoo/libraries.py``: torchvision nets, Hugging Face
transformers decoders, encoders and MoE layers, random weights) through the backend, checked
like the zoo's own (``zoo.harness``: within 2x of Inductor's error against float64 eager).

Optional: each case skips where its library is not installed (``pip install -e .[zoo]``).
CPU (Triton's interpreter, tiny configs): policy ``always`` in fp32. GPU (``pytest -m gpu``,
real sizes, bf16): ``always`` and ``mixed`` (some templates win, some lose, some problems
have no record), and a training step of the decoder in fp32.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from test_zoo import Table
from zoo.harness import Case, Outcome, is_image, run
from zoo.libraries import NEEDS, TORCHVISION, TRANSFORMERS

FP32, BF16 = torch.float32, torch.bfloat16
TINY = [*TRANSFORMERS["tiny"], *TORCHVISION["tiny"]]
REAL = [*TRANSFORMERS["real"], *TORCHVISION["real"]]
CPU_CASES = [Case(m, FP32, channels_last=is_image(m)) for m in TINY]
GPU_CASES = [
    *(Case(m, BF16, channels_last=is_image(m), policy=p) for m in REAL for p in ("always", "mixed")),
    Case("hf_llama", FP32, training=True),
]

pytestmark = pytest.mark.usefixtures("fresh_compiler")


@pytest.fixture(scope="module")
def table() -> Table:
    return Table("library-zoo")


def _needs(case: Case) -> None:
    library = NEEDS[case.model]
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{case.model} is built from {library}, which is not installed (pip install -e .[zoo])")


def _check(outcome: Outcome) -> None:
    assert outcome.ok, outcome.describe()
    assert not outcome.unreadable, outcome.unreadable  # every epilogue's text reads back
    used = sum(outcome.templates.values())
    assert used > 0, f"no template was used: {outcome.describe()}"
    # one anchor cannot be mixed: Mixtral's block with its experts looped (the library's eager
    # experts, data-dependent: outside the graphs the backend sees) has only its router's GEMM
    if outcome.case.policy == "mixed" and outcome.anchors > 1:
        assert used < outcome.anchors, f"the decisions are not mixed: {outcome.describe()}"


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.id)
def test_library_models_on_cpu(case, table):
    _needs(case)
    outcome = run(case, "tiny", "cpu")
    table.add(outcome)
    _check(outcome)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.id)
def test_library_models_on_gpu(case, table):
    _needs(case)
    outcome = run(case, "real", "cuda")
    table.add(outcome)
    _check(outcome)
