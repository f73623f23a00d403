"""Switched compiles (``compiler/switch.py``): one compile, each template or its aten path by a flag.

Kernels run in Triton's interpreter (the templates are the custom op on CPU tensors); each
setting of the flags is checked against float64 eager, and a dispatch mode counts which
path each site ran.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from zoo.quantized import Fp8Linear

import epilab
from epilab.compiler.graph_pass import SWITCHED
from epilab.compiler.switch import Switches, aliased
from epilab.ir.check import rel_error

pytestmark = pytest.mark.usefixtures("fresh_compiler")


class Counted:
    """Counts the template calls and the aten GEMMs a compiled call runs (the profiler sees the
    compiled code's ops; a dispatch mode would make Dynamo run the model eagerly)."""

    def __enter__(self) -> Counted:
        self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.profile.__exit__(*exc)
        names = Counter(e.name for e in self.profile.events())
        self.ops = Counter(
            template=names["epilab::template_call"],
            aten=sum(names[n] for n in ("aten::addmm", "aten::mm", "aten::_scaled_mm")),
        )


class Block(nn.Module):
    def __init__(self, d: int = 16, f: int = 24) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x))) + x


def switched(model, db_path, switches):
    options = {"policy": "always", "db": db_path, "switches": switches}
    return torch.compile(model, backend="epilab", options=options)


def test_each_setting_runs_its_templates_and_the_aten_path_of_the_rest(tmp_path):
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 5, 16)
    ref = copy.deepcopy(model).double()(x.double())
    switches = Switches()
    with torch.no_grad():
        step = switched(model, str(tmp_path / "t.db"), switches)
        step(x)
        decisions = epilab.explain(clear=True)
        keys = switches.keys
        assert len(keys) == 2 and all(SWITCHED in d.runs_as for d in decisions if d.template)
        for on in ([], keys, keys[:1], keys[1:]):
            switches.set(on)
            with Counted() as counted:
                out = step(x)
            assert rel_error(out, ref) <= 1e-5, on
            assert (counted.ops["template"], counted.ops["aten"]) == (len(on), 2 - len(on)), on
    with pytest.raises(KeyError, match="no switched site"):
        switches.set(["0" * 64])


def test_a_training_step_switches_its_forward_and_backward_alike(tmp_path):
    torch.manual_seed(0)
    model, x = Block().train(), torch.randn(2, 5, 16)
    switches = Switches()
    step = switched(model, str(tmp_path / "t.db"), switches)

    def grads():
        model.zero_grad()
        step(x).square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    grads()
    keys = switches.keys
    assert len(keys) > 2  # the backward's GEMMs have problems (and flags) of their own
    switches.set(keys)
    with_templates = grads()
    switches.set([])
    with Counted() as counted:
        without = grads()
    assert counted.ops["template"] == 0
    eager = copy.deepcopy(model).double()
    eager(x.double()).square().sum().backward()
    for a, b, p in zip(with_templates, without, eager.parameters(), strict=True):
        assert rel_error(a, p.grad) <= 1e-5 and rel_error(b, p.grad) <= 1e-5


class Fp8Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = Fp8Linear(32, 64), Fp8Linear(64, 32)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def test_an_operand_keeps_the_strides_the_aten_op_was_traced_with(tmp_path):
    # a rowwise scale [M, 1] that Inductor computes: laid out as (1, M) for the cond, the aten
    # path's _scaled_mm refused it ("expected scale_a.stride(1) to be 1")
    torch.manual_seed(0)
    model, x = Fp8Mlp(), torch.randn(16, 32).to(torch.bfloat16)
    switches = Switches()
    with torch.no_grad():
        step = switched(model, str(tmp_path / "t.db"), switches)
        ref = model(x)
        for on in ([], None):
            switches.set(switches.keys if on is None else on)
            assert rel_error(step(x), ref) <= 2e-2


def test_the_backend_refuses_switches_that_are_not_switches(tmp_path):
    with pytest.raises(Exception, match=r"switches takes an epilab\.compiler\.switch\.Switches"):
        switched(Block(), str(tmp_path / "t.db"), {"a": True})(torch.randn(2, 16))


def test_outputs_that_share_a_storage_are_not_switched():
    # a member and a view of it both used outside the group: a cond may not return both
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.fx.Graph()
    with FakeTensorMode():
        base = torch.empty(4, 6)
        values = {"a": base, "view": base.view(6, 4), "other": torch.empty(4, 6)}
    nodes = {}
    for name, value in values.items():
        nodes[name] = g.placeholder(name)
        nodes[name].meta["val"] = value
    assert aliased([nodes["a"], nodes["view"]])
    assert not aliased([nodes["a"], nodes["other"]])
