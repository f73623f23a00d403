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
    files: tuple[str, ...]  # every file its source depends on (the template hash covers them)
    space: Mapping[str, tuple[int, ...] | tuple[str, ...]]  # the tuner's search space
    seeds: Sequence[Config]  # known-good configs a new study tries first

    def check(self, problem: Problem, config: Config) -> str | None:
        """Why ``config`` does not fit this template for ``problem`` (None when it does)."""
        ...

    def default_config(self, problem: Problem, target: Target, *, sm_count: int) -> Config:
        """The untuned heuristic config."""
        ...

    def kernel_shape(self, problem: Problem) -> Shape:
        """The shape the kernel's tiles cover (blocks are capped at it)."""
        ...

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

    def inputs(self, problem: Problem, device: torch.device, gen: torch.Generator) -> InputSet:
        """Random A, B and operands with exactly the problem's shapes, dtypes and layouts."""
        ...

    def reference(
        self, problem: Problem, a: torch.Tensor, b: torch.Tensor, operands: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        """The outputs in float64, before rounding to their dtypes."""
        ...

    def twin_of(self, problem: Problem) -> Problem | None:
        """The same computation as ``problem`` (of another kind) on this template, where
        this template can run it; None otherwise."""
        ...
