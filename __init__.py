"""epilab: autotuned Triton templates for matmul-like ops with fused epilogues.

Public surface (see docs/design.md): ``torch.compile(model, backend="epilab")`` and
``epilab.compile`` (the backend), ``epilab.explain()`` (its decisions),
``epilab.matmul`` (one fused matmul), ``epilab.gated_matmul`` (a gated MLP's gate and up
projections in one dual GEMM), ``epilab.tune_model`` (record, tune, check in
context and measure a model), the epilogue builders (``acc``, ``acc2``,
``operand``, ``const``, ``ops``, ``Epilogue``), ``Config``, and the ``epilab``
command line.

Triton decides between its interpreter and its compiler when it is first
imported, so ``matmul`` (which needs Triton) is imported on first use: by then
``EPILAB_INTERPRET=1`` has been turned into ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import os as _os
import sys as _sys
from typing import Any

from epilab.config import SettingsError as _SettingsError
from epilab.config import settings as _settings
from epilab.templates.epilogue import Epilogue, acc, acc2, const, operand, ops
from epilab.templates.problem import Config

__all__ = [
    "Config",
    "Epilogue",
    "acc",
    "acc2",
    "compile",
    "const",
    "explain",
    "gated_matmul",
    "matmul",
    "operand",
    "ops",
    "tune_model",
]
__version__ = "0.1.0"


def enable_interpreter_if_asked() -> None:
    """Set TRITON_INTERPRET=1 when epilab's interpreter mode is on and Triton is not loaded yet.
    Bad settings do not stop ``import epilab``: they are reported where they are first used."""
    try:
        interpret = _settings().interpret
    except _SettingsError:
        return
    if interpret and "triton" not in _sys.modules:
        _os.environ["TRITON_INTERPRET"] = "1"


enable_interpreter_if_asked()


def __getattr__(name: str) -> Any:
    if name == "matmul":
        from epilab.templates.matmul_api import matmul

        return matmul
    if name == "gated_matmul":
        from epilab.templates.matmul_api import gated_matmul

        return gated_matmul
    if name == "compile":
        from epilab.compiler.backend import compile

        return compile
    if name == "tune_model":
        from epilab.tuner.model import tune_model

        return tune_model
    if name == "explain":
        from epilab.compiler.explain import explain

        return explain
    raise AttributeError(f"module 'epilab' has no attribute {name!r}")
