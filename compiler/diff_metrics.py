"""Two finished runs' metrics side by side, for `runexp diff OLD_ROOT NEW_ROOT`.

Each metric is read from the ``metrics.json`` a finished evaluate or finetune stage wrote
(runtime/stages/evaluate.py, runtime/stages/finetune.py), found and judged finished the way
`runexp report` does (runtime/report/collect.py: plan.json, COMPLETED, MANIFEST.json,
local or gs://); a stage without one falls back to its MANIFEST.json summary. No
TensorFlow.

Usage:
    rows = metric_rows(collect(old_root, draw=False), collect(new_root, draw=False))
    for row in rows: row.stage, row.metric, row.old, row.new, row.delta
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

from runexp.compiler.kinds import read_summary
from runexp.compiler.specs.outputs import Summary
from runexp.compiler.specs.task_kinds import ACCURACY
from runexp.runtime.report.collect import RootReader

# The file the evaluate and finetune stages write (their modules import TensorFlow, so the
# name is repeated here; tests/compiler/test_diff.py checks that they agree).
METRICS_FILE = "metrics.json"
SWEEP_FILE = "sweep.json"  # a sweep stage's (runtime/stages/sweep.py)


@dataclasses.dataclass(frozen=True)
class MetricRow:
    stage: str
    metric: str
    old: Optional[float]  # None: not measured on that side (stage missing or not finished)
    new: Optional[float]
    higher_is_better: bool = True

    @property
    def delta(self) -> Optional[float]:
        return None if self.old is None or self.new is None else self.new - self.old

    @property
    def verdict(self) -> str:
        if not self.delta:
            return ""
        return "better" if (self.delta > 0) == self.higher_is_better else "worse"


def _number(value) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _stage_metrics(reader, stage_report) -> Optional[Summary]:
    """The stage's metrics.json, else its MANIFEST summary, as its kind declares them; None
    if it is not finished or has neither."""
    if not stage_report.done:
        return None
    text = reader.text(reader.join(stage_report.dir, METRICS_FILE))
    try:
        metrics = json.loads(text) if text else {}
    except ValueError:
        metrics = {}
    found = metrics if isinstance(metrics, dict) and metrics else stage_report.summary
    return read_summary(stage_report.stage.kind, found) if found else None


def _metrics(report) -> dict[tuple[str, str], tuple[float, bool]]:
    """{(stage id, metric): (value, higher is better)} of a run's finished stages."""

    reader = RootReader(report.root)
    out: dict[tuple[str, str], tuple[float, bool]] = {}

    def put(stage: str, metric: str, value, higher: bool = True) -> None:
        if _number(value) is not None:
            out[(stage, metric)] = (_number(value), higher)

    for sr in report.stages:
        sid = sr.stage.id
        m = _stage_metrics(reader, sr) if sr.stage.kind in ("evaluate", "finetune") else None
        if sr.stage.kind == "evaluate" and m:
            put(sid, "held-out MLM accuracy", m.mlm_accuracy)
            put(sid, "held-out MLM loss", m.mlm_loss, higher=False)
            put(sid, "held-out NSP accuracy", m.nsp_accuracy)
            for task, tm in sorted((m.tasks or {}).items()):  # a mixture's members
                put(sid, f"held-out MLM accuracy, task {task}", tm.mlm_accuracy)
        elif sr.stage.kind == "finetune" and m:
            for name, scores in m.dev_scores().items():
                put(sid, "dev accuracy" + ("" if name == "dev" else f", {name}"),
                    scores.values.get(ACCURACY))
        elif sr.stage.kind == "sweep" and sr.done:  # each setting's mean over its seeds
            sweep = _json(reader.text(reader.join(sr.dir, SWEEP_FILE)))
            for setting in sweep.get("settings") or []:
                put(sid, f"dev {sweep.get('metric', 'score')} of {setting.get('name')}, mean "
                    "over seeds", setting.get("mean"))
            selected = sweep.get("selected") or {}
            put(sid, f"dev {sweep.get('metric', 'score')} of the selected setting",
                selected.get("mean"))
    return out


def _json(text) -> dict:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def metric_rows(old_report, new_report) -> list[MetricRow]:
    """Every metric either run measured, in NEW's stage order, then OLD's others."""
    old, new = _metrics(old_report), _metrics(new_report)
    order = [s.stage.id for s in new_report.stages] + [s.stage.id for s in old_report.stages]
    keys = sorted([*new, *(k for k in old if k not in new)], key=lambda k: order.index(k[0]))
    rows = []
    for key in keys:
        higher = (new.get(key) or old.get(key))[1]
        rows.append(MetricRow(key[0], key[1], (old.get(key) or (None,))[0],
                              (new.get(key) or (None,))[0], higher))
    return rows
