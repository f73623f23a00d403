"""Offline tuning reaches compile time: problems tuned from a shapes file (the math as a user
writes it) serve the compiler's problems of the same math (decomposed activations, rounding
casts, other operand names and ops), and `explain()` says so."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import epilab
from epilab.cli import app
from epilab.db import TuningDB
from epilab.templates.registry import is_current

M, N, K = 32, 48, 64


def _functions():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=gen, dtype=torch.bfloat16) * K**-0.5
    b = torch.randn(N, generator=gen, dtype=torch.bfloat16)
    r = torch.randn(M, N, generator=gen, dtype=torch.bfloat16)
    return {  # the function, and the epilogue a shapes file writes for it
        "gelu_tanh(acc + bias[n])": lambda x: F.gelu(x @ w.t() + b, approximate="tanh"),
        "acc + residual": lambda x: x @ w.t() + r,
        "acc + bias[n] + residual": lambda x: x @ w.t() + b + r,
        "silu(acc)": lambda x: F.silu(x @ w.t()),
        "relu(acc + bias[n])": lambda x: F.relu(x @ w.t() + b),
    }


@pytest.mark.usefixtures("fresh_compiler")
def test_a_shapes_file_tuned_offline_serves_the_compiled_functions(tmp_path):
    functions = _functions()
    shapes = tmp_path / "projections.json"
    shapes.write_text(json.dumps([{"m": M, "n": N, "k": K, "epilogue": ep} for ep in functions]))
    db = str(tmp_path / "t.db")
    tuned = CliRunner().invoke(
        app, ["tune", "--shapes", str(shapes), "--interpret", "--trials", "2", "--db", db]
    )
    assert tuned.exit_code == 0, tuned.output
    x = torch.randn(M, K, dtype=torch.bfloat16)
    for text, f in functions.items():
        torch._dynamo.reset()
        epilab.explain(clear=True)
        with torch.no_grad():
            out = torch.compile(f, backend="epilab", options={"db": db, "policy": "auto"})(x)
        (decision,) = epilab.explain()
        assert decision.template == "matmul", (text, decision.reason)
        assert decision.source.startswith("record of the same math"), (text, decision.source)
        torch.testing.assert_close(out, f(x), rtol=2e-2, atol=2e-2)
    # the compiler recorded its own forms of the five problems: --seen finds them served
    with TuningDB.open(db) as store:
        assert store.stats(is_current).problems == 2 * len(functions)
    seen = CliRunner().invoke(app, ["tune", "--seen", "--interpret", "--trials", "2", "--db", db])
    assert seen.exit_code == 0 and "nothing to tune" in seen.output, seen.output
