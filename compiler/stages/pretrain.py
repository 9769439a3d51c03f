"""Planning the pretrain stage (one per pretraining phase: compiler/stages/phases.py): the
encoder, the optimizer, the loop, and their checks."""

from __future__ import annotations

from typing import Optional

from runexp.compiler.plan import Stage
from runexp.compiler.specs import PreprocessSpec, TrainSpec
from runexp.compiler.specs.preprocess import MAX_INSTANCES_PER_ROW
from runexp.compiler.specs.phases import LATER_PHASES_ONLY
from runexp.compiler.stages.common import PlanContext, StageBuilder, data_inputs
from runexp.compiler.stages.encoder import check_init_checkpoint, model_config
from runexp.compiler.stages.huggingface_init import huggingface_init, init_checkpoint
from runexp.compiler.stages.phases import SINGLE, Phase


def plan_pretrain(ctx: PlanContext, pre, vocab: Stage, accel, phase: Phase = SINGLE,
                  previous: Optional[Stage] = None) -> Optional[Stage]:
    """``pre``: the phase's preprocess stage, or a mixture's list of them; ``previous``: the
    pretrain stage of the phase before (whose final checkpoint this phase starts from)."""
    pres = pre if isinstance(pre, list) else [pre]
    b = StageBuilder(ctx.r)
    init = init_checkpoint(ctx, "train") if previous is None else None
    hf = init and huggingface_init(ctx, init, ctx.loc("train", "init_checkpoint"))
    config = model_config(ctx, b, vocab, hf)
    p = b.take_spec(TrainSpec, "train")
    phase.apply(b, "pretrain")
    if previous is None:
        _drop_later_phase_settings(ctx, b, phase)
    else:
        # The phase starts from the previous one's weights, never from init_checkpoint.
        del b.params["init_checkpoint"], b.provenance["init_checkpoint"]
    if init is not None:
        p["init_checkpoint"] = init
    if p["jit_compile"] is None:
        # bench/train.py: one CPU replica trains ~13% faster compiled; under
        # MirroredStrategy only the gradients compile, which gains little.
        b.set("jit_compile", accel is not None and (accel.type == "tpu" or accel.replicas == 1),
              "auto: on for TPUs and for one replica (see train.jit_compile)")
    b.copy(pres[0], "max_seq_length", "max_predictions_per_seq")
    plan_packing(ctx, b, pres[0], phase)
    if isinstance(pre, list):
        name = ctx.r.get("train", "task")
        rates = ctx.r.get("bert_pretraining_mixture", "rates", name)
        b.set("mixture", name, f"train.task @ {ctx.r.provenance('train', 'task').short()}")
        b.set("mixture_rates", {t: float(rates[t]) for t in sorted(rates)},
              ctx.r.provenance("bert_pretraining_mixture", "rates", name).short())
    b.set("accelerator", accel.to_dict() if accel else None, "experiment.accelerator")
    if config is None:
        return None
    check_training(ctx, p, config, pres[0].params["task"], accel, phase)
    inputs, fps, deps = data_inputs(pre)
    inputs["vocab_dir"] = vocab.output_dir
    fps["vocab"] = vocab.fingerprint
    if init is not None:
        check_init_checkpoint(ctx, init, config, ctx.loc("train", "init_checkpoint"), accel,
                              hf, vocab)
        inputs["init_checkpoint"] = init
        fps["init_checkpoint"] = ctx.checkpoint_digest(init, directory=hf is not None)
    if previous is not None:
        inputs["previous_phase_dir"] = previous.output_dir
        fps["previous_phase"] = previous.fingerprint
        deps = [*deps, previous.id]
    return ctx.add(f"pretrain{phase.suffix}", "pretrain", b, inputs, fps, [*deps, vocab.id])


def plan_packing(ctx: PlanContext, b: StageBuilder, pre: Stage, phase: Phase) -> None:
    """A phase trained on packed rows (the preprocess stage's ``packing``) says so, with its
    rows' prediction slots and what its batch size counts; unpacked, none of the three is in
    the plan (as plans made before packing existed, whose fingerprints stay the same)."""
    names = ("packing", "max_predictions_per_row", "batch_counts")
    if pre.params.get("packing"):
        b.copy(pre, "packing")
        spec = PreprocessSpec.pick(pre.params)
        b.set("max_predictions_per_row", spec.predictions_per_row,
              f"derived: {MAX_INSTANCES_PER_ROW} instances a row, masked_lm_prob "
              f"{spec.masking.masked_lm_prob:g} of {spec.max_seq_length} tokens")
        return
    where = phase.loc(ctx, "batch_counts", "train", "batch_counts")
    if where is not None and b.params.get("batch_counts") != TrainSpec.default("batch_counts"):
        ctx.c.warn(f"{phase.label}train.batch_counts says what a batch of packed rows counts, "
                   "and this phase's examples are not packed: it is ignored", where,
                   hint="remove it, or pack the phase's examples ('packing': True)")
    for name in names:
        b.params.pop(name, None)
        b.provenance.pop(name, None)


def _drop_later_phase_settings(ctx: PlanContext, b: StageBuilder, phase: Phase) -> None:
    """The first (or only) phase starts from scratch or init_checkpoint: how a phase starts
    from the one before does not apply; binding it without later phases changes nothing."""
    for name in LATER_PHASES_ONLY:
        value = b.params.pop(name)
        b.provenance.pop(name)
        where = ctx.loc("train", name)
        if phase.count == 1 and where is not None and value != TrainSpec.default(name):
            ctx.c.warn(f"train.{name} applies to pretraining phases after the first, and this "
                       "experiment trains in one: it is ignored", where,
                       hint="remove it, or declare the phases: train.phases = [{...}, {...}]")


def check_training(ctx: PlanContext, p: dict, config: dict, task: str, accel,
                   phase: Phase = SINGLE) -> None:
    length, label = p["max_seq_length"], phase.label
    if length and length > config["max_position_embeddings"]:
        ctx.c.error(f"{label}max_seq_length ({length}) exceeds the model's "
                    f"max_position_embeddings ({config['max_position_embeddings']})",
                    phase.loc(ctx, "max_seq_length", "bert_pretraining_task", "max_seq_length",
                              task),
                    hint=(f"shorten phase {phase.number}'s 'max_seq_length'"
                          if phase.sets("max_seq_length") else "shorten MAX_SEQ_LENGTH")
                    + " or raise model.max_position_embeddings")
    batch = p["batch_size"]
    ctx.check_batch(batch, accel, f"{label}global batch size",
                    phase.loc(ctx, "batch_size", "train", "batch_size"))
    accum = p["grad_accum_steps"]
    if accel is not None and batch and accum and batch % accel.replicas == 0 \
            and batch % (accel.replicas * accum):
        ctx.c.error(f"{label}global batch size {batch} cannot be split into {accum} "
                    f"micro-batches across {accel.replicas} replica(s)",
                    phase.loc(ctx, "grad_accum_steps", "train", "grad_accum_steps"),
                    hint=f"use a batch size divisible by {accel.replicas * accum}")
    if accel is not None and p["compute_dtype"] == "mixed_float16" and accel.type == "tpu":
        ctx.c.error("mixed_float16 is for GPUs; TPUs compute in bfloat16",
                    ctx.loc("train", "compute_dtype"), hint="set train.compute_dtype = 'bfloat16'")
    steps, warmup = p["train_steps"], p["warmup_steps"]
    if steps and warmup is not None and warmup > steps:
        ctx.c.warn(f"{label}warmup_steps ({warmup}) exceeds train steps ({steps}): the "
                   "learning rate never reaches its peak",
                   phase.loc(ctx, "warmup_steps", "train", "warmup_steps"),
                   hint="warm up over about 1-10% of training")
    every, loop = p["checkpoint_every"], p["steps_per_loop"]
    if every and loop and every % loop:
        ctx.c.error(f"{label}checkpoint_every ({every}) is not a multiple of steps_per_loop "
                    f"({loop})", phase.loc(ctx, "checkpoint_every", "train", "checkpoint_every"),
                    hint="checkpoints are written between host loops")
