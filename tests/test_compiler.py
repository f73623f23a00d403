"""The torch.compile backend on CPU, kernels in Triton's interpreter.

Each test compiles real module code with ``backend="epilab"``, compares the
outputs (and gradients) with eager in float64, and checks through
``epilab.explain()`` that the template was used where expected. Inductor's
caches are off so that every compilation runs the pass.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from records import record

import epilab
from epilab import config
from epilab.compiler.explain import table as explain_table
from epilab.db import INTERPRETER_DEVICE, TuningDB
from epilab.ir.check import rel_error
from epilab.ir.problem import Problem
from epilab.tuner import on_compile

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 1e-2}
ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}
# ops that show each decomposed activation in the fused epilogue's text


pytestmark = pytest.mark.usefixtures("fresh_compiler")


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "tuning.db")


def compiled(model, db_path, policy="always", mode=None, kernels=True, **kw):
    options = {"policy": policy, "db": db_path, **({"mode": mode} if mode else {})}
    options |= {} if kernels else {"kernels": False}
    return torch.compile(model, backend="epilab", options=options, **kw)


def check_close(out, ref, dtype=torch.float32):
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    for o, r in zip(outs, refs, strict=True):
        err = rel_error(o, r)
        assert err <= TOL[dtype], f"relative error {err:.3g} > {TOL[dtype]:.0e}"


def as64(module: nn.Module) -> nn.Module:
    """A float64 copy (``Module.double()`` converts in place)."""
    return copy.deepcopy(module).double()


def used(decisions, anchor=None):
    return [d for d in decisions if d.template and (anchor is None or d.anchor == anchor)]


class LinearAct(nn.Module):
    def __init__(self, act: str, k: int = 24, n: int = 40) -> None:
        super().__init__()
        self.up = nn.Linear(k, n)
        self.down = nn.Linear(n, k)
        self.act = ACTIVATIONS[act]

    def forward(self, x):
        return self.down(self.act(self.up(x))) + x


@pytest.mark.parametrize("act", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_linear_activation_residual_3d(act, dtype, db_path):
    torch.manual_seed(0)
    model = LinearAct(act).to(dtype)
    x = torch.randn(3, 7, 24, dtype=dtype)
    with torch.no_grad():
        out = compiled(model, db_path)(x)
        ref = as64(model)(x.double())
    check_close(out, ref, dtype)
    d = epilab.explain()
    up, down = used(d, "aten.addmm")
    assert up.epilogue == f"{act}(acc + bias[n])"  # the decomposed activation, recognised
    assert down.epilogue == "acc + bias[n] + op0", "the residual add is fused into the down projection"
    assert up.shape == "21x40x24" and down.shape == "21x24x40"


def test_bmm_attention_scores_with_scale(db_path):
    torch.manual_seed(0)

    def scores(q, k):
        return torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.125, dim=-1)

    q, k = torch.randn(3, 9, 16), torch.randn(3, 11, 16)
    out = compiled(scores, db_path)(q, k)
    check_close(out, scores(q.double(), k.double()))
    (d,) = epilab.explain()
    assert d.template == "matmul" and d.anchor == "aten.bmm" and d.epilogue.startswith("0.125 * acc ; ")


def test_addmm_alpha_beta(db_path):
    torch.manual_seed(0)

    def f(bias, a, b):
        return torch.addmm(bias, a, b, beta=0.5, alpha=2.0)

    args = (torch.randn(1, 13), torch.randn(9, 7), torch.randn(7, 13))
    check_close(compiled(f, db_path)(*args), f(*(t.double() for t in args)))
    (d,) = epilab.explain()
    assert d.template and d.epilogue == "2 * acc + 0.5 * bias[n]"


def test_a_value_used_twice_becomes_a_second_output(db_path):
    torch.manual_seed(0)
    lin = nn.Linear(16, 24)

    def f(x):
        h = lin(x)
        return torch.relu(h), h.sum(dim=-1)  # the sum is not pointwise: h leaves the group too

    x = torch.randn(9, 16)
    with torch.no_grad():
        out = compiled(f, db_path)(x)
        ref = (torch.relu(as64(lin)(x.double())), as64(lin)(x.double()).sum(-1))
    check_close(out, ref)
    (d,) = epilab.explain()
    assert d.template and d.epilogue == "relu(acc + bias[n]) ; acc + bias[n] -> row_sum", d.epilogue


def test_an_op_outside_the_table_ends_the_group(db_path):
    torch.manual_seed(0)
    lin = nn.Linear(16, 24)

    def f(x):
        return torch.cumsum(torch.relu(lin(x)), dim=-1) * 3.0

    x = torch.randn(5, 16)
    with torch.no_grad():
        out = compiled(f, db_path)(x)
        check_close(out, torch.cumsum(torch.relu(as64(lin)(x.double())), dim=-1) * 3.0)
    (d,) = epilab.explain()
    assert d.template and d.epilogue == "relu(acc + bias[n])"


def test_an_operand_computed_from_the_anchor_is_not_fused(db_path):
    torch.manual_seed(0)
    w = torch.randn(16, 8)

    def f(x):
        h = x @ w
        return h * h.amax()  # amax depends on h: fusing it would be a cycle

    x = torch.randn(6, 16)
    h64 = x.double() @ w.double()
    check_close(compiled(f, db_path)(x), h64 * h64.amax())
    (d,) = epilab.explain()
    assert d.template and d.epilogue == "acc"


def test_training_gradients_match_and_backward_matmuls_are_matched(db_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 6))
    ref = nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 6)).double()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x = torch.randn(2, 5, 12)
    out = compiled(model, db_path)(x)
    out.square().sum().backward()
    ref(x.double()).square().sum().backward()
    check_close(out, ref(x.double()))
    for (name, p), p64 in zip(model.named_parameters(), ref.parameters(), strict=True):
        err = rel_error(p.grad, p64.grad)
        assert err <= 1e-5, f"gradient of {name}: relative error {err:.3g}"
    d = epilab.explain()
    assert len(used(d, "aten.addmm")) == 2, "forward"
    assert len(used(d, "aten.mm")) >= 3, "backward: grad input and grad weights"


def test_dynamic_m_one_compile_serves_several_sizes(db_path):
    torch.manual_seed(0)
    lin = nn.Linear(16, 24)

    def f(x):
        return F.silu(lin(x))

    fn = compiled(f, db_path, dynamic=True)
    with torch.no_grad():
        for m in (5, 17, 64):
            x = torch.randn(m, 16)
            check_close(fn(x), F.silu(as64(lin)(x.double())))
    d = epilab.explain()
    assert len(d) == 1, "one compilation for every M"
    assert d[0].template and "buckets" in d[0].config and d[0].shape.startswith("s")


def test_cpu_tensors_stay_with_inductor_without_the_interpreter(db_path):
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with config.patch(interpret=False), torch.no_grad():
        check_close(compiled(lin, db_path)(x), as64(lin)(x.double()))
    (d,) = epilab.explain()
    assert d.template is None and "CPU" in d.reason


def test_policy_never_is_plain_inductor(db_path):
    lin = nn.Linear(8, 8)
    with torch.no_grad():
        compiled(lin, db_path, policy="never")(torch.randn(4, 8))
    assert epilab.explain() == []


def test_bad_options_are_refused_with_a_clear_error(db_path):
    lin = nn.Linear(8, 8)
    with pytest.raises(Exception, match="policy 'sometimes' is not one of"):
        compiled(lin, db_path, policy="sometimes")(torch.randn(4, 8))
    torch._dynamo.reset()
    bad = torch.compile(lin, backend="epilab", options={"no_such_option": 1})
    with pytest.raises(Exception, match="no_such_option"):
        bad(torch.randn(4, 8))


def test_epilab_compile_and_log_table(db_path, caplog):
    lin = nn.Linear(8, 8)
    with caplog.at_level(logging.INFO, logger="epilab.compiler"), torch.no_grad():
        epilab.compile(lin, db=db_path, policy="always")(torch.randn(4, 8))
    assert "anchor" in caplog.text and "aten.addmm" in caplog.text and "heuristic" in caplog.text


def test_epilab_log_1_prints_the_decision_table(tmp_path):
    code = (
        "import torch, epilab\n"
        "lin = torch.nn.Linear(16, 8)\n"
        "with torch.no_grad():\n"
        f"    epilab.compile(lin, policy='always', db={str(tmp_path / 'x.db')!r})(torch.randn(3, 16))\n"
    )
    env = {**os.environ, "EPILAB_LOG": "1", "EPILAB_INTERPRET": "1", "EPILAB_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "epilab decisions for one graph" in run.stderr and "aten.addmm" in run.stderr, run.stderr[-2000:]


WARM_SCRIPT = """
import sys, torch, epilab
from epilab.tuner import on_compile
on_compile.TUNE_NOW["trials"] = 2
print("the script's top level ran", file=sys.stderr)  # no __main__ guard: workers must not rerun it
torch.manual_seed(0)
lin = torch.nn.Linear(16, 24)
with torch.no_grad():
    epilab.compile(lambda t: torch.relu(lin(t)), db=sys.argv[1], tune_missing=True)(torch.randn(10, 16))
print("DECISIONS", [(d.source, d.replayed) for d in epilab.explain()])
"""


def test_a_warm_inductor_cache_still_reports_decisions_and_tunes_a_fresh_database(tmp_path):
    """Inductor's caches serve a compiled graph without running the pass: its decisions are
    replayed (explain and EPILAB_LOG), and a fresh database at the same path is tuned again.
    The script has no ``if __name__ == "__main__":`` guard: the tuner's spawned workers must
    not run it again."""
    script = tmp_path / "warm.py"
    script.write_text(WARM_SCRIPT)
    db = tmp_path / "tuning.db"
    env = {
        **os.environ,
        "EPILAB_INTERPRET": "1",
        "EPILAB_LOG": "1",
        "EPILAB_CACHE_DIR": str(tmp_path / "kernels"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }

    def run() -> tuple[str, str]:
        done = subprocess.run(
            [sys.executable, str(script), str(db)], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("DECISIONS")]
        return line, done.stderr

    line, log = run()
    assert line == "DECISIONS [('tuned now', False)]" and log.count("top level ran") == 1, log[-3000:]
    assert run()[0] == "DECISIONS [('exact record', False)]"  # the database changed: compiled again
    line, log = run()
    assert line == "DECISIONS [('exact record', True)]"  # served warm, its decisions replayed
    assert "Inductor's cache served it" in log and "aten.addmm" in log, log[-3000:]
    db.unlink()
    assert run()[0] == "DECISIONS [('tuned now', False)]"  # a fresh database is tuned, not skipped
    with TuningDB.open(db) as opened:
        assert opened.fingerprint().split(";")[0] != "0:None:None"


DELETED_SCRIPT = """
import os, sys, torch, epilab
from epilab.db import TuningDB
torch.manual_seed(0)
lin = torch.nn.Linear(16, 24)
for deleted in (False, True):
    if deleted:
        os.unlink(sys.argv[1])  # under this live process, whose backend opened it
    torch._dynamo.reset()
    with torch.no_grad():
        epilab.compile(lambda t: torch.relu(lin(t)), db=sys.argv[1])(torch.randn(10, 16))
    with TuningDB.open(sys.argv[1]) as db:
        print("PROBLEMS", db.stats(lambda text: True).problems, flush=True)
print("REPLAYED", [d.replayed for d in epilab.explain()])
"""


def test_a_database_deleted_under_a_live_process_is_made_again_and_learns_a_warm_graphs_problems(tmp_path):
    """The backend kept its engine of a deleted file ("no such table"); and a graph Inductor's
    cache served warm recorded none of its problems in the fresh database at the same path
    (its facts were the same: no records in either), so `tune --seen` found nothing."""
    script = tmp_path / "deleted.py"
    script.write_text(DELETED_SCRIPT)
    env = {
        **os.environ,
        "EPILAB_INTERPRET": "1",
        "EPILAB_CACHE_DIR": str(tmp_path / "kernels"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "t.db")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [x for x in done.stdout.splitlines() if x.startswith(("PROBLEMS", "REPLAYED"))]
    said = done.stdout + done.stderr[-3000:]
    assert len(lines) == 3 and lines[2] == "REPLAYED [False, True]", said  # the second served warm
    first, fresh = (int(x.split()[1]) for x in lines[:2])
    assert first > 0 and fresh == first, said  # the fresh database learned the problems (and twins)


def test_explain_prints_as_the_table_and_iterates_as_decisions(db_path):
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(approximate="tanh"))
    with torch.no_grad():
        epilab.compile(model, db=db_path, policy="always")(torch.randn(4, 8))
    decisions = epilab.explain()
    (d,) = list(decisions)
    assert (
        d.module == "0 (Linear)" and d.epilogue == "gelu_tanh(acc + bias[n])"
    )  # which Linear, what it fuses
    text = str(decisions)  # not a terminal here: Markdown
    header = [cell.strip() for cell in text.splitlines()[1].strip().strip("|").split("|")]
    assert header[:4] == ["module", "anchor", "shape", "template"]  # a Markdown table (tables.markdown)
    assert "aten.addmm" in text and "Decision(" not in text and "gelu_tanh(acc + bias[n])" in text
    assert decisions._repr_markdown_() == text  # a notebook shows the same
    # at a terminal of 80 columns: a rich table, no line wider, the columns left out said
    shown = explain_table(decisions, terminal=True, width=80)
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in shown.splitlines()]
    assert "┃" in shown and max(len(line) for line in plain) <= 80, shown
    said = "\n".join(plain)
    assert "0 (Linear)" in said and "gelu_tanh(acc +" in said and "left out to fit 80 columns" in said
    # a decision Inductor's cache served says so
    replayed = explain_table([dataclasses.replace(d, replayed=True)], terminal=False)
    assert "some replayed" in replayed and "replayed |" in replayed.splitlines()[-1]
    assert str(epilab.explain(clear=True)) == text and "no decisions" in str(epilab.explain())


# ----------------------------------------------------------- decisions from the db


def _seen_problem(db_path) -> Problem:
    (d,) = epilab.explain(clear=True)
    with TuningDB.open(db_path) as db:
        text = db.problem_json(d.problem_key)
    assert text is not None, "the compiler records the problems it sees"
    return Problem.from_json(text[1] if isinstance(text, tuple) else text)


CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "num_warps": 2, "num_stages": 1}


def _run(db_path, m=10, act=F.relu):
    torch.manual_seed(0)
    lin = nn.Linear(16, 24, bias=act is not None)
    x = torch.randn(m, 16)
    f = (lambda t: act(lin(t))) if act is not None else lin
    with torch.no_grad():
        out = torch.compile(f, backend="epilab", options={"db": db_path})(x)
        ref = as64(lin)(x.double())
        check_close(out, act(ref) if act is not None else ref)
    torch._dynamo.reset()


def test_auto_without_records_keeps_aten_and_records_the_problem(db_path):
    _run(db_path)
    (d,) = epilab.explain()
    assert d.template is None and "nothing recorded" in d.reason
    assert _seen_problem(db_path).shape.m == 10


@pytest.mark.parametrize(
    "trial_ms,baseline_ms,want",
    [(1.0, 2.0, "matmul"), (2.0, 1.0, None), (1.0, None, "matmul")],
    ids=["template-faster", "baseline-faster", "no-baseline"],
)
def test_decisions_follow_the_records(db_path, trial_ms, baseline_ms, want):
    _run(db_path)
    record(db_path, _seen_problem(db_path), CONFIG, trial_ms, baseline_ms)
    _run(db_path)
    (d,) = epilab.explain()
    assert d.template == want, d.reason
    assert d.source == "exact record" or want is None
    if want:
        assert d.config["BLOCK_N"] == 32 and d.config["num_warps"] == 2
    else:
        assert "faster than" in d.reason


@pytest.mark.parametrize(
    "bad",
    [
        {"variant": "atomic", "SPLIT_K": 2},
        {"EPILOGUE_SUBTILE": 4, "BLOCK_N": 16},
        {"variant": "sm90_pingpong"},  # a Gluon kernel: not on this device
        {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "num_stages": 6},  # 1.5 MB of shared memory
    ],
    ids=["gemv-variant-on-matmul", "subtile-wider-than-the-tile", "gluon-off-sm90", "over-shared-memory"],
)
def test_records_the_template_cannot_run_are_passed_over(db_path, bad):
    """An "ok" record (an import, another version's) whose config the kind's own rules refuse
    is never chosen to fail on the first call: the next usable record is (issue 38, item 3)."""
    _run(db_path)
    problem = _seen_problem(db_path)
    record(db_path, problem, {**CONFIG, **bad}, 0.5, 2.0)  # the fastest, and not runnable
    _run(db_path)
    (d,) = epilab.explain(clear=True)
    assert d.template is None and "nothing recorded" in d.reason, d
    record(db_path, problem, CONFIG, 1.0, 2.0)
    _run(db_path)
    (d,) = epilab.explain()
    assert d.template == "matmul" and d.config == {**d.config, **CONFIG}, d


@pytest.mark.parametrize(
    "act,trial_ms,baseline_ms,want",
    [
        (None, 0.030, 0.060, None),
        (F.relu, 0.030, 0.060, "matmul"),
        (F.relu, 0.010, 0.020, None),
        (F.relu, 0.030, 0.035, None),
        (F.relu, 0.030, None, None),
        (F.relu, 0.060, None, "matmul"),
    ],
    ids=[
        "nothing-fused-30us",
        "relu-30us",
        "relu-10us",
        "relu-saves-5us",
        "relu-30us-no-baseline",
        "relu-60us",
    ],
)
def test_launch_bound_templates_keep_aten(db_path, act, trial_ms, baseline_ms, want):
    _run(db_path, act=act)
    record(db_path, _seen_problem(db_path), CONFIG, trial_ms, baseline_ms)
    _run(db_path, act=act)
    (d,) = epilab.explain()
    assert d.template == want, d.reason
    assert want or "launch-bound" in d.reason


def test_small_m_takes_the_gemv_template_when_its_record_is_faster(db_path):
    from epilab.templates.gemv.gemv import gemv_twin

    _run(db_path, m=10)
    problem = _seen_problem(db_path)
    gemv_config = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 1, "GROUP_M": 1}
    record(db_path, problem, CONFIG, 1.0, 3.0)
    record(db_path, gemv_twin(problem), {**gemv_config, "SPLIT_K": 2, "variant": "atomic"}, 0.5, 3.0)
    _run(db_path, m=10)  # checks the outputs against float64
    (d,) = epilab.explain()
    assert d.template == "gemv" and d.config["variant"] == "atomic", d


@pytest.mark.parametrize("m,n", [(3, 40), (40, 5)], ids=["small-m", "small-n"])
def test_always_runs_skinny_matmuls_on_the_gemv_heuristic_without_records(db_path, m, n):
    from epilab.templates.gemv.gemv import default_gemv_config

    torch.manual_seed(0)
    lin = nn.Linear(24, n)
    x = torch.randn(m, 24)
    with torch.no_grad():
        out = compiled(lambda t: torch.relu(lin(t)), db_path)(x)
    check_close(out, torch.relu(as64(lin)(x.double())))
    (d,) = epilab.explain()
    assert d.template == "gemv" and d.source == "heuristic", d
    with TuningDB.open(db_path) as db:
        problem = Problem.from_json(db.problem_json(d.problem_key)[1])
    assert d.config == default_gemv_config(problem, "interpreter").to_dict()


def test_nearest_record_is_used_and_noted(db_path):
    _run(db_path, m=10)
    problem = _seen_problem(db_path)
    other = dataclasses.replace(problem, shape=dataclasses.replace(problem.shape, m=16))
    record(db_path, other, CONFIG, 1.0, 2.0)
    _run(db_path, m=10)
    (d,) = epilab.explain()
    assert d.template == "matmul" and d.source == "nearest record (M=16)", (d.source, d.reason)


def test_tune_missing_tunes_now_and_stores(db_path, monkeypatch, capsys):
    monkeypatch.setitem(on_compile.TUNE_NOW, "trials", 2)
    torch.manual_seed(0)
    lin = nn.Linear(16, 24)
    x = torch.randn(10, 16)
    with torch.no_grad():
        out = epilab.compile(lambda t: torch.relu(lin(t)), db=db_path, tune_missing=True)(x)
    check_close(out, F.relu(as64(lin)(x.double())))
    (d,) = epilab.explain()
    assert d.source == "tuned now" and d.template in ("matmul", "gemv"), d.reason
    told = capsys.readouterr().err.splitlines()  # a line as each problem starts and ends
    assert [line.split(" 10x24x16")[0] for line in told] == [
        "epilab: tuning addmm",
        "epilab: tuned addmm",
    ] * 2, told
    with TuningDB.open(db_path) as db:
        assert db.best(d.problem_key, INTERPRETER_DEVICE) is not None


# ------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_gpu_linear_block_matches_eager_in_every_mode(mode, db_path):
    torch.manual_seed(0)
    model = LinearAct("gelu_tanh", k=512, n=1536).to("cuda", torch.bfloat16)
    fn = compiled(model, db_path, mode=mode)
    with torch.no_grad():
        for m in (1, 127, 1024):
            x = torch.randn(2, m, 512, device="cuda", dtype=torch.bfloat16)
            for _ in range(3):  # CUDA graphs record on a later call
                out = fn(x)
            check_close(out.float(), as64(model)(x.double()), torch.bfloat16)
    assert len(used(epilab.explain(), "aten.addmm")) >= 2


@pytest.mark.gpu
def test_gpu_training_step_matches_eager(db_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.SiLU(), nn.Linear(1024, 256)).cuda()
    ref = as64(model)
    x = torch.randn(4, 100, 256, device="cuda")
    out = compiled(model, db_path)(x)
    out.square().sum().backward()
    ref(x.double()).square().sum().backward()
    for p, p64 in zip(model.parameters(), ref.parameters(), strict=True):
        assert rel_error(p.grad, p64.grad) <= 1e-5
    assert len(used(epilab.explain(), "aten.mm")) >= 3


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,n", [(1, 4096), (4, 14336), (2048, 8)], ids=["decode-m1", "decode-m4", "router-n8"]
)
def test_gpu_compiler_runs_the_gemv_template_where_its_record_wins(db_path, m, n):
    from epilab.db import DeviceInfo
    from epilab.templates.gemv.gemv import gemv_twin

    torch.manual_seed(0)
    lin = nn.Linear(4096, n).to("cuda", torch.bfloat16)

    def model(t):
        return F.gelu(lin(t), approximate="tanh")

    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        compiled(model, db_path, policy="auto")(x)
        problem = _seen_problem(db_path)
        gemv = {**CONFIG, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}
        device = DeviceInfo.of_cuda(0)
        record(db_path, problem, CONFIG, 1.0, 0.9, device=device)
        record(db_path, gemv_twin(problem), {**gemv, "SPLIT_K": 4, "variant": "two_pass"}, 0.5, 0.9, device)
        torch._dynamo.reset()
        out = compiled(model, db_path, policy="auto")(x)
    check_close(out.float(), F.gelu(as64(lin)(x.double()), approximate="tanh"), torch.bfloat16)
    (d,) = epilab.explain()
    assert d.template == "gemv" and d.config["variant"] == "two_pass", d


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", [True, False], ids=["as-kernels", "as-op"])
@pytest.mark.parametrize("variant", ["tma", "tma_persistent", "stream_k", "tma_stream_k"])
def test_gpu_compiler_replays_a_tma_record_with_each_calls_tensors(db_path, variant, kernels):
    """A recorded tma (or stream-K) config runs through the backend, on each call's own
    tensors (new inputs give their own results): emitted as Inductor's kernels (descriptors
    over each call's tensors, stream-K's workspace a buffer of the graph), and through the
    custom op (``kernels=False``), whose later calls replay the launch with TMA descriptors
    remade over their tensors and stream-K's workspace looked up per call."""
    from epilab.db import DeviceInfo

    torch.manual_seed(0)
    lin = nn.Linear(1024, 768).to("cuda", torch.bfloat16)

    def model(t):
        return F.gelu(lin(t), approximate="tanh")

    xs = [torch.randn(1000, 1024, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    with torch.no_grad():
        compiled(model, db_path, policy="auto")(xs[0])
        problem = _seen_problem(db_path)
        tma = {**CONFIG, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "variant": variant}
        record(db_path, problem, tma, 0.5, 0.9, device=DeviceInfo.of_cuda(0))
        torch._dynamo.reset()
        epilab.explain(clear=True)
        run = compiled(model, db_path, policy="auto", kernels=kernels)
        for x in xs:  # the first call binds, the others replay
            check_close(run(x).float(), F.gelu(as64(lin)(x.double()), approximate="tanh"), torch.bfloat16)
    decisions = used(epilab.explain())
    assert decisions and all(d.template == "matmul" and d.config["variant"] == variant for d in decisions)
    assert all((d.runs_as == "kernel") == kernels for d in decisions), [d.runs_as for d in decisions]
    if kernels:
        return
    from epilab.compiler import op

    replayed = [r for r, _ in op._replays.values()]
    if variant.startswith("tma"):
        assert any(r.descriptors for r in replayed), "the tma launch was not replayed"
    if variant.endswith("stream_k"):
        assert any(r.workspace for r in replayed), "the stream-K launch was not replayed"


def test_a_replayed_twin_launch_gets_the_views_its_kernel_reads():
    """A replayed launch of a 1x1 convolution's matmul twin is handed the 2-D views its
    kernel reads, not the call's 4-D tensors: a TMA descriptor is made over their shapes
    (an MBConv stage's expansion on an sm90 record failed with "rank mismatch" at its
    second call, before this)."""
    from epilab.compiler import op
    from epilab.templates import registry
    from epilab.templates.conv.conv_spec import ConvSpec
    from epilab.templates.runtime.replay import replay_key
    from epilab.templates.verify import random_inputs

    conv = ConvSpec(2, 8, 3, 5, 16, 1, 1, epilogue="bias").problem()
    (twin,) = [t for t in registry.twins(conv) if t.template == "matmul"]
    x, w, operands = random_inputs(conv, "cpu", 0)
    got = []

    def replay(tensors):
        got.append([tuple(t.shape) for t in tensors])
        return [torch.full((2 * 3 * 5, 16), 2.0)]  # the kernel's [M, N] output

    tensors = [x, w, *operands.values()]
    key = (twin.to_json(), "plan", replay_key(tensors))
    op._replays[key] = (replay, registry.twin_call(twin, x, w))
    try:
        (out,) = op.template_call(twin.to_json(), "plan", x, w, list(operands.values()))
    finally:
        del op._replays[key]
    assert got[0][:2] == [(30, 8), (8, 16)]  # A [N*H*W, C] and B [C, K]: the matmul's
    assert out.shape == (2, 16, 3, 5) and out.is_contiguous(memory_format=torch.channels_last)
    assert bool((out == 2.0).all())


@pytest.mark.gpu
def test_gpu_a_1x1_convolutions_matmul_twin_replays_a_tma_record(db_path):
    """A recorded sm90 TMA config of a 1x1 convolution's matmul twin, called three times
    (the first binds, the others replay), gives each call's own result."""
    from epilab.db import DeviceInfo
    from epilab.templates import registry

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the sm90 variants need a Hopper GPU")
    torch.manual_seed(0)
    conv = nn.Conv2d(64, 128, 1).to("cuda", torch.bfloat16).to(memory_format=torch.channels_last)
    xs = [
        torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.bfloat16).contiguous(
            memory_format=torch.channels_last
        )
        for _ in range(3)
    ]

    def model(t):
        return F.silu(conv(t))

    with torch.no_grad():
        compiled(model, db_path, policy="auto")(xs[0])
        (twin,) = [t for t in registry.twins(_seen_problem(db_path)) if t.template == "matmul"]
        # the config tuning chose for an MBConv stage's expansion (H100), which failed to replay
        tma = {
            **CONFIG,
            **{"BLOCK_M": 256, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 8, "num_stages": 3},
            **{"TMA_STORE": 1, "variant": "sm90_persistent"},
        }
        record(db_path, twin, tma, 0.5, 0.9, device=DeviceInfo.of_cuda(0))
        torch._dynamo.reset()
        run = compiled(model, db_path, policy="auto")
        for x in xs:
            check_close(run(x).float(), F.silu(as64(conv)(x.double())), torch.bfloat16)
    assert any(
        d.template == "matmul" and d.config["variant"] == "sm90_persistent" for d in used(epilab.explain())
    )


def test_epilab_tune_seen_tunes_what_the_compiler_recorded(db_path, monkeypatch):
    from typer.testing import CliRunner

    import epilab.cli

    _run(db_path)  # compiles with auto: nothing recorded yet, the problem is stored
    (d,) = epilab.explain(clear=True)
    monkeypatch.setattr(epilab.cli.console, "width", 200)
    runner = CliRunner()
    args = ["tune", "--seen", "--interpret", "--trials", "2", "--db", db_path]
    result = runner.invoke(epilab.cli.app, args)
    assert result.exit_code == 0, result.output
    assert "addmm 10x24x16 float32 row/col" in result.output, result.output
    with TuningDB.open(db_path) as db:
        assert db.best(d.problem_key, INTERPRETER_DEVICE) is not None
    again = runner.invoke(epilab.cli.app, args)
    assert again.exit_code == 0 and "nothing to tune" in again.output, again.output


def test_dynamic_3d_input_grows_over_symbolic_views(db_path):
    torch.manual_seed(0)
    model = LinearAct("gelu", k=16, n=24)
    fn = compiled(model, db_path, dynamic=True)
    with torch.no_grad():
        for b, s in ((2, 5), (3, 7)):
            x = torch.randn(b, s, 16)
            check_close(fn(x), as64(model)(x.double()))
    d = epilab.explain()
    up, down = used(d, "aten.addmm")
    assert (up.epilogue, down.epilogue) == ("gelu(acc + bias[n])", "acc + bias[n] + op0")


# ---------------------------------------------------------------- convolutions


class Bottleneck(nn.Module):
    """conv-bn-relu, conv-bn, + residual, relu (eval mode: batch norms are per-channel affines)."""

    def __init__(self, c: int = 16, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def _randomized(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model.eval()


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
def test_resnet_block_convolutions_take_the_template_with_bn_relu_residual_fused(db_path, channels_last):
    torch.manual_seed(0)
    model = _randomized(Bottleneck())
    x = torch.randn(2, 16, 7, 6)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        out = compiled(model, db_path)(x)
        check_close(out, as64(model)(x.double()))
    decisions = epilab.explain()
    convs = used(decisions, "aten.conv2d")
    assert len(convs) == 2 and all(d.template == "conv2d" for d in convs), [
        (d.anchor, d.reason) for d in decisions
    ]
    first, second = convs
    bn = "(acc - op0[n]) * op1[n] * op2[n] + op3[n]"  # the batch norm's four vectors
    assert first.epilogue == f"relu({bn})"
    assert second.epilogue == f"relu({bn} + op4)"  # + the residual, then relu


def test_template_calls_get_the_strides_their_problem_was_made_for(db_path, monkeypatch):
    """Issue 15: a convolution after a max pool, on the template while the one before stays
    on aten. Inductor lays out the pool's output as it likes unless the call pins its inputs'
    strides; before the fix the call got NCHW for an NHWC problem and its output broke the
    graph's stride assertion."""
    from epilab.compiler import op
    from epilab.templates.conv.conv_geometry import conv_layout

    torch.manual_seed(0)
    block1 = [nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)]
    block2 = [nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    net = _randomized(nn.Sequential(*block1, *block2)).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        compiled(net, db_path, policy="auto")(x)
        first, second = epilab.explain(clear=True)
        with TuningDB.open(db_path) as db:
            problems = [Problem.from_json(db.problem_json(d.problem_key)[1]) for d in (first, second)]
        record(db_path, problems[0], {**CONFIG, "BLOCK_N": 16}, 2.0, 1.0)  # aten is faster
        record(db_path, problems[1], {**CONFIG, "BLOCK_N": 16}, 1.0, 2.0)  # the template is
        seen = []
        real_bind = op.bind

        def spy(problem, config, a, *args, **kw):
            seen.append((problem.layout_a, conv_layout(a)))
            return real_bind(problem, config, a, *args, **kw)

        monkeypatch.setattr(op, "bind", spy)
        torch._dynamo.reset()
        out = compiled(net, db_path, policy="auto")(x)
    check_close(out, as64(net)(x.double()))
    assert [d.template for d in epilab.explain()] == [None, "conv2d"]
    assert seen == [("nhwc", "nhwc")], seen


def test_conv_with_bias_stride_and_groups_through_the_backend(db_path):
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=2)
    x = torch.randn(1, 16, 9, 8)
    with torch.no_grad():
        out = compiled(lambda t: F.silu(conv(t)), db_path)(x)
        check_close(out, F.silu(as64(conv)(x.double())))
    (d,) = used(epilab.explain(), "aten.conv2d")
    assert d.template == "conv2d" and d.epilogue == "silu(acc + bias[n])"  # silu, recognised


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand + BN + ReLU6, 3x3 depthwise + BN + ReLU6, 1x1 project
    + BN, + the input."""

    def __init__(self, c: int = 8, expand: int = 3) -> None:
        super().__init__()
        h = c * expand
        self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6())
        self.depthwise = nn.Sequential(
            nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6()
        )
        self.project = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.project(self.depthwise(self.expand(x)))


def test_a_depthwise_convolution_takes_the_depthwise_template_with_its_bn_relu6_fused(db_path):
    """Under ``always`` its heuristic is preferred to the implicit GEMM's; a second batch size
    recompiles with a dynamic batch (Dynamo's automatic dynamic shapes): the convolutions stay
    on their templates, decided at a representative batch."""
    torch.manual_seed(0)
    block = _randomized(InvertedResidual()).to(memory_format=torch.channels_last)
    run = compiled(block, db_path)
    with torch.no_grad():
        for batch, dynamic in ((2, False), (3, True)):
            x = torch.randn(batch, 8, 6, 5).contiguous(memory_format=torch.channels_last)
            check_close(run(x), as64(block)(x.double()))
            convs = used(epilab.explain(clear=True), "aten.conv2d")
            assert [d.template for d in convs] == ["conv2d", "depthwise", "conv2d"], [
                (d.template, d.reason) for d in convs
            ]
            assert all(("dynamic batch" in d.reason) == dynamic for d in convs), [d.reason for d in convs]
    dw = convs[1].epilogue
    assert dw == "relu6((acc - op0[n]) * op1[n] * op2[n] + op3[n])", dw  # the batch norm and ReLU6, fused


class MBConv(nn.Module):
    """EfficientNet's block: 1x1 expand + BN + SiLU, 5x5 depthwise + BN + SiLU, a
    squeeze-excite (global average pool, two 1x1 convolutions, sigmoid gate), 1x1 project +
    BN, + the input."""

    def __init__(self, c: int = 8, expand: int = 4, squeeze: int = 8) -> None:
        super().__init__()
        h = c * expand
        self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.SiLU())
        self.depthwise = nn.Sequential(
            nn.Conv2d(h, h, 5, 1, 2, groups=h, bias=False), nn.BatchNorm2d(h), nn.SiLU()
        )
        self.squeeze, self.excite = nn.Conv2d(h, squeeze, 1), nn.Conv2d(squeeze, h, 1)
        self.project = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        y = self.depthwise(self.expand(x))
        gate = torch.sigmoid(self.excite(F.silu(self.squeeze(y.mean((2, 3), keepdim=True)))))
        return x + self.project(y * gate)


def test_a_squeeze_excite_pool_joins_the_depthwise_convolutions_epilogue(db_path):
    """The SE's global average pool after the depthwise conv + BN + SiLU is a column
    statistic (per image and channel over the pixels) of the depthwise template's epilogue."""
    torch.manual_seed(0)
    block = _randomized(MBConv()).to(memory_format=torch.channels_last)
    x = torch.randn(2, 8, 8, 8).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        check_close(compiled(block, db_path)(x), as64(block)(x.double()))
    convs = used(epilab.explain(), "aten.conv2d")
    (dw,) = [d for d in convs if d.template == "depthwise"]
    y = "silu((acc - op0[n]) * op1[n] * op2[n] + op3[n])"  # SiLU, then the pool
    assert dw.epilogue == f"{y} ; 0.015625 * {y} -> col_sum", dw.epilogue


def test_a_1x1_convolution_runs_as_a_matmul_when_that_record_is_faster(db_path):
    from epilab.templates.registry import twins

    torch.manual_seed(0)
    conv = nn.Conv2d(32, 24, 1).to(memory_format=torch.channels_last)
    x = torch.randn(2, 32, 5, 3).contiguous(memory_format=torch.channels_last)
    r = torch.randn(2, 24, 5, 3).contiguous(memory_format=torch.channels_last)

    def f(t, res):
        return torch.relu(conv(t) + res)

    with torch.no_grad():
        compiled(f, db_path, policy="auto")(x, r)
        problem = _seen_problem(db_path)
        conv_problem, matmul_problem = twins(problem)
        record(db_path, conv_problem, {**CONFIG, "BLOCK_M": 16}, 1.0, 2.0)
        record(db_path, matmul_problem, CONFIG, 0.5, 2.0)
        torch._dynamo.reset()
        out = compiled(f, db_path, policy="auto")(x, r)
    check_close(out, torch.relu(as64(conv)(x.double()) + r.double()))
    (d,) = epilab.explain()
    assert d.anchor == "aten.conv2d" and d.template == "matmul", d


@pytest.mark.gpu
def test_gpu_resnet_block_and_a_1x1_twin_match_eager(db_path):
    from epilab.db import DeviceInfo
    from epilab.templates.registry import twins

    torch.manual_seed(0)
    model = _randomized(Bottleneck(64)).to("cuda", torch.bfloat16).to(memory_format=torch.channels_last)
    x = torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last
    )
    with torch.no_grad():
        for _ in range(2):  # the second call replays the launches
            out = compiled(model, db_path)(x)
        check_close(out.float(), as64(model)(x.double()), torch.bfloat16)
    assert len(used(epilab.explain(), "aten.conv2d")) == 2
    torch._dynamo.reset()
    epilab.explain(clear=True)
    conv = nn.Conv2d(64, 256, 1).to("cuda", torch.bfloat16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        compiled(lambda t: torch.relu(conv(t)), db_path, policy="auto")(x)
        conv_problem, matmul_problem = twins(_seen_problem(db_path))
        device = DeviceInfo.of_cuda(0)
        record(
            db_path,
            conv_problem,
            {**CONFIG, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4},
            1.0,
            2.0,
            device,
        )
        record(
            db_path,
            matmul_problem,
            {**CONFIG, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4},
            0.5,
            2.0,
            device,
        )
        torch._dynamo.reset()
        fn = compiled(lambda t: torch.relu(conv(t)), db_path, policy="auto")
        for _ in range(2):
            out = fn(x)
    check_close(out.float(), torch.relu(as64(conv)(x.double())), torch.bfloat16)
    assert out.is_contiguous(memory_format=torch.channels_last)
    (d,) = epilab.explain()
    assert d.template == "matmul", d
