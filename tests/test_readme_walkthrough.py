"""The README's first session, run as written (in Triton's interpreter): install aside,
every command of its shell block in a fresh directory, with its Python file beside it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"<!-- walkthrough: (\S+) -->\n```[a-z]*\n(.*?)```", re.S)


def test_the_readme_walkthrough_runs_as_written(tmp_path):
    blocks = dict(BLOCK.findall(README.read_text()))
    assert set(blocks) == {"first_model.py", "shell"}, sorted(blocks)
    (tmp_path / "first_model.py").write_text(blocks["first_model.py"])
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "EPILAB_CACHE_DIR": str(tmp_path / "kernels"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    env.pop("EPILAB_DB", None)
    outputs = []
    for line in blocks["shell"].splitlines():
        if line.startswith("python -m pip install"):  # installed already: the test runs in it
            continue
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value
            continue
        done = subprocess.run(
            line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
    tune, model, listed, report = outputs
    assert "epilab tune: best config per problem" in tune
    header = [cell.strip() for cell in model.splitlines()[1].strip().strip("|").split("|")]
    assert header[:4] == ["module", "anchor", "shape", "template"], model  # explain()'s Markdown table
    assert "aten.addmm" in model and "Decision(" not in model and "0 (Linear)" in model
    assert "gelu_tanh(acc + bias[n])" in model  # the epilogue as the README says it prints
    assert "trial record(s), newest first" in listed
    assert (tmp_path / "report.html").stat().st_size > 10_000 and "report.html" in report
