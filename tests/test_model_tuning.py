"""`epilab tune --model` and `epilab.tune_model`: a model's problems found by compiling it,
tuned until no new one appears, each template checked in the compiled model (the verdict
stored and followed by later compiles), and the model measured beside Inductor."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from records import record
from typer.testing import CliRunner
from zoo.quantized import Fp8Linear

import epilab
from epilab.cli import app
from epilab.db import INTERPRETER_DEVICE, TuningDB, Versions
from epilab.ir.problem import Problem
from epilab.model_tuning.in_context import split
from epilab.model_tuning.load import ModelSpecError, build_model, parse_input
from epilab.model_tuning.tune import tune_model
from epilab.model_tuning.variants import ModelOptions
from epilab.tuner.search import Budget
from epilab.tuner.timing import Measured
from epilab.tuner.tune import TuneOptions, Tuner
from epilab.tuner.work import unserved

pytestmark = pytest.mark.usefixtures("fresh_compiler")
CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 2, "num_stages": 1}
GEMV_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 1, "GROUP_M": 1}


class Block(nn.Module):
    """Two projections: GELU after the first, a residual after the second."""

    def __init__(self, d: int = 16, f: int = 24) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh")) + x


def test_parse_input_takes_shape_and_dtype_and_says_what_is_wrong():
    spec = parse_input("8x1024x1024:bfloat16")
    assert spec.shape == (8, 1024, 1024) and spec.dtype == torch.bfloat16
    assert parse_input("4x128:int64:32000").high == 32000
    assert parse_input("3x4:bf16").dtype == torch.bfloat16
    for bad, words in [
        ("8x1024", "SHAPE:DTYPE"),
        ("8xx4:float32", "SHAPE:DTYPE"),
        ("0x4:float32", "positive"),
        ("8x4:flaot32", "not a dtype an example input can have"),
        ("8x4:qint8", "not a dtype an example input can have"),
        ("99999999999x99999999999:bfloat16", "more than any device holds"),
        ("8x4:float32:10", "only integer inputs"),
    ]:
        with pytest.raises(ModelSpecError, match=words):
            parse_input(bad)


def test_build_model_imports_the_factory_and_casts_to_the_input_dtype(tmp_path, monkeypatch):
    (tmp_path / "zoo_for_test.py").write_text(
        textwrap.dedent(
            """
            import torch.nn as nn
            def build():
                return nn.Linear(8, 4)
            def pair():
                import torch
                return nn.Linear(8, 4), (torch.randn(2, 8),)
            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    model, inputs, label = build_model("zoo_for_test:build", ["2x8:bfloat16"], torch.device("cpu"))
    assert model.weight.dtype == torch.bfloat16 and inputs[0].shape == (2, 8)
    assert not model.training and label == "zoo_for_test:build 2x8:bfloat16"
    model, inputs, _ = build_model("zoo_for_test:pair", [], torch.device("cpu"))
    assert inputs[0].shape == (2, 8)
    for target, words in [
        ("zoo_for_test", "MODULE:FACTORY"),
        ("no_such_module_here:build", "cannot import"),
        ("zoo_for_test:NOT_CALLABLE", "no callable"),
        ("zoo_for_test:missing", "no callable"),
    ]:
        with pytest.raises(ModelSpecError, match=words):
            build_model(target, ["2x8:float32"], torch.device("cpu"))
    with pytest.raises(ModelSpecError, match="--input"):
        build_model("zoo_for_test:build", [], torch.device("cpu"))
    sys.modules.pop("zoo_for_test", None)


def _problems(db_path, model, x):
    """The model's problems, as the compiler records them (matmul; gemv twins aside)."""
    with torch.no_grad():
        torch.compile(model, backend="epilab", options={"db": db_path})(x)
    torch._dynamo.reset()
    decisions = epilab.explain(clear=True)
    with TuningDB.open(db_path) as db:
        return decisions, [Problem.from_json(db.problem_json(d.problem_key)[1]) for d in decisions]


def _record_wins(db_path, problems):
    """Each problem's template beats cuBLAS in isolation; its gemv twin is slower."""
    from epilab.templates.gemv.gemv import gemv_twin

    for p in problems:
        record(db_path, p, CONFIG, 1.0, 2.0)
        record(db_path, gemv_twin(p), GEMV_CONFIG, 1.5, 2.0)


ONE_LOOK = ModelOptions(rounds=6, max_rounds=6)  # 6 rounds, one look: [min, max] covers at 96.9%


def switched_on(name: str) -> set[str] | None:
    """The key prefixes a switched variant runs templates for (None: not a switched variant)."""
    prefix = "epilab switched on: "
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    return set() if rest == "none" else set(rest.split())


class GainTimer:
    """Times a switched variant by the templates it runs: ``base`` ms, less ``gains[key]`` for
    each one on (a negative gain: it loses in context; a number: each one's gain); named
    variants by ``named``."""

    def __init__(self, gains: dict[str, float] | float, named: dict[str, float], base: float = 1.0) -> None:
        self.gains, self.named, self.base, self.names = gains, named, base, []

    def __call__(self, name, fn):
        if name not in self.names:
            fn()  # each variant runs (the interpreter is slow: once)
        self.names.append(name)
        on = switched_on(name)
        if on is None:
            ms = self.named[name]
        else:
            gains = self.gains
            ms = self.base - (
                gains * len(on)
                if isinstance(gains, float)
                else sum(g for k, g in gains.items() if k[:12] in on)
            )
        return Measured(ms, ms, ms, 1, "fake")


def test_templates_are_kept_only_where_the_model_is_faster_with_them(tmp_path):
    torch.manual_seed(0)
    db_path = str(tmp_path / "t.db")
    model, x = Block().eval(), torch.randn(2, 5, 16)
    decisions, problems = _problems(db_path, model, x)
    _record_wins(db_path, problems)
    kept, losing = problems[0].key, problems[1].key  # ... but the second one loses inside the model
    timer = GainTimer(
        {kept: 0.1, losing: -0.2}, {"epilab kept": 0.85, "inductor": 1.0, "epilab": 0.9, "eager": 2}
    )
    with TuningDB.open(db_path) as db:
        tuner = Tuner(db, TuneOptions(budget=Budget(trials=1), interpret=True, jobs=0, baselines=()))
        with tuner:
            report = tune_model(model, x, db=db, tuner=tuner, options=ONE_LOOK, label="block", timer=timer)
        verdicts = {
            p.key: db.verdict(p.key, INTERPRETER_DEVICE, tuner.versions, cuda_graphs=False) for p in problems
        }
    assert report.passes == 1 and not report.tuned  # everything was recorded: nothing to tune
    # both at once lose (1.1 ms against 1.0): the group is split, each judged against none
    assert verdicts[losing] is not None and not verdicts[losing].keep
    assert (verdicts[losing].with_ms, verdicts[losing].without_ms) == (1.2, 1.0)
    assert verdicts[kept] is not None and verdicts[kept].keep and verdicts[kept].context == "block"
    assert (verdicts[kept].with_ms, verdicts[kept].without_ms) == (0.9, 1.0)
    assert {v["problem"]: v["keep"] for v in report.verdicts} == {kept: True, losing: False}
    # one switched compile serves every variant: the model with all, none, each alone
    switched = [n for n in timer.names if switched_on(n) is not None]
    assert {frozenset(switched_on(n)) for n in switched} == {
        frozenset({kept[:12], losing[:12]}),
        frozenset(),
        frozenset({kept[:12]}),
        frozenset({losing[:12]}),
    }
    # the model with the kept template (compiled without switches) is timed against Inductor
    assert timer.names.count("epilab kept") == 6 and timer.names.count("inductor") == 12
    assert {v["outcome"] for v in report.verdicts} == {"faster", "not faster"}
    assert all(v["rounds"] == 6 and v["ratio"]["low"] == v["ratio"]["high"] for v in report.verdicts)
    # compiles: the record step's; the check's switched model, its model with the kept one and
    # Inductor; the measurement compiles nothing: the check's last two are what it times
    assert report.compiles == {"record": 1, "context check": 3}
    # the table: every variant measured, epilab's speedups against each
    rows = {r["variant"]: r for r in report.rows}
    assert set(rows) == {"eager", "inductor", "epilab"} and rows["epilab"]["templates"] == 1
    assert "| per call | epilab |" in report.table() and "reject" in report.table()
    # the seconds each step spent compiling its variants (and their first calls), within its own
    for step in ("record", "context check"):
        assert 0 < report.compiling[step] <= report.seconds[step]
        compiling = f"(compiling {report.compiling[step]:.0f}, {report.compiles[step]} compiles)"
        assert f"{step} {report.seconds[step]:.0f} {compiling}" in report.table()
    assert report.to_dict()["compiling"].keys() == {"record", "context check"}
    # print(report) prints its tables; its repr is one line, not the dataclass's fields
    assert str(report) == report.table() and "\n" not in repr(report) and len(repr(report)) < 300
    assert "1 of 2 verdict(s) kept" in repr(report)
    # a later compile follows the verdicts without measuring
    decisions, _ = _problems(db_path, model, x)
    by_key = {d.problem_key: d for d in decisions}
    assert by_key[kept].template == "matmul" and "checked in block" in by_key[kept].reason
    assert by_key[losing].template is None and "faster without it" in by_key[losing].reason


def test_every_template_is_dropped_when_the_model_is_slower_than_inductor(tmp_path):
    torch.manual_seed(0)
    db_path = str(tmp_path / "t.db")
    model, x = Block().eval(), torch.randn(2, 5, 16)
    _, problems = _problems(db_path, model, x)
    _record_wins(db_path, problems)

    # each template helps a little, Inductor is faster still
    timer = GainTimer({p.key: 0.05 for p in problems}, {"inductor": 0.5, "epilab kept": 1.0}, base=1.1)

    with TuningDB.open(db_path) as db:
        with Tuner(db, TuneOptions(interpret=True, jobs=0, baselines=())) as tuner:
            tune_model(
                model,
                x,
                db=db,
                tuner=tuner,
                options=ModelOptions(rounds=6, max_rounds=6, measure=False),
                timer=timer,
            )
        versions = tuner.versions
        for p in problems:
            v = db.verdict(p.key, INTERPRETER_DEVICE, versions, cuda_graphs=False)
            assert v is not None and not v.keep and (v.with_ms, v.without_ms) == (1.0, 0.5)
            assert v.outcome == "slower than inductor" and (v.ratio_low, v.ratio_high, v.rounds) == (
                0.5,
                0.5,
                6,
            )
            # a verdict of the other mode, or of other versions, is not this one
            assert db.verdict(p.key, INTERPRETER_DEVICE, versions, cuda_graphs=True) is None
            assert db.verdict(p.key, INTERPRETER_DEVICE, Versions("0", "0"), cuda_graphs=False) is None


def test_tune_model_tunes_what_the_model_needs_until_no_new_problem_appears(tmp_path, capsys):
    torch.manual_seed(0)
    db_path = str(tmp_path / "t.db")
    model, x = Block().eval(), torch.randn(2, 5, 16)
    with TuningDB.open(db_path) as db:
        tuner = Tuner(
            db, TuneOptions(budget=Budget(trials=1, patience=1), interpret=True, jobs=0, baselines=())
        )
        with tuner:
            report = tune_model(
                model, x, db=db, tuner=tuner, options=ModelOptions(check_context=False, measure=False)
            )
            told = capsys.readouterr().err  # by default the steps and each problem's tuning
            # two projections at M=10, each with its gemv twin
            assert len(report.tuned) == 4 and all(r.best is not None for r in report.tuned)
            assert report.passes == 2  # the second pass found nothing new
            _, problems = _problems(db_path, model, x)
            assert unserved(db, tuner.device, problems) == []
            again = tune_model(
                model,
                x,
                db=db,
                tuner=tuner,
                options=ModelOptions(check_context=False, measure=False),
                progress=False,
            )
    assert again.passes == 1 and again.tuned == []  # resumed: nothing left to tune
    assert "epilab: pass 1: " in told and told.count("epilab: tuned [") == 4, told
    # no total time given: one by the model's size (4 problems: the 45 s floor), said up front
    assert "epilab: expected: tuning 4 problem(s) in about 45 s" in told, told
    assert "compiles of ~" in told and " min in all" in told
    assert "epilab: tuned [4/4] " in told and " trials, " in told
    assert capsys.readouterr().err == ""  # progress=False: silent


class NormBlock(nn.Module):
    """A projection and residual, an RMSNorm, a projection: the norm folds with freezing."""

    def __init__(self, d: int = 16, f: int = 24) -> None:
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(d, d), nn.RMSNorm(d, eps=1e-6), nn.Linear(d, f)

    def forward(self, x):
        return self.down(self.norm(self.up(x) + x))


@pytest.mark.parametrize("freezing", [False, True], ids=["plain", "freezing"])
def test_tune_model_with_freezing_tunes_the_folded_norms_problems(freezing, tmp_path):
    torch.manual_seed(0)
    model, x = NormBlock().eval(), torch.randn(2, 5, 16)
    options = ModelOptions(check_context=False, measure=False, freezing=freezing)
    with TuningDB.open(str(tmp_path / "t.db")) as db:
        tuner = Tuner(
            db, TuneOptions(budget=Budget(trials=1, patience=1), interpret=True, jobs=0, baselines=())
        )
        with tuner:
            report = tune_model(model, x, db=db, tuner=tuner, options=options)
        problems = [Problem.from_json(db.problem_json(r.key)[1]) for r in report.tuned]
    # the residual's mean square joins its GEMM either way; the next GEMM scales by rstd[m]
    # (a per-row operand) only where the norm's weight is a constant folded into its weight
    assert any(p.epilogue.reductions for p in problems)
    assert any("broadcast=col" in p.epilogue.text() for p in problems) == freezing
    assert ("Inductor freezing" in report.method) == freezing


def test_problems_a_rejection_brings_in_are_checked_in_a_next_round(tmp_path):
    # every template loses in context; rejecting the folded projection leaves its norm
    # unfolded, and the plain projection's problem (chosen then) gets a verdict of its own
    torch.manual_seed(0)
    model, x = NormBlock().eval(), torch.randn(2, 5, 16)

    def timer(name, fn):  # each template on makes the model slower
        fn()
        ms = 0.9 + 0.1 * len(switched_on(name) or ())
        return Measured(ms, ms, ms, 1, "fake")

    options = ModelOptions(rounds=6, max_rounds=6, measure=False, freezing=True)
    with TuningDB.open(str(tmp_path / "t.db")) as db:
        tuner = Tuner(
            db, TuneOptions(budget=Budget(trials=1, patience=1), interpret=True, jobs=0, baselines=())
        )
        with tuner:
            report = tune_model(model, x, db=db, tuner=tuner, options=options, timer=timer)
        texts = [Problem.from_json(db.problem_json(v["problem"])[1]).epilogue.text() for v in report.verdicts]
    assert not any(v["keep"] for v in report.verdicts)
    # round 1: the producer (its sum of squares) and the folded projection (rstd, a per-row
    # operand); round 2: the producer as the unfolded norm reads it, the plain projection
    assert len(report.verdicts) == len({v["problem"] for v in report.verdicts}) == 4
    assert ["broadcast=col" in t for t in texts].count(True) == 1
    assert ["row_sum" in t for t in texts].count(True) == 2


def test_unknown_modes_and_rounds_that_decide_nothing_are_refused(tmp_path):
    with TuningDB.open(str(tmp_path / "t.db")) as db:
        with pytest.raises(ValueError, match="unknown mode"):
            tune_model(Block(), torch.randn(2, 16), db=db, options=ModelOptions(modes=("per kall",)))
        # 2 rounds a look, 3 looks: each held to 98.3%, which needs 7 rounds; 5 rounds, 1 look: 6
        for rounds, max_rounds in [(2, 6), (5, 5)]:
            with pytest.raises(ValueError, match="can decide nothing"):
                options = ModelOptions(rounds=rounds, max_rounds=max_rounds)
                tune_model(Block(), torch.randn(2, 16), db=db, options=options)


def test_cli_tune_model_refuses_bad_input_clearly(tmp_path):
    runner = CliRunner()
    db = str(tmp_path / "t.db")
    out = runner.invoke(
        app, ["tune", "--model", "nope_module:x", "--input", "2x8:float32", "--interpret", "--db", db]
    )
    assert out.exit_code == 1 and "cannot import 'nope_module'" in out.output
    out = runner.invoke(
        app, ["tune", "--suite", "smoke", "--input", "2x8:float32", "--interpret", "--db", db]
    )
    assert out.exit_code != 0 and "--input goes with --model" in out.output
    out = runner.invoke(app, ["tune", "--model", "a:b", "--suite", "smoke", "--interpret", "--db", db])
    assert out.exit_code == 1 and "exactly one of" in out.output


def _tune_block_on_gpu(tmp_path, trials: int, train: bool = False):
    """A Block at real size, tuned (cuBLAS baselines), checked and timed in both modes."""
    torch.manual_seed(0)
    model = Block(d=512, f=2048).to("cuda", torch.bfloat16).train(train)
    x = torch.randn(8, 128, 512, device="cuda", dtype=torch.bfloat16)
    modes = ("per call", "CUDA graphs")
    with TuningDB.open(str(tmp_path / "t.db")) as db:
        budget = Budget(trials=trials, seconds=20, patience=trials)
        with Tuner(db, TuneOptions(budget=budget, baselines=("cublas",))) as tuner:
            options = ModelOptions(rounds=6, max_rounds=12, modes=modes, train=train)
            report = tune_model(model, x, db=db, tuner=tuner, options=options)
    assert {r["mode"] for r in report.rows} == set(modes)
    assert all(r["ms"] > 0 and r["min_ms"] <= r["ms"] <= r["max_ms"] for r in report.rows)
    # every template the records chose was checked in each mode, and the verdict applied
    for mode in modes:
        verdicts = [v for v in report.verdicts if v["mode"] == mode]
        epilab_row = next(r for r in report.rows if r["mode"] == mode and r["variant"] == "epilab")
        assert epilab_row["templates"] <= sum(v["keep"] for v in verdicts)
    return model, x, report


@pytest.mark.gpu
def test_gpu_tune_model_checks_templates_in_context_and_measures(tmp_path):
    _, _, report = _tune_block_on_gpu(tmp_path, trials=4)
    assert len(report.tuned) == 2 and report.passes == 2


@pytest.mark.gpu
def test_gpu_tune_model_tunes_checks_and_times_a_training_step(tmp_path):
    from epilab.model_tuning.step import Workload

    model, x, report = _tune_block_on_gpu(tmp_path, trials=3, train=True)
    assert report.training and not report.skipped  # the step is captured in a CUDA graph
    # the forward's two projections and the backward's GEMMs
    assert len(report.tuned) >= 5, [r.label for r in report.tuned]
    # each parameter's gradient through epilab's step matches eager's
    grads = []
    for fn in (model, torch.compile(model, backend="epilab", options={"db": str(tmp_path / "t.db")})):
        Workload(model, (x,), train=True).bind(fn)()
        grads.append([p.grad.float() for p in model.parameters()])
    for got, want in zip(grads[1], grads[0], strict=True):
        assert (got - want).norm() <= 2e-2 * want.norm()


def _check_block(tmp_path, timer, options: ModelOptions) -> tuple:
    """A Block whose two problems' templates win alone, checked in context with ``timer``:
    (the report, the stored verdicts, the decisions of a compile after)."""
    torch.manual_seed(0)
    db_path = str(tmp_path / "t.db")
    model, x = Block().eval(), torch.randn(2, 5, 16)
    _, problems = _problems(db_path, model, x)
    _record_wins(db_path, problems)
    with TuningDB.open(db_path) as db:
        with Tuner(db, TuneOptions(interpret=True, jobs=0, baselines=())) as tuner:
            report = tune_model(model, x, db=db, tuner=tuner, options=options, timer=timer, progress=False)
        stored = [db.verdict(p.key, INTERPRETER_DEVICE, tuner.versions, cuda_graphs=False) for p in problems]
    decisions, _ = _problems(db_path, model, x)
    return report, stored, decisions


def test_an_undecided_verdict_keeps_the_aten_op_and_says_so(tmp_path):
    # the model with and without each template alternate in which is faster: the interval
    # straddles the margin at every look, the budget ends, Inductor is kept ("undecided")
    calls = {"n": 0}

    def timer(name, fn):
        calls["n"] += 1
        ms = 1.0 if switched_on(name) else (0.95 if calls["n"] % 2 else 1.05)
        return Measured(ms, ms, ms, 1, "fake")

    report, stored, decisions = _check_block(
        tmp_path, timer, ModelOptions(rounds=6, max_rounds=12, measure=False)
    )
    # the group of both straddles 1 (a loss may hide in it): each is judged alone, undecided
    assert [v["outcome"] for v in report.verdicts] == ["undecided", "undecided"]
    assert all(not v["keep"] and v["rounds"] == 12 for v in report.verdicts)
    assert all("in a group" not in v["why"] for v in report.verdicts)
    assert all(v is not None and v.outcome == "undecided" and v.rounds == 12 for v in stored)
    assert "| undecided |" in report.table() and "rule: a template is kept" in report.table()
    assert all(d.template is None and "no significant difference" in d.reason for d in decisions)


@pytest.mark.parametrize("gain", [0.025, 0.004])
def test_templates_too_small_to_decide_alone_are_kept_as_a_group(gain, tmp_path):
    # each template gains ``gain`` of the model's 1 ms: with the 1% margin, 2.5% each is kept as
    # a group of two (5%) at once; 0.4% each (0.8% together, the interval above 1) is a gain too
    # small for the margin: rejected whole, not split (its halves gain less still)
    timer = GainTimer(gain, {"epilab kept": 0.9, "inductor": 1.1})
    report, stored, decisions = _check_block(
        tmp_path, timer, ModelOptions(rounds=6, max_rounds=6, measure=False)
    )
    assert len(report.verdicts) == 2
    if gain > 0.01:
        assert [v["outcome"] for v in report.verdicts] == ["faster together"] * 2
        assert all(v["keep"] and v["ratio"]["low"] == pytest.approx(1 / 0.95) for v in report.verdicts)
        assert all(v is not None and v.keep and v.outcome == "faster together" for v in stored)
        assert timer.names.count("inductor") == 6
        assert all(d.template and "the others of its group" in d.reason for d in decisions)
    else:
        assert all(not v["keep"] and v["outcome"] == "not faster" for v in report.verdicts)
        assert all("judged in a group of 2" in v["why"] for v in report.verdicts)
        assert "inductor" not in timer.names  # nothing kept: nothing to time against Inductor
        assert all(d.template is None for d in decisions)


def test_problems_too_small_to_move_the_model_are_skipped_and_say_so(tmp_path):
    # the records say each problem's aten GEMM takes 2 ms; the model takes 1000 ms: both
    # together (8 ms at most) cannot move it by the 1% margin, so neither is timed
    timer = GainTimer({}, {"inductor": 1000.0}, base=1000.0)
    report, stored, decisions = _check_block(
        tmp_path, timer, ModelOptions(rounds=6, max_rounds=6, measure=False)
    )
    assert [v["outcome"] for v in report.verdicts] == ["skipped", "skipped"]
    assert all(not v["keep"] and v["ratio"] is None and "0.40%" in v["why"] for v in report.verdicts)
    assert len(timer.names) == 1  # the model's time, once: no comparison
    assert all(v is not None and v.outcome == "skipped" and "skipped in" in v.describe() for v in stored)
    assert "| skipped |" in report.table()
    assert all(d.template is None and "too small a share" in d.reason for d in decisions)


def test_a_group_that_may_lose_is_halved_then_judged_one_by_one():
    # largest potential first: the halves alternate so that each holds about half of it
    assert split(tuple("abcdefghi")) == [tuple("acegi"), tuple("bdfh")]
    # four or fewer: one by one (all losing, 4 comparisons where halving takes 2 + 4)
    assert split(tuple("abcd")) == [("a",), ("b",), ("c",), ("d",)]
    assert split(("a", "b")) == [("a",), ("b",)]


def test_no_speedup_is_claimed_where_epilab_keeps_no_template(tmp_path):
    # nothing recorded: epilab compiles Inductor's graph; a (noise) ratio of 1.2 is not a speedup
    model, x = Block().eval(), torch.randn(2, 5, 16)

    def timer(name, fn):
        ms = {"epilab": 1.0, "inductor": 1.2, "eager": 2.0}[name]
        return Measured(ms, ms, ms, 1, "fake")

    options = ModelOptions(rounds=6, max_rounds=6, check_context=False)
    with TuningDB.open(str(tmp_path / "t.db")) as db:
        tuner = Tuner(db, TuneOptions(budget=Budget(trials=0), interpret=True, jobs=0, baselines=()))
        with tuner:
            report = tune_model(model, x, db=db, tuner=tuner, options=options, timer=timer, progress=False)
    rows = {r["variant"]: r for r in report.rows}
    assert rows["epilab"]["templates"] == 0
    assert rows["inductor"]["speedup"]["same_graph"] and not rows["inductor"]["speedup"]["significant"]
    # against eager the comparison is real (Inductor's graph against eager PyTorch)
    assert rows["eager"]["speedup"]["significant"] and rows["eager"]["speedup"]["ratio"]["low"] == 2.0
    table = report.table()
    assert "same graph as Inductor" in table and "1.200x" not in table
    assert all(r["low_ms"] == r["high_ms"] == r["ms"] for r in report.rows)


class Fp8Mlp(nn.Module):
    def __init__(self, d: int = 32, f: int = 64) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d, dtype=torch.bfloat16)
        self.up, self.down = Fp8Linear(d, f), Fp8Linear(f, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(self.norm(x))))


def test_casts_leave_float8_and_matching_dtypes_alone():
    from epilab.model_tuning.load import cast_model, parse_dtype

    model = Fp8Mlp()
    cast_model(model, None, torch.bfloat16)  # the parameters match the input: nothing is cast
    assert model.up.weight.dtype == torch.float8_e4m3fn and model.up.scale.dtype == torch.float32
    cast_model(model, torch.float32, torch.bfloat16)  # --dtype float32: all but the float8
    assert model.norm.weight.dtype == model.up.scale.dtype == torch.float32
    assert model.up.weight.dtype == torch.float8_e4m3fn
    linear = nn.Linear(4, 4)
    cast_model(linear, None, torch.bfloat16)  # a float32 factory on bfloat16 inputs
    assert linear.weight.dtype == torch.bfloat16
    assert parse_dtype("bf16") is torch.bfloat16
    for bad in ("float8_e4m3fn", "int8", "banana"):
        with pytest.raises(ModelSpecError, match="float8 and integer tensors are never cast"):
            parse_dtype(bad)


def test_cli_tunes_a_float8_model_as_it_is(tmp_path, monkeypatch):
    (tmp_path / "fp8_zoo_for_test.py").write_text(
        textwrap.dedent(
            """
            import torch
            from test_model_tuning import Fp8Mlp
            def build():
                return Fp8Mlp(), (torch.randn(16, 32).to(torch.bfloat16),)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out_file = tmp_path / "report.json"
    args = ["tune", "--model", "fp8_zoo_for_test:build", "--interpret", "--db", str(tmp_path / "t.db")]
    args += ["--trials", "1", "--rounds", "6", "--max-rounds", "6", "--out", str(out_file)]
    out = CliRunner().invoke(app, args)
    sys.modules.pop("fp8_zoo_for_test", None)
    assert out.exit_code == 0, out.output
    import json

    report = json.loads(out_file.read_text())
    # both float8 GEMMs were found, tuned and checked in the model
    assert len(report["tuned"]) == 2 and all("float8_e4m3fn" in r["label"] for r in report["tuned"])
    assert len(report["verdicts"]) == 2 and {r["variant"] for r in report["rows"]} == {
        "eager",
        "inductor",
        "epilab",
    }
    bad = CliRunner().invoke(app, [*args[:4], "--dtype", "float8_e4m3fn", "--db", str(tmp_path / "u.db")])
    assert bad.exit_code == 1 and "never cast" in bad.output and not (tmp_path / "u.db").exists()


def test_cli_tune_model_train_tunes_the_backward_of_a_model_in_train_mode(tmp_path, monkeypatch):
    (tmp_path / "train_zoo_for_test.py").write_text(
        textwrap.dedent(
            """
            import torch
            import torch.nn.functional as F

            class Up(torch.nn.Linear):
                def forward(self, x):
                    assert self.training  # --train runs the model in train mode
                    return F.gelu(super().forward(x), approximate="tanh")

            def build():
                return Up(16, 24).eval(), (torch.randn(2, 5, 16),)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out_file = tmp_path / "report.json"
    args = ["tune", "--model", "train_zoo_for_test:build", "--interpret", "--db", str(tmp_path / "t.db")]
    args += ["--trials", "1", "--no-context", "--rounds", "6", "--max-rounds", "6", "--out", str(out_file)]
    out = CliRunner().invoke(app, [*args, "--train"])
    sys.modules.pop("train_zoo_for_test", None)
    assert out.exit_code == 0, out.output
    import json

    report = json.loads(out_file.read_text())
    assert report["training"] and "a training step (forward and backward)" in out.output
    # the forward's GEMM (its pre-activation kept for the backward) and the weight's gradient
    # grad.T @ x (24 x 16 over the 10 rows), each with its gemv twin
    shapes = {r["label"].split()[1] for r in report["tuned"]}
    assert shapes == {"10x24x16", "24x16x10"}, [r["label"] for r in report["tuned"]]
    assert {r["variant"] for r in report["rows"]} == {"eager", "inductor", "epilab"}


@pytest.mark.parametrize(
    "outcome, low, high, words",
    [
        ("not faster", 0.80, 0.90, "the model is faster without it"),
        ("not faster", 0.99, 1.005, "not faster with it by the margin"),
        ("undecided", 0.97, 1.04, "no significant difference"),
        ("slower than inductor", 1.00, 1.01, "not faster than Inductor"),
        (None, None, None, "the model is faster without it"),  # recorded before revision 0006
    ],
)
def test_a_rejected_verdict_says_why(outcome, low, high, words):
    from datetime import datetime, timezone

    from epilab.db.values import Verdict

    v = Verdict(
        "k",
        False,
        1.0,
        0.9,
        "block",
        False,
        "default",
        "m",
        Versions("t", "t"),
        datetime.now(timezone.utc),
        ratio_low=low,
        ratio_high=high,
        rounds=None if low is None else 8,
        outcome=outcome,
    )
    assert words in v.why_not()
    assert ("over 8 rounds" in v.describe()) == (low is not None)


def _training_problems(db_path, model, x):
    """The problems of one compiled training step (forward and backward graphs)."""
    from epilab.model_tuning.step import Workload

    Workload(model, (x,), train=True).bind(torch.compile(model, backend="epilab", options={"db": db_path}))()
    torch._dynamo.reset()
    decisions = epilab.explain(clear=True)
    with TuningDB.open(db_path) as db:
        return decisions, [Problem.from_json(db.problem_json(d.problem_key)[1]) for d in decisions]


def test_a_training_step_tunes_the_backward_and_keeps_its_verdicts_apart(tmp_path):
    torch.manual_seed(0)
    db_path = str(tmp_path / "t.db")
    model, x = Block().train(), torch.randn(2, 5, 16)
    _, inference = _problems(db_path, model, x)
    decisions, training = _training_problems(db_path, model, x)
    # the forward's two projections and the backward's GEMMs (grad @ W for the inputs' grads,
    # x.T @ grad for the weights'); the GELU's backward joins the first one's epilogue
    assert len(decisions) >= 5, [(d.anchor, d.shape, d.epilogue) for d in decisions]
    assert {p.key for p in training} - {p.key for p in inference}
    with TuningDB.open(db_path) as db:
        tuner = Tuner(
            db, TuneOptions(budget=Budget(trials=1, patience=1), interpret=True, jobs=0, baselines=())
        )
        with tuner:
            report = tune_model(
                model,
                x,
                db=db,
                tuner=tuner,
                options=ModelOptions(rounds=6, max_rounds=6, train=True),
                label="block",
                timer=lambda name, fn: Measured(
                    *(3 * [1.0 if switched_on(name) == set() or name == "inductor" else 0.9]), 1, "fake"
                ),
                progress=False,
            )
            assert report.training and "a training step" in report.table()
            assert not unserved(db, tuner.device, training)  # every training problem tuned
            tuned = {r.key for r in report.tuned}
            assert tuned & ({p.key for p in training} - {p.key for p in inference})
            kept = [v for v in report.verdicts if v["keep"]]
            assert kept, report.table()
            for v in kept:
                got = db.verdict(
                    v["problem"], INTERPRETER_DEVICE, tuner.versions, cuda_graphs=False, training=True
                )
                assert got is not None and got.keep and got.training and "a training step" in got.describe()
                # ... and none at inference: an inference compile does not follow it
                assert db.verdict(v["problem"], INTERPRETER_DEVICE, tuner.versions, cuda_graphs=False) is None
    # the training step was timed: eager, Inductor and epilab, each a forward and a backward
    assert {r["variant"] for r in report.rows} == {"eager", "inductor", "epilab"}
    with TuningDB.open(db_path) as db:  # a verdict that rejects each kept training template...
        for v in kept:
            db.record_verdict(
                Problem.from_json(db.problem_json(v["problem"])[1]),
                INTERPRETER_DEVICE,
                cuda_graphs=False,
                training=True,
                keep=False,
                with_ms=1.0,
                without_ms=0.5,
                context="train",
                timing_method="fake",
                versions=tuner.versions,
                outcome="not faster",
            )
    decisions, _ = _training_problems(db_path, model, x)
    assert all(d.template is None for d in decisions), [(d.shape, d.reason) for d in decisions]
    assert any("a training step" in d.reason for d in decisions)
    decisions, _ = _problems(db_path, model.eval(), x)  # ... leaves inference to its own records
    assert all("a training step" not in d.reason for d in decisions)


def test_train_refuses_a_model_with_nothing_to_train_and_freezing(tmp_path):
    model, x = Block().requires_grad_(False), torch.randn(2, 5, 16)
    with TuningDB.open(str(tmp_path / "t.db")) as db:
        with pytest.raises(ValueError, match="requires grad, and none does"):
            tune_model(model, x, db=db, options=ModelOptions(train=True), progress=False)
        with pytest.raises(ValueError, match="give train or freezing"):
            tune_model(Block(), x, db=db, options=ModelOptions(train=True, freezing=True), progress=False)
    result = CliRunner().invoke(app, ["tune", "--suite", "smoke", "--train", "--interpret"])
    assert result.exit_code != 0 and "--train goes with --model" in result.output
