"""Render a (Problem, Config) into Triton source from a Jinja template.

Templates see a small whitelisted hook API (in the spirit of Inductor's
``triton_mm.py.jinja``): ``epilogue_params()`` adds the epilogue's operand and
output parameters to the kernel signature, ``store_output(...)`` emits the fused
epilogue on the fp32 accumulator and the masked stores. Everything the source
depends on comes from structured data; names in it are validated identifiers
and numbers are rendered as exact literals.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import jinja2
import sympy

from epilab.templates.problem import ELEMENT_BYTES, Config, Problem
from epilab.templates.rules import rounded

Target = Literal["cuda", "interpreter"]
TARGETS = ("cuda", "interpreter")
TEMPLATE_DIR = Path(__file__).parent

# Every file a template's source depends on; its hash covers all of them.
_EPILOGUE_FILES = ("rounding.py.jinja", "store_output.py.jinja", "rules.py")
TEMPLATE_FILES: dict[str, tuple[str, ...]] = {
    "matmul": ("matmul.py.jinja", "tile_order.py.jinja", *_EPILOGUE_FILES),
    "gemv": ("gemv.py.jinja", *_EPILOGUE_FILES),
    "conv2d": ("conv2d.py.jinja", "tile_order.py.jinja", *_EPILOGUE_FILES),
}
# tma: operand tiles through tensor descriptors (Hopper); persistent: one program per SM
# looping over the tiles; tma_persistent: both
MATMUL_VARIANTS = ("default", "tma", "persistent", "tma_persistent")
TMA_VARIANTS = ("tma", "tma_persistent")
PERSISTENT_VARIANTS = ("persistent", "tma_persistent")
GEMV_BLOCK_M = 16  # the gemv template covers M <= 16 with one tile of rows
GEMV_VARIANTS = ("default", "two_pass", "atomic")  # default: no split-K

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


@cache
def template_hash(template: str) -> str:
    """sha256 over the template's files: editing any of them makes old records stale."""
    if template not in TEMPLATE_FILES:
        raise ValueError(f"unknown template {template!r}; known: {sorted(TEMPLATE_FILES)}")
    h = hashlib.sha256()
    for name in TEMPLATE_FILES[template]:
        h.update(name.encode() + b"\0" + (TEMPLATE_DIR / name).read_bytes() + b"\0")
    return h.hexdigest()


def divides(block: int, dim: int | sympy.Expr) -> bool:
    """True when ``block`` provably divides ``dim`` (works for symbolic dims)."""
    return bool(sympy.Mod(dim, block) == 0)


@dataclass(frozen=True)
class _StoredOutput:
    value: str  # Triton expression of the value to store, already in the output dtype


def _epilogue_hooks(problem: Problem, tma_store: bool = False) -> dict[str, object]:
    """``epilogue_params()`` and ``store_output(...)``; with ``tma_store`` every output is
    stored through its tensor descriptor ``out{i}_desc`` at (m0, n0) instead of by pointers."""
    ep = problem.epilogue
    operands = [{"name": name, "kind": kind} for name, kind in ep.operands]

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

    def store_output(
        *, acc: str, rm: str, rn: str, pid_b: str, mask_m: str, mask_n: str, m0: str = "", n0: str = ""
    ) -> str:
        leaf_vars = {"acc": acc, **{o["name"]: f"op_{o['name']}" for o in operands}}
        lines, out_vars = ep.triton_lines(leaf_vars)
        outputs = []
        for out, var in zip(ep.outputs, out_vars, strict=True):
            node_kind = ep.kinds[out.node]
            if out.dtype == "bool":
                value = var if node_kind == "bool" else f"{var} != 0.0"
            else:
                value = rounded(var, out.dtype)
            outputs.append(_StoredOutput(value))
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
            )
            .rstrip("\n")
        )

    return {"epilogue_params": epilogue_params, "store_output": store_output}


def config_error(problem: Problem, config: Config) -> str | None:
    """Why ``config`` does not fit the problem's template (None when it does)."""
    if problem.template == "matmul":
        if config.SPLIT_K != 1:
            return "the matmul template has no split-K; use SPLIT_K=1"
        if config.variant not in MATMUL_VARIANTS:
            return f"the matmul template has no variant {config.variant!r}; use one of {MATMUL_VARIANTS}"
        return _matmul_variant_error(problem, config)
    if _hopper_knobs(config) != _hopper_knobs(Config(16, 16, 16)):
        return f"only the matmul template has the knobs {sorted(HOPPER_KNOBS)}; leave them at their defaults"
    if problem.template == "conv2d":
        if problem.conv is None:
            return "the conv2d template needs a conv2d problem"
        if config.SPLIT_K != 1 or config.variant != "default":
            return "the conv2d template has no split-K or variants; use SPLIT_K=1, variant 'default'"
        return None
    s = problem.shape
    if config.BLOCK_M != GEMV_BLOCK_M:
        return f"the gemv template computes M in one tile of {GEMV_BLOCK_M} rows; use BLOCK_M={GEMV_BLOCK_M}"
    if config.variant not in GEMV_VARIANTS:
        return f"the gemv template has no variant {config.variant!r}; use one of {GEMV_VARIANTS}"
    if (config.variant == "default") != (config.SPLIT_K == 1):
        return f"gemv variant {config.variant!r} with SPLIT_K={config.SPLIT_K}: 'default' means SPLIT_K=1"
    if s.batch != 1 or not any(isinstance(d, int) and d <= GEMV_BLOCK_M for d in (s.m, s.n)):
        return f"the gemv template takes 2-D problems with a static M or N <= {GEMV_BLOCK_M}, got {s}"
    return None


HOPPER_KNOBS = ("EPILOGUE_SUBTILE", "PROGRAMS_PER_SM", "FLATTEN", "WARP_SPECIALIZE", "TMA_STORE")
TMA_ALIGN_BYTES = 16  # TMA needs 16-byte aligned strides (and base addresses)


def _hopper_knobs(config: Config) -> tuple[int, ...]:
    return tuple(getattr(config, name) for name in HOPPER_KNOBS)


def _matmul_variant_error(problem: Problem, config: Config) -> str | None:
    """The matmul template's rules for its variants and Hopper knobs."""
    if config.BLOCK_N // config.EPILOGUE_SUBTILE < 16:
        return f"EPILOGUE_SUBTILE={config.EPILOGUE_SUBTILE} slices BLOCK_N={config.BLOCK_N} below 16 columns"
    persistent = config.variant in PERSISTENT_VARIANTS
    if not persistent and (config.PROGRAMS_PER_SM, config.FLATTEN, config.WARP_SPECIALIZE) != (1, 0, 0):
        return "PROGRAMS_PER_SM, FLATTEN and WARP_SPECIALIZE apply to the persistent variants only"
    if config.variant not in TMA_VARIANTS:
        return "TMA_STORE needs a tma variant" if config.TMA_STORE else None
    s = problem.shape
    if s.batch != 1 or problem.op in ("bmm", "baddbmm") or "strided" in (problem.layout_a, problem.layout_b):
        return "the tma variants take 2-D problems with row- or column-major A and B"
    # The leading stride of each operand as stored (contiguous): TMA needs it 16-byte aligned
    leading = {"a": s.k if problem.layout_a == "row" else s.m, "b": s.n if problem.layout_b == "row" else s.k}
    for name, dim in leading.items():
        if isinstance(dim, int) and dim * ELEMENT_BYTES[problem.dtype] % TMA_ALIGN_BYTES:
            return (
                f"the tma variants need 16-byte aligned rows; {name.upper()}'s rows of {dim} "
                f"{problem.dtype} elements are not"
            )
    if config.TMA_STORE:
        for out in problem.epilogue.outputs:
            if out.dtype == "bool":
                return "TMA_STORE cannot store bool outputs"
            if isinstance(s.n, int) and s.n * ELEMENT_BYTES[out.dtype] % TMA_ALIGN_BYTES:
                return f"TMA_STORE needs 16-byte aligned output rows; rows of {s.n} {out.dtype} are not"
    return None


def kernel_name(problem: Problem) -> str:
    """Readable in profiles: the template, then the epilogue's ops in order."""
    ops = [n.op for n in problem.epilogue.nodes if n.op not in ("acc", "operand", "const")]
    name = "_".join(["epilab", problem.template, *ops])
    if len(name) > 80:
        name = name[:70] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return name


def render(problem: Problem, config: Config, *, target: Target = "cuda", index_64: bool = False) -> str:
    """Triton source of ``problem`` tiled by ``config`` for ``target``.

    ``index_64`` computes offsets in int64 (needed when a tensor spans 2**31
    elements or more); the interpreter target upcasts bf16 tiles before
    ``tl.dot``, which Triton's interpreter gets wrong.
    """
    if target not in TARGETS:
        raise ValueError(f"target {target!r} is not one of {TARGETS}")
    if problem.template not in TEMPLATE_FILES:
        raise ValueError(f"no renderer for template {problem.template!r}; known: {sorted(TEMPLATE_FILES)}")
    if problem.template_hash != template_hash(problem.template):
        raise ValueError(
            f"problem was made for another version of template {problem.template!r} "
            f"(hash {problem.template_hash[:12]}, current {template_hash(problem.template)[:12]})"
        )
    why = config_error(problem, config)
    if why is not None:
        raise ValueError(why)
    return _ENV.get_template(f"{problem.template}.py.jinja").render(
        kernel_name=kernel_name(problem),
        variant=config.variant,
        layout_a=problem.layout_a,
        layout_b=problem.layout_b,
        config_text=config.short(),
        dtype=problem.dtype,
        precision="tf32" if problem.precision == "tf32" else "ieee",
        epilogue_text=problem.epilogue.text(),
        even_k=divides(config.BLOCK_K, problem.shape.k),
        upcast_dot=target == "interpreter" and problem.dtype == "bfloat16",
        index_64=index_64,
        interpret=target == "interpreter",
        subtile=config.EPILOGUE_SUBTILE,
        flatten=bool(config.FLATTEN),
        warp_specialize=bool(config.WARP_SPECIALIZE),
        **_conv_vars(problem, config),
        **_epilogue_hooks(problem, tma_store=bool(config.TMA_STORE)),
    )


def _conv_vars(problem: Problem, config: Config) -> dict[str, object]:
    """The conv2d template's geometry (rendered as constants), or nothing for other templates."""
    g = problem.conv
    if g is None:
        return {}
    k_g = int(problem.shape.n) // g.groups
    return {
        "g": g,
        "groups": g.groups,
        "c_g": g.c_per_group,
        "k_g": k_g,
        "depthwise": g.c_per_group == 1,
        "even_c": g.c_per_group % config.BLOCK_K == 0,
    }
