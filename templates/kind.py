"""What a template kind is: the ``TemplateKind`` protocol.

A kind is one module beside its Jinja file (``matmul.py`` with ``matmul.py.jinja``), whose
``KIND`` object answers every question the rest of epilab has about the template: its
files, which configs it takes, where the tuner searches, what it starts from, how a
problem is checked against tensors, bound and launched, how the tuner makes its inputs
and float64 reference, and which problems of other kinds it can also run (its twins).
``templates/kinds.py`` lists the kinds; nothing outside the kind modules branches on a
template's name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from epilab.templates.problem import Config, Problem, Shape
from epilab.templates.render import Target
from epilab.templates.runtime import Bound

InputSet = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]


class TemplateKind(Protocol):
    name: str
    files: tuple[str, ...]  # its Jinja file first, then every file its source depends on (hashed)
    space: Mapping[str, tuple[int, ...] | tuple[str, ...]]  # the tuner's search space
    seeds: Sequence[Config]  # known-good configs a new study tries first
    library: str  # the vendor library it is timed against: "cublas" or "cudnn"
    prefer_untuned: bool  # its heuristic beats the other template's on the twins it takes

    # -- configs
    def check(self, problem: Problem, config: Config) -> str | None:
        """Why ``config`` does not fit this template for ``problem`` (None when it does):
        what rendering refuses."""
        ...

    def search_error(self, problem: Problem, config: Config) -> str | None:
        """Why the tuner should not spend a trial on ``config`` though the template takes it
        (idle threads, empty split-K slices), or None."""
        ...

    def applies(self, name: str, chosen: Mapping[str, object]) -> bool:
        """Whether search dimension ``name`` means anything given the values chosen before
        it (in the space's order); one that does not keeps its first value."""
        ...

    def default_config(self, problem: Problem, target: Target, *, sm_count: int) -> Config:
        """The untuned heuristic config."""
        ...

    def kernel_shape(self, problem: Problem) -> Shape:
        """The shape the kernel's tiles cover (blocks are capped at it)."""
        ...

    def render_vars(self, problem: Problem, config: Config) -> dict[str, object]:
        """What its Jinja file needs beyond what every template gets (``render.render``)."""
        ...

    # -- tensors
    def problem_of(
        self, problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
    ) -> Problem:
        """The problem these tensors make under ``problem``'s op, precision and geometry:
        equal to ``problem`` exactly when they fit it."""
        ...

    def bind(
        self,
        problem: Problem,
        config: Config,
        a: torch.Tensor,
        b: torch.Tensor,
        operands: Mapping[str, torch.Tensor],
        out: tuple[torch.Tensor, ...] | None,
    ) -> Bound:
        """Everything up to the launch: outputs allocated (or ``out`` checked), the kernel
        built, its arguments fixed."""
        ...

    def empty_outputs(self, problem: Problem, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Uninitialised outputs as a launch without ``out`` allocates them (shape, dtype,
        memory format)."""
        ...

    # -- checking and measuring
    def inputs(self, problem: Problem, device: torch.device, gen: torch.Generator) -> InputSet:
        """Random A, B and operands with exactly the problem's shapes, dtypes and layouts."""
        ...

    def reference(
        self, problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        """The outputs in float64, before rounding to their dtypes."""
        ...

    def baseline(
        self, problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        """The outputs computed in eager torch at the input dtype (``library`` for the main
        loop, torch for the epilogue), not yet rounded to the output dtypes."""
        ...

    def input_elements(self, problem: Problem) -> tuple[int, int]:
        """Elements of A and B as stored (a convolution's input and weight, not its im2col
        matrix): with the operands and outputs, the bytes a kernel must move."""
        ...

    # -- other templates
    def twins(self, problem: Problem) -> tuple[Problem, ...]:
        """The same computation as ``problem`` on other templates, those this kind knows of
        (conv2d: a 1x1 convolution as a matmul; gemv: a skinny matmul on gemv)."""
        ...
