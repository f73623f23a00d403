"""Render a (Problem, Config) into Triton source from a Jinja template.

Templates see a small whitelisted hook API (in the spirit of Inductor's
``triton_mm.py.jinja``): ``epilogue_params()`` adds the epilogue's operand and
output parameters to the kernel signature, ``store_output(...)`` emits the fused
epilogue on the fp32 accumulator (and a dual GEMM's second, ``acc2``) and the masked
stores. Everything the source depends on comes from structured data; names in it are
validated identifiers and numbers are rendered as exact literals.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import jinja2

from epilab.config import settings
from epilab.ir.config import Config
from epilab.ir.epilogue import LEAVES, REDUCTIONS, Epilogue
from epilab.ir.patterns import identity
from epilab.ir.problem import Problem
from epilab.ir.rules import rounded
from epilab.templates.kind import TemplateKind

if TYPE_CHECKING:
    import sympy

Target = Literal["cuda", "interpreter"]
TARGETS = ("cuda", "interpreter")
TEMPLATE_ROOT = Path(__file__).resolve().parents[1]  # templates/
# Where Jinja files are found: the shared epilogue files at the root, each family's in its
# folder. A file is named without its folder (in ``TemplateKind.files``, in includes and in
# ``files_hash``), so moving one between folders changes no kernel's hash.
TEMPLATE_DIRS = (
    TEMPLATE_ROOT,
    *sorted({p.parent for p in TEMPLATE_ROOT.rglob("*.py.jinja")} - {TEMPLATE_ROOT}),
)


def template_path(name: str) -> Path:
    """The Jinja file ``name`` (no folder), wherever under ``TEMPLATE_DIRS`` it is."""
    found = [d / name for d in TEMPLATE_DIRS if (d / name).is_file()]
    if len(found) != 1:
        raise ValueError(f"template file {name!r}: {'not found' if not found else 'in two folders'}")
    return found[0]


# The files every template's epilogue depends on (a kind's ``files`` end with them). They
# are not hashed as files: what they put into a problem's kernels is (``kernel_hash``).
EPILOGUE_FILES = ("rounding.py.jinja", "fast_math.py.jinja", "store_output.py.jinja")
# ``store_output``'s arguments when its text is hashed: the names a template passes vary, what
# the shared files make of the epilogue does not
_PROBE_ARGS = {
    name: name
    for name in ("acc", "acc2", "rm", "rn", "pid_b", "mask_m", "mask_n", "m0", "n0", "m_slot", "n_slot")
}

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATE_DIRS),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


@cache
def files_hash(files: tuple[str, ...]) -> str:
    """sha256 over a template's files (a kind's ``files``): editing any of them makes old
    records stale."""
    h = hashlib.sha256()
    for name in files:
        h.update(name.encode() + b"\0" + template_path(name).read_bytes() + b"\0")
    return h.hexdigest()


@cache
def kernel_hash(files: tuple[str, ...], *epilogues: Epilogue) -> str:
    """What a problem's kernels are made of, hashed: the template's own files (``files`` less
    the shared ``EPILOGUE_FILES``) and the text the shared files and the rule table put into
    its kernels for ``epilogue``'s identity (``patterns.identity``: the form problems share
    records under, so problems of one identity have one hash), under every variant a config
    or setting picks (pointer, TMA and shared-memory stores; exact and fast math; both
    targets). A stored record goes stale exactly when one of these changes: a new op,
    operand broadcast or template leaves every other epilogue's text, and its records, as they were.
    A kind whose kernels render another form of the epilogue too (gemv's transpose: row and
    column vectors swapped) passes each (``TemplateKind.kernel_epilogues``)."""
    h = hashlib.sha256(files_hash(tuple(f for f in files if f not in EPILOGUE_FILES)).encode())
    for epilogue in epilogues:
        _hash_epilogue(h, identity(epilogue))
    return h.hexdigest()


def _hash_epilogue(h: Any, epilogue: Epilogue) -> None:
    """Add what the shared files put into a kernel for ``epilogue`` to ``h``."""
    text = epilogue.text()
    for interpret in (False, True):
        helpers = {"interpret": interpret, "epilogue_text": text}
        h.update(_ENV.get_template("rounding.py.jinja").render(**helpers).encode())
        if epilogue.fast_nodes:
            h.update(_ENV.get_template("fast_math.py.jinja").render(**helpers).encode())
    every_output = tuple(range(len(epilogue.outputs)))
    for fast in (True, False):
        for tma_store, smem in ((False, ()), (True, ()), (False, every_output)):
            hooks = _epilogue_hooks(epilogue, tma_store=tma_store, smem_outputs=smem, fast=fast)
            h.update(hooks["epilogue_params"]().encode() + b"\0")  # type: ignore[operator]
            h.update(hooks["store_output"](**_PROBE_ARGS).encode() + b"\0")  # type: ignore[operator]


def divides(block: int, dim: int | sympy.Expr) -> bool:
    """True when ``block`` provably divides ``dim`` (works for symbolic dims)."""
    if isinstance(dim, int):
        return dim % block == 0
    import sympy

    return bool(sympy.Mod(dim, block) == 0)


@dataclass(frozen=True)
class _StoredOutput:
    value: str  # Triton expression of the value to store, already in the output dtype
    reduce: str = ""  # a reduction output: "sum" or "max"
    axis: str = ""  # ... over the tile's columns ("n": one value per row) or rows ("m")
    group: int = 0  # a group output: the max over each group of this many columns, stored once
    smem: bool = False  # through its shared-memory buffer and a TMA store (Gluon kernels)
    added: str = ""  # the interpreter's combine "add": the sum of old value ``outN_old`` and this


def _epilogue_hooks(
    ep: Epilogue,
    *,
    tma_store: bool = False,
    smem_outputs: tuple[int, ...] = (),
    fast: bool = True,
    interpret: bool = False,
) -> dict[str, object]:
    """``epilogue_params()``, ``epilogue_args()`` (the same names, to pass them on) and
    ``store_output(...)``; with ``tma_store`` every output is stored through its tensor
    descriptor ``out{i}_desc`` at (m0, n0) instead of by pointers; outputs ``smem_outputs`` are
    written to their shared-memory buffer ``out{i}_smem`` and stored from it by TMA (Gluon);
    ``fast`` lets the fast nodes take their fast forms; ``interpret``: for Triton's
    interpreter, which has no 16-bit atomics (a combine "add" adds its rows in order there)."""
    operands = [{"name": name, "broadcast": broadcast} for name, broadcast in ep.operands]

    def epilogue_params() -> str:
        params = [
            f"op_{o['name']}_ptr, op_{o['name']}_stride_b, op_{o['name']}_stride_m, op_{o['name']}_stride_n,"
            for o in operands
        ]
        params += [
            f"out{i}_ptr, out{i}_stride_b, out{i}_stride_m, out{i}_stride_n," for i in range(len(ep.outputs))
        ]
        if tma_store:
            params.append(" ".join(f"out{i}_desc," for i in range(len(ep.outputs))))
        return "\n    ".join(params)

    def epilogue_args() -> str:
        return epilogue_params().replace("\n    ", " ")

    def store_output(
        *,
        acc: str,
        rm: str,
        rn: str,
        pid_b: str,
        mask_m: str,
        mask_n: str,
        m0: str = "",
        n0: str = "",
        acc2: str = "",
        m_slot: str = "0",
        n_slot: str = "0",
        out_rm: str = "",
        out_mask: str = "",
        combine: str = "",
    ) -> str:
        """``m_slot``/``n_slot``: this tile's index along M and N in the partial-statistics
        workspace of reduction outputs (``runtime.Statistics``, ``matmul.tile_slots``).
        ``out_rm``: the output rows the tile's rows go to where they are not ``rm`` (a routed
        grouped GEMM's scatter), stored under ``out_mask``; ``combine`` "add": added there
        with an atomic instead of stored."""
        leaf_vars = {
            "acc": acc,
            **({"acc2": acc2} if acc2 else {}),
            **{o["name"]: f"op_{o['name']}" for o in operands},
        }
        lines, out_vars = ep.triton_lines(leaf_vars, fast=fast, col_mask=mask_n)
        outputs = _stored_outputs(ep, out_vars, mask_n, smem_outputs, combine=bool(combine) and interpret)
        return (
            _ENV.get_template("store_output.py.jinja")
            .render(
                operands=operands,
                lines=lines,
                outputs=outputs,
                rm=rm,
                rn=rn,
                pid_b=pid_b,
                mask_m=mask_m,
                mask_n=mask_n,
                tma_store=tma_store,
                m0=m0,
                n0=n0,
                m_slot=m_slot,
                n_slot=n_slot,
                out_rm=out_rm or rm,
                out_mask=out_mask or "c_mask",
                combine=combine,
                interpret=interpret,
            )
            .rstrip("\n")
        )

    return {"epilogue_params": epilogue_params, "epilogue_args": epilogue_args, "store_output": store_output}


def _stored_outputs(
    ep: Epilogue, out_vars: list[str], mask_n: str, smem_outputs: tuple[int, ...], *, combine: bool
) -> list[_StoredOutput]:
    """What each of ``ep``'s outputs stores, from its variable ``out_vars[i]`` of the
    epilogue's lines; ``combine``: the interpreter's in-order combine "add"."""
    outputs = []
    for out, var in zip(ep.outputs, out_vars, strict=True):
        node_kind = ep.kinds[out.node]
        if out.reduce in REDUCTIONS:
            outputs.append(_StoredOutput(var, *REDUCTIONS[out.reduce]))
            continue
        if out.group:  # its value broadcast along each group (its max there, unless it is one already)
            value = var if out.node in ep.group_constant else f"group_max({var}, {mask_n}, {out.group})"
            outputs.append(_StoredOutput(value, group=out.group))
            continue
        if out.dtype == "bool":
            value = var if node_kind == "bool" else f"{var} != 0.0"
        else:  # a predicate stored as a float is 0.0 / 1.0 (the rounding helpers bit-cast fp32)
            value = rounded(var if node_kind == "float" else f"{var}.to(tl.float32)", out.dtype)
        i = len(outputs)
        added = ""  # the interpreter's in-order combine (store_output.py.jinja)
        if combine:
            added = rounded(f"(out{i}_old + ({value}).to(tl.float32))", out.dtype)
        outputs.append(_StoredOutput(value, smem=i in smem_outputs, added=added))
    return outputs


def kernel_name(problem: Problem) -> str:
    """Readable in profiles: the template, then the epilogue's ops in order."""
    ops = [n.op for n in problem.epilogue.nodes if n.op not in LEAVES]
    name = "_".join(["epilab", problem.template, *ops])
    if len(name) > 80:
        name = name[:70] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return name


def render(
    kind: TemplateKind, problem: Problem, config: Config, *, target: Target = "cuda", index_64: bool = False
) -> str:
    """Triton source of ``problem`` tiled by ``config`` for ``target``, from ``kind``'s Jinja
    file (the first of its ``files``).

    ``index_64`` computes offsets in int64 (needed when a tensor spans 2**31
    elements or more); the interpreter target upcasts bf16 tiles before
    ``tl.dot``, which Triton's interpreter gets wrong.
    """
    if target not in TARGETS:
        raise ValueError(f"target {target!r} is not one of {TARGETS}")
    if problem.template != kind.name:
        raise ValueError(f"a {problem.template} problem cannot be rendered by the {kind.name} template")
    current = kernel_hash(kind.files, *kind.kernel_epilogues(problem.epilogue))
    if problem.template_hash != current:
        raise ValueError(
            f"problem was made for another version of template {problem.template!r} "
            f"(hash {problem.template_hash[:12]}, current {current[:12]})"
        )
    why = kind.config_error(problem, config)
    if why is not None:
        raise ValueError(why)
    return _ENV.get_template(kind.source(config) or kind.files[0]).render(
        kernel_name=kernel_name(problem),
        variant=config.variant,
        layout_a=problem.layout_a,
        layout_b=problem.layout_b,
        config_text=config.short(),
        dtype=problem.dtype,
        precision=problem.precision,
        epilogue_text=problem.epilogue.text(),
        even_k=divides(config.BLOCK_K * config.PROMOTE, problem.shape.k),
        promote=config.PROMOTE,  # fp8 exact accumulation: K blocks summed before each fp32 add
        upcast_dot=target == "interpreter" and problem.dtype == "bfloat16",
        index_64=index_64,
        interpret=target == "interpreter",
        dual=kind.accumulators == 2,  # two accumulators: A @ B and A @ B2 (the kind's extra input)
        subtile=config.EPILOGUE_SUBTILE,
        split_k=config.SPLIT_K > 1,  # two-pass split-K (templates/split_k.py.jinja)
        flatten=bool(config.FLATTEN),
        warp_specialize=bool(config.WARP_SPECIALIZE),
        # fast_math.py.jinja's helpers are called (EPILAB_EXACT_MATH keeps every exact form)
        fast_math=bool(problem.epilogue.fast_nodes) and not settings().exact_math,
        **(variables := kind.render_vars(problem, config)),
        **_epilogue_hooks(
            problem.epilogue,
            tma_store=bool(config.TMA_STORE) and "tma_outputs" not in variables,
            smem_outputs=tuple(variables.get("tma_outputs", ())),  # type: ignore[arg-type]
            fast=not settings().exact_math,
            interpret=target == "interpreter",
        ),
    )
