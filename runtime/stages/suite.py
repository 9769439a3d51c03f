"""suite stage: the fine-tunes of a downstream suite scored together, into ``suite.json``.

Contract (docs/STAGES.md): params ``tasks`` (the suite's, in order) and ``glue_tasks``
(those that are GLUE's); inputs ``finetune_dirs`` (task -> its finetune stage directory,
holding ``metrics.json``). Writes ``suite.json``: per task its kind, metrics, each dev set's
scores and its task score; and ``glue``: the GLUE average over the GLUE tasks run
(runtime/glue_score.py: the leaderboard's rule), which tasks it covers, those of GLUE's it
lacks, and that WNLI is left out. No TensorFlow.
"""

from __future__ import annotations

import json
import os

from runexp.compiler.glue_tasks import GLUE_TASKS, LEFT_OUT
from runexp.compiler.specs import SuiteSpec
from runexp.compiler.specs.finetune import FinetuneMetrics
from runexp.compiler.specs.suite import SuiteSummary, SuiteTask
from runexp.runtime.glue_score import RULE, glue_average, task_score

SUITE_FILE = "suite.json"
METRICS_FILE = "metrics.json"  # each finetune stage's


def _task(metrics: dict) -> SuiteTask:
    run = FinetuneMetrics.read(metrics)
    names = run.scored_by  # runs older than task kinds: accuracy
    dev_sets = {name: {m: scores.values[m] for m in names}
                for name, scores in run.dev_scores().items()}
    return SuiteTask(kind=run.kind or "classification", metrics=names, dev_sets=dev_sets,
                     score=task_score(dev_sets, names), dev_examples=run.dev_examples)


def _tasks(tasks: dict) -> dict[str, SuiteTask]:
    return {name: _task(metrics) for name, metrics in tasks.items()}


def summarise(tasks: dict, glue_tasks: list) -> dict:
    """suite.json's contents from each task's metrics.json contents."""
    per_task = _tasks(tasks)
    glue = {"rule": RULE, "tasks": list(glue_tasks),
            "missing": [n for n in GLUE_TASKS if n not in glue_tasks],
            "left_out": dict(LEFT_OUT)}
    if glue_tasks:
        glue["average"] = glue_average({n: per_task[n].score for n in glue_tasks})
    return {"tasks": {name: task.to_dict() for name, task in per_task.items()}, "glue": glue}


def run(ctx) -> SuiteSummary:
    spec = SuiteSpec.from_stage(ctx)
    tasks = {}
    for name in spec.tasks:
        with open(os.path.join(ctx.inputs["finetune_dirs"][name], METRICS_FILE),
                  encoding="utf-8") as f:
            tasks[name] = json.load(f)
    suite = summarise(tasks, list(spec.glue_tasks))
    with open(os.path.join(ctx.work_dir, SUITE_FILE), "w", encoding="utf-8") as f:
        json.dump(suite, f, indent=2)
        f.write("\n")
    per_task = _tasks(tasks)
    for name, task in per_task.items():
        ctx.progress(f"{name}: score {task.score:.4f} ("
                     + "; ".join(f"{s}: " + ", ".join(f"{m} {v:.4f}" for m, v in scores.items())
                                 for s, scores in task.dev_sets.items()) + ")")
    glue = suite["glue"]
    scores = {n: t.score for n, t in per_task.items()}
    if "average" not in glue:
        return SuiteSummary(task_scores=scores)
    partial = f"; without {', '.join(glue['missing'])}" if glue["missing"] else ""
    ctx.progress(f"GLUE average {glue['average']:.4f} over {', '.join(glue['tasks'])} "
                 f"(WNLI left out{partial})")
    return SuiteSummary(task_scores=scores, glue_average=glue["average"],
                        glue_tasks=glue["tasks"])
