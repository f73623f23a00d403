"""The problems that compute the same thing with another template: a small-M (or
small-N) matmul on the gemv template, a 1x1 convolution on the matmul template.
The tuner tunes every twin and the compiler runs whichever record is fastest."""

from __future__ import annotations

from epilab.templates.conv2d import matmul_twin
from epilab.templates.gemv import gemv_twin
from epilab.templates.problem import Problem


def twins(problem: Problem) -> list[Problem]:
    """``problem`` first, then each twin that applies."""
    found = [t for t in (gemv_twin(problem), matmul_twin(problem)) if t is not None]
    return [problem, *found]
