"""The maintained benchmarks (``benchmarks/*.py``) run on today's tree: each imports (its
imports of the library, of the shared ``rounds`` helper and of the zoo resolve) and has a
``main``. The one-off probes whose findings live in ``benchmarks/RESULTS.md`` were retired
(git keeps them). Their numbers come from GPU runs (RESULTS.md); here nothing is timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import epilab

BENCHMARKS = Path(epilab.__file__).parent / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "rounds")
IMPORT_ALL = """
import importlib, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
missing = []
for name in sys.argv[3:]:
    module = importlib.import_module(name)
    if not callable(getattr(module, "main", None)):
        missing.append(name)
print("no main:", missing)
"""


def test_every_benchmark_imports_and_has_a_main():
    assert len(SCRIPTS) >= 20 and "matmul_quick" in SCRIPTS
    tests = Path(__file__).parent
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, str(BENCHMARKS), str(tests), *SCRIPTS],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "no main: []" in run.stdout, run.stdout


def test_the_benchmarks_only_is_one_based_like_the_cli():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from rounds import only
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert only("1-3,5", 6) == [0, 1, 2, 4]
    assert only(None, 3) == [0, 1, 2]
