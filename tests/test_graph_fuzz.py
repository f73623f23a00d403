"""Seeded fuzzing of the graph pass: random small graphs of GEMMs and the work around them.

Each graph is a few steps over values of one input ``x`` and weights of its own: GEMMs of a
value with a weight (plain, transposed as ``nn.Linear`` stores it, with a bias), several of
one value (the shared inputs of a dual GEMM or of q/k/v), pointwise ops, row reductions
(sum, mean, amax) broadcast back, softmax, views there and back, and values used by several
later steps and returned. Traced to ATen as Inductor decomposes it, with epilab's pass run
under each policy (the kernels emitted for the interpreter), the graph must run and match
eager in float64: the pass may choose a template or leave the aten op, never fail where
Inductor alone would not (issue 89: ``KeyError: amax`` from the dual matcher). A failure
names its seed and graph, which reproduce exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from test_emit import _pass_graph

from epilab.ir.check import rel_error

ROWS = (8, 24)  # a gemv's rows, and a matmul tile's
K = 16
WIDTHS = (16, 24)
UNARY = {
    "relu": torch.relu,
    "silu": F.silu,
    "gelu": F.gelu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
}
REDUCTIONS = {
    "sum": lambda v: v.sum(-1, keepdim=True),
    "mean": lambda v: v.mean(-1, keepdim=True),
    "amax": lambda v: v.amax(-1, keepdim=True),
}
SEEDS = range(4)
GRAPHS = 6  # per seed


@dataclass
class Graph:
    """Steps over a list of values (value 0 is ``x``); each step appends one value."""

    steps: list[tuple] = field(default_factory=list)
    widths: list[int] = field(default_factory=lambda: [K])  # each value's last dim
    weights: list[tuple[int, ...]] = field(default_factory=list)  # each weight's shape
    outputs: list[int] = field(default_factory=list)
    m: int = ROWS[0]
    batched: bool = False  # x is [2, m / 2, K]: each GEMM flattens it, as nn.Linear does
    dtype: torch.dtype = torch.float32

    def __call__(self, x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [x.reshape(self.m, K)]
        for step in self.steps:
            values.append(_run(step, values, weights))
        return tuple(
            values[i].reshape(2, self.m // 2, -1) if self.batched else values[i] for i in self.outputs
        )

    def describe(self) -> str:
        steps = "; ".join(f"v{i + 1} = {step}" for i, step in enumerate(self.steps))
        return f"{str(self.dtype)[6:]}{' batched' if self.batched else ''}: {steps}; out {self.outputs}"


def _run(step: tuple, values: list[torch.Tensor], weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
    op, *args = step
    if op == "mm":
        v, w = args
        return values[v] @ weights[w]
    if op == "linear":
        v, w, bias = args
        return F.linear(values[v], weights[w], weights[bias] if bias is not None else None)
    if op == "glu":  # a gated MLP's two projections of one value
        v, gate, up, act = args
        return UNARY[act](values[v] @ weights[gate]) * (values[v] @ weights[up])
    if op in UNARY:
        return UNARY[op](values[args[0]])
    if op in ("add", "mul"):
        a, b = (values[i] for i in args)
        return a + b if op == "add" else a * b
    if op in REDUCTIONS:
        v, into = args
        return REDUCTIONS[op](values[v]) * values[into]
    if op == "softmax":
        return torch.softmax(values[args[0]], -1)
    if op == "view":
        v = values[args[0]]
        m = v.shape[0]
        return v.reshape(m // 2, 2, -1).transpose(0, 1).reshape(m, -1).t().contiguous().t()
    raise AssertionError(op)


def random_graph(rng: random.Random) -> Graph:
    g = Graph(
        m=rng.choice(ROWS),
        batched=rng.random() < 0.3,
        dtype=rng.choice([torch.float32, torch.float32, torch.bfloat16]),
    )

    def weight(shape: tuple[int, ...]) -> int:
        g.weights.append(shape)
        return len(g.weights) - 1

    def of_width(width: int) -> list[int]:
        return [i for i, w in enumerate(g.widths) if w == width]

    for _ in range(rng.randint(3, 7)):
        kind = rng.choice(["gemm", "gemm", "gemm", "glu", "unary", "binary", "reduce", "softmax", "view"])
        src = rng.randrange(len(g.widths))
        width = g.widths[src]
        if kind == "gemm":
            n = rng.choice(WIDTHS)
            if rng.random() < 0.5:
                g.steps.append(("mm", src, weight((width, n))))
            else:
                bias = weight((n,)) if rng.random() < 0.5 else None
                g.steps.append(("linear", src, weight((n, width)), bias))
            g.widths.append(n)
        elif kind == "glu":
            n = rng.choice(WIDTHS)
            g.steps.append(("glu", src, weight((width, n)), weight((width, n)), rng.choice(sorted(UNARY))))
            g.widths.append(n)
        elif kind == "unary":
            g.steps.append((rng.choice(sorted(UNARY)), src))
            g.widths.append(width)
        elif kind == "binary":
            other = rng.choice(of_width(width))
            g.steps.append((rng.choice(["add", "mul"]), src, other))
            g.widths.append(width)
        elif kind == "reduce":
            into = rng.choice(range(len(g.widths)))
            g.steps.append((rng.choice(sorted(REDUCTIONS)), src, into))
            g.widths.append(g.widths[into])
        elif kind == "softmax":
            g.steps.append(("softmax", src))
            g.widths.append(width)
        else:
            g.steps.append(("view", src))
            g.widths.append(width)
    last = len(g.steps)
    g.outputs = sorted({last, *rng.sample(range(1, last + 1), k=min(2, last))})
    return g


def _inputs(g: Graph, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((2, g.m // 2, K) if g.batched else (g.m, K), generator=gen)
    return tuple(t.to(g.dtype) for t in (x, *(torch.randn(s, generator=gen) * 0.3 for s in g.weights)))


# bound on each output's error against float64 eager: bf16 rounds every step (eager too)
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


CASES = [(seed, i) for seed in SEEDS for i in range(GRAPHS)]


@pytest.mark.parametrize("policy", ["auto", "always"])
@pytest.mark.parametrize("case", CASES, ids=[f"seed{s}-graph{i}" for s, i in CASES])
def test_the_pass_runs_every_random_graph_and_matches_eager(case, policy, tmp_path):
    seed, i = case
    rng = random.Random(seed * 1000 + i)
    g = random_graph(rng)
    inputs = _inputs(g, seed * 1000 + i)
    gm, decisions = _pass_graph(g, inputs, tmp_path / "t.db", policy=policy)
    got = gm(*inputs)
    want = g(*(t.double() for t in inputs))
    for out, (o, w) in zip(g.outputs, zip(got, want, strict=True), strict=True):
        assert o.shape == w.shape and o.dtype == g.dtype, f"output v{out} of {g.describe()}"
        error = rel_error(o, w)
        assert error < TOLERANCE[g.dtype], (
            f"output v{out} of {g.describe()}: {error:.3g} ({len(decisions)} decisions)"
        )


def test_the_fuzzer_makes_graphs_the_pass_takes_templates_in():
    """Under ``always`` the random graphs give the matcher what it groups: GEMMs with
    epilogues, GEMMs sharing an input, reductions after a GEMM."""
    graphs = [random_graph(random.Random(seed * 1000 + i)) for seed, i in CASES]
    ops = [[step[0] for step in g.steps] for g in graphs]
    assert sum("mm" in o or "linear" in o for o in ops) >= len(graphs) * 3 // 4
    assert any(o.count("mm") + o.count("linear") >= 2 for o in ops) and any("glu" in o for o in ops)
    assert {g.m for g in graphs} == set(ROWS) and {g.dtype for g in graphs} == {torch.float32, torch.bfloat16}
    assert any(set(o) & set(REDUCTIONS) for o in ops) and any("softmax" in o for o in ops)
