"""`epilab report`: the HTML file's structure for a prepared database, escaping of
hostile strings, the empty database, thousands of records, optuna study plots, and
the page in a real browser (headless Chromium: no console errors, plots drawn)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from epilab.cli import app
from epilab.cli.common import is_current_now
from epilab.db import DeviceInfo, Timing, TuningDB, Versions
from epilab.reports import data as report_data
from epilab.reports import html as report_html
from epilab.templates.gemm.gemm_spec import Spec
from epilab.tuner.search import PENALTY

HOSTILE = "<script>alert('x')</script>"
NBYTES = 8_000_000  # what the records say each problem moves (GB/s x ms)
H200 = DeviceInfo("NVIDIA H200", "9.0", 132)
EVIL_GPU = DeviceInfo(f"GPU {HOSTILE}", "9.0", 132)
VERSIONS = Versions("2.11.0+cu130", "3.6.0")
CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
PROBLEMS = [
    Spec(1024, 1024, 1024, epilogue="bias_gelu_tanh"),  # addmm
    Spec(2048, 512, 256),  # mm
    Spec(64, 64, 64, batch=4, layout="NN"),  # bmm
]


def _timing(
    ms: float,
    graph: float | None = None,
    method: str = "cuda-events; L2 flushed before each of 99 reps; median",
) -> Timing:
    return Timing(ms, ms * 0.98, ms * 1.03, method, graph_ms=graph, gbps=NBYTES / (ms * 1e6))


def _fill(
    db: TuningDB,
    device: DeviceInfo = H200,
    *,
    trials: int = 3,
    failures: int = 1,
    detail: str = "boom",
    specs: list[Spec] = PROBLEMS,
) -> None:
    for i, spec in enumerate(specs):
        problem = spec.problem()
        for t in range(trials):
            db.record_trial(
                problem,
                device,
                config={**CONFIG, "num_stages": 1 + t % 6},
                status="ok",
                timing=_timing(0.1 * (i + 1) * (1 + 0.1 * t)),
                max_rel_error=1e-3,
                versions=VERSIONS,
                study=f"study-{i}",
                trial_number=t,
            )
        for f in range(failures):
            db.record_trial(
                problem,
                device,
                config={**CONFIG, "num_warps": 8, "num_stages": 1 + f % 6},
                status="incorrect",
                timing=None,
                max_rel_error=None,
                versions=VERSIONS,
                study=f"study-{i}",
                trial_number=100 + f,
                detail=detail,
            )
        db.record_baseline(
            problem,
            device,
            library="cublas",
            timing=_timing(0.15 * (i + 1)),
            max_rel_error=1e-3,
            versions=VERSIONS,
        )
        if i != 1:
            db.record_baseline(
                problem,
                device,
                library="inductor",
                timing=_timing(0.08 * (i + 1)),
                max_rel_error=1e-3,
                versions=VERSIONS,
            )


def _collect(db: TuningDB, **kw) -> report_data.ReportData:
    return report_data.collect(db.snapshot(), db_url=db.url, is_current=is_current_now, **kw)


class _Page(HTMLParser):
    """Tables (class -> rows of cell texts), element ids, JSON script blocks."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.scripts: dict[str, str] = {}
        self._cell: list[str] | None = None
        self._script: str | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "table":
            self.tables.append((a.get("class", ""), []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "script" and a.get("type") == "application/json":
            self._script = a["id"]
            self.scripts[self._script] = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "script":
            self._script = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._script is not None:
            self.scripts[self._script] += data


@pytest.fixture
def db(tmp_path):
    with TuningDB.open(str(tmp_path / "tuning.db")) as store:
        yield store


def test_report_has_the_rows_speedups_and_plot_containers(db):
    _fill(db)
    data = _collect(db)
    assert data.device == H200 and len(data.tuned) == 3 and data.failed_total == 3
    addmm = next(p for p in data.problems if p.op == "addmm")
    assert addmm.ms == pytest.approx(0.1) and addmm.speedups["cublas"] == pytest.approx(1.5)
    assert addmm.nbytes == NBYTES and addmm.flops == 2 * 1024**3
    assert addmm.speedups["inductor"] == pytest.approx(0.8)
    # every speedup says how both sides were timed (graph replay only where both have one)
    assert set(addmm.timed_as) == set(addmm.speedups) and set(addmm.timed_as.values()) <= {"graph", "events"}
    assert data.geomean("cublas")[0] == pytest.approx(1.5)
    assert 'data-how="' in report_html.render(data)
    page = _Page(report_html.render(data))
    problems = {cls: rows for cls, rows in page.tables if "problems" in cls}
    assert len([c for c, _ in page.tables if "problems" in c]) == 3  # one table per op
    rows = [r for cls, rs in page.tables if "problems" in cls for r in rs[1:]]
    assert len(rows) == 3 and problems
    head = next(rs[0] for cls, rs in page.tables if "problems" in cls)
    assert "vs cublas" in head and "vs inductor" in head and "% of roofline" in head
    addmm_row = next(r for r in rows if r[0].startswith("1024x1024x1024"))
    assert "row/col gelu_tanh(acc + bias[n]) [matmul]" in addmm_row[0]
    assert addmm_row[1] == "gelu_tanh(acc + bias[n])"  # one text for the epilogue everywhere
    assert addmm_row[3] == "0.1000" and "1.50x" in addmm_row and "0.80x" in addmm_row
    assert {"plot-throughput", "plot-roofline", "plot-speedups"} <= page.ids
    for name in ("fig-throughput", "fig-roofline", "fig-speedups"):
        fig = json.loads(page.scripts[name])
        assert fig["data"], name
    failures = next(rs for cls, rs in page.tables if "failures" in cls)
    assert len(failures) == 1 + 3 and all(r[3] == "incorrect" for r in failures[1:])
    assert "NVIDIA H200 (sm 9.0, 132 SMs)" in report_html.render(data)
    assert "CUDA 13.0" in report_html.render(data)


def _rows(page: _Page) -> tuple[list[str], list[list[str]]]:
    tables = [rs for cls, rs in page.tables if "problems" in cls]
    return tables[0][0], [r for rs in tables for r in rs[1:]]


def test_each_spread_is_shown_with_its_own_median(db):
    """The compared time is the graph time where one was measured; the events' p20-p80 sit
    beside the events median, never beside the graph time (a graph median of 0.0114 ms next
    to p20-p80 of 0.0176-0.0185 read as a median outside its own spread)."""
    problem = PROBLEMS[1].problem()
    timing = Timing(0.018, 0.0176, 0.0185, "events and graph", graph_ms=0.0114, gbps=1.0)
    db.record_trial(
        problem,
        H200,
        config=CONFIG,
        status="ok",
        timing=timing,
        max_rel_error=1e-3,
        versions=VERSIONS,
        study="spread",
    )
    head, (row,) = _rows(_Page(report_html.render(_collect(db))))
    cells = dict(zip(head, row, strict=False))
    assert cells["ms"] == "0.0114" and cells["graph ms"] == "0.0114"
    assert cells["events ms (p20–p80)"] == "0.0180 (0.0176–0.0185)"


def test_a_hundred_problems_make_a_page_under_1_mb(db):
    """plotly.js (4.8 MB) comes from its CDN unless asked for inline; the figures of a hundred
    problems, 60 with their optuna studies drawn, keep the page under 1 MB."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _fill(
        db,
        trials=4,
        failures=0,
        specs=[Spec(64 * (i + 1), 1024, 512, epilogue="bias_gelu_tanh") for i in range(100)],
    )
    for i in range(report_html.DETAIL_LIMIT):  # the rest get a note, not plots: no study needed
        study = optuna.create_study(study_name=f"study-{i}", storage=db.storage_url)
        for t in range(4):
            trial = study.ask()
            trial.suggest_categorical("num_stages", [1, 2, 3, 4])
            trial.suggest_categorical("BLOCK_M", [64, 128])
            study.tell(trial, -2.0 + 0.01 * t)
    data = _collect(db)
    page = report_html.render(data, db=db)
    assert len(data.tuned) == 100 and len(page.encode()) < 1_000_000, len(page.encode())
    assert "cdn.plot.ly/plotly-" in page and "--plotly inline" in page  # offline: how to get the plots
    inline = report_html.render(data, plotly="inline")
    assert "cdn.plot.ly/plotly-" not in inline and len(inline) > 4_000_000
    with pytest.raises(ValueError, match="one of"):
        report_html.render(data, plotly="local")


def test_an_interpreter_run_is_labelled_and_leaves_out_gpu_columns(db):
    from epilab.db import INTERPRETER_DEVICE

    _fill(db, INTERPRETER_DEVICE)
    data = _collect(db)
    assert data.interpreter
    head, rows = _rows(_Page(report_html.render(data)))
    assert "interpreter wall ms (p20–p80)" in head and len(rows) == 3
    assert not {"ms", "graph ms", "TFLOP/s", "GB/s", "% of roofline"} & set(head), head
    page = _Page(report_html.render(data))  # no throughput plots of wall times (`10μ TFLOP/s`)
    assert not {"plot-throughput", "plot-roofline"} & page.ids, page.ids


def test_hostile_strings_render_as_text(db):
    _fill(db, EVIL_GPU, detail=f"error {HOSTILE} & more")
    db.record_baseline(
        PROBLEMS[0].problem(),
        EVIL_GPU,
        library="cublas",
        timing=_timing(0.5, method=f"method {HOSTILE}"),
        max_rel_error=0.0,
        versions=Versions(f"2.0 {HOSTILE}", "3.6.0"),
    )
    text = report_html.render(_collect(db))
    assert HOSTILE not in text and "alert(" not in text.replace("alert(&#39;x&#39;)", "")
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in text
    page = _Page(text)
    for name, body in page.scripts.items():  # plot labels: escaped for plotly, and no </script> inside
        assert "<" not in body, name


def test_empty_database_gives_a_clear_page(db, tmp_path):
    data = _collect(db)
    assert data.device is None and not data.problems
    page = _Page(report_html.render(data))
    assert "nothing-tuned" in page.ids
    result = CliRunner().invoke(app, ["report", "--db", db.url, "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert "nothing tuned yet" in result.output and (tmp_path / "r.html").stat().st_size > 1000


def test_filters_and_a_clear_error_for_an_unknown_device(db, tmp_path):
    _fill(db)
    assert [p.op for p in _collect(db, op="bmm").problems] == ["bmm"]
    assert _collect(db, keys=[PROBLEMS[1].problem().key]).problems[0].op == "mm"
    with pytest.raises(ValueError, match=r"no device named like 'A100'.*NVIDIA H200"):
        _collect(db, device="A100")
    run = CliRunner().invoke(
        app, ["report", "--db", db.url, "--out", str(tmp_path / "r.html"), "--op", "conv"]
    )
    assert run.exit_code != 0 and "is not one of addmm, baddbmm, block_scaled_mm, bmm, conv2d" in run.output
    run = CliRunner().invoke(
        app, ["report", "--db", db.url, "--out", str(tmp_path / "r.html"), "--suite", "nope"]
    )
    assert run.exit_code != 0 and "unknown suite" in run.output
    missing = tmp_path / "typo.db"
    run = CliRunner().invoke(app, ["report", "--db", str(missing), "--out", str(tmp_path / "r.html")])
    assert run.exit_code != 0 and "no database at" in run.output and not missing.exists()


def test_thousands_of_records_in_seconds(db):
    problems = [Spec(64 * (i + 1), 256, 128, epilogue="bias").problem() for i in range(40)]
    rows = []
    for problem in problems:
        grid = itertools.product((16, 32, 64, 128, 256), (16, 32, 64), (1, 2, 3, 4, 5))
        for t, (bn, bk, stages) in enumerate(grid):  # 75 distinct configs per problem
            rows.append(
                (problem, {**CONFIG, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": stages}, t % 5 != 0, t)
            )
    for problem, config, ok, t in rows:
        db.record_trial(
            problem,
            H200,
            config=config,
            status="ok" if ok else "crashed",
            timing=_timing(0.01 * (1 + t % 7)) if ok else None,
            max_rel_error=1e-3 if ok else None,
            versions=VERSIONS,
            study="s",
            trial_number=t,
            detail=None if ok else "CUDA error",
        )
    start = time.perf_counter()
    data = _collect(db)
    text = report_html.render(data)
    took = time.perf_counter() - start
    assert len(data.tuned) == 40 and data.failed_total == 40 * 15 and len(data.failures) == 500
    assert text.count('<tr id="row-') == 40
    assert took < 30, f"{len(rows)} records took {took:.1f} s"  # ~2 s on a 2-core machine


def test_study_history_and_importances_from_the_database(db):
    problem = PROBLEMS[1].problem()
    study = optuna.create_study(
        study_name="study-1",
        storage=db.storage_url,
        direction="minimize",
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    for t in range(12):
        trial = study.ask()
        warps = trial.suggest_categorical("num_warps", [2, 4, 8])
        stages = trial.suggest_int("num_stages", 1, 6)
        ms = 0.05 * warps + 0.01 * stages
        study.tell(trial, float(f"{__import__('math').log10(ms):.6f}"))
        db.record_trial(
            problem,
            H200,
            config={**CONFIG, "num_warps": warps, "num_stages": stages},
            status="ok",
            timing=_timing(ms),
            max_rel_error=1e-3,
            versions=VERSIONS,
            study="study-1",
            trial_number=t,
        )
    for _ in range(2):  # infeasible configs: told the penalty, left out of the plots
        trial = study.ask()
        trial.suggest_categorical("num_warps", [2, 4, 8])
        trial.suggest_int("num_stages", 1, 6)
        study.tell(trial, PENALTY)
    data = _collect(db)
    text = report_html.render(data, db=db)
    page = _Page(text)
    key = problem.key[:16]
    figs = [json.loads(page.scripts[f"fig-{key}-{i}"]) for i in (1, 2)]
    assert max(figs[0]["data"][0]["y"]) < 0 and "(12 measured trials)" in figs[0]["layout"]["title"]["text"]
    assert "2 infeasible or failed configs of study-1 are not plotted" in text
    assert "Optimization history" in figs[0]["layout"]["title"]["text"]
    assert "importances" in figs[1]["layout"]["title"]["text"]
    assert {"num_warps", "num_stages"} <= set(figs[1]["data"][0]["y"])


# ------------------------------------------------------------------ in a browser


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    if os.environ.get("EPILAB_REQUIRE_BROWSER"):
        pytest.fail("EPILAB_REQUIRE_BROWSER is set but no chromium is installed (apt-get install chromium)")
    pytest.skip("headless Chromium is not installed (apt-get install chromium); CI installs it")


def _headless(browser: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--enable-logging=stderr",
        "--v=0",
        "--hide-scrollbars",
        "--virtual-time-budget=15000",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


def test_report_in_headless_chromium(db, tmp_path):
    browser = _chromium()
    _fill(db, detail=f"error {HOSTILE}")
    problem = PROBLEMS[0].problem()
    study = optuna.create_study(study_name="study-0", storage=db.storage_url)
    for t in range(6):
        trial = study.ask()
        trial.suggest_categorical("num_stages", [1, 2, 3, 4])
        study.tell(trial, -1.0 + 0.05 * t)
    out = report_html.write(_collect(db), tmp_path / "report.html", db=db, plotly="inline")  # no network
    url = out.resolve().as_uri()
    artifacts = Path(os.environ.get("EPILAB_ARTIFACT_DIR", "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = _headless(browser, "--window-size=1400,2400", f"--screenshot={artifacts / 'report.png'}", url)
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert (artifacts / "report.png").stat().st_size > 10_000
    dom = _headless(browser, "--dump-dom", url)
    console = [ln for ln in dom.stderr.splitlines() if ":CONSOLE" in ln]
    assert dom.returncode == 0 and not console, console or dom.stderr[-2000:]
    assert dom.stdout.count('class="main-svg"') >= 3 * 2  # three summary plots drawn (plotly: 2 svgs each)
    anchor = f"#p-{problem.key[:16]}"
    detail = _headless(browser, "--dump-dom", url + anchor)
    opened = re.search(
        r'<details class="problem" id="p-' + problem.key[:16] + r'"[^>]*open.*?</details>',
        detail.stdout,
        re.S,
    )
    assert opened and 'class="main-svg"' in opened.group(0), "the problem's study plots were drawn"
    assert not [ln for ln in detail.stderr.splitlines() if ":CONSOLE" in ln]
    detail_shot = _headless(
        browser, "--window-size=1400,4200", f"--screenshot={artifacts / 'report-problem.png'}", url + anchor
    )
    assert detail_shot.returncode == 0


def test_a_dual_gemm_counts_both_gemms_flops():
    """The report's TFLOP/s and roofline count a dual GEMM's two GEMMs (its kind's accumulators)."""
    shape = [1, 256, 512, 1024]
    one = report_data._flops({"shape": shape, "template": "matmul"})
    assert one == 2 * 256 * 512 * 1024
    assert report_data._flops({"shape": shape, "template": "dual_weight_only_matmul"}) == 2 * one
    assert report_data._flops({"shape": [1, None, 512, 1024], "template": "matmul"}) == 0


def test_conv_problems_are_first_class_in_the_report(db, tmp_path):
    """`--op conv2d` is accepted, and a convolution is labelled in its own terms (as `tune`
    labels it), not by its GEMM view; every op the compiler anchors and every suite's op is
    a valid `--op`."""
    from epilab.compiler.match import GROWERS
    from epilab.policy.suites import SUITES
    from epilab.templates.conv.conv_spec import ConvSpec
    from epilab.templates.registry import problem_ops, twins

    ops = {q.op for specs in SUITES.values() for spec in specs for q in twins(spec.problem())}
    assert ops <= set(problem_ops())
    assert set(GROWERS) - {"scaled_mm"} <= set(problem_ops())  # a scaled mm's problems are mm's
    spec = ConvSpec(2, 8, 6, 6, 8, 3, 3, padding=1, epilogue="none")
    db.record_trial(
        spec.problem(),
        H200,
        config=CONFIG,
        status="ok",
        timing=_timing(0.01),
        max_rel_error=1e-3,
        versions=VERSIONS,
        study="conv",
    )
    _, (row,) = _rows(_Page(report_html.render(_collect(db, op="conv2d"))))
    assert row[0].startswith("2x8x6x6 -> 8x6x6 3x3 "), row[0]
    assert spec.label().startswith("conv 2x8x6x6 -> 8x6x6 3x3 ")
    out = tmp_path / "conv.html"
    done = CliRunner().invoke(app, ["report", "--db", db.url, "--op", "conv2d", "--out", str(out)])
    assert done.exit_code == 0 and out.exists(), done.output
