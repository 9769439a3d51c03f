"""Planning a downstream suite (finetune.suite): one finetune stage per task, GLUE's read
from glue.data_dir in GLUE's layout (compiler/glue_tasks.py), the others registered
classification_tasks; all on the one vocab and encoder; then the suite stage, which scores
them together.

Why a stage for the summary: suite.json is then an output like any other, made once every
fine-tune is done, remade exactly when one of them changes (its fingerprint is theirs), and
found on gs:// beside them; the compiler only chains it (no scoring here), and its handler
reads the fine-tunes' metrics.json, without TensorFlow.
"""

from __future__ import annotations

from typing import Optional, Sequence

from runexp.compiler.errors import did_you_mean
from runexp.compiler.glue_tasks import GLUE_TASKS, LEFT_OUT
from runexp.compiler.plan import Stage
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.stages.finetune import TASK, plan_finetune
from runexp.compiler.sweep import Grid


def plan_suite(ctx: PlanContext, names: Sequence[str], vocab: Stage, pretrain: Optional[Stage],
               accel, grid: Optional[Grid] = None) -> list[Stage]:
    """The suite's finetune stages, then the suite stage (when every task was planned). With
    a sweep's ``grid``, each task's points and its sweep stage, whose metrics.json (the
    selected point's, its mean over the seeds) the suite stage reads."""
    where = ctx.loc("finetune", "suite")
    registered = ctx.r.scopes(TASK)
    glue_dir = ctx.r.get("glue", "data_dir")
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        ctx.c.error(f"finetune.suite names {', '.join(map(repr, repeated))} more than once",
                    where, hint="name each task once")
        return []
    if grid is not None and ctx.r.get("finetune", "export_point") is not None:
        ctx.c.error("finetune.export_point is set, but the export of a suite is of the "
                    "pretrained encoder: no point of its sweeps is exported",
                    ctx.loc("finetune", "export_point"),
                    hint="unset finetune.export_point (each task's sweep.json names its "
                         "selected point)")
    stages, known = [], [*GLUE_TASKS, *registered]
    for name in names:
        glue = GLUE_TASKS.get(name)
        if name in LEFT_OUT:
            ctx.c.error(f"finetune.suite names {name!r}: {LEFT_OUT[name]}", where,
                        hint=f"drop {name!r}; GLUE's others are {', '.join(GLUE_TASKS)}")
            continue
        if glue is not None and name in registered:
            ctx.c.error(f"finetune.suite names {name!r}, which is both GLUE's {glue.directory} "
                        "and a classification_task of this experiment", where,
                        hint=f"rename your task (its stage would be finetune.{name} too), or "
                             f"unset {name}/classification_task.* to fine-tune GLUE's")
            continue
        if glue is not None and glue_dir is None:
            ctx.c.error(f"finetune.suite names GLUE's {glue.directory} ({name!r}), but "
                        "glue.data_dir is not set", where,
                        hint="set GLUE_DIR to the directory holding GLUE's task directories "
                             "(MNLI/, QQP/, CoLA/, ...)")
            continue
        if glue is None and name not in registered:
            ctx.c.error(f"finetune.suite names {name!r}, which is neither a GLUE task nor a "
                        "registered classification_task", where,
                        hint=(did_you_mean(name, known) or "") + f" (GLUE's: "
                        f"{', '.join(GLUE_TASKS)}; or register {name}/classification_task."
                        "train_file = '...')")
            continue
        stage = plan_finetune(ctx, name, vocab, pretrain, accel, glue=glue, glue_dir=glue_dir,
                              grid=grid)
        if stage is None:  # a problem every task shares (the checkpoint): said once
            return stages
        stages.append(stage)
    if len(stages) == len(names) and stages:
        b = StageBuilder(ctx.r)
        why = ctx.r.provenance("finetune", "suite").short()
        b.set("tasks", list(names), why)
        b.set("glue_tasks", [n for n in names if n in GLUE_TASKS], why)
        ctx.add("suite", "suite", b, {"finetune_dirs": {s.params["task"]: s.output_dir
                                                        for s in stages}},
                {s.id: s.fingerprint for s in stages}, [s.id for s in stages])
    return stages
