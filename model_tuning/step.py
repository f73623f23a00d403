"""What one call of a model is, for ``model_tuning/tune.py``: an inference call, or a training step.

    work = Workload(model, inputs, train=True)
    step = work.bind(torch.compile(model, backend="epilab"))
    step()                        # grads reset, forward, backward: one training step

A training step (``tune --model --train``) resets the gradients of the parameters that
require grad (``p.grad = None``, as ``optimizer.zero_grad()`` does), runs the forward and
backpropagates a fixed random cotangent of every output that requires grad (the same values
for every variant: drawn once per step object from a seeded generator). The optimizer's step
is not part of it: it is the same pointwise work with or without a template. Compiled, the
step runs the two graphs AOTAutograd makes (the forward, which also returns what the
backward saves, and the backward with its own GEMMs: ``grad @ W`` and ``x.T @ grad``), both
through the backend's pass, so both bring their problems to the tuner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves


class NothingToTrain(ValueError):
    """A training step was asked of a model none of whose outputs requires grad."""


@dataclass
class TrainingStep:
    """One training step of ``fn`` over ``inputs`` (see the module's text)."""

    fn: Callable[..., Any]
    inputs: Sequence[Any]
    params: Sequence[torch.nn.Parameter]
    seed: int = 0
    cotangents: list[torch.Tensor] = field(default_factory=list)

    def __call__(self) -> None:
        for p in self.params:
            p.grad = None
        outputs = [t for t in tree_leaves(self.fn(*self.inputs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in outputs if t.requires_grad]
        if not outputs:
            raise NothingToTrain(
                "a training step needs an output that requires grad: no parameter of the model "
                "(nor any input) requires grad; leave --train out to tune it for inference"
            )
        if not self.cotangents:
            generator = torch.Generator().manual_seed(self.seed)
            self.cotangents = [
                torch.randn(t.shape, generator=generator, dtype=torch.float32).to(t.device, t.dtype)
                for t in outputs
            ]
        torch.autograd.backward(outputs, self.cotangents)


@dataclass(frozen=True)
class Workload:
    """A model, its example inputs, and whether a call of it is a training step."""

    model: torch.nn.Module
    inputs: tuple[Any, ...]
    train: bool = False

    def bind(self, fn: Callable[..., Any]) -> Callable[[], object]:
        """One call of ``fn`` (the model, or a compiled form of it) as this workload runs it."""
        if not self.train:
            return lambda: fn(*self.inputs)
        params = [p for p in self.model.parameters() if p.requires_grad]
        return TrainingStep(fn, self.inputs, params)

    def grad_mode(self) -> torch.autograd.grad_mode.set_grad_enabled:
        """Autograd on for a training step, off for inference (what the model is compiled under)."""
        return torch.set_grad_enabled(self.train)


__all__ = ["NothingToTrain", "TrainingStep", "Workload"]
