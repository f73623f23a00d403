"""Tuning records written by tests: one measured config and, beside it, a baseline, so that
the compiler's decisions can be steered (a template that wins, one that loses)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton

from epilab.db import INTERPRETER_DEVICE, DeviceInfo, Timing, TuningDB, Versions
from epilab.ir.problem import Problem


def record(
    db_path: str,
    problem: Problem,
    config: Mapping[str, object],
    trial_ms: float,
    baseline_ms: float | None = None,
    device: DeviceInfo = INTERPRETER_DEVICE,
) -> None:
    """Store ``config`` as an ok trial of ``problem`` taking ``trial_ms``, and a cuBLAS
    baseline taking ``baseline_ms`` (if given), for ``device`` and this torch and triton."""
    versions = Versions(torch.__version__, triton.__version__)
    with TuningDB.open(db_path) as db:
        db.record_trial(
            problem,
            device,
            config=config,
            status="ok",
            timing=Timing(trial_ms, trial_ms, trial_ms, "test"),
            max_rel_error=0.0,
            versions=versions,
            study="test",
            trial_number=0,
        )
        if baseline_ms is not None:
            db.record_baseline(
                problem,
                device,
                library="cublas",
                timing=Timing(baseline_ms, baseline_ms, baseline_ms, "test"),
                max_rel_error=0.0,
                versions=versions,
            )


def record_slower_in_context(
    db_path: str, problem: Problem, device: DeviceInfo = INTERPRETER_DEVICE, training: bool = False
) -> None:
    """Store verdicts that a model ran faster without ``problem``'s template, with CUDA graphs
    and without (what ``tune --model`` stores), for this torch and triton: what keeps the aten
    op where no baseline applies (a dequantize-then-mm's, ``Group.aten_dequantizes``)."""
    versions = Versions(torch.__version__, triton.__version__)
    with TuningDB.open(db_path) as db:
        for cuda_graphs in (False, True):
            db.record_verdict(
                problem,
                device,
                cuda_graphs=cuda_graphs,
                keep=False,
                with_ms=2.0,
                without_ms=1.0,
                context="test",
                timing_method="test",
                versions=versions,
                training=training,
            )
