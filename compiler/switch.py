"""Template call sites switched at run time: one compile for every with/without variant.

    switches = Switches()
    step = torch.compile(model, backend="epilab", options={"switches": switches, ...})
    switches.set({"3fa2...", "91bc..."})   # these problems run their templates, the rest aten
    step(x)

``tune --model`` judges each template in the model it runs in (``model_tuning/tune.py``): the model
with a template against the model without it, in groups. Compiled once per variant, a
60-problem convnet took dozens of Inductor compiles of 3-6 s each. With ``switches`` given
(the backend's option), the graph pass (``graph_pass.py``) puts each group it gives a template
into the graph as a ``torch.cond`` on a flag of its problem: the true branch is the template's
call (its kernels, or the custom op), the false branch the group's own aten nodes (the GEMM and
the pointwise work the template absorbed), as Inductor compiles them without it. Inductor's
output code reads the flag, a CPU tensor of the ``Switches``, on every call (``flag.item()``,
no GPU sync), so a variant is a setting of the flags; under CUDA graphs the branch taken is
captured, one capture per variant.

What the branches cost that the compiled model without switches does not: each site's output
is a buffer of its own (Inductor fuses no work of its consumers into either branch, where
without a switch it may fuse the aten path's epilogue into the next kernel, a residual add into
a norm), and per call a flag read and a subgraph call on the host. Both sides of every
comparison carry them; the final comparison of the model with its kept templates against
Inductor is compiled without switches (``model_tuning/tune.py``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.fx as fx
from torch._higher_order_ops.triton_kernel_wrap import (
    triton_kernel_wrapper_functional,
    triton_kernel_wrapper_mutation,
)
from torch.multiprocessing.reductions import StorageWeakRef


class Switches:
    """The flags of a switched compile, one per template problem (by key): on, its sites run
    the template; off, the aten path. New flags are on. Shared by every graph compiled with
    it (a training step's forward and backward)."""

    def __init__(self) -> None:
        self._flags: dict[str, torch.Tensor] = {}
        self._on: frozenset[str] | None = None  # the setting last made (None: unknown)

    @property
    def keys(self) -> list[str]:
        """The problems whose sites can be switched, in the order first compiled."""
        return list(self._flags)

    def flag(self, key: str) -> torch.Tensor:
        """``key``'s flag (made on): a 1x1 CPU bool tensor, kept by Inductor as a constant of
        the graph (a 0-d or short 1-d constant would be inlined into the code as its value)."""
        if key not in self._flags:
            self._flags[key] = torch.ones((1, 1), dtype=torch.bool)
            self._on = None
        return self._flags[key]

    def set(self, on: Iterable[str]) -> None:
        """Switch the templates of ``on`` on and every other off (cheap where unchanged: it
        runs before each call of a timed variant)."""
        wanted = frozenset(on)
        if wanted == self._on:
            return
        unknown = wanted - set(self._flags)
        if unknown:
            raise KeyError(f"no switched site has problem(s) {sorted(k[:12] for k in unknown)}")
        for key, flag in self._flags.items():
            flag.fill_(key in wanted)
        self._on = wanted

    def running(self, on: Iterable[str], step: Callable[[], object]) -> Callable[[], object]:
        """``step`` with the templates of ``on`` switched on (the rest off) before each call."""
        wanted = frozenset(on)

        def switched() -> object:
            self.set(wanted)
            return step()

        return switched


class NotSwitched(Exception):
    """Why a site stays as rewritten (its template always on)."""


def switch(
    graph: fx.Graph,
    members: Sequence[fx.Node],
    rewrite: Callable[[], dict[fx.Node, fx.Node]],
    switches: Switches,
    key: str,
) -> bool:
    """Rewrite a group as ``rewrite`` does (it returns which new node replaced each member
    used outside the group), then make the rewrite one branch of a ``torch.cond`` on the flag
    of problem ``key`` in ``switches`` whose other branch is the group's ``members`` as they
    were. False (the rewrite left as it is) where nothing was replaced; raises ``NotSwitched``
    before rewriting where the graph belongs to no module (a trial copy)."""
    owner = graph.owning_module
    if owner is None:
        raise NotSwitched("the graph belongs to no module")
    before = set(graph.nodes)
    inside = set(members)
    escaping = [m for m in members if any(u not in inside for u in m.users)]
    if not escaping:
        raise NotSwitched("no member of the group is used outside it")
    aten_inputs = _inputs(members)
    aten = _region(members, escaping, aten_inputs)  # copied before the rewrite erases them
    replaced = rewrite()
    made = _sorted([n for n in graph.nodes if n not in before])
    if not replaced:
        return False
    missing = [m.name for m in escaping if m not in replaced]
    if missing:  # the rewrite is done: a site it cannot switch is a fault of the pass
        raise AssertionError(f"the rewrite replaced no node for the group's outputs {missing}")
    outs = [replaced[m] for m in escaping]
    if aliased(escaping) or aliased(outs):  # a cond's outputs may not share storage: left on
        return False
    template_inputs = _inputs(made)
    operands = list(dict.fromkeys([*aten_inputs, *template_inputs]))
    template = _region(made, outs, operands)
    _mutate_in_place(template)
    _pad_inputs(aten, operands)
    _hold_operand_strides()
    pred = _attr(graph, owner, f"_epilab_switch_{key}", switches.flag(key))
    on = _attr(graph, owner, _free_name(owner, _TEMPLATE_BRANCH), template)
    off = _attr(graph, owner, _free_name(owner, "_epilab_aten"), aten)
    vals = [m.meta["val"] for m in escaping]  # the aten path's outputs: what every user was made for
    with graph.inserting_after(max(made, key=list(graph.nodes).index)):
        cond = graph.call_function(torch.ops.higher_order.cond, (pred, on, off, tuple(operands)))
        cond.meta["val"] = vals
    node, branch = cond, set(made)
    for i, (new, value) in enumerate(zip(outs, vals, strict=True)):
        with graph.inserting_after(node):
            node = graph.call_function(operator.getitem, (cond, i))
            node.meta["val"] = value
        new.replace_all_uses_with(node, delete_user_cb=lambda user: user not in branch)
    for n in reversed(made):
        if not n.users:
            graph.erase_node(n)
    return True


_TEMPLATE_BRANCH = "_epilab_template"


def aliased(nodes: Sequence[fx.Node]) -> bool:
    """Whether two of ``nodes`` hold views of one storage (a member and its reshape both used
    outside the group): Inductor refuses a cond whose outputs alias, so such a site stays
    its template, unswitched (and unchecked: ``model_tuning/in_context.py`` says so)."""
    seen: set[StorageWeakRef] = set()
    for node in nodes:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        ref = StorageWeakRef(value.untyped_storage())
        if ref in seen:
            return True
        seen.add(ref)
    return False


def _hold_operand_strides() -> None:
    """Make Inductor lay each operand of a switched cond out as the branches were traced with
    (its node's value): its lowering of ``cond`` realizes an operand Inductor computes with
    whatever strides it picks, where the aten op it feeds would have held it to its own (a
    ``_scaled_mm`` scale of [M, 1] came out with strides (1, M), which the op refuses). Wraps
    the lowering once per process; other conds are lowered as before."""
    from torch._inductor import lowering
    from torch._inductor.ir import ExternKernel, TensorBox
    from torch._inductor.virtualized import V

    cond_op = torch.ops.higher_order.cond
    original = lowering.lowerings[cond_op]
    if getattr(original, "_epilab_holds_strides", False):
        return

    def cond(pred: object, true_fn: object, false_fn: object, operands: list[object]) -> object:
        node = V.graph.current_node
        branch = node.args[1]
        if isinstance(branch, fx.Node) and str(branch.target).startswith(_TEMPLATE_BRANCH):
            values = [a.meta.get("val") if isinstance(a, fx.Node) else None for a in node.args[3]]
            operands = [
                ExternKernel.require_exact_strides(x, v.stride(), allow_padding=False)
                if isinstance(x, TensorBox) and isinstance(v, torch.Tensor)
                else x
                for x, v in zip(operands, values, strict=True)
            ]
        return original(pred, true_fn, false_fn, operands)

    cond._epilab_holds_strides = True  # type: ignore[attr-defined]
    lowering.lowerings[cond_op] = cond


def _sorted(nodes: Sequence[fx.Node]) -> list[fx.Node]:
    """``nodes`` with each after the nodes of them it reads (the rewrite inserts in an order
    the pass sorts later)."""
    inside, out, seen = set(nodes), [], set()

    def visit(node: fx.Node) -> None:
        if node in seen:
            return
        seen.add(node)
        for i in node.all_input_nodes:
            if i in inside:
                visit(i)
        out.append(node)

    for node in nodes:
        visit(node)
    return out


def _inputs(nodes: Sequence[fx.Node]) -> list[fx.Node]:
    """The nodes outside ``nodes`` that they read, in order of first reading."""
    inside = set(nodes)
    return list(dict.fromkeys(i for n in nodes for i in n.all_input_nodes if i not in inside))


def _region(nodes: Sequence[fx.Node], outs: Sequence[fx.Node], inputs: Sequence[fx.Node]) -> fx.GraphModule:
    """A module of copies of ``nodes`` taking ``inputs`` and returning ``outs``."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, node in enumerate(inputs):
        env[node] = g.placeholder(f"in{i}")
        env[node].meta["val"] = node.meta.get("val")
    for node in nodes:
        env[node] = g.node_copy(node, lambda n: env[n])
    g.output([env[o] for o in outs])
    return fx.GraphModule(torch.nn.Module(), g)


def _pad_inputs(module: fx.GraphModule, inputs: Sequence[fx.Node]) -> None:
    """Give ``module`` (made with the first of ``inputs``) a placeholder for each of the rest:
    both branches of a cond take the same operands."""
    g = module.graph
    have = [n for n in g.nodes if n.op == "placeholder"]
    for i in range(len(have), len(inputs)):
        with g.inserting_after(have[-1] if have else None):
            have.append(g.placeholder(f"in{i}"))
            have[-1].meta["val"] = inputs[i].meta.get("val")
    module.recompile()


def _mutate_in_place(module: fx.GraphModule) -> None:
    """Launch the template's kernels on their buffers in place, as Inductor's reinplacing and
    its decomposition of the functional launches do for the main graph (neither visits a
    subgraph made after them): each buffer a launch writes was made in the branch for it, so
    no copy is needed. Inductor lowers the mutating form. (A launch then has no user: a dead
    code pass that enters the branches erases it, ``graph_pass._drop_dead``.)"""
    g = module.graph
    for launch in list(g.find_nodes(op="call_function", target=triton_kernel_wrapper_functional)):
        kwargs = launch.kwargs["kwargs"]
        for user in list(launch.users):
            assert user.target is operator.getitem, user
            user.replace_all_uses_with(kwargs[user.args[1]])
            g.erase_node(user)
        call = {k: v for k, v in launch.kwargs.items() if k != "tensors_to_clone"}
        with g.inserting_before(launch):
            g.call_function(triton_kernel_wrapper_mutation, (), call)
        g.erase_node(launch)
    module.recompile()


def _attr(graph: fx.Graph, owner: torch.nn.Module, name: str, value: object) -> fx.Node:
    """A ``get_attr`` node of ``value`` set on ``owner`` as ``name`` (a flag's node once per graph)."""
    if isinstance(value, torch.Tensor):
        have = getattr(owner, name, None)
        if have is value:
            found = [n for n in graph.find_nodes(op="get_attr") if n.target == name]
            if found:
                return found[0]
        elif have is not None:
            raise NotSwitched(f"the graph's module has an attribute {name} of its own")
        owner.register_buffer(name, value, persistent=False)
    else:
        owner.add_submodule(name, value)  # type: ignore[arg-type]
    first = next(iter(graph.nodes))
    with graph.inserting_before(first):
        return graph.get_attr(name)


def _free_name(owner: torch.nn.Module, stem: str) -> str:
    i = 0
    while hasattr(owner, f"{stem}_{i}"):
        i += 1
    return f"{stem}_{i}"


__all__ = ["NotSwitched", "Switches", "switch"]
