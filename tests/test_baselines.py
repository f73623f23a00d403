"""The baseline libraries: one registration (``tuner/baselines.BASELINES``) that the tuner, the
CLI, the reports and the database agree on, and each library's function where it applies
(on the CPU: the eager ones; cuBLASLt's fused bias + activation through torch's CPU kernel)."""

from __future__ import annotations

import pytest

from epilab.db.models import LIBRARY_NAME
from epilab.ir.check import rel_error
from epilab.reports.data import LIBRARY_ORDER
from epilab.reports.plots import COLORS
from epilab.templates.gemm.gemm_spec import Spec
from epilab.templates.registry import KINDS
from epilab.templates.verify import random_inputs
from epilab.tuner.baselines import BASELINES, KIND_LIBRARIES, baseline
from epilab.tuner.evaluate import baseline_fn
from epilab.tuner.tune import TuneOptions


def test_one_registration_serves_the_tuner_the_reports_and_the_database():
    assert {kind.library for kind in KINDS.values()} == set(KIND_LIBRARIES)
    assert all(LIBRARY_NAME.fullmatch(name) for name in BASELINES)
    assert tuple(BASELINES) == LIBRARY_ORDER and set(BASELINES) <= set(COLORS)
    assert TuneOptions().baselines == KIND_LIBRARIES
    TuneOptions(baselines=tuple(BASELINES))
    with pytest.raises(ValueError, match=r"unknown baseline.*'mkl'.*choose from cublas, cudnn"):
        TuneOptions(baselines=("cublas", "mkl"))
    with pytest.raises(ValueError, match="unknown baseline library 'mkl'"):
        baseline("mkl")


@pytest.mark.parametrize("epilogue", ["bias_relu", "bias_gelu_tanh", "bias_gelu"])
def test_each_library_computes_the_problem_where_it_applies(epilogue):
    problem = Spec(24, 40, 32, dtype="float32", epilogue=epilogue).problem()
    a, b, operands = random_inputs(problem, "cpu", seed=1)
    (want,) = baseline_fn(problem, "cublas")(a, b, operands)
    fused = baseline_fn(problem, "cublaslt")  # relu and tanh-gelu only: cuBLASLt's epilogues
    assert (fused is None) == (epilogue == "bias_gelu")
    if fused is not None:
        (got,) = fused(a, b, operands)
        # torch's CPU kernel computes the erf gelu where cuBLASLt computes the tanh one (4e-5 apart)
        assert got.dtype == want.dtype and rel_error(got, want.double()) < 1e-3
    assert baseline_fn(problem, "cudnn") is None and baseline_fn(problem, "grouped_mm") is None
    with pytest.raises(ValueError, match="unknown baseline library"):
        baseline_fn(problem, "mkl")
