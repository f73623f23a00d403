"""epilab: autotuned Triton templates for matmul-like ops with fused epilogues.

Public surface (see docs/design.md): ``torch.compile(model, backend="epilab")`` and
``epilab.compile`` (the backend), ``epilab.aot_compile`` (an AOTInductor package with the
templates as its kernels), ``epilab.explain()`` (its decisions),
``epilab.matmul`` (one fused matmul), ``epilab.gated_matmul`` (a gated MLP's gate and up
projections in one dual GEMM), ``epilab.grouped_matmul`` (a mixture of experts' projections,
one grouped GEMM), ``epilab.tune_model`` (record, tune, check in
context and measure a model), the epilogue builders (``acc``, ``acc2``,
``operand``, ``const``, ``ops``, ``Epilogue``), ``Config``, and the ``epilab``
command line.

Triton decides between its interpreter and its compiler when it is first
imported, so ``matmul`` (which needs Triton) is imported on first use: by then
``EPILAB_INTERPRET=1`` has been turned into ``TRITON_INTERPRET=1``. Every public name is
imported on first use, so ``import epilab`` imports neither torch nor Triton.
"""

from __future__ import annotations

import os as _os
import sys as _sys
from typing import Any

from epilab.config import SettingsError as _SettingsError
from epilab.config import settings as _settings

# name -> module: imported on first use, so that `import epilab` (and `epilab --help`,
# `--version`) does not import torch
_LAZY = {
    "Config": "epilab.ir.config",
    "Epilogue": "epilab.ir.epilogue",
    "acc": "epilab.ir.epilogue",
    "acc2": "epilab.ir.epilogue",
    "const": "epilab.ir.epilogue",
    "operand": "epilab.ir.epilogue",
    "ops": "epilab.ir.epilogue",
    "matmul": "epilab.api.matmul",
    "gated_matmul": "epilab.api.matmul",
    "grouped_matmul": "epilab.api.grouped",
    "compile": "epilab.compiler.backend",
    "aot_compile": "epilab.compiler.aot",
    "tune_model": "epilab.model_tuning.tune",
    "explain": "epilab.compiler.explain",
}

__all__ = [
    "Config",
    "Epilogue",
    "acc",
    "acc2",
    "aot_compile",
    "compile",
    "const",
    "explain",
    "gated_matmul",
    "grouped_matmul",
    "matmul",
    "operand",
    "ops",
    "tune_model",
]
__version__ = "0.1.0"


def enable_interpreter_if_asked() -> None:
    """Set TRITON_INTERPRET=1 when epilab's interpreter mode is on and Triton is not loaded yet,
    and keep numpy's warnings about the lanes a kernel masks off the user's screen.
    Bad settings do not stop ``import epilab``: they are reported where they are first used."""
    try:
        interpret = _settings().interpret
    except _SettingsError:
        return
    if interpret and "triton" not in _sys.modules:
        _os.environ["TRITON_INTERPRET"] = "1"
    if interpret:  # numpy's overflow warnings on padded lanes, which every store masks out
        import warnings

        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")


enable_interpreter_if_asked()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'epilab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
