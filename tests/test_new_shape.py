"""A kind of a new problem shape comes in through the registry alone: its geometry, its spec
format and suite, its label and its transfer rule are its own, and the problem, the suites,
the shapes files, config transfer, the tuner, the database and the CLI take it unchanged.

The toy kind here runs E experts of equal token counts (a grouped GEMM without the
grouping's raggedness) on the matmul's batched kernel: ``experts_mm``, a problem op no
module of epilab names, with an ``experts`` geometry in its problems' JSON and a spec
format marked by ``banks`` (the grouped GEMM kinds' own format is marked by ``experts``).
Everything it declares lives in this file; the registry line is the ``monkeypatch.setitem``
of the fixture.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from epilab.cli import app
from epilab.db import INTERPRETER_DEVICE, TuningDB
from epilab.ir.config import Config
from epilab.ir.problem import Problem
from epilab.ir.spec import EpilogueSpec, SpecFormat
from epilab.policy import nearest, suites
from epilab.templates import registry
from epilab.templates.conv.conv_spec import ConvSpec
from epilab.templates.gemm import matmul, matmul_config, matmul_reference
from epilab.templates.gemm.gemm_spec import Spec
from epilab.tuner import evaluate
from epilab.tuner.search import Budget
from epilab.tuner.tune import TuneOptions, Tuner

NAME, OP = "toy_experts", "experts_mm"


@dataclasses.dataclass(frozen=True)
class ExpertsGeometry:
    KEY: ClassVar[str] = "experts"
    experts: int

    def to_dict(self) -> dict[str, Any]:
        return {"experts": self.experts}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExpertsGeometry:
        return cls(int(d["experts"]))


def _as_bmm(p: Problem) -> Problem:
    """The matmul's batched problem the toy's kernel is (its tensors are the bmm's)."""
    return dataclasses.replace(
        p,
        op="bmm",
        template="matmul",
        template_hash=registry.template_hash("matmul", p.epilogue),
        geometry=None,
    )


def _as_experts(p: Problem) -> Problem:
    return dataclasses.replace(
        p,
        op=OP,
        template=NAME,
        template_hash=registry.template_hash(NAME, p.epilogue),
        geometry=ExpertsGeometry(int(p.shape.batch)),
    )


def _on_bmm(f):  # a kind's function of (problem, ...), run on the bmm
    return lambda p, *args, **kw: f(_as_bmm(p), *args, **kw)


TOY = dataclasses.replace(
    matmul.KIND,
    name=NAME,
    ops=(OP,),
    check=_on_bmm(matmul_config.config_error),
    default_config=_on_bmm(matmul.default_matmul_config),
    render_vars=_on_bmm(matmul.render_vars),
    problem_of=lambda p, a, b, operands: _as_experts(matmul.matmul_problem_of(_as_bmm(p), a, b, operands)),
    bind=_on_bmm(matmul.bind_matmul),
    output_specs=_on_bmm(matmul.matmul_output_specs),
    empty_outputs=_on_bmm(matmul.empty_matmul_outputs),
    inputs=_on_bmm(matmul_reference.matmul_inputs),
    reference=_on_bmm(matmul.KIND.reference),
    baseline=_on_bmm(matmul_reference.eager_matmul),
    input_elements=_on_bmm(matmul.matmul_input_elements),
    search_error=_on_bmm(matmul_config.matmul_search_error),
    geometry=ExpertsGeometry,
    problem_error=lambda p: None if p.shape.batch == p.geometry.experts else "one batch per expert",
    label=lambda p: f"{p.geometry.experts} experts x {p.shape.m} tokens -> {p.shape.n}x{p.shape.k}",
    transfer_key=lambda p: p.geometry.experts,  # configs carry between problems of one expert count
    spec_module=__name__,
)


@dataclasses.dataclass(frozen=True)
class ExpertsSpec:
    banks: int
    tokens_each: int
    n: int
    k: int
    dtype: str = "float32"
    epilogue: EpilogueSpec = "none"

    def problem(self) -> Problem:
        bmm = Spec(
            self.tokens_each, self.n, self.k, batch=self.banks, dtype=self.dtype, layout="NN"
        ).problem()
        return _as_experts(
            dataclasses.replace(bmm, epilogue=Spec(1, 1, 1, epilogue=self.epilogue).problem().epilogue)
        )

    def label(self) -> str:
        return f"{self.banks} experts x {self.tokens_each} tokens {self.dtype} {self.epilogue}"

    def flops(self) -> int:
        return 2 * self.banks * self.tokens_each * self.n * self.k


FORMAT = SpecFormat(
    what="a toy experts problem",
    keys=frozenset({"banks", "tokens_each", "n", "k", "dtype", "epilogue"}),
    required=frozenset({"banks", "tokens_each", "n", "k"}),
    marks=frozenset({"banks", "tokens_each"}),
    make=ExpertsSpec,
    suites={"toy-experts": [ExpertsSpec(2, 8, 16, 16), ExpertsSpec(2, 16, 16, 16)]},
)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(registry.KINDS, TOY.name, TOY)  # the one registry line
    return TOY


def test_its_problems_are_checked_stored_and_labelled_by_the_kind(toy):
    spec = suites.spec_from_dict({"banks": 2, "tokens_each": 8, "n": 16, "k": 16})
    assert isinstance(spec, ExpertsSpec)
    problem = spec.problem()
    assert problem.op == OP and problem.geometry == ExpertsGeometry(2)
    assert json.loads(problem.to_json())["experts"] == {"experts": 2}
    assert Problem.from_json(problem.to_json()) == problem
    assert registry.is_current(problem.to_json())
    assert suites.shape_label(problem) == "2 experts x 8 tokens -> 16x16"
    assert suites.problem_label(problem).startswith(f"{OP} 2 experts x 8 tokens")
    with pytest.raises(ValueError, match="one batch per expert"):
        dataclasses.replace(problem, geometry=ExpertsGeometry(3))
    with pytest.raises(ValueError, match="needs its experts geometry"):
        dataclasses.replace(problem, geometry=None)
    assert OP in registry.problem_ops()


def test_its_spec_format_and_suite_join_the_others(toy, tmp_path):
    assert [s.label() for s in suites.suite("toy-experts")] == [
        s.label() for s in FORMAT.suites["toy-experts"]
    ]
    assert "toy-experts" in suites.SUITES and "conv" in suites.SUITES
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        '{"m": 16, "n": 16, "k": 16}\n'
        '{"n": 1, "c": 4, "h": 5, "w": 5, "k": 4, "r": 3, "s": 3}\n'
        '{"banks": 2, "tokens_each": 8, "n": 16, "k": 16, "epilogue": "relu(acc)"}\n'
        '{"banks": 2, "tokens_each": 8, "n": 16}\n'
    )
    with pytest.raises(ValueError, match=r"mixed.jsonl:4: missing \['k'\] for a toy experts problem"):
        suites.load_shapes(path)
    path.write_text("\n".join(path.read_text().splitlines()[:3]))
    assert [type(s) for s in suites.load_shapes(path)] == [Spec, ConvSpec, ExpertsSpec]
    with pytest.raises(ValueError, match="do not go together"):
        suites.spec_from_dict({"banks": 2, "tokens_each": 8, "n": 16, "k": 16, "c": 3})


def test_configs_carry_by_its_transfer_rule(toy):
    small, large = (ExpertsSpec(2, t, 16, 16).problem() for t in (8, 32))
    other = ExpertsSpec(4, 8, 16, 16).problem()
    assert nearest.distance(small, large) == pytest.approx(2.0)  # tokens x4: two doublings
    assert nearest.distance(small, other) is None  # another expert count


def test_the_tuner_the_database_and_the_cli_run_it(toy, tmp_path):
    spec = ExpertsSpec(2, 8, 16, 16, epilogue="relu(acc)")
    problem = spec.problem()
    result = evaluate.evaluate_candidate(problem.to_json(), Config(16, 16, 16).to_dict(), seed=1)
    assert result["status"] == "ok", result
    db_path = tmp_path / "t.db"
    with TuningDB.open(db_path) as db:
        options = TuneOptions(
            budget=Budget(trials=2, seconds=600, batch=2), interpret=True, jobs=0, baselines=()
        )
        hook = tmp_path / "hook.py"  # the registry line, in the spawned worker process
        hook.write_text(
            "import importlib\nfrom epilab.templates import registry\n"
            f"toy = importlib.import_module({__name__!r}).TOY\n"
            "def hook(task):\n    registry.KINDS.setdefault(toy.name, toy)\n"
        )
        with Tuner(db, options, hook=(str(hook), "hook")) as tuner:
            tuned = tuner.tune(spec)
        assert tuned.evaluated == 2 and tuned.best_ms is not None
        assert db.best(problem.key, INTERPRETER_DEVICE) is not None
    listed = CliRunner().invoke(app, ["db", "list", "--db", str(db_path)], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and "2 experts x 8 tokens -> 16x16" in listed.output, listed.output
