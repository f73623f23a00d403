"""Problem suites: built-in ones and shapes files, in the formats the kinds own.

A problem is written as a small JSON object in the format of the kind whose problems it
describes (``ir/spec.py``; a kind names its format's module: ``TemplateKind.spec_module``):
a matmul as ``{"m": 2048, "n": 4096, "k": 4096}`` plus options (``templates/gemm/gemm_spec.py``),
a convolution as ``{"n", "c", "h", "w", "k", "r", "s"}`` plus options
(``templates/conv/conv_spec.py``). An object's format is the one whose marking keys it has (a
convolution's c, h, w, r, s), else the matmul's. Every format writes an ``epilogue`` alike:
a name of the catalog (``ir/catalog.py``: none, bias, bias_relu, ...), an expression
(``"gelu_tanh(acc + bias[n]) + residual"``, ``"silu(acc) * up"``, ``"acc * scale[m] + s[]"``:
``ir/epilogue_text.py``), or a list of outputs, each an expression or
``{"expr": ..., "dtype": "float32"}``. A shapes file is a JSON list of such objects, or JSON
Lines (one object per line); its errors name the line, and for an epilogue's syntax the
line and column.

The built-in suites are the formats' own (``SpecFormat.suites``): smoke, quick, llm, square,
midm, fp8, fp8-block, fp8-weight, gemv, gemv-fused and mlp of the matmul family, conv of the
conv2d kind. A spec's problem is tuned with each of its twins (the same computation on another template:
``registry.twins``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from epilab.files import read_text_bounded
from epilab.ir.epilogue_text import EpilogueSyntaxError
from epilab.ir.problem import Problem
from epilab.ir.spec import LABEL_EPILOGUE, ProblemSpec, clip, format_of
from epilab.templates.registry import default_template, kind_of, spec_formats


def problem_label(problem: Problem) -> str:
    """A short label of any problem (one the compiler recorded, say): op, shape, dtype,
    layouts of A and B, and the epilogue (``Problem.epilogue_text``, clipped)."""
    epilogue = clip(problem.epilogue_text(), LABEL_EPILOGUE)
    suffix = "" if problem.template == default_template(problem.op) else f" [{problem.template}]"
    layouts = f"{problem.layout_a}/{problem.layout_b}"
    return f"{problem.op} {shape_label(problem)} {problem.dtype} {layouts} {epilogue}{suffix}"


def shape_label(problem: Problem) -> str:
    """A problem's shape as every table shows it, in its kind's terms (``TemplateKind.label``:
    MxNxK, BxMxNxK batched, a convolution as N x C x H x W -> K x P x Q)."""
    return kind_of(problem).label(problem)


def builtin_suites() -> dict[str, Sequence[ProblemSpec]]:
    """Every built-in suite of the registered kinds' formats, by name."""
    found: dict[str, Sequence[ProblemSpec]] = {}
    for fmt in spec_formats():
        for name, specs in fmt.suites.items():
            if name in found:  # a registry fault, not the user's
                raise RuntimeError(f"two spec formats define the suite {name!r}")
            found[name] = specs
    return found


class _Suites(Mapping[str, Sequence[ProblemSpec]]):
    """The built-in suites as a mapping, read from the registry at each use (a kind
    registered later brings its suites)."""

    def __getitem__(self, name: str) -> Sequence[ProblemSpec]:
        return builtin_suites()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(builtin_suites())

    def __len__(self) -> int:
        return len(builtin_suites())


SUITES: Mapping[str, Sequence[ProblemSpec]] = _Suites()


def suite(name: str) -> Sequence[ProblemSpec]:
    """A built-in suite's specs; ``"quick,llm,conv"`` is those suites' in that order, each
    problem once (one command tunes them all, paying its start-up once)."""
    found = builtin_suites()
    names = [part.strip() for part in name.split(",")]
    unknown = [n for n in names if n not in found]
    if unknown:
        raise ValueError(f"unknown suite {', '.join(map(repr, unknown))}; built-in suites: {sorted(found)}")
    if len(names) == 1:
        return found[names[0]]
    specs: dict[str, ProblemSpec] = {}
    for n in names:
        for spec in found[n]:
            specs.setdefault(spec.problem().key, spec)
    return list(specs.values())


def spec_from_dict(d: Any) -> ProblemSpec:
    """The spec of a JSON object, in the format its keys mark (``ir.spec.format_of``)."""
    if not isinstance(d, dict):
        raise ValueError(
            f'a problem must be an object like {{"m": 128, "n": 4096, "k": 4096}}, got {d!r:.60}'
        )
    return format_of(d, spec_formats()).parse(d)


def load_shapes(path: str | Path) -> list[ProblemSpec]:
    """Specs from a JSON list or a JSON Lines file (``#`` comments and blank lines allowed);
    a ValueError names the file, the line and what is wrong. Linear in the file's size."""
    path = Path(path)
    text = read_text_bounded(path, "shapes")
    specs = _json_list(path, text) if text.lstrip().startswith("[") else _json_lines(path, text)
    if not specs:
        raise ValueError(f"{path}: no problems in the file")
    return specs


def _spec_at(path: Path, line: int, parse: Any, locate: Any) -> ProblemSpec:
    """The spec ``parse()`` reads, or a ValueError naming the file and line (and, for an
    epilogue's syntax, the line and column of the fault in the file: ``locate(needle)``)."""
    try:
        return spec_from_dict(parse())
    except EpilogueSyntaxError as e:
        found = locate(json.dumps(e.text)[1:-1])
        if found is None:
            raise ValueError(f"{path}:{line}: {e}") from None
        at_line, at_col = found
        raise ValueError(f"{path}:{at_line}:{at_col + e.col - 1}: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}:{line}: nested too deeply to be a problem") from None
    except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{path}:{line}: {e}") from None


def _json_list(path: Path, text: str) -> list[ProblemSpec]:
    decoder = json.JSONDecoder()
    specs: list[ProblemSpec] = []
    pos = text.index("[") + 1
    line, counted = 1, 0  # the line of `pos`, counted up to `counted` (each character once)
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise ValueError(f"{path}: the list is not closed with ']'")
        line, counted = line + text.count("\n", counted, pos), pos
        if text[pos] == "]":
            break
        start = pos

        def parse(start: int = start) -> Any:
            nonlocal pos
            obj, pos = decoder.raw_decode(text, start)
            return obj

        def locate(needle: str, start: int = start) -> tuple[int, int] | None:
            return _position(text, text.find(needle, start))  # this spec's text comes first

        specs.append(_spec_at(path, line, parse, locate))
    rest = text[pos + 1 :].strip()
    if rest:
        line += text.count("\n", counted, pos)
        raise ValueError(f"{path}:{line}: text after the list's closing ']': {rest[:40]!r}")
    return specs


def _json_lines(path: Path, text: str) -> list[ProblemSpec]:
    specs = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            specs.append(
                _spec_at(
                    path,
                    line_no,
                    lambda line=line: json.loads(line),
                    lambda needle, line=line, line_no=line_no: (
                        (line_no, line.find(needle) + 1) if needle in line else None
                    ),
                )
            )
    return specs


def _position(text: str, index: int) -> tuple[int, int] | None:
    """Line and column (1-based) of ``text[index]``; None for index -1 (not found)."""
    if index < 0:
        return None
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1


__all__ = ["SUITES", "load_shapes", "problem_label", "shape_label", "spec_from_dict", "suite"]
