"""Specs: problems as a user writes them, in a shapes file or a built-in suite.

A spec is a small JSON object (``{"m": 2048, "n": 4096, "k": 4096}``); the kind whose
problems it describes owns its format (``SpecFormat``: its keys, the class that checks them
and builds the ``Problem``, its built-in suites). ``policy/suites.py`` picks the format of an
object by the keys only that format has and knows nothing of any one kind. The pieces every
format shares (an epilogue written as a catalog name, an expression or a list of outputs)
are here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from epilab.ir.catalog import EPILOGUES, epilogue
from epilab.ir.dtypes import canonical_dtype, default_output_dtype
from epilab.ir.epilogue import Epilogue
from epilab.ir.epilogue_print import readable
from epilab.ir.epilogue_text import parse_epilogue, parse_text
from epilab.ir.problem import Problem

# a spec's epilogue: a catalog name, a whole epilogue's text (epilogue_text.parse_text), or outputs as
# (expression, dtype or None for the input dtype) pairs
EpilogueSpec = str | tuple[tuple[str, str | None], ...]

# the layout of an operand read as a vector or a scalar (a tile is stored as its output is)
OPERAND_LAYOUTS = {"row": "vector", "col": "vector", "scalar": "scalar"}


class ProblemSpec(Protocol):
    """What every format's spec is: a problem to build, label and count."""

    def problem(self) -> Problem: ...

    def label(self) -> str: ...

    def flops(self) -> int: ...


@dataclass(frozen=True)
class SpecFormat:
    """How one kind's problems are written: a kind names the module that holds its format
    (``TemplateKind.spec_module``, whose ``FORMAT`` this is)."""

    what: str  # its problems in an error: "a conv2d problem"
    keys: frozenset[str]  # every key it takes
    required: frozenset[str]
    # keys that only its objects have (a convolution's c, h, w, r, s): an object with any of
    # them is of this format; the one format with none is the default (the matmul's)
    marks: frozenset[str]
    make: Callable[..., ProblemSpec]  # make(**object) -> a checked spec, or a ValueError
    # its built-in suites, by name (each name unique over all formats)
    suites: Mapping[str, Sequence[ProblemSpec]]

    def parse(self, d: Mapping[str, Any]) -> ProblemSpec:
        """The spec of a JSON object of this format; a ValueError says what is wrong."""
        unknown = set(d) - self.keys
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)} for {self.what}; known: {sorted(self.keys)}")
        missing = self.required - set(d)
        if missing:
            raise ValueError(f"missing {sorted(missing)} for {self.what}")
        if "epilogue" in d:
            d = {**d, "epilogue": epilogue_value(d["epilogue"])}
        if "dtype" in d:
            d = {**d, "dtype": canonical_dtype(d["dtype"])}  # "bf16" as --input takes it
        return self.make(**d)


def format_of(d: Mapping[str, Any], formats: Sequence[SpecFormat]) -> SpecFormat:
    """The format of a JSON object: the one whose marks it has, else the default."""
    marked = [f for f in formats if f.marks & set(d)]
    if len(marked) > 1:
        names = " and ".join(f"{f.what} ({', '.join(sorted(f.marks & set(d)))})" for f in marked)
        raise ValueError(f"the keys of {names} do not go together in one problem")
    if marked:
        return marked[0]
    default = [f for f in formats if not f.marks]
    if len(default) != 1:  # a registry fault, not the user's
        raise RuntimeError(f"{len(default)} spec formats have no marks; exactly one must")
    return default[0]


def spec_epilogue(value: EpilogueSpec, dtype: str) -> Epilogue:
    """The epilogue a spec names or writes out (see ``EpilogueSpec``; a string is a catalog
    name or a whole epilogue's text, as every table shows one): for fp8 inputs its outputs
    default to bfloat16."""
    dtype = default_output_dtype(dtype)
    if isinstance(value, str):
        return epilogue(value, dtype) if value in EPILOGUES else parse_text(value, dtype)
    return parse_epilogue(list(value), dtype)


def epilogue_value(v: Any) -> EpilogueSpec:
    """A spec's ``epilogue`` from JSON: a string, or a list of outputs, each a string or
    ``{"expr": ..., "dtype": ...}``."""
    if isinstance(v, str):
        return v
    if not isinstance(v, list) or not v:
        raise ValueError(f"epilogue must be a string or a non-empty list of outputs, got {v!r:.60}")
    outputs = []
    for item in v:
        if isinstance(item, str):
            outputs.append((item, None))
        elif isinstance(item, dict) and set(item) <= {"expr", "dtype"} and isinstance(item.get("expr"), str):
            dt = item.get("dtype")
            if dt is not None and not isinstance(dt, str):
                raise ValueError(f"an output's dtype must be a string, got {dt!r:.40}")
            outputs.append((item["expr"], dt))
        else:
            raise ValueError(
                f'an epilogue output is a string or {{"expr": ..., "dtype": ...}}, got {item!r:.60}'
            )
    return tuple(outputs)


def epilogue_label(value: EpilogueSpec, dtype: str) -> str:
    """A spec's epilogue as every label shows one (``ir/epilogue_print.readable``), clipped."""
    return clip(readable(spec_epilogue(value, dtype), default_output_dtype(dtype)), LABEL_EPILOGUE)


LABEL_EPILOGUE = 60  # characters of an epilogue in a one-line label


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, "..." saying it was."""
    return text if len(text) <= width else text[: width - 3] + "..."


def int_in(name: str, v: Any, lo: int, hi: int) -> None:
    """A ValueError unless ``v`` is an int (not a bool) in lo..hi."""
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {v!r:.40}")
