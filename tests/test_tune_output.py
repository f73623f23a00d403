"""What `epilab tune` prints: speedups like with like, a summary that keeps every character
when stdout is not a terminal, and --json for scripts (progress on stderr)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

from epilab.db import DeviceInfo, Record, Versions
from epilab.tuner.tune import like_with_like

DEVICE = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", 132)


def _record(median_ms, graph_ms, library=None):
    return Record(
        "k" * 64, DEVICE, "ok", None if library else {"BLOCK_M": 64}, library, median_ms, median_ms, median_ms,
        graph_ms, None, None, 0.0, "events", Versions("2.11", "3.6"), None, None, None,
        datetime.now(timezone.utc),
    )  # fmt: skip


def test_speedups_compare_graph_with_graph_else_events_with_events():
    tuned = _record(0.025, 0.018)
    # eager cuBLAS + epilogue: three launches, host-bound one call at a time (0.3 ms), 20 us replayed
    eager = _record(0.30, 0.020, "cublas")
    slower_eager = _record(0.40, 0.030, "cublas")  # the library's slower baseline is not the one compared
    no_graph = _record(0.50, None, "inductor")
    got = like_with_like(tuned, [eager, no_graph, slower_eager])
    assert got["cublas"] == (0.020, 0.018, "graph")  # 1.11x, not the 12x of 0.30 / 0.025
    assert got["inductor"] == (0.50, 0.025, "events")
    assert like_with_like(_record(0.2, None), [eager])["cublas"] == (0.30, 0.2, "events")


def _tune(tmp_path, *extra):
    shapes = tmp_path / "s.json"
    long_label = "gelu_tanh(acc + bias[n]) * scale[m] + 0.5 * relu(residual) - sigmoid(acc) * s[]"
    shapes.write_text(json.dumps([{"m": 20, "n": 24, "k": 16, "epilogue": long_label}]))
    cmd = [sys.executable, "-m", "epilab.cli", "tune", "--shapes", str(shapes), "--interpret"]
    cmd += ["--trials", "2", "--patience", "2", "--db", str(tmp_path / "t.db"), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done, long_label


def test_summary_is_not_cut_when_stdout_is_a_pipe(tmp_path):
    done, long_label = _tune(tmp_path)
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| problem | best config | best | trials | failed | wall s |")
    assert long_label[:57] in table[1] and "…" not in table[1]  # the label as the spec says it, not cut
    # an interpreter run says so, and shows no GPU-only column (TFLOP/s, library, speedup)
    assert "interpreter ms (not GPU time)" in done.stdout and "like with like" not in done.stdout
    assert "Warning" not in done.stderr, done.stderr[-2000:]  # numpy's, on lanes the stores mask off


def test_json_goes_to_stdout_and_progress_to_stderr(tmp_path):
    done, _ = _tune(tmp_path, "--json")
    results = json.loads(done.stdout)
    assert len(results) == 1 and results[0]["trials"] == 2 and results[0]["best"]["BLOCK_M"] >= 16
    assert results[0]["statuses"] == {"ok": 2} and results[0]["library"] == "cublas"
    assert "[1/1]" in done.stderr  # the progress bar
