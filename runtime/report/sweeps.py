"""The report's sweep section: each fine-tuning sweep's grid as a table (one row per setting:
the swept values, each seed's dev score, their mean ± standard deviation, which is selected
and which point exported) and its ``grid.png``.

A finished sweep stage is read from its ``sweep.json`` (runtime/stages/sweep.py); one still
running is scored from the points that are done, with the same code, and says so (no
selection until every point is done). No TensorFlow.
"""

from __future__ import annotations

import json
from typing import Optional

from runexp.compiler.specs import SweepSpec
from runexp.compiler.specs.finetune import FinetuneMetrics
from runexp.compiler.sweep import value_text
from runexp.runtime.report.collect import Report, RootReader, StageReport
from runexp.runtime.report.format import esc, img, status_badge
from runexp.runtime.stages.sweep import select

SWEEP_FILE = "sweep.json"
METRICS_FILE = "metrics.json"
GRID_FILE = "grid.png"


def _json(reader: RootReader, path: str) -> Optional[dict]:
    text = reader.text(path)
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _partial(r: Report, sr: StageReport, reader: RootReader) -> tuple[Optional[dict], int]:
    """The grid of the points done so far (no selection), and how many are done."""

    spec = SweepSpec.from_stage(sr.stage)
    metrics = {}
    for name in spec.points:
        point = r.get(f"finetune.{spec.task}.{name}")
        m = _json(reader, reader.join(point.dir, METRICS_FILE)) if point and point.done else None
        if m and FinetuneMetrics.read(m).dev_sets is not None:
            metrics[name] = m
    if not metrics:
        return None, 0
    done = {n: p for n, p in spec.points.items() if n in metrics}
    spec = SweepSpec.from_params(dict(sr.stage.params, points=done, export_point=None))
    return select(spec, metrics), len(metrics)


def _table(sweep: dict, final: bool) -> str:
    varied = sweep["varied"]
    seeds = sorted({s for g in sweep["settings"] for s in g["seeds"] if s is not None})
    head = ("<tr><th>setting</th>" + "".join(f"<th>{esc(v.replace('_', ' '))}</th>"
                                             for v in varied)
            + "".join(f"<th>seed {esc(s)}</th>" for s in seeds)
            + (f"<th>dev {esc(sweep['metric'])}</th>" if not seeds else
               f"<th>mean ± std (dev {esc(sweep['metric'])})</th>")
            + "<th></th></tr>")
    best = max(g["mean"] for g in sweep["settings"])
    rows = []
    for g in sweep["settings"]:
        by_seed = dict(zip(g["seeds"], zip(g["scores"], g["points"])))
        cells = []
        for s in seeds:
            score, point = by_seed.get(s, (None, None))
            text = "—" if score is None else f"{score:.4f}"
            if final and point == sweep["exported"]:
                text = f"<b>{text}</b> ⬅ exported"
            cells.append(f"<td class='num'>{text}</td>")
        spread = f" ± {g['std']:.4f}" if g.get("std") is not None else ""
        mean = f"{g['mean']:.4f}{spread}"
        selected = final and g["name"] == sweep["selected"]["setting"]
        note = "selected" if selected else ("" if final else
                                            ("best so far" if g["mean"] == best else ""))
        if not seeds and final and g["points"][0] == sweep["exported"]:
            note = (note + ", exported").lstrip(", ")
        rows.append(f"<tr{' class=total' if selected else ''}><td><code>{esc(g['name'])}"
                    "</code></td>"
                    + "".join(f"<td class='num'>{esc(value_text(g['settings'].get(v)))}</td>"
                              for v in varied)
                    + "".join(cells) + f"<td class='num'><b>{esc(mean)}</b></td>"
                    f"<td>{esc(note)}</td></tr>")
    return (f"<table><thead>{head}</thead><tbody>" + "".join(rows) + "</tbody></table>")


def section_sweeps(r: Report, reader: RootReader) -> str:
    parts = []
    for sr in r.by_kind("sweep"):
        spec = SweepSpec.from_stage(sr.stage)
        n = len(spec.points)
        head = (f"<h3>{esc(sr.stage.id)} {status_badge(sr, note=False)}</h3>"
                f"<p>{n} point{'s' if n != 1 else ''} of <code>finetune.sweep</code>, one "
                f"finetune stage each (<code>finetune.{esc(spec.task)}.POINT</code>).</p>")
        sweep = _json(reader, reader.join(sr.dir, SWEEP_FILE)) if sr.done else None
        if sweep:
            sel = sweep["selected"]
            spread = f" ± {sel['std']:.4f}" if sel.get("std") is not None else ""
            body = (_table(sweep, final=True)
                    + f"<p class='note'>Selected: <code>{esc(sel['setting'])}</code>, dev "
                    f"{esc(sweep['metric'])} {sel['mean']:.4f}{esc(spread)} over "
                    f"{sel['seeds']} seed{'s' if sel['seeds'] != 1 else ''}; exported: "
                    f"<code>{esc(sweep['exported'])}</code> ({esc(sweep['exported_why'])}). "
                    + (f"Majority class on the dev set: {sweep['majority_baseline']:.4f}. "
                       if sweep.get("majority_baseline") is not None else "")
                    + f"Rule: {esc(sweep['rule'])}. Standard deviations are sample ones "
                    "(n − 1).</p>")
            body += "".join(f"<p class='note'><b>At the edge of the grid</b>: {esc(edge)}: "
                            "extend <code>finetune.sweep</code> past it.</p>"
                            for edge in sweep.get("at_edge") or [])
            png = reader.data(reader.join(sr.dir, GRID_FILE))
            if png:
                body += (f"<figure>{img(png, sr.stage.id + ' grid')}<figcaption>"
                         f"<code>{GRID_FILE}</code>: the same scores drawn against "
                         f"{esc((sweep['varied'] or ['the seed'])[0].replace('_', ' '))}."
                         "</figcaption></figure>")
        else:
            partial, done = _partial(r, sr, reader)
            body = (f"<p class='muted'>{done} of {n} points done: no selection until every "
                    "point is.</p>")
            if partial:
                body += _table(partial, final=False)
        parts.append(head + body)
    return "".join(parts)
