"""What ``tune --model`` reports (``ModelReport``: per mode the times, the speedups with
their intervals, each template's verdict, where the seconds went), as text, a table or JSON."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epilab.db import Versions
from epilab.db.values import SKIPPED
from epilab.model_tuning import significance as sig
from epilab.model_tuning.variants import ModelOptions
from epilab.tables import markdown
from epilab.tuner.phases import add_phases, phase_text
from epilab.tuner.tune import ProblemResult


@dataclass
class ModelReport:
    label: str
    device: str
    versions: Versions
    passes: int = 0
    tuned: list[ProblemResult] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    compiling: dict[str, float] = field(default_factory=dict)  # a step's seconds spent compiling variants
    compiles: dict[str, int] = field(default_factory=dict)  # ... and how many compiles
    interrupted: bool = False
    method: str = ""
    rule: str = ""  # the confidence rule the verdicts and speedups were decided by
    skipped: dict[str, str] = field(default_factory=dict)  # mode -> why it was not checked or timed
    training: bool = False  # a call was a training step (forward and backward)

    @property
    def tune_phases(self) -> dict[str, float]:
        """Where the tuning's seconds went, over every problem tuned (``phases.PHASES``)."""
        return functools.reduce(add_phases, (r.phases for r in self.tuned), {})

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "training": self.training,
            "device": self.device,
            "torch": self.versions.torch,
            "triton": self.versions.triton,
            "passes": self.passes,
            "tuned": [r.to_dict() for r in self.tuned],
            "verdicts": self.verdicts,
            "rows": self.rows,
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
            "compiling": {k: round(v, 1) for k, v in self.compiling.items()},
            "compiles": self.compiles,
            "tune_phases": {k: round(v, 1) for k, v in self.tune_phases.items()},
            "interrupted": self.interrupted,
            "method": self.method,
            "rule": self.rule,
            "skipped": self.skipped,
        }

    def _seconds_text(self, step: str, seconds: float) -> str:
        compiling = self.compiling.get(step)
        if compiling is None:
            return f"{step} {seconds:.0f}"
        return f"{step} {seconds:.0f} (compiling {compiling:.0f}, {self.compiles.get(step, 0)} compiles)"

    def speedups(self, mode: str) -> dict[str, float]:
        """epilab against each other variant of ``mode``: the median of the rounds' paired
        ratios (their time over epilab's); see each row's ``speedup`` for its interval."""
        return {
            r["variant"]: r["speedup"]["ratio"]["estimate"]
            for r in self.rows
            if r["mode"] == mode and r.get("speedup") and r["speedup"]["ratio"]
        }

    def __str__(self) -> str:
        """``print(tune_model(...))`` prints the report's tables (``table``)."""
        return self.table()

    def __repr__(self) -> str:
        kept = sum(1 for v in self.verdicts if v.get("keep"))
        return (
            f"<ModelReport {self.label!r} on {self.device}: {len(self.tuned)} problem(s) tuned, "
            f"{kept} of {len(self.verdicts)} verdict(s) kept, {len(self.rows)} timed row(s); "
            "print() it for the tables>"
        )

    def table(self) -> str:
        """A Markdown table of the measured variants, then the verdicts."""
        held = next((r["confidence"] for r in self.rows), None)
        level = "" if held is None else f" [{held:.2%} interval]"
        step = ", a training step (forward and backward)" if self.training else ""
        versions = f"torch {self.versions.torch}, triton {self.versions.triton}"
        rows = [
            [
                r["mode"],
                r["variant"],
                _ms_text(r),
                str(len(r["rounds_ms"])),
                _speedup_text(r.get("speedup")),
                f"{r['compile_s']:.1f}",
                f"{r['templates']}/{r['anchors']}",
            ]
            for r in self.rows
        ]
        headers = ["mode", "variant", f"ms (median of rounds){level}", "rounds", f"epilab speedup{level}"]
        out = [
            f"{self.label}{step} on {self.device} ({versions})",
            "",
            markdown([*headers, "compile s", "templates"], rows, left=2),
        ]
        if any(r["variant"] == "epilab" and not r["templates"] for r in self.rows):
            out.append(
                "\nepilab with 0 templates compiles the same graph as Inductor: no speedup is claimed "
                "there (the rounds' ratio is timing noise; the JSON keeps it, marked same_graph)"
            )
        if self.verdicts:
            verdicts = []
            for v in self.verdicts:
                verdict = "keep" if v["keep"] else _NOT_KEPT.get(v["outcome"], "reject")
                ratio = v.get("ratio")
                verdicts.append(
                    [
                        v["mode"],
                        f"{v['problem'][:12]} {v['label']}",
                        verdict,
                        f"{v['with_ms']:.4f}",
                        f"{v['without_ms']:.4f}",
                        "" if ratio is None else _ratio_text(ratio),
                        str(v["rounds"] or "-"),
                        v["why"],
                    ]
                )
            headers = ["mode", "problem", "verdict", "with ms", "without ms", f"speedup with it{level}"]
            out += ["", markdown([*headers, "rounds", ""], verdicts, left=3)]
        out += [f"\n{mode}: not timed: {why}" for mode, why in self.skipped.items()]
        if self.rule:
            out += ["", self.rule]
        out += ["", "seconds: " + ", ".join(self._seconds_text(k, v) for k, v in self.seconds.items())]
        if self.tuned:
            out.append(f"tuning's seconds went to: {phase_text(self.tune_phases)}")
        return "\n".join(out)


_NOT_KEPT = {sig.UNDECIDED: "undecided", SKIPPED: "skipped"}  # the table's word for a verdict


def _ratio_text(ratio: dict[str, Any]) -> str:
    if ratio["low"] is None:
        return f"{ratio['estimate']:.3f}x [too few rounds]"
    return f"{ratio['estimate']:.3f}x [{ratio['low']:.3f}, {ratio['high']:.3f}]"


def _ms_text(row: dict[str, Any]) -> str:
    if row["low_ms"] is None:
        return f"{row['ms']:.4f}"
    return f"{row['ms']:.4f} [{row['low_ms']:.4f}, {row['high_ms']:.4f}]"


def _speedup_text(speedup: dict[str, Any] | None) -> str:
    """A speedup where its interval excludes 1, "no significant difference" where it does
    not, "same graph" where epilab kept no template."""
    if not speedup:
        return ""
    if speedup["same_graph"]:
        return "same graph as Inductor"
    text = _ratio_text(speedup["ratio"])
    return text if speedup["significant"] else f"no significant difference ({text})"


def rule_text(options: ModelOptions) -> str:
    """The confidence rule, as the report states it."""
    schedule = sig.looks(options.rounds, options.max_rounds)
    held = sig.per_look(options.confidence, len(schedule))
    return (
        f"rule: a template is kept where the model is faster with it by at least {options.margin:.0%} "
        f"at {options.confidence:.0%} confidence (the paired rounds' sign-test interval of the ratio "
        f"without/with lies at or above {1 + options.margin:g}), or, two or more undecided alone "
        "but each faster at the median round, where the model is faster with them together by "
        "the same rule; and only while the model with its "
        f"kept templates beats Inductor by the same rule; rounds are looked at after "
        f"{', '.join(map(str, schedule))} (each look at {held:.2%}, Bonferroni), and a comparison "
        "still straddling the margin after the last is undecided: Inductor is kept. A speedup is "
        "called significant where its interval excludes 1."
    )


def save(report: ModelReport, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_dict(), indent=1))
    return path
