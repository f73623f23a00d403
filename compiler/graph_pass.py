"""The Inductor pass: match anchors, decide, replace groups by template calls.

Installed as Inductor's ``post_grad_custom_post_pass``, so it sees the
post-grad ATen graphs of the forward and the backward alike. Its ``uuid()``
covers everything that changes what it does: epilab's compiler and template
sources, the policy, the database (URL and a fingerprint of its records), the
device and ``tune_missing``, and the nonce of the decisions stored for a warm cache
(``replay.py``); Inductor's caches therefore never serve a graph decided on other facts, nor
one whose decisions could not be reported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import operator
import re
from collections.abc import Callable
from pathlib import Path

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from epilab.compiler import explain, replay
from epilab.compiler.aten_ops import ANCHORS
from epilab.compiler.decide import Context, Decision, Plan, candidates_of, decide, norm_group_loses
from epilab.compiler.emit import NotEmitted
from epilab.compiler.emit import emit as emit_call
from epilab.compiler.grow import Group, NoGroup, fake_mode_of, val
from epilab.compiler.grow_dual import same_input
from epilab.compiler.halves import split_halves
from epilab.compiler.match import match, match_dual
from epilab.compiler.norms import fold_norms
from epilab.compiler.op import TEMPLATE_CALL, operand_names
from epilab.compiler.switch import NotSwitched, switch
from epilab.compiler.unpad import PADDED, unpad
from epilab.ir.problem import Problem
from epilab.templates.registry import code_hash

log = logging.getLogger("epilab.compiler")
_SOURCES = sorted(Path(__file__).parent.glob("*.py"))


def code_version() -> str:
    """sha256 over the compiler's sources and the templates' (``registry.code_hash``)."""
    h = hashlib.sha256()
    for path in _SOURCES:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(code_hash().encode())
    return h.hexdigest()


class EpilabPass(CustomGraphPass):
    """Replaces each anchor's epilogue group with one ``epilab::template_call``
    where the decision rules (``compiler/decide.py``) choose the template."""

    def __init__(self, context: Context, facts: str, kept: tuple[str, replay.Entry] | None = None) -> None:
        self.context = context
        self.facts = facts  # policy, database fingerprint, device...: all that decisions read
        self.kept = kept  # where this compile's decisions are stored for warm caches (replay.py)
        self.recorded: list[str] = []  # the problems recorded for `tune --seen` (JSON), kept there too
        self.ran = False

    def uuid(self) -> str:
        return hashlib.sha256((code_version() + "\0" + self.facts).encode()).hexdigest()

    def __deepcopy__(self, memo: dict) -> EpilabPass:
        """Inductor deep-copies its config patches (AOTInductor does): the pass and its context,
        which holds an open database, are shared, not copied."""
        return self

    def __call__(self, graph: fx.Graph) -> None:
        tried: list[Decision] = []
        if self.context.device is not None:  # before anchors are found: a fold makes new ones
            kept, tried = self._trial_folds(graph)
            if kept:
                fold_norms(graph, only=kept)
        decisions = self._decide(graph)
        if any(d.template for d in decisions):
            from torch._inductor.pattern_matcher import stable_topological_sort

            stable_topological_sort(graph)
            _drop_dead(graph)
            graph.lint()
        explain.record(decisions + tried)
        if self.kept is not None:
            key, entry = self.kept
            if not self.ran:  # Inductor missed: what an older compile stored is replaced
                entry.decisions, entry.problems = [], []
            entry.decisions += decisions + tried
            entry.problems += [p for p in self.recorded if p not in entry.problems]
            replay.save(key, entry)
        self.ran = True

    def _decide(
        self, graph: fx.Graph, by_anchor: dict[fx.Node, list[Decision]] | None = None
    ) -> list[Decision]:
        """Match and decide every anchor of ``graph``, rewriting the groups given a template;
        the decisions (also by anchor into ``by_anchor``: a dual pair's under its first).
        Matmuls Inductor padded are decided unpadded; those left to ATen get their padding
        back (``unpad.py``)."""
        decisions: list[Decision] = []
        unpadded = unpad(graph)
        anchors = [
            n
            for n in graph.nodes
            if n.op == "call_function" and n.target in ANCHORS and not n.meta.get(PADDED)
        ]
        precision = "tf32" if torch.get_float32_matmul_precision() != "highest" else "ieee"
        for i, anchor in enumerate(anchors):
            if anchor.graph is not graph or anchor not in graph.nodes:
                continue
            before = len(decisions)
            module = module_of(anchor)
            self._decide_anchor(graph, anchor, anchors[i + 1 :], precision, decisions)
            decisions[before:] = [
                dataclasses.replace(d, module=d.module or module) for d in decisions[before:]
            ]
            if by_anchor is not None:
                by_anchor[anchor] = decisions[before:]
        for u in unpadded:
            if u.anchor in graph.nodes:  # not replaced by a template call
                u.undo(graph)
        return decisions

    def _decide_anchor(
        self,
        graph: fx.Graph,
        anchor: fx.Node,
        later: list[fx.Node],
        precision: str,
        decisions: list[Decision],
    ) -> None:
        if self._dual(graph, anchor, later, precision, decisions):
            return
        name = f"aten.{ANCHORS[anchor.target]}"  # type: ignore[index]
        nodes = list(graph.nodes)
        after = nodes[nodes.index(anchor) + 1 :]
        try:
            group = match(anchor, after, precision=precision)
        except NoGroup as e:
            decisions.append(Decision(name, "", _shape(anchor), None, None, None, f"not matched: {e}"))
            return
        self._record_seen(group)
        decision, plan, chosen = decide(
            group.problem, self.context, name, group.shape_text, aten_dequantizes=group.aten_dequantizes
        )
        if group.problem.epilogue.row_totals:
            group, (decision, plan, chosen) = self._fused_or_plain(
                lambda: match(anchor, after, precision=precision, whole_rows=False),
                name,
                group,
                (decision, plan, chosen),
            )
        if _gathers(group):
            group, (decision, plan, chosen) = self._fused_or_plain(
                lambda: match(anchor, after, precision=precision, gather=False),
                name,
                group,
                (decision, plan, chosen),
                GATHERED,
            )
        if plan is not None:
            decision = self._apply(graph, group, plan, chosen, decision)
        decisions.append(decision)

    def _apply(
        self, graph: fx.Graph, group: Group, plan: Plan, chosen: Problem, decision: Decision
    ) -> Decision:
        """Rewrite ``group`` as its decision says (``_rewrite``); with the context's switches
        (``tune --model``'s check), as a site that runs the template or the group's aten path
        by its problem's flag (``switch.py``)."""
        switches, key = self.context.switches, decision.problem_key
        if switches is None or key is None:
            return _ran(decision, _rewrite(graph, group, plan, chosen, self.context.emit)[0])
        ran: list[str] = []

        def rewrite() -> dict[fx.Node, fx.Node]:
            runs_as, replaced = _rewrite(graph, group, plan, chosen, self.context.emit)
            ran.append(runs_as)
            return replaced

        try:
            switched = switch(graph, group.nodes, rewrite, switches, key)
        except NotSwitched:  # raised before the rewrite: a trial copy of the graph
            return _ran(decision, _rewrite(graph, group, plan, chosen, self.context.emit)[0])
        decision = _ran(decision, ran[0])
        if switched:
            decision = dataclasses.replace(decision, runs_as=f"{decision.runs_as}, {SWITCHED}")
        return decision

    def _fused_or_plain(
        self,
        remake: Callable[[], Group],
        name: str,
        group: Group,
        decided: tuple[Decision, Plan | None, Problem],
        what: tuple[str, str] = ("the norm in its epilogue", "Inductor computes the norm"),
    ) -> tuple[Group, tuple[Decision, Plan | None, Problem]]:
        """A group that normalises in its epilogue (row totals), or the group without the norm
        (Inductor computes it; ``remake`` matches it): both are recorded, so that tuning (and
        tune --model's checks) weighs them; the one without runs where the norm's group gets
        no template, or a template slower than its own (``norm_group_loses``). ``what``: the
        fused work and who does it otherwise (a grouped GEMM's gathered rows: ``GATHERED``,
        whose problems the plain group's decision names too: ``tune --model`` tunes the
        problems its decisions name, and without a record the gathered one would never run)."""
        try:
            plain = remake()
        except NoGroup:
            return group, decided
        self._record_seen(plain)
        _, plan, chosen = decided
        why = None if plan is None else norm_group_loses(self.context, chosen, plain.problem, *what)
        if plan is not None and why is None:
            return group, decided
        decision, plan, chosen = decide(
            plain.problem, self.context, name, plain.shape_text, aten_dequantizes=plain.aten_dequantizes
        )
        if why is not None:
            decision = dataclasses.replace(decision, reason=f"{why}; {decision.reason}")
        if what == GATHERED:  # both stay candidates, so tune --model tunes the gathered one too
            fused = decided[0].candidates
            decision = dataclasses.replace(decision, candidates=(*decision.candidates, *fused))
        return plain, (decision, plan, chosen)

    def _trial_folds(self, graph: fx.Graph) -> tuple[set[str], list[Decision]]:
        """The norms worth folding (``norms.Folded.key``): each foldable norm is folded in a
        copy of the graph (dry: no constant computed), the copy is decided, and a norm is kept
        only where every projection reading it was then given a template (in front of an aten
        mm the fold is more work than Inductor's norm). The copy's decisions on the
        projections of the norms left unfolded come back too, marked (not applied): their
        problems are recorded, so ``epilab tune --seen`` and ``--model`` tune them."""
        trial = _copy(graph)
        folds = fold_norms(trial, dry=True, module=graph.owning_module)
        if not folds:
            return set(), []
        by_anchor: dict[fx.Node, list[Decision]] = {}
        self._decide(trial, by_anchor)
        left = _live(trial)  # a product given a template is dead (its group's call replaced it)
        kept = {f.key for f in folds if not any(p in left for p in f.products)}
        note = "; tried with its norm folded in, not applied: a projection of that norm keeps its aten op"
        unapplied = {"template": None, "config": None, "source": None, "tried": True}
        tried = [
            dataclasses.replace(d, reason=d.reason + note, **unapplied)  # type: ignore[arg-type]
            for f in folds
            if f.key not in kept
            for p in f.products
            for d in by_anchor.get(p, [])
        ]
        return kept, tried

    def _dual(
        self,
        graph: fx.Graph,
        first: fx.Node,
        later: list[fx.Node],
        precision: str,
        decisions: list[Decision],
    ) -> bool:
        """Fuse ``first`` with a later mm/addmm that reads the same A into one dual-GEMM call
        where their products meet (``silu(gate) * up``) and the decision rules choose the
        dual template; True when the graph was rewritten. A concatenated projection whose
        output is split in two halves is tried as those halves (``halves.split_halves``).
        Otherwise each anchor goes on alone (a decision against the dual form is recorded
        too) and the graph is as it was."""
        halves = split_halves(graph, first)
        if halves is not None:
            if self._try_dual(graph, halves.first, halves.second, precision, decisions, concatenated=True):
                return True
            halves.undo(graph)
            return False
        a = _a_of(first)
        for second in later:
            if a is None or second not in graph.nodes or not same_input(_a_of(second), a):
                continue
            found = self._try_dual(graph, first, second, precision, decisions)
            if found is not None:
                return found
        return False

    def _try_dual(
        self,
        graph: fx.Graph,
        first: fx.Node,
        second: fx.Node,
        precision: str,
        decisions: list[Decision],
        concatenated: bool = False,
    ) -> bool | None:
        """Whether the dual group of ``first`` and ``second`` was chosen and the graph
        rewritten (None: they make no dual group)."""
        nodes = list(graph.nodes)
        after = nodes[nodes.index(first) + 1 :]
        try:
            group = match_dual(first, second, after, precision=precision)
        except NoGroup:
            return None
        self._record_seen(group)
        name = f"aten.{ANCHORS[first.target]}+aten.{ANCHORS[second.target]}"  # type: ignore[index]
        if concatenated:
            name = f"aten.{ANCHORS[first.target]} (concatenated, in halves)"  # type: ignore[index]
        decided = decide(group.problem, self.context, name, group.shape_text)
        if _gathers(group):
            group, decided = self._fused_or_plain(
                lambda: match_dual(first, second, after, precision=precision, gather=False),
                name,
                group,
                decided,
                GATHERED,
            )
        decision, plan, chosen = decided
        if plan is not None:
            decision = self._apply(graph, group, plan, chosen, decision)
        decisions.append(decision)
        return decision.template is not None

    def _record_seen(self, group: Group) -> None:
        """Store static problems in the database, so that ``epilab tune --seen`` finds them."""
        db = self.context.db
        if db is None or self.context.device is None or not group.problem.shape.is_static():
            return
        try:
            for problem in candidates_of(group.problem):
                db.put_problem(problem)
                self.recorded.append(problem.to_json())
        except Exception as e:  # a read-only or busy database must not fail the compile
            log.warning("could not record problem %s in %s: %s", group.problem.key[:12], db.url, e)


def _drop_dead(graph: fx.Graph) -> None:
    """Erase the nodes whose values nothing uses, in ``graph`` alone: ``Graph.eliminate_dead_code``
    also enters the subgraphs of its module (torch 2.11), where it erased the kernel launches
    of a switched site's template branch (``switch.py``): a launch writes its output in place
    and has no user."""
    for node in reversed(graph.nodes):
        if node.op in ("call_function", "get_attr") and not node.users and not node.is_impure():
            graph.erase_node(node)


def _copy(graph: fx.Graph) -> fx.Graph:
    """A copy of ``graph`` (same node names and values) for trials: owned by no module, so
    its dry constants (``get_attr`` of nothing registered) pass its checks."""
    copy = fx.Graph()
    out = copy.graph_copy(graph, {})
    copy.output(out)
    return copy


def _live(graph: fx.Graph) -> set[fx.Node]:
    """The nodes the graph's output depends on (the trial's rewrites leave it unsorted, so
    no dead-code pass: that lints the order)."""
    live: set[fx.Node] = set()
    todo = [n for n in graph.nodes if n.op == "output"]
    while todo:
        node = todo.pop()
        if node not in live:
            live.add(node)
            todo.extend(node.all_input_nodes)
    return live


GATHERED = ("its rows gathered in the kernel", "Inductor copies the rows")


def _gathers(group: Group) -> bool:
    """Whether a grouped group reads its A rows gathered by an index (``routing.route``)."""
    return bool(getattr(group.problem.geometry, "gather", False))


def _a_of(anchor: fx.Node) -> fx.Node | None:
    """The A node of an mm, addmm or grouped mm anchor (None for the other anchors)."""
    op = ANCHORS[anchor.target]  # type: ignore[index]
    if op not in ("mm", "addmm", "grouped_mm"):
        return None
    a = anchor.args[0 if op != "addmm" else 1]
    return a if isinstance(a, fx.Node) else None


def module_of(node: fx.Node) -> str:
    """The module a node was traced in, as the model names it (``layers.0.mlp.up_proj``) and
    its class (``Linear``): the innermost entry of its ``nn_module_stack``; "" where the graph
    has none (a backward graph's nodes)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, cls = list(stack.values())[-1]
    path = re.sub(r"^L\[['\"][^'\"]*['\"]\]\.?", "", str(path))  # dynamo's L['self'] prefix
    path = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path).lstrip(".")  # [0] and ['key'] as .0 and .key
    name = getattr(cls, "__name__", str(cls))
    return f"{path} ({name})" if path else name


def _shape(anchor: fx.Node) -> str:
    v = val(anchor)
    return "x".join(str(d) for d in v.shape) if v is not None else "?"


VIEW_STEPS = {"reshape": torch.ops.aten.reshape.default, "permute": torch.ops.aten.permute.default}


def _rewrite(
    graph: fx.Graph, group: Group, plan: Plan, problem: Problem, emit: str = "kernels"
) -> tuple[str, dict[fx.Node, fx.Node]]:
    """Replace the group's nodes by one call of ``problem``'s template (the group's
    problem, or the same problem for another template) and views of its outputs: its
    kernels' launches where they can be Inductor's (``emit.py``; ``emit``: the context's
    ``Context.emit``), else the custom op. How it runs (``Decision.runs_as``), and the node
    that replaced each member used outside the group (none where the group stays)."""
    members = set(group.nodes)
    order = {n: i for i, n in enumerate(graph.nodes)}
    by_name = {o.name: o for o in group.operands}
    operands = [by_name[spec.name] for spec in problem.operands]
    inputs = [*members, *(o.node for o in operands), group.a, group.b, *group.extra]
    last = max(inputs, key=order.__getitem__)
    fake = fake_mode_of(val(group.anchor))
    replaced: dict[fx.Node, fx.Node] = {}

    def add(target: object, args: tuple, value: object) -> fx.Node:
        node = graph.call_function(target, args)  # type: ignore[arg-type]
        node.meta["val"] = value
        return node

    def viewed(node: fx.Node, steps: tuple[tuple[str, list[object]], ...]) -> fx.Node:
        """``node`` reshaped and permuted by ``steps`` (new nodes, in order)."""
        for step, arg in steps:
            target = VIEW_STEPS[step]
            with fake:
                moved = target(val(node), list(arg))
            node = add(target, (node, list(arg)), moved)
        return node

    with graph.inserting_after(last):
        # a dequantized group's fp8 weight [N, K]: B is its transpose; its fp8 activation: A is its rows
        b = viewed(group.b, (("permute", list(group.b_permute)),) if group.b_permute is not None else ())
        a = viewed(group.a, (("reshape", group.a_reshape),) if group.a_reshape is not None else ())
        # the kind's extra inputs (a dual GEMM's B2, block scales) first, each viewed as the kind reads it
        args = [viewed(x, group.extra_views.get(i, ())) for i, x in enumerate(group.extra)]
        for o in operands:
            if o.reshape is None:
                args.append(o.node)
            else:
                with fake:
                    moved = torch.ops.aten.reshape.default(val(o.node), list(o.reshape))
                args.append(add(torch.ops.aten.reshape.default, (o.node, list(o.reshape)), moved))
        items, runs_as = _emitted(graph, problem, plan, a, b, args, fake, emit)
        if items is None and runs_as.startswith(KEPT_ATEN):
            return runs_as, {}  # the group stays as it is (the views made above are dead code)
        if items is None:
            problem_json, plan_json = problem.to_json(), plan.to_json()
            fake_args = (problem_json, plan_json, val(a), val(b), [val(x) for x in args])
            with fake:
                outs = TEMPLATE_CALL(*fake_args)
            call = add(TEMPLATE_CALL, (problem_json, plan_json, a, b, args), outs)
            # The strides the problem was made for: Inductor holds the call's inputs to exactly these
            # (the op's needs_exact_strides tag reads them here; without them it may re-layout them)
            call.meta["eager_input_vals"] = (fake_args, {})
            items = [add(operator.getitem, (call, i), out) for i, out in enumerate(outs)]
        for use in group.uses:
            new = items[use.output]
            if use.permute is not None:
                with fake:
                    permuted = torch.ops.aten.permute.default(val(new), list(use.permute))
                new = add(torch.ops.aten.permute.default, (new, list(use.permute)), permuted)
            if use.reshape is not None:
                shaped = val(use.node).to(val(new).dtype)  # type: ignore[union-attr]
                new = add(torch.ops.aten.reshape.default, (new, use.reshape), shaped)
            if use.cast is not None:
                new = add(torch.ops.prims.convert_element_type.default, (new, use.cast), val(use.node))
            use.node.replace_all_uses_with(new, delete_user_cb=lambda user: user not in members)
            replaced[use.node] = new
    for node in reversed(group.nodes):
        if not node.users:
            graph.erase_node(node)
    return runs_as, replaced


def _emitted(
    graph: fx.Graph,
    problem: Problem,
    plan: Plan,
    a: fx.Node,
    b: fx.Node,
    args: list[fx.Node],
    fake: object,
    emit: str,
) -> tuple[list[fx.Node] | None, str]:
    """The output nodes of the call's kernels emitted as Inductor's (None where it stays the
    custom op), and how it runs."""
    if emit == "op":
        return None, "op: asked for (the backend's option kernels=False)"
    try:
        names = operand_names(problem)
        items = emit_call(graph, problem, plan, a, b, args, names, fake, interpreted=emit == "interpreted")
    except NotEmitted as e:
        if emit == "kernels_only":
            return None, f"{KEPT_ATEN}{e}"
        log.debug("epilab: %s stays the custom op: %s", problem.key[:12], e)
        return None, f"op: {e}"
    return items, "kernel"


KEPT_ATEN = "aten: "
SWITCHED = "switched at run time with its aten path"


def _ran(decision: Decision, runs_as: str) -> Decision:
    """``decision`` with how its template runs; where the group was left to aten (the
    context's ``emit`` is kernels_only), a decision for the aten op that says why."""
    if not runs_as.startswith(KEPT_ATEN):
        return dataclasses.replace(decision, runs_as=runs_as)
    why = runs_as.removeprefix(KEPT_ATEN)
    reason = (
        f"{decision.reason}; the aten op kept, as only kernels Inductor launches were asked for "
        f"(an AOTInductor package or Inductor's C++ wrapper: neither can call the custom op) and "
        f"{decision.template}'s call is not one: {why}"
    )
    return dataclasses.replace(decision, template=None, config=None, reason=reason, runs_as="")


class ChainedPass(CustomGraphPass):
    """A user's own post-grad pass, then epilab's."""

    def __init__(self, first: object, second: EpilabPass) -> None:
        self.first, self.second = first, second

    def __call__(self, graph: fx.Graph) -> None:
        self.first(graph)  # type: ignore[operator]
        self.second(graph)

    def uuid(self) -> object:
        first = getattr(self.first, "uuid", lambda: None)()
        return None if first is None else (first, self.second.uuid())
