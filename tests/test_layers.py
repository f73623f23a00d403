"""The house's floors (docs/design.md, "Layout"): each folder imports only from the floors
below it (ir/ on the ground floor, the compiler and the tuner side by side on theirs, neither
importing the other), and no two modules import each other, however indirectly (imports
inside functions and under ``TYPE_CHECKING`` count: a circle is a circle; so does a module
loaded by its name, ``importlib.import_module("epilab....")``, and an entry point of
pyproject.toml, as installed)."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.metadata import distribution, entry_points
from pathlib import Path

import epilab
from epilab.templates.registry import KINDS

ROOT = Path(epilab.__file__).parent
SKIP = {"tests", "benchmarks", "docs", "test-artifacts", ".whl", "build"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if parts[0] in SKIP or parts[0].startswith(".") or "migrations" in parts:
            continue
        name = ".".join(("epilab", *parts))[: -len(".py")].removesuffix(".__init__")
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The epilab modules ``path`` imports, anywhere in it, or names as a string to load
    (``"epilab.templates.registry"``, ``"epilab.tuner.worker:main"``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, (ast.Assign, ast.Call)):
            names = [s.split(":")[0] for s in _named_to_load(node)]
        else:
            continue
        found |= {n for n in names if n in modules and n != "epilab"}
    return found


def _named_to_load(node: ast.Assign | ast.Call) -> list[str]:
    """Strings that name a module to load: ``import_module("...")``'s argument, a constant
    ``..._MODULE = "..."`` (a kind's ``spec_module`` is loaded by the registry beside it)."""
    if isinstance(node, ast.Call):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        values = node.args[:1] if called == "import_module" else []
    else:
        named = [t.id for t in node.targets if isinstance(t, ast.Name)]
        values = [node.value] if any(n.endswith("_MODULE") for n in named) else []
    return [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]


def _entry_points() -> dict[str, str]:
    """The entry points of epilab's own groups (pyproject.toml, as installed): group -> the
    module it loads."""
    return {e.group: e.module for e in distribution("epilab").entry_points if e.group.startswith("epilab.")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    for group, target in _entry_points().items():  # the module that loads the group's entry points
        for name, path in modules.items():
            if f'"{group}"' in path.read_text():
                graph[name].add(target)
    return graph


# The floors by folder, bottom up: a folder (or a module beside the package's root) imports
# only from floors below its own. Folders on one floor import nothing of each other.
FLOORS = (
    {"config", "files", "tables"},
    {"ir"},
    {"templates", "db"},
    {"policy", "api"},
    {"compiler", "tuner"},
    {"model_tuning", "reports"},
    {"cli"},
    {"__main__"},
)
# The edges against the floors, by design, each a plugin's: a problem checks its template
# and a config its kinds' knobs against the registry, which ir/ loads by name if nothing did
# yet (``ir/plugin.py``); the
# backend's tune_missing finds the tuner through an entry point (``compiler/backend.py``)
PLUGIN_EDGES = {
    ("epilab.ir.plugin", "epilab.templates.registry"),
    ("epilab.compiler.backend", "epilab.tuner.on_compile"),
}


def _floor(module: str) -> int:
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else parts[0]
    return next(i for i, rooms in enumerate(FLOORS) if room in rooms)


def test_each_folder_imports_only_the_floors_below_it():
    graph = _graph()
    assert {m.split(".")[1] for m in graph if m != "epilab"} == set().union(*FLOORS)
    against = sorted(
        (name, dep)
        for name, deps in graph.items()
        if name != "epilab"
        for dep in deps
        if name.split(".")[1] != dep.split(".")[1] and _floor(dep) >= _floor(name)
    )
    assert [e for e in against if e not in PLUGIN_EDGES] == []
    assert set(against) == PLUGIN_EDGES  # a plugin edge that went away leaves this list too


# Inside templates/, by room (a family's folder, runtime/, tools/, or a module beside them),
# bottom up: what a kind's bind returns and the protocol; the path every launch runs
# through; the gemm family, whose kinds the others build on; the other families, none
# importing another; the registry; the check through it; the tools over kernels. The one edge upward
# is a family's spec format (``TemplateKind.spec_module``), which the registry loads by name
# and which asks the registry for its problems' templates.
TEMPLATE_ROOMS = (
    {"bound"},
    {"kind"},
    {"runtime"},
    {"gemm"},
    {"gemv", "conv", "grouped"},
    {"registry"},
    {"verify"},
    {"tools"},
)


def _template_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "templates" else None


def test_template_rooms_import_only_the_rooms_below_theirs():
    rank = {room: i for i, rooms in enumerate(TEMPLATE_ROOMS) for room in rooms}
    graph = _static_graph()
    assert {_template_room(m) for m in graph} - {None} == set(rank)
    against = sorted(
        (name, dep)
        for name, deps in graph.items()
        for dep in deps
        if _template_room(name) and _template_room(dep) and _template_room(name) != _template_room(dep)
        if rank[_template_room(dep)] >= rank[_template_room(name)]
    )
    specs = {kind.spec_module for kind in KINDS.values() if kind.spec_module}
    assert [e for e in against if not (e[0] in specs and e[1] == "epilab.templates.registry")] == []
    assert {e[0] for e in against} == specs  # each spec format does ask the registry


def test_the_compiler_finds_the_tuner_through_its_entry_point():
    """``tune_missing`` reaches the tuner through pyproject's entry point, not an import:
    the group is declared, and it names a function the tuner defines."""
    assert _entry_points() == {"epilab.compile_tuners": "epilab.tuner.on_compile"}
    (found,) = [e for e in entry_points(group="epilab.compile_tuners") if e.name == "epilab"]
    assert found.load().__module__ == "epilab.tuner.on_compile"


def _static_graph() -> dict[str, set[str]]:
    """The graph without the plugin edges: what a module needs before it runs."""
    return {name: {d for d in deps if (name, d) not in PLUGIN_EDGES} for name, deps in _graph().items()}


def test_ir_is_the_ground_floor():
    graph = _static_graph()
    assert any(name.startswith("epilab.ir.") for name in graph)
    above = {
        name: sorted(m for m in deps if not m.startswith(("epilab.ir", "epilab.config")))
        for name, deps in graph.items()
        if name.startswith("epilab.ir")
    }
    assert {k: v for k, v in above.items() if v} == {}


def test_ir_imports_no_torch_triton_or_sympy():
    """Problems, epilogues and configs are read without torch (issue 92: a command that leases
    its work before it imports torch); the dtype table's sizes and kinds are torch's own."""
    code = (
        "import importlib, pkgutil, sys, epilab.ir as ir\n"
        "for m in pkgutil.iter_modules(ir.__path__): importlib.import_module('epilab.ir.' + m.name)\n"
        "print(sorted(m for m in ('torch', 'triton', 'sympy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    from epilab.ir.dtypes import TABLE

    assert all(
        d.itemsize == d.torch.itemsize and d.input == d.torch.is_floating_point for d in TABLE.values()
    )


def test_no_module_imports_itself_through_others():
    graph = _static_graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep] if dep in path else [name, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


# Who may import a kind module (one defining ``KIND``) besides the registry and the kinds
# themselves: the user functions (``epilab.matmul``, ``epilab.gated_matmul``,
# ``epilab.grouped_matmul``) are the matmul (dual, block-scaled, weight-only) and grouped kinds'
# own API. The compiler, the tuner, the suites and the CLI ask the registry.
KIND_IMPORTERS = {
    "epilab.api.matmul": {
        "epilab.templates.gemm.matmul",
        "epilab.templates.gemm.dual_matmul",
        "epilab.templates.gemm.block_scaled",
        "epilab.templates.gemm.weight_only",
    },
    "epilab.api.grouped": {
        "epilab.templates.grouped.grouped_matmul",
        "epilab.templates.grouped.dual_grouped_matmul",
    },
}


def test_only_the_registry_imports_the_kind_modules():
    modules = _modules()
    kind_modules = {name for name, path in modules.items() if "\nKIND = " in path.read_text()}
    assert {"epilab.templates.gemm.matmul", "epilab.templates.conv.conv2d"} <= kind_modules
    found = {}
    for name, deps in _graph().items():
        if name == "epilab.templates.registry" or name in kind_modules:
            continue
        if deps & kind_modules:
            found[name] = deps & kind_modules
    assert found == KIND_IMPORTERS


def test_every_package_and_template_file_is_installed():
    """pyproject.toml lists packages one by one (the root is the package): a folder left out
    imports from a source tree and an editable install, not from a wheel (the CLI's was)."""
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        ".".join(("epilab", *p.parent.relative_to(ROOT).parts))
        for p in ROOT.rglob("*.py")
        if p.parent.relative_to(ROOT).parts[:1] not in {(s,) for s in SKIP}
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    }
    assert set(setup["packages"]) == folders
    data = {
        ".".join(("epilab", *p.parent.relative_to(ROOT).parts))
        for p in ROOT.rglob("*.jinja")
        if p.parent.relative_to(ROOT).parts[:1] not in {(s,) for s in SKIP}
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    }
    assert data <= set(setup["package-data"])


def _code_lines(node: ast.AST) -> int:
    """A function's lines less its docstring's."""
    lines = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        lines -= body[0].end_lineno - body[0].lineno + 1  # type: ignore[operator]
    return lines


def test_rooms_stay_small():
    """No module over 700 lines and no function over 80 (docstrings aside), the migrations
    too: a room that grows past them holds more than one job."""
    paths = [*_modules().values(), *ROOT.glob("db/migrations/versions/*.py")]
    long_modules = {
        str(p.relative_to(ROOT)): n for p in paths if (n := len(p.read_text().splitlines())) > 700
    }
    long_functions = {
        f"{p.relative_to(ROOT)}:{node.name}": _code_lines(node)
        for p in paths
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _code_lines(node) > 80
    }
    assert not long_modules and not long_functions, (long_modules, long_functions)
