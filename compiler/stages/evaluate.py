"""Planning the evaluate stage: held-out MLM/NSP metrics of the pretrained encoder."""

from __future__ import annotations

from runexp.compiler.plan import Stage
from runexp.compiler.specs import EvaluateSpec
from runexp.compiler.stages.common import PlanContext, StageBuilder, data_inputs


def plan_evaluate(ctx: PlanContext, pre, pretrain: Stage) -> Stage:
    """``pre``: the preprocess stage, or the list of a mixture's with held-out files."""
    pres = pre if isinstance(pre, list) else [pre]
    b = StageBuilder(ctx.r)
    b.copy(pretrain, "model")
    b.take_spec(EvaluateSpec, "evaluate")
    b.copy(pres[0], "max_seq_length", "max_predictions_per_seq")
    inputs, fps, deps = data_inputs(pre)
    inputs["checkpoint_dir"] = pretrain.output_dir
    fps["checkpoint"] = pretrain.fingerprint
    return ctx.add("evaluate", "evaluate", b, inputs, fps, [*deps, pretrain.id])
