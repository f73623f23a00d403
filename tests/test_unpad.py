"""Matmuls that Inductor's pad_mm padded are decided as the matmuls they pad (``compiler/unpad.py``).

pad_mm only acts on a GPU and only where its benchmark says so, so these tests write its
padding into the models themselves: ``constant_pad_nd`` of the inputs (K with zeros), a bias
padded by ``cat``, the product sliced back.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import epilab
from epilab.compiler.unpad import PADDED, unpad
from epilab.ir.check import rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
aten = torch.ops.aten


def padded_linear(x, w, b=None):
    """``relu(x @ w.T + b)`` computed as pad_mm computes it: M, K and N padded to 8."""
    (m, k), n = x.shape, w.shape[0]
    mp, kp, np_ = -m % 8, -k % 8, -n % 8
    a = F.pad(x, (0, kp, 0, mp))
    wt = F.pad(w.t(), (0, np_, 0, kp))
    y = a @ wt if b is None else torch.addmm(torch.cat([b, b.new_zeros(np_)]), a, wt)
    return torch.relu(y[:m, :n])


class PaddedLinear(nn.Module):
    def __init__(self, k=13, n=21, bias=True):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, k) / k**0.5)
        self.b = nn.Parameter(torch.randn(n)) if bias else None

    def forward(self, x):
        return padded_linear(x, self.w, self.b)


class PaddedGateUp(nn.Module):
    """A concatenated gate/up projection whose M pad_mm padded (a decode step of 4 rows)."""

    def __init__(self, d=24, f=40):
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * f, bias=False)

    def forward(self, x):
        m = x.shape[0]
        y = F.pad(x, (0, 0, 0, -m % 8)) @ self.gate_up.weight.t()
        gate, up = y[:m].chunk(2, dim=-1)
        return F.silu(gate) * up


def _compile(model, tmp_path, policy="always"):
    return torch.compile(model, backend="epilab", options={"policy": policy, "db": str(tmp_path / "t.db")})


@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize("bias", [False, True], ids=["mm", "addmm"])
def test_a_padded_matmul_is_decided_at_its_own_shape_with_its_epilogue(tmp_path, bias):
    torch.manual_seed(0)
    model = PaddedLinear(bias=bias).to(DEVICE)
    x = torch.randn(5, 13, device=DEVICE)
    with torch.no_grad():
        out = _compile(model, tmp_path)(x)
        ref = copy.deepcopy(model).double()(x.double())
    assert rel_error(out, ref) < 1e-5
    (d,) = epilab.explain()
    assert d.template and d.shape == "5x21x13", d  # unpadded, not 8x24x16
    assert "relu" in d.epilogue  # the slices no longer hide the activation


@pytest.mark.usefixtures("fresh_compiler")
def test_a_padded_concatenated_gate_up_is_one_dual_call(tmp_path):
    torch.manual_seed(0)
    model = PaddedGateUp().to(DEVICE)
    x = torch.randn(4, 24, device=DEVICE)
    with torch.no_grad():
        out = _compile(model, tmp_path)(x)
        ref = copy.deepcopy(model).double()(x.double())
    assert rel_error(out, ref) < 1e-5
    (d,) = epilab.explain()
    assert d.template == "dual_gemv" and d.shape == "4x40x24", d


def _graph(f, *args):
    return make_fx(f, tracing_mode="fake")(*args).graph


def _targets(graph):
    return [n.target for n in graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("bias", [False, True], ids=["mm", "addmm"])
def test_unpad_rewrites_the_product_and_undo_restores_the_graph_exactly(bias):
    x, w, b = torch.randn(5, 13), torch.randn(21, 13), torch.randn(21)
    graph = _graph(padded_linear, x, w, b) if bias else _graph(lambda x, w: padded_linear(x, w), x, w)
    before = str(graph)
    (u,) = unpad(graph)
    assert tuple(u.anchor.meta["val"].shape) == (5, 21)
    assert u.anchor.args[-2].meta["val"].shape == (5, 13)  # A unpadded
    assert u.padded.meta[PADDED] and not u.sliced.users  # the padded chain is dead meanwhile
    (relu,) = u.anchor.users
    assert relu.target is aten.relu.default
    if bias:
        assert u.anchor.args[0].meta["val"].shape == (21,)  # the bias before its cat
    u.undo(graph)
    graph.lint()
    assert str(graph) == before and PADDED not in u.padded.meta


def test_a_padded_k_that_is_not_zero_is_left_padded():
    def f(x, w):
        return (F.pad(x, (0, 3), value=1.0) @ F.pad(w, (0, 0, 0, 3), value=1.0))[:, :]

    graph = _graph(f, torch.randn(5, 13), torch.randn(13, 8))
    assert unpad(graph) == []


def test_a_padded_product_read_whole_is_left_padded():
    def f(x, w):
        y = F.pad(x, (0, 0, 0, 3)) @ w
        return y[:5], y.sum()  # the padded rows are read too

    graph = _graph(f, torch.randn(5, 13), torch.randn(13, 8))
    assert unpad(graph) == []
    assert aten.constant_pad_nd.default in _targets(graph)


@pytest.mark.usefixtures("fresh_compiler")
def test_a_padded_matmul_left_to_aten_keeps_its_padding(tmp_path, monkeypatch):
    from epilab.compiler import graph_pass

    seen = []
    original = graph_pass.EpilabPass.__call__

    def call(self, graph):
        original(self, graph)
        seen.append(_targets(graph))

    monkeypatch.setattr(graph_pass.EpilabPass, "__call__", call)
    model = PaddedLinear().to(DEVICE)
    x = torch.randn(5, 13, device=DEVICE)
    with torch.no_grad():
        out = _compile(model, tmp_path, policy="auto")(x)  # nothing recorded: ATen
    assert rel_error(out, model(x)) < 1e-5
    (targets,) = seen
    assert targets.count(aten.constant_pad_nd.default) == 2 and aten.addmm.default in targets
    assert [(d.shape, d.template) for d in epilab.explain()] == [("5x21x13", None)]
