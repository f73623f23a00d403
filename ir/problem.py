"""Problem (what to compute): frozen, JSON round-trip. How it is tiled is a ``Config``
(``ir/config.py``).

A ``Problem`` names everything that changes the generated kernel or its speed:
op kind, template and its source hash, dtypes, layouts, the epilogue and the
shape (a dim may be a sympy expression for dynamic shapes). Its ``key`` is the
sha256 of its canonical JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Union

from epilab.ir.dtypes import FP8_DTYPES, INPUT_DTYPES, OPERAND_DTYPES, default_output_dtype
from epilab.ir.epilogue import MALFORMED, Epilogue
from epilab.ir.epilogue_print import readable
from epilab.ir.patterns import identity_with_names
from epilab.ir.plugin import templates

if TYPE_CHECKING:  # imported where a symbolic dim is parsed: 0.4-0.7 s a process otherwise
    import sympy

LAYOUTS = ("row", "col", "strided")  # row: the last dim has stride 1; col: the one before it
# the layouts an operand of each broadcast is recorded with (``templates.runtime.operand_layout``,
# a convolution's ``conv_geometry.conv_layout``): a vector of one value a row or column, a
# scalar, a tile as a matrix or an image (a convolution records a per-pixel column as an image)
_TILE_LAYOUTS = (*LAYOUTS, "nhwc", "nchw")
ALLOWED_OPERAND_LAYOUTS = {
    "row": ("vector",),
    "col": ("vector", *_TILE_LAYOUTS),
    "scalar": ("scalar",),
    "tile": _TILE_LAYOUTS,
}
# how a dot accumulates: ieee (fp32; fp8 products of PROMOTE K blocks summed by the tensor
# cores, then added in fp32: templates/gemm/matmul.py's EXACT_PROMOTION_MAX_K bounds the interval),
# tf32 (float32 inputs rounded to tf32), fast (fp8 only: the tensor cores' accumulator carries
# the whole K loop, as torch._scaled_mm(use_fast_accum=True))
PRECISIONS = ("ieee", "tf32", "fast")
BATCHED_OPS = ("bmm", "baddbmm")  # B has a batch dim of its own
_SAME_OP = {"addmm": "mm", "baddbmm": "bmm"}  # the bias is an epilogue operand either way


Dim = Union[int, "sympy.Expr"]


def is_symbolic(v: object) -> bool:
    """Whether ``v`` is a sympy expression (there is none before sympy is imported)."""
    sym = sys.modules.get("sympy")
    return sym is not None and isinstance(v, sym.Expr)


MAX_DIM = 2**31 - 1  # a dim the database's integer columns (and Triton's int32 indices) can hold


@dataclass(frozen=True)
class Shape:
    """C[batch, m, n] = A[batch, m, k] @ B[batch, k, n]; batch is 1 for 2-D problems."""

    batch: Dim
    m: Dim
    n: Dim
    k: Dim

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not (isinstance(v, int) or is_symbolic(v)):
                raise TypeError(f"shape.{f.name} must be an int or sympy expression, got {v!r}")
            if isinstance(v, int) and not 0 <= v <= MAX_DIM:
                raise ValueError(f"shape.{f.name}={str(v)[:40]} is not in 0..{MAX_DIM}")

    def to_dict(self) -> dict[str, int | str]:
        return {f.name: _dim_json(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Shape:
        return cls(**{f.name: _dim_parse(d[f.name]) for f in fields(cls)})

    def is_static(self) -> bool:
        return all(isinstance(getattr(self, f.name), int) for f in fields(self))

    def flops(self) -> int:
        """2*B*M*N*K multiply-adds of the anchor (static shapes only)."""
        if not self.is_static():
            raise ValueError("flops() needs a static shape")
        return 2 * int(self.batch) * int(self.m) * int(self.n) * int(self.k)


def _dim_json(v: Dim) -> int | str:
    return v if isinstance(v, int) else str(v)


_TERM = re.compile(r"^(?:\d+|[A-Za-z_]\w{0,15})(?:\*(?:\d+|[A-Za-z_]\w{0,15}))*$")


def symbol(name: str) -> sympy.Symbol:
    """A size symbol with the assumptions Inductor gives its own (s0, s1...)."""
    import sympy

    return sympy.Symbol(name, integer=True, positive=True)


def _dim_parse(v: Any) -> Dim:
    """Parse a dim: an int, or a sum of products of ints and symbols ("2*s0*s1 + 3").

    A small parser of our own: text from a database is never handed to eval
    (which sympy.sympify would do).
    """
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM:
        return v
    if not isinstance(v, str) or len(v) > 200:
        raise ValueError(f"shape dim {v!r:.40} is not an int in 0..{MAX_DIM} or a symbolic size")
    text = v.replace(" ", "")
    signs_terms = re.findall(r"([+-]?)([^+-]+)", text)
    if not text or "".join(s + t for s, t in signs_terms) != text:
        raise ValueError(f"shape dim {v!r} is not a sum of products of ints and symbols")
    import sympy

    total: sympy.Expr = sympy.Integer(0)
    for sign, term in signs_terms:
        if not _TERM.match(term):
            raise ValueError(f"shape dim {v!r}: term {term!r} is not a product of ints and symbols")
        factor: sympy.Expr = sympy.Integer(-1 if sign == "-" else 1)
        for f in term.split("*"):
            factor = factor * (sympy.Integer(int(f)) if f.isdigit() else symbol(f))
        total = total + factor
    return int(total) if total.is_Integer else total


@dataclass(frozen=True)
class OperandSpec:
    """Dtype and layout of one epilogue operand tensor (``ALLOWED_OPERAND_LAYOUTS``: the
    layouts each broadcast may have)."""

    name: str
    dtype: str
    layout: str  # row/col/strided for tiles; "vector" or "scalar" otherwise


class Geometry(Protocol):
    """A kind's own dimensions beyond ``Shape`` (conv2d: the convolution's), which the
    problem's JSON keeps under the class's ``KEY``; the kind checks them against the shape."""

    KEY: ClassVar[str]

    def to_dict(self) -> dict[str, Any]: ...


class Template(Protocol):
    """What a problem asks of its template (a ``templates.kind.TemplateKind``), found by name
    in the registry (``ir.plugin.templates``)."""

    layouts: tuple[str, ...]  # the layouts of A and B it takes
    geometry: Any  # the ``Geometry`` class its problems carry (``from_dict``), or None

    def runs_op(self, op: str) -> bool: ...

    def problem_error(self, problem: Problem) -> str | None: ...


@dataclass(frozen=True)
class Problem:
    op: str
    template: str
    template_hash: str
    dtype: str  # of A and B
    layout_a: str
    layout_b: str
    operands: tuple[OperandSpec, ...]
    epilogue: Epilogue
    shape: Shape
    precision: str = "ieee"
    geometry: Geometry | None = None  # the template's own dimensions, where it has any (conv2d)

    def __post_init__(self) -> None:
        # operands are a set keyed by name: keep them sorted so equality ignores their order
        object.__setattr__(self, "operands", tuple(sorted(self.operands, key=lambda o: o.name)))
        template = templates().get(self.template)
        if template is None:
            raise ValueError(f"unknown template {self.template!r}; known: {sorted(templates())}")
        if not template.runs_op(self.op):
            raise ValueError(f"the {self.template} template does not run {self.op} problems")
        if self.dtype not in INPUT_DTYPES:
            raise ValueError(f"input dtype {self.dtype!r} is not supported; use one of {INPUT_DTYPES}")
        for name, layout in (("A", self.layout_a), ("B", self.layout_b)):
            if layout not in template.layouts:
                raise ValueError(f"layout of {name} {layout!r} is not one of {template.layouts}")
        wants = template.geometry
        if wants is None and self.geometry is not None:
            raise ValueError(f"a {self.template} problem has no geometry beyond its shape")
        if wants is not None and not isinstance(self.geometry, wants):
            raise ValueError(f"a {self.template} problem needs its {wants.KEY} geometry")
        why = template.problem_error(self)
        if why is not None:
            raise ValueError(why)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not one of {PRECISIONS}")
        if (self.precision == "tf32" and self.dtype != "float32") or (
            self.precision == "fast" and self.dtype not in FP8_DTYPES
        ):
            raise ValueError(f"precision {self.precision!r} does not apply to {self.dtype} inputs")
        declared = {name for name, _ in self.epilogue.operands}
        given = {o.name for o in self.operands}
        if declared != given:
            raise ValueError(f"operand specs {sorted(given)} do not match the epilogue's {sorted(declared)}")
        broadcasts = dict(self.epilogue.operands)
        for o in self.operands:
            if o.dtype not in OPERAND_DTYPES:
                raise ValueError(f"operand {o.name!r} dtype {o.dtype!r} is not one of {OPERAND_DTYPES}")
            layouts = ALLOWED_OPERAND_LAYOUTS[broadcasts[o.name]]
            if o.layout not in layouts:
                raise ValueError(
                    f"operand {o.name!r} is broadcast as {broadcasts[o.name]!r}: its layout must be one "
                    f"of {layouts}, not {o.layout!r:.40}"
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "template": self.template,
            "template_hash": self.template_hash,
            "dtype": self.dtype,
            "layout_a": self.layout_a,
            "layout_b": self.layout_b,
            "operands": [asdict(o) for o in sorted(self.operands, key=lambda o: o.name)],
            "epilogue": self.epilogue.to_dict(),
            "shape": self.shape.to_dict(),
            "precision": self.precision,
            **({self.geometry.KEY: self.geometry.to_dict()} if self.geometry is not None else {}),
        }

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): the input of ``key``."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    @property
    def key(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def identity(self) -> Problem:
        """The problem as far as performance goes (``patterns.identity``): its epilogue with
        named ops, no intermediate rounding and operands named by kind and position, and
        addmm/baddbmm as mm/bmm (the bias is in the epilogue either way). Problems with
        one identity share records."""
        ep, names = identity_with_names(self.epilogue)
        return dataclasses.replace(
            self,
            op=_SAME_OP.get(self.op, self.op),
            epilogue=ep,
            operands=tuple(dataclasses.replace(o, name=names[o.name]) for o in self.operands),
        )

    def epilogue_text(self) -> str:
        """The epilogue as users read it everywhere (``ir/epilogue_print.readable``)."""
        return readable(self.epilogue, default_output_dtype(self.dtype))

    @cached_property
    def identity_key(self) -> str:
        return self.identity().key

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Problem:
        try:
            return cls(
                op=str(d["op"]),
                template=str(d["template"]),
                template_hash=str(d["template_hash"]),
                dtype=str(d["dtype"]),
                layout_a=str(d["layout_a"]),
                layout_b=str(d["layout_b"]),
                operands=tuple(
                    OperandSpec(str(o["name"]), str(o["dtype"]), str(o["layout"])) for o in d["operands"]
                ),
                epilogue=Epilogue.from_dict(d["epilogue"]),
                shape=Shape.from_dict(d["shape"]),
                precision=str(d.get("precision", "ieee")),
                geometry=_geometry_of(str(d["template"]), d),
            )
        except ValueError:
            raise
        except MALFORMED as e:
            raise ValueError(f"not a valid problem: missing or malformed {type(e).__name__}: {e}") from e

    @classmethod
    def from_json(cls, text: str) -> Problem:
        try:
            return cls.from_dict(json.loads(text))
        except RecursionError:
            raise ValueError("not a valid problem: nested too deeply") from None


def _geometry_of(template: str, d: Mapping[str, Any]) -> Geometry | None:
    """The geometry a stored problem of ``template`` keeps (its kind's ``Geometry``), if any."""
    found = templates().get(template)
    wants = None if found is None else found.geometry
    if wants is None or wants.KEY not in d:
        return None
    return wants.from_dict(d[wants.KEY])


def applied_precision(dtype: str, precision: str) -> str:
    """``precision`` where it applies to ``dtype`` inputs (tf32 to float32, fast to fp8),
    else ieee: what a problem of those inputs stores."""
    applies = (precision == "tf32" and dtype == "float32") or (precision == "fast" and dtype in FP8_DTYPES)
    return precision if applies else "ieee"


@lru_cache(maxsize=4096)
def identity_key_of(problem_json: str) -> str | None:
    """The identity key of a stored problem's JSON (None for one this version cannot read)."""
    try:
        return Problem.from_json(problem_json).identity_key
    except ValueError:
        return None
