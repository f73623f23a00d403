"""epilab: autotuned Triton templates for matmul-like ops with fused epilogues.

Public surface (see DESIGN.md): ``epilab.matmul`` (one fused matmul), the
epilogue builders (``acc``, ``operand``, ``const``, ``ops``, ``Epilogue``),
``Config``, and the ``epilab`` command line.
"""

import os as _os
import sys as _sys

from epilab.config import settings as _settings

# Triton chooses interpreter or compiler when triton.language is first imported.
if _settings().interpret and "triton" not in _sys.modules:
    _os.environ["TRITON_INTERPRET"] = "1"

from epilab.templates.epilogue import Epilogue, acc, const, operand, ops
from epilab.templates.matmul import matmul
from epilab.templates.problem import Config

__all__ = ["Config", "Epilogue", "acc", "const", "matmul", "operand", "ops"]
__version__ = "0.1.0"
