"""Planning the finetune stage: a classification task on the pretrained or a released
encoder, its files and labels checked where they can be read cheaply."""

from __future__ import annotations

import os
import re
from typing import Optional

from runexp.compiler import uris
from runexp.compiler.errors import did_you_mean
from runexp.compiler.plan import Stage
from runexp.compiler.specs import FinetuneSpec
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.stages.encoder import check_init_checkpoint, model_config

TASK = "classification_task"
# Training files up to this size are read at compile time to check their labels.
LABEL_CHECK_BYTES = 16 << 20


def plan_finetune(ctx: PlanContext, task: str, vocab: Stage, pretrain: Optional[Stage],
                  accel) -> Optional[Stage]:
    tasks = ctx.r.scopes(TASK)
    if task not in tasks:
        ctx.c.error(f"finetune.task names {task!r}, which is not a registered "
                    "classification_task", ctx.loc("finetune", "task"),
                    hint=(did_you_mean(task, tasks) or "") + f" (register one with "
                    f"{task}/classification_task.train_file = '...')")
        return None
    b = StageBuilder(ctx.r)
    b.set("task", task, ctx.r.provenance("finetune", "task").short())
    p = b.take_spec(FinetuneSpec, "finetune", task)
    init = p["init_checkpoint"]
    if pretrain is not None:
        b.copy(pretrain, "model")
        if init is not None:
            ctx.c.error("finetune.init_checkpoint is set, but this experiment also "
                        "pretrains: the fine-tune starts from the pretrain stage",
                        ctx.loc("finetune", "init_checkpoint"),
                        hint="remove finetune.init_checkpoint, or drop pretraining (unset "
                             "train.task) to fine-tune that checkpoint")
            return None
    else:
        if model_config(ctx, b, vocab) is None:
            return None
        if init is None:
            ctx.c.error("a fine-tune without pretraining needs a checkpoint to start from, "
                        "but finetune.init_checkpoint is not set",
                        ctx.loc("finetune", "init_checkpoint") or ctx.loc("finetune", "task"),
                        hint="set INIT_CHECKPOINT to the released checkpoint's prefix, e.g. "
                             "'gs://BUCKET/uncased_L-12_H-768_A-12/bert_model.ckpt'")
            return None
        p["init_checkpoint"] = uris.absolute(init)
        check_init_checkpoint(ctx, p["init_checkpoint"], p["model"],
                              ctx.loc("finetune", "init_checkpoint"), accel)
    b.set("accelerator", accel.to_dict() if accel else None, "experiment.accelerator")
    check_finetune(ctx, task, p, accel)
    inputs, fps, deps = finetune_files(ctx, task)
    labels = p["labels"]
    if labels is not None and "train_file" in inputs and not uris.is_gcs(inputs["train_file"]):
        check_labels(ctx, task, inputs["train_file"], labels, p["text_fields"],
                     p["label_field"])
    inputs["vocab_dir"] = vocab.output_dir
    fps["vocab"] = vocab.fingerprint
    deps.append(vocab.id)
    if pretrain is not None:
        inputs["checkpoint_dir"] = pretrain.output_dir
        fps["checkpoint"] = pretrain.fingerprint
        deps.append(pretrain.id)
    else:
        inputs["init_checkpoint"] = p["init_checkpoint"]
        fps["checkpoint"] = ctx.checkpoint_digest(p["init_checkpoint"])
    return ctx.add(f"finetune.{task}", "finetune", b, inputs, fps, sorted(set(deps)))


def check_finetune(ctx: PlanContext, task: str, p: dict, accel) -> None:
    fields, labels = p["text_fields"], p["labels"]
    if fields is not None and len(fields) not in (1, 2):
        ctx.c.error(f"{task}/classification_task.text_fields must name one or two fields, "
                    f"got {fields!r}", ctx.loc(TASK, "text_fields", task),
                    hint="['sentence'] or ['sentence1', 'sentence2']")
    if labels is not None and len(set(labels)) < 2:
        ctx.c.error(f"{task}: a classification task needs at least two labels, got {labels!r}",
                    ctx.loc(TASK, "labels", task))
    length, max_pos = p["max_seq_length"], p["model"]["max_position_embeddings"]
    if length and length > max_pos:
        ctx.c.error(f"finetune.max_seq_length ({length}) exceeds max_position_embeddings "
                    f"({max_pos})", ctx.loc("finetune", "max_seq_length"),
                    hint=f"use at most {max_pos}")
    ctx.check_batch(p["batch_size"], accel, "fine-tune batch size",
                    ctx.loc("finetune", "batch_size"))


def finetune_files(ctx: PlanContext, task: str) -> tuple[dict, dict, list]:
    """The task's train file and its named dev sets (dev_file is the set named "dev")."""
    inputs, fps, deps = {}, {}, []

    def one(value, label, location):
        found, fp, d = ctx.files([value], label, location)
        deps.extend(d)
        return (found[0] if found else None), fp

    train = ctx.r.get(TASK, "train_file", task)
    if train is not None:
        found, fps["train_file"] = one(train, f"{task}.train_file",
                                       ctx.loc(TASK, "train_file", task))
        if found:
            inputs["train_file"] = found
    dev_file = ctx.r.get(TASK, "dev_file", task)
    dev_files = ctx.r.get(TASK, "dev_files", task)
    loc_dev = ctx.loc(TASK, "dev_files", task)
    named: dict = {}
    if dev_file is not None:
        named["dev"] = (dev_file, ctx.loc(TASK, "dev_file", task))
    for name, value in (dev_files or {}).items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name) \
                or not isinstance(value, str):
            ctx.c.error(f"{task}/classification_task.dev_files: entry {name!r}: {value!r} "
                        "must map a plain name to a file", loc_dev,
                        hint="e.g. {'matched': 'dev_matched.tsv', 'mismatched': "
                             "'dev_mismatched.tsv'}")
            continue
        if name in named:
            ctx.c.error(f"{task}: dev set {name!r} is given by both dev_file and dev_files",
                        loc_dev, hint="use one of them")
            continue
        named[name] = (value, loc_dev)
    if not named:
        ctx.c.error(f"{task}: no dev set: set {task}/classification_task.dev_file or "
                    "dev_files", ctx.loc(TASK, "train_file", task),
                    hint="the fine-tune is scored on each dev set")
    dev_uris = {}
    for name, (value, location) in named.items():
        found, fps[f"dev_files.{name}"] = one(value, f"{task}.dev_files[{name!r}]", location)
        if found:
            dev_uris[name] = found
            if found == inputs.get("train_file"):
                ctx.c.warn(f"{task}: dev set {name!r} is the train file: accuracy will be "
                           "optimistic", location,
                           hint="evaluate on examples the model does not train on")
    inputs["dev_files"] = dev_uris
    return inputs, fps, deps


def check_labels(ctx: PlanContext, task: str, path: str, labels: list, text_fields,
                 label_field) -> None:
    """Labels in the training data that the task does not list (when the file is small)."""
    if not os.path.isfile(path) or os.path.getsize(path) > LABEL_CHECK_BYTES or not text_fields:
        return
    from runexp.tasks.classification import load_examples  # light: numpy, no TensorFlow

    loc = ctx.loc(TASK, "labels", task)
    try:
        found = {label for _, label in load_examples(path, text_fields, label_field)}
    except ValueError as e:
        ctx.c.error(f"{task}: cannot read the training data: {e}", loc,
                    hint="fix the file, or check text_fields and label_field")
        return
    unknown = sorted(found - set(labels))
    if unknown:
        ctx.c.error(f"{task}: the training data has {len(found)} labels, "
                    f"{len(unknown)} of them not in {task}/classification_task.labels: "
                    f"{', '.join(map(repr, unknown[:5]))}", loc,
                    hint="add them to labels, or leave labels unset to read them from the data")
