"""Problem (what to compute) and Config (how to tile it): frozen, JSON round-trip.

A ``Problem`` names everything that changes the generated kernel or its speed:
op kind, template and its source hash, dtypes, layouts, the epilogue and the
shape (a dim may be a sympy expression for dynamic shapes). Its ``key`` is the
sha256 of its canonical JSON. A ``Config`` is one point of the search space;
it is validated on construction, so a config read from anywhere (a database, a
user) holds only values from ``CHOICES``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
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
DUAL_OP = "dual_mm"  # ep(A @ B, A @ B2): two GEMMs of one A (templates/gemm/dual_matmul.py)
# ep(sum over 128-K groups of scale_a * scale_b * the group's A @ B): fp8 with block scales, A's
# per row and 128 of K, B's per 128x128 block (DeepSeek-V3's; templates/gemm/block_scaled.py)
BLOCK_SCALED_OP = "block_scaled_mm"
# ep(A @ B) of a float16 / bfloat16 A and an fp8 B (a weight stored in fp8, its scales in the
# epilogue), B converted to A's dtype in the K loop (templates/gemm/weight_only.py)
WEIGHT_ONLY_OP = "weight_only_mm"
DUAL_WEIGHT_ONLY_OP = "dual_weight_only_mm"  # ep(A @ B, A @ B2) of two fp8 weights (a gated MLP's)
WEIGHT_ONLY_OPS = (WEIGHT_ONLY_OP, DUAL_WEIGHT_ONLY_OP)
MATRIX_OPS = ("mm", "addmm", DUAL_OP, BLOCK_SCALED_OP, *WEIGHT_ONLY_OPS)  # 2-D: no batch at all
_SAME_OP = {"addmm": "mm", "baddbmm": "bmm"}  # the bias is an epilogue operand either way

# The values a Config may hold (the tuner's search space draws from these).
CHOICES: dict[str, tuple[int, ...] | tuple[str, ...]] = {
    # 192: sm90_cooperative's three warp groups of 64 rows only; 512 and 1024: depthwise strips' pixels only
    "BLOCK_M": (16, 32, 64, 128, 192, 256, 512, 1024),
    # 192: sm90_weight_only's three warp groups of 64 weight rows only; 512: a depthwise
    # program holding a pixel's channels
    "BLOCK_N": (16, 32, 64, 128, 192, 256, 512),
    "BLOCK_K": (16, 32, 64, 128, 256),
    "GROUP_M": (1, 2, 4, 8, 16),
    "SPLIT_K": (1, 2, 4, 8, 16, 32),
    "num_warps": (1, 2, 4, 8, 16),
    "num_stages": (1, 2, 3, 4, 5, 6, 7),
    # gemv split-K reductions; matmul's Hopper main loops and stream-K
    "variant": (
        "default",
        "two_pass",
        "atomic",
        "tma",
        "persistent",
        "tma_persistent",
        "stream_k",
        "tma_stream_k",
        "sm90_persistent",
        "sm90_pingpong",
        "sm90_cooperative",
        "sm90_weight_only",
        "w_vector",  # depthwise: lanes along W (NCHW)
        "in_flight",  # depthwise: channel lanes, the output rows in flight roll (not the input window)
    ),
    # matmul: the epilogue runs on 1, 2 or 4 column slices of the tile (fewer live registers)
    "EPILOGUE_SUBTILE": (1, 2, 4),
    # persistent matmul: programs per multiprocessor (NUM_SMS = this x the device's SMs), and the
    # tile loop's tl.range options (0/1): flatten the K loop into it, warp-specialize it
    "PROGRAMS_PER_SM": (1, 2),
    "FLATTEN": (0, 1),
    "WARP_SPECIALIZE": (0, 1),
    # tma matmul: outputs stored through tensor descriptors (where the outputs allow)
    "TMA_STORE": (0, 1),
    # depthwise: output rows a program walks down (BLOCK_M pixels: a strip BLOCK_M / TILE_H wide)
    "TILE_H": (1, 2, 4, 8, 16, 32, 64),
    # fp8 matmul, exact accumulation: K blocks whose products the tensor cores sum before the
    # sum is added in fp32 (promotion every PROMOTE * BLOCK_K elements of K)
    "PROMOTE": (1, 2, 4),
    # weight-only matmul: the dot's operands swapped, the converted fp8 weight tile on the left
    # (C^T = B^T @ A^T, transposed after the K loop): Hopper's wgmma reads a left operand from
    # registers, a right one only from shared memory
    "SWAP_AB": (0, 1),
}

Dim = Union[int, "sympy.Expr"]


def is_symbolic(v: object) -> bool:
    """Whether ``v`` is a sympy expression (there is none before sympy is imported)."""
    sym = sys.modules.get("sympy")
    return sym is not None and isinstance(v, sym.Expr)


MAX_DIM = 2**31 - 1  # a dim the database's integer columns (and Triton's int32 indices) can hold


@dataclass(frozen=True)
class Config:
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 8
    SPLIT_K: int = 1
    num_warps: int = 4
    num_stages: int = 3
    variant: str = "default"
    EPILOGUE_SUBTILE: int = 1
    PROGRAMS_PER_SM: int = 1
    FLATTEN: int = 0
    WARP_SPECIALIZE: int = 0
    TMA_STORE: int = 0
    TILE_H: int = 1
    PROMOTE: int = 1
    SWAP_AB: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            allowed = CHOICES[f.name]
            kind = type(allowed[0])  # int or str; 64.0 == 64, True == 1, but neither launches a kernel
            if type(value) is not kind or value not in allowed:
                raise ValueError(
                    f"config {f.name}={value!r:.40} is not allowed; choose one of {allowed} ({kind.__name__})"
                )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Config:
        """The one validation of a config from outside (an import, a database row, a user):
        known fields only, each an exact value of ``CHOICES``; raises ValueError."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a config must be an object of {list(CHOICES)}, got {type(d).__name__}")
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            shown = sorted(str(k)[:40] for k in unknown)[:5]
            raise ValueError(f"unknown config field(s) {shown}; known: {list(CHOICES)}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ValueError(f"incomplete config: {e}") from e

    @classmethod
    def is_valid(cls, d: Mapping[str, Any]) -> bool:
        """Whether ``from_dict(d)`` accepts ``d`` (the database reader skips rows it does not)."""
        try:
            cls.from_dict(d)
        except ValueError:
            return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def short(self) -> str:
        """The one shorthand (``config_text``)."""
        return config_text(self)


def config_text(config: Config | Mapping[str, Any] | None) -> str:
    """The one shorthand of a config, in every table, log and report: tile MxNxK, ``g`` group,
    ``w`` warps, ``st`` stages, then only what differs from the default: ``split`` split-K,
    the variant, ``sub`` epilogue slices, programs ``/sm``, ``flat``, ``ws``, ``tma-store``, a
    pixel tile's ``rows``, fp8's ``promote`` interval in K blocks, and ``swap`` (weight-only's
    swapped dot)."""
    if not config:
        return ""
    c = config.to_dict() if isinstance(config, Config) else config
    parts = [
        f"{c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{c.get('BLOCK_K')} g{c.get('GROUP_M', 1)} "
        f"w{c.get('num_warps')} st{c.get('num_stages')}",
        f"split{c['SPLIT_K']}" if c.get("SPLIT_K", 1) != 1 else "",
        str(c["variant"]) if c.get("variant", "default") != "default" else "",
        f"sub{c['EPILOGUE_SUBTILE']}" if c.get("EPILOGUE_SUBTILE", 1) != 1 else "",
        f"{c['PROGRAMS_PER_SM']}/sm" if c.get("PROGRAMS_PER_SM", 1) != 1 else "",
        "flat" if c.get("FLATTEN") else "",
        "ws" if c.get("WARP_SPECIALIZE") else "",
        "tma-store" if c.get("TMA_STORE") else "",
        f"rows{c['TILE_H']}" if c.get("TILE_H", 1) != 1 else "",
        f"promote{c['PROMOTE']}" if c.get("PROMOTE", 1) != 1 else "",
        "swap" if c.get("SWAP_AB") else "",
    ]
    return " ".join(filter(None, parts))


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
    """What a problem asks of its template (a ``templates.kind.TemplateKind``)."""

    layouts: tuple[str, ...]  # the layouts of A and B it takes
    geometry: Any  # the ``Geometry`` class its problems carry (``from_dict``), or None

    def runs_op(self, op: str) -> bool: ...

    def problem_error(self, problem: Problem) -> str | None: ...


# The template registry by name (``templates/registry.KINDS``, handed over when that module is
# imported). ir/ imports nothing above it, so a problem checked before the registry was
# imported loads that module by name, as a plugin is loaded.
_REGISTRY: list[Mapping[str, Template]] = []
REGISTRY_MODULE = "epilab.templates.registry"


def register_templates(templates: Mapping[str, Template]) -> None:
    """Make ``templates`` (kept, not copied) the registry problems are checked against."""
    _REGISTRY[:] = [templates]


def templates() -> Mapping[str, Template]:
    """The registered templates by name (importing the registry the first time)."""
    if not _REGISTRY:
        importlib.import_module(REGISTRY_MODULE)
    return _REGISTRY[0]


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
