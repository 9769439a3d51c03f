"""Planning the export stage: the fine-tuned model when there is one (of a sweep, its
selected or named point: compiler/sweep.py), else the encoder."""

from __future__ import annotations

from typing import Optional

from runexp.compiler.plan import Stage
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.sweep import export_source


def plan_export(ctx: PlanContext, vocab: Stage, pretrain: Optional[Stage],
                finetune: Optional[Stage]) -> Optional[Stage]:
    source = finetune or pretrain
    if source is None:
        return None
    point = None
    if finetune is not None and finetune.kind == "sweep":  # the selected or the named point
        point = export_source(ctx, finetune)
        source = point[3]
    b = StageBuilder(ctx.r)
    b.copy(source, "model")
    inputs = {"vocab_dir": vocab.output_dir}
    fps = {"vocab": vocab.fingerprint}
    deps = [vocab.id]
    if pretrain is not None:
        inputs["checkpoint_dir"] = pretrain.output_dir
        fps["checkpoint"] = pretrain.fingerprint
        deps.append(pretrain.id)
    if point is not None:
        inputs.update(point[0])
        fps.update(point[1])
        deps.extend(point[2])
    elif finetune is not None:
        inputs["finetune_dir"] = finetune.output_dir
        fps["finetune"] = finetune.fingerprint
        deps.append(finetune.id)
    return ctx.add("export", "export", b, inputs, fps, deps)
