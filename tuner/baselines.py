"""The libraries epilab's kernels are timed against: one ``Baseline`` each in ``BASELINES``, in the
order reports list them. A new library is its entry here (and where it needs code of its own,
the function its entry names, in a module of its own); the database records any library by
name (``db.rows.LIBRARY_NAME``), the tuner, the CLI, the reports and model tuning read this.

Imports no torch: the CLI's help and the reports read the names; each ``build`` imports what it
runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epilab.ir.problem import Problem

# (a, b, operands) -> the problem's outputs: the kind's eager function, and every library's
Eager = Callable[..., tuple[Any, ...]]


def _as_is(problem: Problem, eager: Eager) -> Eager | None:
    return eager


def _cublaslt(problem: Problem, eager: Eager) -> Eager | None:
    """torch._addmm_activation (cuBLASLt's epilogue) for act(A @ B + row bias), relu or
    gelu(tanh), on 2-D inputs; None for any other problem."""
    import torch

    from epilab.ir import dtypes
    from epilab.ir.epilogue import Epilogue, acc, operand, ops

    ep = problem.epilogue
    if problem.op not in ("mm", "addmm") or [n for n, _ in ep.operands] != ["bias"] or len(ep.outputs) != 1:
        return None  # cuBLASLt fuses them into 2-D GEMMs only
    out = ep.outputs[0].dtype
    for act, gelu in (("relu", False), ("gelu_tanh", True)):
        if ep == Epilogue.build([(getattr(ops, act)(acc() + operand("bias", "row")), out)]):
            dtype = dtypes.torch_dtype(out)
            return lambda a, b, operands, gelu=gelu: (
                torch._addmm_activation(operands["bias"], a, b, use_gelu=gelu).to(dtype),
            )
    return None


def _inductor(mode: str | None) -> Callable[[Problem, Eager], Eager | None]:
    def build(problem: Problem, eager: Eager) -> Eager | None:
        """torch.compile of the kind's eager function (once: input sets of the same shapes and
        strides reuse the compiled code)."""
        import torch

        # Every problem compiles the same ``eager`` code object: without a reset, Dynamo stops
        # compiling it after its recompile limit (8) and the "Inductor" baseline silently
        # becomes eager (its time several times the compiled one's).
        torch._dynamo.reset()
        return torch.compile(eager, mode=mode, dynamic=False)

    return build


@dataclass(frozen=True)
class Baseline:
    name: str  # as the database records it and ``--baselines`` takes it
    about: str  # what is timed (``epilab tune --help``)
    color: str  # its marks in the report's plots
    # the kind library (``TemplateKind.library``) whose problems it runs; None: every kind's
    serves: str | None = None
    # a kind's own library: each problem is timed against its kind's by default, and the
    # speedup columns and the roofline compare with it
    own: bool = False
    # (problem, its kind's eager function: the library's op then the epilogue in eager torch
    # at the input dtype) -> the function timed, or None where the library does not apply
    build: Callable[[Problem, Eager], Eager | None] = _as_is


_EPILOGUE = "the epilogue in eager torch"
BASELINES: dict[str, Baseline] = {
    b.name: b
    for b in (
        Baseline("cublas", f"torch.matmul (cuBLAS), {_EPILOGUE}", "#ff7f0e", serves="cublas", own=True),
        Baseline("cudnn", f"torch's conv2d (cuDNN), {_EPILOGUE}", "#d62728", serves="cudnn", own=True),
        Baseline(
            "grouped_mm",
            f"torch._grouped_mm (CUTLASS on Hopper), {_EPILOGUE}",
            "#9467bd",
            serves="grouped_mm",
            own=True,
        ),
        Baseline(
            "cublaslt",
            "torch._addmm_activation: cuBLASLt's bias + relu / gelu(tanh) epilogue",
            "#bcbd22",
            serves="cublas",
            build=_cublaslt,
        ),
        Baseline("inductor", "torch.compile of the eager function", "#2ca02c", build=_inductor(None)),
        # max-autotune's kernels without its CUDA graphs: kernels are compared here (graph
        # timing is ours, over rotating inputs); a graph-owned output would also be overwritten
        Baseline(
            "inductor-max-autotune",
            "torch.compile(mode='max-autotune-no-cudagraphs') of it",
            "#17becf",
            build=_inductor("max-autotune-no-cudagraphs"),
        ),
    )
}
KIND_LIBRARIES = tuple(name for name, b in BASELINES.items() if b.own)


def baseline(name: str) -> Baseline:
    """The library ``name``; a ValueError that lists them where it is none."""
    found = BASELINES.get(name)
    if found is None:
        raise ValueError(f"unknown baseline library {name!r}; choose from {', '.join(BASELINES)}")
    return found


def serves(name: str, kind_library: str) -> bool:
    """Whether the library ``name`` runs the problems of a kind whose own library is
    ``kind_library`` (cuBLAS and cuBLASLt the matmul kinds', cuDNN convolutions', Inductor every kind's)."""
    found = baseline(name)
    return found.serves is None or found.serves == kind_library
