"""Planning the pretrain stage: the encoder, the optimizer, the loop, and their checks."""

from __future__ import annotations

from typing import Optional

from runexp.compiler import uris
from runexp.compiler.plan import Stage
from runexp.compiler.specs import TrainSpec
from runexp.compiler.stages.common import PlanContext, StageBuilder, data_inputs
from runexp.compiler.stages.encoder import check_init_checkpoint, model_config


def plan_pretrain(ctx: PlanContext, pre, vocab: Stage, accel) -> Optional[Stage]:
    """``pre``: the preprocess stage, or a mixture's list of them."""
    pres = pre if isinstance(pre, list) else [pre]
    b = StageBuilder(ctx.r)
    config = model_config(ctx, b, vocab)
    p = b.take_spec(TrainSpec, "train")
    init = p["init_checkpoint"]
    if init is not None:
        p["init_checkpoint"] = uris.absolute(init)
    if p["jit_compile"] is None:
        # bench/train.py: one CPU replica trains ~13% faster compiled; under
        # MirroredStrategy only the gradients compile, which gains little.
        b.set("jit_compile", accel is not None and (accel.type == "tpu" or accel.replicas == 1),
              "auto: on for TPUs and for one replica (see train.jit_compile)")
    b.copy(pres[0], "max_seq_length", "max_predictions_per_seq")
    if isinstance(pre, list):
        name = ctx.r.get("train", "task")
        rates = ctx.r.get("bert_pretraining_mixture", "rates", name)
        b.set("mixture", name, f"train.task @ {ctx.r.provenance('train', 'task').short()}")
        b.set("mixture_rates", {t: float(rates[t]) for t in sorted(rates)},
              ctx.r.provenance("bert_pretraining_mixture", "rates", name).short())
    b.set("accelerator", accel.to_dict() if accel else None, "experiment.accelerator")
    if config is None:
        return None
    check_training(ctx, p, config, pres[0].params["task"], accel)
    inputs, fps, deps = data_inputs(pre)
    inputs["vocab_dir"] = vocab.output_dir
    fps["vocab"] = vocab.fingerprint
    if init is not None:
        check_init_checkpoint(ctx, p["init_checkpoint"], config,
                              ctx.loc("train", "init_checkpoint"), accel)
        inputs["init_checkpoint"] = p["init_checkpoint"]
        fps["init_checkpoint"] = ctx.checkpoint_digest(p["init_checkpoint"])
    return ctx.add("pretrain", "pretrain", b, inputs, fps, [*deps, vocab.id])


def check_training(ctx: PlanContext, p: dict, config: dict, task: str, accel) -> None:
    length = p["max_seq_length"]
    if length and length > config["max_position_embeddings"]:
        ctx.c.error(f"max_seq_length ({length}) exceeds the model's max_position_embeddings "
                    f"({config['max_position_embeddings']})",
                    ctx.loc("bert_pretraining_task", "max_seq_length", task),
                    hint="shorten MAX_SEQ_LENGTH or raise model.max_position_embeddings")
    batch = p["batch_size"]
    ctx.check_batch(batch, accel, "global batch size", ctx.loc("train", "batch_size"))
    accum = p["grad_accum_steps"]
    if accel is not None and batch and accum and batch % accel.replicas == 0 \
            and batch % (accel.replicas * accum):
        ctx.c.error(f"global batch size {batch} cannot be split into {accum} micro-batches "
                    f"across {accel.replicas} replica(s)", ctx.loc("train", "grad_accum_steps"),
                    hint=f"use a batch size divisible by {accel.replicas * accum}")
    if accel is not None and p["compute_dtype"] == "mixed_float16" and accel.type == "tpu":
        ctx.c.error("mixed_float16 is for GPUs; TPUs compute in bfloat16",
                    ctx.loc("train", "compute_dtype"), hint="set train.compute_dtype = 'bfloat16'")
    steps, warmup = p["train_steps"], p["warmup_steps"]
    if steps and warmup is not None and warmup > steps:
        ctx.c.warn(f"warmup_steps ({warmup}) exceeds train steps ({steps}): the learning "
                   "rate never reaches its peak", ctx.loc("train", "warmup_steps"),
                   hint="warm up over about 1-10% of training")
    every, loop = p["checkpoint_every"], p["steps_per_loop"]
    if every and loop and every % loop:
        ctx.c.error(f"checkpoint_every ({every}) is not a multiple of steps_per_loop ({loop})",
                    ctx.loc("train", "checkpoint_every"),
                    hint="checkpoints are written between host loops")
