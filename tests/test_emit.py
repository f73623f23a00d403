"""Template calls emitted as Inductor's own kernel launches (``compiler/emit.py``).

Inductor compiles an emitted launch from its kernel's source for a GPU, which Triton's
interpreter has none of: on the CPU the emitted graph runs eagerly instead, where the
higher-order op's own implementation launches the interpreted kernels with the arguments,
grid and launch options the graph holds. Each case traces a call of the custom op, replaces
it by its emitted launches and runs both: the outputs must be bitwise equal (the same kernel,
the same config, the same inputs), and every output poisoned buffer written. On the GPU
(``-m gpu``) the same graphs go through Inductor, and ``torch.compile`` is checked end to end.
"""

from __future__ import annotations

import dataclasses
import operator

import pytest
import torch
import torch.nn.functional as F
from test_template_call import CASES, _problem_of
from torch.fx.experimental.proxy_tensor import make_fx

from epilab.compiler import backend, graph_pass
from epilab.compiler.decide import Plan
from epilab.compiler.emit import NotEmitted, emit, folded
from epilab.compiler.op import TEMPLATE_CALL, operand_names
from epilab.config import patch
from epilab.ir.check import rel_error
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.templates import registry
from epilab.templates.registry import default_config

HOP = torch.ops.higher_order.triton_kernel_wrapper_functional


def _traced(problem: Problem, plan: Plan, a, b, operands) -> torch.fx.GraphModule:
    """A graph of one custom-op call (fake values on every node, as Inductor's graphs have)."""
    pj, plj = problem.to_json(), plan.to_json()

    def call(a, b, *operands):
        return TEMPLATE_CALL(pj, plj, a, b, list(operands))

    return make_fx(call, tracing_mode="fake")(a, b, *operands)


def _emitted(gm: torch.fx.GraphModule, problem: Problem, plan: Plan) -> torch.fx.GraphModule:
    """``gm`` with its custom-op call replaced by the emitted launches."""
    graph = gm.graph
    (node,) = graph.find_nodes(op="call_function", target=TEMPLATE_CALL)
    _, _, a, b, operands = node.args
    fake = node.meta["val"][0].fake_mode
    with graph.inserting_before(node):
        outs = emit(graph, problem, plan, a, b, operands, operand_names(problem), fake, interpreted=True)
    for user in list(node.users):
        assert user.target is operator.getitem
        user.replace_all_uses_with(outs[user.args[1]])
        graph.erase_node(user)
    graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm


def _check_emitted(problem: Problem, config: Config, a, b, operands) -> torch.fx.GraphModule:
    plan = Plan(config=config)
    args = [operands[spec.name] for spec in problem.operands]
    extra = [operands[name] for name in registry.kind_of(problem).inputs_of(problem)]
    want = TEMPLATE_CALL(problem.to_json(), plan.to_json(), a, b, [*extra, *args])
    gm = _emitted(_traced(problem, plan, a, b, [*extra, *args]), problem, plan)
    assert not gm.graph.find_nodes(op="call_function", target=TEMPLATE_CALL)
    assert gm.graph.find_nodes(op="call_function", target=HOP), "no launch was emitted"
    got = gm(a, b, *extra, *args)
    got = got if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype), f"output {i}'s layout"
        same = torch.equal(g, w) or (
            (torch.isnan(g) == torch.isnan(w)).all() and torch.equal(g.nan_to_num(), w.nan_to_num())
        )
        assert same, f"output {i}: relative error {rel_error(g, w.double()):.3g} against the op's"
    return gm


def _variant(problem: Problem, **changes) -> Config:
    return dataclasses.replace(default_config(problem, "interpreter"), **changes)


# (case of test_template_call, config changes): every classic main loop of the matmul
# family, split-K's two launches, gemv's split forms, and the convolutions
VARIANTS = [
    ("matmul", {}),
    ("matmul", {"variant": "persistent"}),
    ("matmul", {"variant": "stream_k", "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}),  # its workspace
    ("matmul", {"SPLIT_K": 2, "BLOCK_K": 16}),  # two launches through a scratch buffer
    ("matmul-from-col", {}),
    ("bmm", {}),
    ("gemv-small-m", {}),
    ("gemv-small-m", {"variant": "two_pass", "SPLIT_K": 2, "BLOCK_K": 16}),
    ("gemv-small-n", {}),
    ("conv2d-nhwc", {}),
    ("conv2d-nchw", {}),
    ("conv1x1-twin", {}),  # the twin's matrix views of a 4-D input and output
]


@pytest.mark.parametrize(("case", "changes"), VARIANTS, ids=lambda v: v if isinstance(v, str) else str(v))
def test_emitted_launches_match_the_custom_op_bitwise(case, changes):
    template, made_from, _ = CASES[case]
    call = made_from()
    problem = _problem_of(template, call)
    _check_emitted(problem, _variant(problem, **changes), call.a, call.b, call.operands)


# (suite, the first spec's fields changed to small ones, the twin's template or None): a
# problem of every other kind, made by its own spec format, its inputs by the kind
KINDS = [
    ("mlp", {"m": 9, "n": 40, "k": 24}, None),  # the dual GEMM: a second weight
    ("mlp", {"m": 3, "n": 40, "k": 24}, "dual_gemv"),
    ("depthwise", {"n": 2, "c": 16, "h": 6, "w": 7, "k": 16, "groups": 16}, "depthwise"),
    ("conv", {"n": 2, "c": 8, "h": 6, "w": 7, "k": 12}, None),
    ("moe", {"experts": 4, "tokens": 9, "n": 40, "k": 24}, None),  # the dual grouped GEMM
    ("moe-routed", {"experts": 4, "tokens": 9, "n": 40, "k": 24}, None),  # rows gathered in the kernel
    ("moe-routed", {"experts": 4, "tokens": 9, "n": 24, "k": 40}, None, 1),  # scattered back, added
    ("fp8", {"m": 33, "n": 40, "k": 64}, None),  # row-wise scaled fp8
    ("fp8-block", {"m": 9, "n": 128, "k": 256}, None),  # scales per 128-deep K block
    ("fp8-weight", {"m": 9, "n": 40, "k": 64}, None),  # the weight converted in the main loop
    ("fp8-weight", {"m": 2, "n": 40, "k": 64}, "weight_only_gemv"),
]


@pytest.mark.parametrize(
    "case", KINDS, ids=lambda c: f"{c[0]}{'-' + c[2] if c[2] else ''}-{sorted(c[1].values())}"
)
def test_every_kind_emits_launches_that_match_its_custom_op(case):
    from epilab.policy import suites
    from epilab.templates.verify import random_inputs

    name, fields, twin, *index = case
    spec = dataclasses.replace(suites.suite(name)[index[0] if index else 0], **fields)
    problem = spec.problem()
    if twin is not None:
        (problem,) = [t for t in registry.twins(problem) if t.template == twin]
    a, b, operands = random_inputs(problem, torch.device("cpu"), 0)
    _check_emitted(problem, default_config(problem, "interpreter"), a, b, operands)


def test_inductor_takes_every_kinds_folded_gpu_kernels_with_only_tensors_to_pass():
    """What Inductor does with an emitted kernel before it compiles it for the GPU, done here
    without one, for every kind and matmul's main loops: the launches bound for an H100 (132
    SMs, sm_90 defaults), their sizes and strides folded in as constexprs (``emit.folded``),
    each kernel's source with every jitted function it calls, as Inductor puts it in its
    output code, and its Triton IR for sm_90 as Inductor makes it, whose only arguments left
    are tensors: a launch passes nothing but pointers (and TMA descriptors). In a process of
    its own: Triton compiles nothing in a process that runs its interpreter."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "EPILAB_INTERPRET")}
    code = "import json, test_emit; print(json.dumps(test_emit.gpu_kernels_checked()))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    checked = json.loads(done.stdout.splitlines()[-1])
    assert len(checked) == len(KINDS) + len(MAIN_LOOPS)
    assert all(n > 0 for n in checked.values()), checked


# matmul's main loops beside the default one (changes to its sm_90 default config)
MAIN_LOOPS = [
    {"variant": "persistent"},
    {"variant": "stream_k"},
    {"SPLIT_K": 4},  # two launches through a workspace
]


def gpu_kernels_checked() -> dict[str, int]:
    """The cases of ``test_inductor_takes_every_kinds_folded_gpu_kernels_with_only_tensors_to_pass``
    (run where Triton compiles): each case's name and how many kernels it checked."""
    from torch._inductor.codegen.triton import TritonKernel
    from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code

    from epilab.policy import suites
    from epilab.templates.runtime.binding import cross_binding
    from epilab.templates.verify import random_inputs

    cases = []
    for name, fields, twin, *index in KINDS:
        spec = dataclasses.replace(suites.suite(name)[index[0] if index else 0], **fields)
        problem = spec.problem()
        if twin is not None:
            (problem,) = [t for t in registry.twins(problem) if t.template == twin]
        cases.append((f"{name}{index[0] if index else ''}-{twin}-{sorted(fields.values())}", problem, {}))
    template, made_from, _ = CASES["matmul"]
    with cross_binding(132, "cuda"):
        matmul = _problem_of(template, made_from())
    cases += [(f"matmul-{changes}", matmul, changes) for changes in MAIN_LOOPS]
    checked = {}
    for case, problem, changes in cases:
        with cross_binding(132, "cuda"):
            a, b, operands = random_inputs(problem, torch.device("cpu"), 0)
            config = default_config(problem, "cuda", sm_count=132, capability="9.0")
            bound = registry.bind(problem, dataclasses.replace(config, **changes), a, b, operands)
        assert bound.launches, f"{case}: {config.short()}"
        for kernel, _, args in bound.launches:
            assert not kernel.is_gluon(), case
            kernel = folded(kernel, {n: v for n, v in args.items() if n in kernel.arg_names}, "cuda")
            imports = TritonKernel.gen_common_triton_imports()  # what Inductor puts before it
            source = imports + user_defined_triton_kernel_transitive_closure_source_code(kernel, None)
            namespace = _imported(source, kernel.fn.__name__)
            assert kernel.fn.__name__ in namespace, case
            assert not _undefined(source, namespace), (
                f"{case}: {kernel.fn.__name__} reads names its source lacks"
            )
            passed = _launch_arguments(kernel, args)
            described = {d.arg for d in bound.descriptors}
            scalars = [n for n in passed if not isinstance(args[n], torch.Tensor) and n not in described]
            assert passed and not scalars, f"{case}: {kernel.fn.__name__} is passed {scalars} per launch"
        checked[case] = len(bound.launches)
    return checked


def _imported(source: str, name: str) -> dict:
    """The namespace of ``source`` imported from a file (Triton reads a kernel's source from
    its file, as from Inductor's output code)."""
    import importlib.util
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="epilab-emitted-")) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def _launch_arguments(kernel, args) -> list[str]:
    """The arguments of ``kernel``'s Triton IR for an H100 (the names a launch passes), made
    as Inductor makes it for a user's kernel (it asks the driver for the target: none here)."""
    from unittest import mock

    import triton.runtime
    from torch._higher_order_ops.triton_kernel_wrap import generate_ttir
    from triton.backends.compiler import GPUTarget

    class H100:
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    values = {n: torch.empty(2, dtype=v.dtype) if isinstance(v, torch.Tensor) else v for n, v in args.items()}
    with mock.patch.object(triton.runtime.driver, "_active", H100(), create=True):
        _, names = generate_ttir(kernel, {n: values[n] for n in kernel.arg_names}, {})
    return names


def _undefined(source: str, namespace: dict) -> set[str]:
    """The global names the functions of ``source`` read that ``namespace`` (the module it
    made) and the builtins do not define."""
    import ast
    import builtins

    missing: set[str] = set()
    for fn in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)):
        local = {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        read = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        missing |= {name for name in read - local if name not in namespace and not hasattr(builtins, name)}
    return missing


def test_a_stream_k_workspace_is_zeros_and_split_k_scratch_is_left_empty():
    template, made_from, _ = CASES["matmul"]
    call = made_from()
    problem = _problem_of(template, call)
    stream_k = _variant(problem, variant="stream_k", BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    gm = _check_emitted(problem, stream_k, call.a, call.b, call.operands)
    zeros = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.full.default)
    assert [n.args[1] for n in zeros] == [0.0] and zeros[0].meta["val"].dtype == torch.int32  # the flags
    gm = _check_emitted(problem, _variant(problem, SPLIT_K=2, BLOCK_K=16), call.a, call.b, call.operands)
    assert not gm.graph.find_nodes(op="call_function", target=torch.ops.aten.full.default)
    first, second = gm.graph.find_nodes(op="call_function", target=HOP)
    assert "ws_ptr" in first.kwargs["tensors_to_clone"]
    assert second.kwargs["kwargs"]["ws_ptr"].args == (first, "ws_ptr")  # the second reads the first's sums


def test_launch_options_travel_as_the_one_config_of_an_autotune_wrapper():
    template, made_from, _ = CASES["matmul"]
    call = made_from()
    problem = _problem_of(template, call)
    config = _variant(problem, num_warps=2, num_stages=1)
    gm = _check_emitted(problem, config, call.a, call.b, call.operands)
    (hop,) = gm.graph.find_nodes(op="call_function", target=HOP)
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    wrapper = kernel_side_table.get_kernel(hop.kwargs["kernel_idx"])
    (only,) = wrapper.configs
    assert (only.num_warps, only.num_stages) == (2, 1)
    constants = kernel_side_table.get_constant_args(hop.kwargs["constant_args_idx"])
    assert constants["BLOCK_M"] == config.BLOCK_M and "num_warps" not in constants


def _statistics_problem() -> tuple[Problem, torch.Tensor, torch.Tensor]:
    from epilab.ir.epilogue import Epilogue, acc
    from epilab.templates.gemm.matmul import make_problem

    a, b = torch.randn(37, 7), torch.randn(7, 45)
    ep = Epilogue.build(
        [(acc(), "float32"), (acc() * acc(), "float32", "row_sum"), (acc(), "float32", "col_max")]
    )
    return make_problem(a, b, ep, {}), a, b


def test_atomic_statistics_are_emitted_into_outputs_filled_before_the_launch():
    problem, a, b = _statistics_problem()
    gm = _check_emitted(problem, _variant(problem, BLOCK_M=16, BLOCK_N=16), a, b, {})
    fills = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.full.default)
    assert sorted(n.args[1] for n in fills) == [-float("inf"), 0.0]  # the sum's and the max's


def test_ordered_statistics_stay_the_custom_op_with_the_reason():
    problem, a, b = _statistics_problem()
    plan = Plan(config=default_config(problem, "interpreter"))
    gm = _traced(problem, plan, a, b, [])
    with patch(deterministic=True), pytest.raises(NotEmitted, match="more than launch kernels"):
        _emitted(gm, problem, plan)
    assert len(gm.graph.find_nodes(op="call_function", target=TEMPLATE_CALL)) == 1  # left as it was
    assert not gm.graph.find_nodes(op="call_function", target=HOP)


def _pass_graph(f, inputs, db_path, emit: str = "interpreted", policy: str = "always"):
    """``f`` traced to ATen as Inductor decomposes it, with epilab's pass run under ``policy``
    (emitting interpreted kernels), and the decisions."""
    from torch._inductor.decomposition import select_decomp_table

    gm = make_fx(f, decomposition_table=select_decomp_table(), tracing_mode="fake")(*inputs)
    context, facts = backend._context(policy, str(db_path), False, False, inputs)
    context.emit = emit
    from epilab.compiler import explain

    explain.explain(clear=True)
    graph_pass.EpilabPass(context, facts)(gm.graph)
    gm.recompile()
    return gm, explain.explain(clear=True)


def test_the_pass_emits_a_linear_block_and_explain_says_it_runs_as_a_kernel(tmp_path):
    def block(x, w, bias, r):
        return F.gelu(x @ w.t() + bias) + r

    inputs = (torch.randn(9, 24), torch.randn(40, 24), torch.randn(40), torch.randn(9, 40))
    gm, decisions = _pass_graph(block, inputs, tmp_path / "t.db")
    (d,) = decisions
    assert d.template is not None and d.runs_as == "kernel"
    assert "| kernel |" in str(decisions)
    assert gm.graph.find_nodes(op="call_function", target=HOP)
    assert not gm.graph.find_nodes(op="call_function", target=TEMPLATE_CALL)
    ref = block(*(t.double() for t in inputs))
    assert rel_error(gm(*inputs), ref) < 1e-5


def test_a_launch_takes_a_transposed_weight_as_the_weight_itself(tmp_path):
    """The kernel reads a pointer and strides of its own: a view that starts where its
    tensor does is passed as that tensor (no view made on every call)."""

    def linear(x, w):
        return torch.relu(x @ w.t())

    inputs = (torch.randn(9, 24), torch.randn(40, 24))
    gm, _ = _pass_graph(linear, inputs, tmp_path / "t.db")
    (launch,) = gm.graph.find_nodes(op="call_function", target=HOP)
    x, w = gm.graph.find_nodes(op="placeholder")
    assert {x, w} <= set(launch.kwargs["kwargs"].values())
    assert rel_error(gm(*inputs), linear(*(t.double() for t in inputs))) < 1e-5


def test_without_a_gpu_the_backend_keeps_the_custom_op_and_says_why(tmp_path):
    def block(x, w):
        return torch.relu(x @ w)

    inputs = (torch.randn(9, 24), torch.randn(24, 40))
    gm, (d,) = _pass_graph(block, inputs, tmp_path / "t.db", emit="kernels")
    assert d.runs_as.startswith("op: its tensors are not on a GPU")
    assert gm.graph.find_nodes(op="call_function", target=TEMPLATE_CALL)
    _, (d,) = _pass_graph(block, inputs, tmp_path / "t.db", emit="op")
    assert d.runs_as.startswith("op: asked for")


def test_kernels_only_leaves_a_call_that_cannot_be_a_kernel_to_aten_and_says_why(tmp_path):
    def block(x, w):
        return torch.relu(x @ w)

    inputs = (torch.randn(9, 24), torch.randn(24, 40))
    gm, (d,) = _pass_graph(block, inputs, tmp_path / "t.db", emit="kernels_only")
    assert d.template is None and "not on a GPU" in d.reason and "AOTInductor" in d.reason
    assert not gm.graph.find_nodes(op="call_function", target=TEMPLATE_CALL)
    assert not gm.graph.find_nodes(op="call_function", target=HOP)
    assert torch.equal(gm(*inputs), block(*inputs))


@pytest.mark.usefixtures("fresh_compiler")
def test_the_cpp_wrapper_leaves_a_call_that_cannot_be_a_kernel_to_aten(tmp_path):
    """Inductor's C++ wrapper cannot call the custom op (its JSON went into C string literals
    unescaped, then its list of outputs was read as one tensor: a segfault): on the CPU, where
    no template is a kernel, the model compiles and runs on aten, and explain() says why."""
    import epilab

    def block(x, w, bias):
        return F.gelu(x @ w + bias)

    inputs = (torch.randn(8, 16), torch.randn(16, 24), torch.randn(24))
    options = {"policy": "always", "db": str(tmp_path / "t.db"), "cpp_wrapper": True}
    out = torch.compile(block, backend="epilab", options=options)(*inputs)
    assert rel_error(out, block(*(t.double() for t in inputs))) < 1e-5
    (d,) = epilab.explain(clear=True)
    assert d.template is None and "C++ wrapper" in d.reason and "not on a GPU" in d.reason


# ------------------------------------------------------------------------- GPU


class _Block(torch.nn.Module):
    """A transformer MLP's shape: Linear + GELU(tanh), Linear, residual."""

    def __init__(self, d: int = 512, f: int = 1536) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, f), torch.nn.Linear(f, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh")) + x


def _gpu_block(m: int = 256):
    torch.manual_seed(0)
    model = _Block().to("cuda", torch.bfloat16)
    x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
    return model, x


def _kernels(decisions) -> list:
    used = [d for d in decisions if d.template]
    assert used, "no template was chosen"
    return used


@pytest.mark.gpu
@pytest.mark.usefixtures("fresh_compiler")
@pytest.mark.parametrize("wrapper", ["python", "cpp"])
def test_gpu_templates_are_kernels_in_inductors_output_code(wrapper, tmp_path):
    from torch._inductor.utils import run_and_get_code

    import epilab

    model, x = _gpu_block()
    options = {"policy": "always", "db": str(tmp_path / "t.db")}
    if wrapper == "cpp":
        options["cpp_wrapper"] = True
    fn = torch.compile(model, backend="epilab", options=options)
    with torch.no_grad():
        out, codes = run_and_get_code(fn, x)
        ref = copy_double(model)(x.double())
    code = "\n".join(codes)
    assert "template_call" not in code and "triton_kernel_wrapper" not in code
    assert all(d.runs_as == "kernel" for d in _kernels(epilab.explain())), epilab.explain()
    assert rel_error(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.usefixtures("fresh_compiler")
def test_gpu_dynamic_shapes_keep_the_custom_op_and_stay_correct(tmp_path):
    import epilab

    model, _ = _gpu_block()
    fn = torch.compile(
        model, backend="epilab", options={"policy": "always", "db": str(tmp_path / "t.db")}, dynamic=True
    )
    with torch.no_grad():
        for m in (33, 100):
            x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
            assert rel_error(fn(x), copy_double(model)(x.double())) < 1e-2
    assert all(d.runs_as.startswith("op: its shapes are not static") for d in _kernels(epilab.explain()))


@pytest.mark.gpu
@pytest.mark.usefixtures("fresh_compiler")
def test_gpu_an_aot_package_runs_in_a_process_without_epilab(tmp_path):
    import subprocess
    import sys

    import epilab

    model, x = _gpu_block()
    _skip_unless_torch_loads_packages(model, x, tmp_path)
    path = epilab.aot_compile(model, (x,), tmp_path / "block.pt2", db=tmp_path / "t.db", policy="always")
    assert all(d.runs_as == "kernel" for d in _kernels(epilab.explain(clear=True)))
    torch.save(x.cpu(), tmp_path / "x.pt")
    script = (
        "import sys, torch\n"
        "runner = torch._inductor.aoti_load_package(sys.argv[1])\n"
        "out = runner(torch.load(sys.argv[2]).cuda())\n"
        "torch.save(out.cpu(), sys.argv[3])\n"
        "assert not [m for m in sys.modules if m.startswith('epilab')], 'epilab was imported'\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, path, tmp_path / "x.pt", tmp_path / "out.pt"], check=True, cwd=tmp_path
    )
    packaged = torch.load(tmp_path / "out.pt").cuda()
    with torch.no_grad():
        compiled = torch.compile(
            model, backend="epilab", options={"policy": "always", "db": str(tmp_path / "t.db")}
        )(x)
        assert rel_error(packaged, copy_double(model)(x.double())) < 1e-2
    assert torch.equal(packaged, compiled), (
        f"the package and the compiled model differ: {rel_error(packaged, compiled.double()):.3g}"
    )


def _skip_unless_torch_loads_packages(model: torch.nn.Module, x: torch.Tensor, tmp_path) -> None:
    """Skip where torch cannot load an AOTInductor package of plain Inductor (no epilab in
    it) in a fresh process: torch 2.11.0+cu130's loader segfaults so on our H100 host
    (benchmarks/RESULTS.md, 2026-12-06), and a crash of ours could not be told from it."""
    import subprocess
    import sys

    path = torch._inductor.aoti_compile_and_package(
        torch.export.export(model, (x,)), package_path=str(tmp_path / "plain.pt2")
    )
    load = "import sys, torch; torch._inductor.aoti_load_package(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", load, path], capture_output=True, cwd=tmp_path)
    if done.returncode != 0:
        pytest.skip(
            f"torch {torch.__version__} cannot load a plain Inductor package here (exit {done.returncode})"
        )


def copy_double(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(model).double()


def test_only_calls_that_will_be_inductor_kernels_skip_the_launch_bound_rules():
    from epilab.compiler.decide import Context, launches_as_kernel
    from epilab.templates.gemm.matmul_sm90 import VARIANTS as GLUON

    problem, _, _ = _statistics_problem()
    on_gpu = Context("auto", None, "cuda", None, None)  # type: ignore[arg-type]
    assert launches_as_kernel(on_gpu, problem, {"variant": "persistent"})
    assert not launches_as_kernel(on_gpu, problem, {"variant": GLUON[0]})  # a Gluon kernel: the op
    with patch(deterministic=True):  # ordered statistics: the op
        assert not launches_as_kernel(on_gpu, problem, {})
    assert not launches_as_kernel(dataclasses.replace(on_gpu, emit="op"), problem, {})
    assert not launches_as_kernel(dataclasses.replace(on_gpu, target="interpreter"), problem, {})


WARM_SCRIPT = """
import sys, torch, epilab
torch.manual_seed(0)
up, down = torch.nn.Linear(512, 1536), torch.nn.Linear(1536, 512)
model = torch.nn.Sequential(up, torch.nn.GELU(approximate="tanh"), down).to("cuda", torch.bfloat16)
x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    out = torch.compile(model, backend="epilab", options={"policy": "always", "db": sys.argv[1]})(x)
used = [d for d in epilab.explain() if d.template]
print("DECISIONS", sorted({(d.runs_as, d.replayed) for d in used}), len(used))
torch.save(out.cpu(), sys.argv[2])
"""


@pytest.mark.gpu
def test_gpu_a_warm_fx_graph_cache_serves_the_emitted_kernels_and_their_decisions(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "warm.py"
    script.write_text(WARM_SCRIPT)
    env = {
        **os.environ,
        "EPILAB_CACHE_DIR": str(tmp_path / "kernels"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }

    def run(i: int) -> str:
        args = [sys.executable, str(script), str(tmp_path / "t.db"), str(tmp_path / f"out{i}.pt")]
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("DECISIONS")]
        return line

    assert run(0) == "DECISIONS [('kernel', False)] 2"
    assert run(1) == "DECISIONS [('kernel', True)] 2"  # served warm: the kernels from the cached code
    assert torch.equal(torch.load(tmp_path / "out0.pt"), torch.load(tmp_path / "out1.pt"))
