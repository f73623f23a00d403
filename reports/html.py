"""Rendering a report to one HTML file (``reports/report.html.jinja``): styles, scripts and the
figures' data inlined; plotly.js from its CDN (``plotly="cdn"``, the default: a page of a
hundred problems stays under 1 MB, where plotly.js alone is 4.8 MB) or inlined too
(``plotly="inline"``: the page opens with no network). Without plotly.js the page says how to
get the plots; its tables work either way.

Everything from the database reaches the page either as HTML text through Jinja's
autoescaping, or inside ``<script type="application/json">`` blocks whose JSON has
``<``, ``>`` and ``&`` written as unicode escapes (no ``</script>`` can end them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jinja2

from epilab.files import write_text_atomic
from epilab.ir.config import config_text
from epilab.reports import plots
from epilab.reports.data import ReportData

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
DETAIL_LIMIT = 60  # problems whose optuna plots are drawn (the fastest-tuned first); the rest list a note


def script_json(text: str) -> str:
    """JSON text made safe inside a <script> element."""
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


PLOTLY = ("cdn", "inline")  # where the page gets plotly.js


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _plotly_cdn() -> str:
    """The CDN's copy of the plotly.js this plotly package bundles (the figures' JSON fits it)."""
    from plotly.offline import get_plotlyjs_version

    return f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"


def _cuda_of(version: str) -> str:
    """'torch 2.11.0+cu130, ...' -> 'CUDA 13.0' (torch's build tag), else ''."""
    m = re.search(r"\+cu(\d+)(\d)\b", version)
    return f"CUDA {m.group(1)}.{m.group(2)}" if m else ""


def _fmt(v: float | None, spec: str = ".4f") -> str:
    return "" if v is None else format(v, spec)


def render(data: ReportData, *, db: Any = None, detail_limit: int = DETAIL_LIMIT, plotly: str = "cdn") -> str:
    """The report page. ``db``: the TuningDB whose optuna studies to draw (None: no study plots);
    ``plotly``: where the page gets plotly.js (``PLOTLY``; the module's text)."""
    if plotly not in PLOTLY:
        raise ValueError(f"plotly.js comes from one of {PLOTLY}, not {plotly!r}")
    summary_figs = {
        name: fig
        for name, fig in (
            ("throughput", plots.throughput(data)),
            ("roofline", plots.roofline(data)),
            ("speedups", plots.speedups(data)),
        )
        if fig is not None
    }
    details = []
    studies, why_not = _open_studies(db) if any(p.studies for p in data.tuned) else (None, None)
    for i, p in enumerate(sorted(data.tuned, key=lambda p: p.label)):
        figures, notes = [], [why_not] if why_not else []
        if studies is not None and i < detail_limit:
            figures, notes = plots.study_figures(p, studies)
        elif studies is not None:
            notes = [f"study plots are drawn for the first {detail_limit} problems only"]
        details.append({"problem": p, "figures": [script_json(f) for f in figures], "notes": notes})
    versions = data.versions
    best_worst = sorted(
        (p for p in data.tuned if p.library_speedup is not None),
        key=lambda p: p.library_speedup,  # type: ignore[arg-type, return-value]
    )
    return _ENV.get_template("report.html.jinja").render(
        data=data,
        cuda=sorted({c for v in versions if (c := _cuda_of(v))}),
        summary_figs={k: script_json(v) for k, v in summary_figs.items()},
        details=details,
        best=best_worst[-1] if best_worst else None,
        worst=best_worst[0] if best_worst else None,
        geomeans={lib: g for lib in data.libraries() if (g := data.geomean(lib)) is not None},
        plotly_js=(
            jinja2.utils.markupsafe.Markup(_plotly_js().replace("</script", "<\\/script"))
            if plotly == "inline"
            else ""
        ),
        plotly_src=_plotly_cdn() if plotly == "cdn" else "",
        template_json=script_json(plots.template_json()),
        fmt=_fmt,
        config_text=config_text,
        json_attr=lambda v: json.dumps(v),
    )


def _open_studies(db: Any) -> tuple[Any, str | None]:
    """Optuna's storage of the studies in ``db`` (a TuningDB; one connection for every
    problem), or why not."""
    if db is None:
        return None, None
    try:
        return db.optuna_storage(create=False), None
    except Exception as e:  # an optuna schema of another version, a missing table: say so, draw the rest
        return None, f"the optuna studies could not be read: {str(e).splitlines()[0][:200]}"


def write(data: ReportData, out: str | Path, **kw: Any) -> Path:
    """Render and write atomically (a half-written report never replaces a good one)."""
    return write_text_atomic(out, render(data, **kw))
