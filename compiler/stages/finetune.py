"""Planning the finetune stage: a classification task on the pretrained or a released
encoder, its files and labels checked where they can be read cheaply."""

from __future__ import annotations

import os
import re
from typing import Optional

from runexp.compiler import uris
from runexp.compiler.formats.classification_files import DataFileError, load_examples
from runexp.compiler.errors import did_you_mean
from runexp.compiler.plan import Stage
from runexp.compiler.specs import FinetuneSpec
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.stages.encoder import check_init_checkpoint, model_config
from runexp.compiler.stages.huggingface_init import huggingface_init
from runexp.compiler.glue_tasks import GlueTask, header_problem
from runexp.compiler.specs.task_kinds import KINDS, metric_names, task_kind
from runexp.compiler.sweep import Grid, plan_points

TASK = "classification_task"
# Task settings newer than the plans of existing experiments: left out of a plan while unset
# (a plan's missing param takes its spec default), so those plans keep their fingerprints.
LEFT_OUT_UNSET = ("kind", "metrics", "columns")
# Training files up to this size are read at compile time to check their labels.
LABEL_CHECK_BYTES = 16 << 20
SAMPLE_ROWS = 10_000  # rows of larger files read at compile time


def plan_finetune(ctx: PlanContext, task: str, vocab: Stage, pretrain: Optional[Stage],
                  accel, glue: Optional[GlueTask] = None,
                  glue_dir: Optional[str] = None, grid: Optional[Grid] = None) -> Optional[Stage]:
    """The finetune stage of a registered classification_task, or of a ``glue`` task read
    from ``glue_dir``; with a sweep's ``grid``, one finetune stage per point and the task's
    sweep stage, which is returned (compiler/sweep.py). None after reporting a problem every
    fine-tune would share."""
    tasks = ctx.r.scopes(TASK)
    if glue is None and task not in tasks:
        ctx.c.error(f"finetune.task names {task!r}, which is not a registered "
                    "classification_task", ctx.loc("finetune", "task"),
                    hint=(did_you_mean(task, tasks) or "") + f" (register one with "
                    f"{task}/classification_task.train_file = '...')")
        return None
    b = StageBuilder(ctx.r)
    b.set("task", task, ctx.r.provenance("finetune", "task").short())
    p = b.take_spec(FinetuneSpec, "finetune", task)
    if glue is not None:
        for name, value in glue.settings().items():
            b.set(name, value, f"GLUE's {glue.directory} (compiler/glue_tasks.py)")
    _leave_out_unset(b)
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
        hf = init and huggingface_init(ctx, uris.absolute(init),
                                       ctx.loc("finetune", "init_checkpoint"))
        if model_config(ctx, b, vocab, hf) is None:
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
                              ctx.loc("finetune", "init_checkpoint"), accel, hf, vocab)
    b.set("accelerator", accel.to_dict() if accel else None, "experiment.accelerator")
    check_finetune(ctx, task, p, accel)
    if glue is not None:
        inputs, fps, deps = glue_files(ctx, glue, glue_dir)
        if check_glue_headers(ctx, glue, inputs):
            check_classification_files(ctx, task, inputs, p)
    else:
        inputs, fps, deps = finetune_files(ctx, task)
        check_classification_files(ctx, task, inputs, p)
    inputs["vocab_dir"] = vocab.output_dir
    fps["vocab"] = vocab.fingerprint
    deps.append(vocab.id)
    if pretrain is not None:
        inputs["checkpoint_dir"] = pretrain.output_dir
        fps["checkpoint"] = pretrain.fingerprint
        deps.append(pretrain.id)
    else:
        inputs["init_checkpoint"] = p["init_checkpoint"]
        fps["checkpoint"] = ctx.checkpoint_digest(p["init_checkpoint"],
                                                  directory=hf is not None)
    if grid is not None:
        return plan_points(ctx, task, b, inputs, fps, sorted(set(deps)), grid, accel)
    return ctx.add(f"finetune.{task}", "finetune", b, inputs, fps, sorted(set(deps)))


def _loc(ctx: PlanContext, task: str, param: str):
    """Where a task's setting is bound; for a GLUE task (not registered: its settings are
    GLUE's), where glue.data_dir is."""
    if task not in ctx.r.scopes(TASK):
        return ctx.loc("glue", "data_dir")
    return ctx.loc(TASK, param, task)


def _leave_out_unset(b: StageBuilder) -> None:
    for name in LEFT_OUT_UNSET:
        if b.params.get(name) is None:
            b.params.pop(name, None)
            b.provenance.pop(name, None)


def check_finetune(ctx: PlanContext, task: str, p: dict, accel) -> None:
    fields, labels = p["text_fields"], p["labels"]
    if fields is not None and len(fields) not in (1, 2):
        ctx.c.error(f"{task}/classification_task.text_fields must name one or two fields, "
                    f"got {fields!r}", _loc(ctx, task, "text_fields"),
                    hint="['sentence'] or ['sentence1', 'sentence2']")
    elif fields is not None:
        check_kind(ctx, task, p)
    regression = p.get("kind") is not None and KINDS[p["kind"]].regression
    if labels is not None and len(set(labels)) < 2 and not regression:
        ctx.c.error(f"{task}: a classification task needs at least two labels, got {labels!r}",
                    _loc(ctx, task, "labels"))
    length, max_pos = p["max_seq_length"], p["model"]["max_position_embeddings"]
    if length and length > max_pos:
        ctx.c.error(f"finetune.max_seq_length ({length}) exceeds max_position_embeddings "
                    f"({max_pos})", ctx.loc("finetune", "max_seq_length"),
                    hint=f"use at most {max_pos}")
    ctx.check_batch(p["batch_size"], accel, "fine-tune batch size",
                    ctx.loc("finetune", "batch_size"))


def check_kind(ctx: PlanContext, task: str, p: dict) -> None:
    """The declared kind fits the text fields; the metrics exist and fit the kind (F1 of
    the positive class needs exactly two labels); a regression lists no labels."""
    kind = task_kind(p.get("kind"), p["text_fields"])
    where = _loc(ctx, task, "kind")
    if kind.text_fields is not None and kind.text_fields != len(p["text_fields"]):
        ctx.c.error(f"{task}: kind {kind.name!r} takes {kind.text_fields} text field"
                    f"{'s' if kind.text_fields > 1 else ''}, but text_fields is "
                    f"{list(p['text_fields'])!r}", where or _loc(ctx, task, "text_fields"),
                    hint="name the fields the kind reads, or choose the kind of the fields")
    metrics_loc = _loc(ctx, task, "metrics")
    names = metric_names(kind, p.get("metrics"))
    wrong = [m for m in names if m not in kind.allowed_metrics]
    if wrong:
        ctx.c.error(f"{task}: {', '.join(map(repr, wrong))} cannot score a {kind.name} task",
                    metrics_loc, hint=f"a {kind.name} task is scored by any of "
                    f"{', '.join(kind.allowed_metrics)}")
    labels = p["labels"]
    if "f1" in names and labels is not None and len(labels) != 2:
        ctx.c.error(f"{task}: f1 scores the positive class of a binary task, but it has "
                    f"{len(labels)} labels", metrics_loc,
                    hint="f1's positive class is the second label: list two labels, or drop f1")
    if kind.regression and labels is not None:
        ctx.c.error(f"{task}: a regression has no labels, but labels is {list(labels)!r}",
                    _loc(ctx, task, "labels"),
                    hint="unset labels: a regression's label_field holds numbers")


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
                                       _loc(ctx, task, "train_file"))
        if found:
            inputs["train_file"] = found
    dev_file = ctx.r.get(TASK, "dev_file", task)
    dev_files = ctx.r.get(TASK, "dev_files", task)
    loc_dev = _loc(ctx, task, "dev_files")
    named: dict = {}
    if dev_file is not None:
        named["dev"] = (dev_file, _loc(ctx, task, "dev_file"))
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
                    "dev_files", _loc(ctx, task, "train_file"),
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


def glue_files(ctx: PlanContext, glue: GlueTask, glue_dir: str) -> tuple[dict, dict, list]:
    """A GLUE task's train file and dev sets in ``glue_dir``, as finetune_files gives a
    registered task's; a local file that is missing is one error naming it."""
    inputs, fps, dev_uris = {}, {}, {}
    location = ctx.loc("glue", "data_dir")
    folder = uris.join(uris.absolute(glue_dir), glue.directory)
    for split, name in glue.files.items():
        path = uris.join(folder, name)
        if not uris.is_gcs(path) and not os.path.isfile(path):
            ctx.c.error(f"GLUE_DIR has no {glue.directory}/{name} ({path}): finetune.suite "
                        f"names {glue.name!r}", location,
                        hint=f"GLUE's {glue.directory} is {', '.join(glue.files.values())} in "
                             f"{glue.directory}/ under GLUE_DIR, as GLUE's download script "
                             f"lays it out: put them there, or drop {glue.name!r} from the suite")
            continue
        found, fp, _ = ctx.files([path], f"{glue.name}.{split}", location)
        if not found:
            continue
        fps["train_file" if split == "train" else f"dev_files.{split}"] = fp
        if split == "train":
            inputs["train_file"] = found[0]
        else:
            dev_uris[split] = found[0]
    inputs["dev_files"] = dev_uris
    return inputs, fps, []


def check_glue_headers(ctx: PlanContext, glue: GlueTask, inputs: dict) -> bool:
    """Local GLUE files have their columns where GLUE's published files have them (CoLA's
    have no header: its rows are checked by the reader). False after reporting one."""
    if glue.columns is not None:
        return True
    ok = True
    for path in [inputs.get("train_file"), *(inputs.get("dev_files") or {}).values()]:
        if not path or uris.is_gcs(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            first = f.readline().decode("utf-8", "replace").lstrip("\ufeff").rstrip("\r\n")
        problem = header_problem(glue, first.split("\t"))
        if problem:
            ok = False
            ctx.c.error(f"{path}: not GLUE's {glue.directory} layout: {problem}",
                        ctx.loc("glue", "data_dir"),
                        hint=f"GLUE_DIR/{glue.directory}/ must hold the files as GLUE "
                             "publishes them (a header line, tab-separated, no quoting); for "
                             "data in another layout, register a classification_task with "
                             "its own text_fields and label_field")
    return ok


def _read(ctx: PlanContext, path: str, p: dict) -> tuple[Optional[list], bool]:
    """(examples, whole) of a local classification file: all of it up to LABEL_CHECK_BYTES,
    else a sample of its first SAMPLE_ROWS rows; (None, False) after reporting an error."""
    whole = os.path.getsize(path) <= LABEL_CHECK_BYTES
    regression = p.get("kind") is not None and KINDS[p["kind"]].regression
    try:
        return load_examples(path, p["text_fields"], p["label_field"],
                             None if whole else SAMPLE_ROWS, columns=p.get("columns"),
                             numeric_labels=regression), whole
    except DataFileError as e:
        ctx.c.problems(e.problems)
        return None, False


def check_classification_files(ctx: PlanContext, task: str, inputs: dict, p: dict) -> None:
    """Local train and dev files read (or sampled, when large) at compile time: header,
    columns, every row's shape, UTF-8; at least two labels in train; the task's labels
    cover train's; every dev label is one the model trains on (else its examples can never
    be scored right: the run would report accuracy on what is left, or 0.000)."""
    if not p["text_fields"] or len(p["text_fields"]) not in (1, 2):
        return
    if p.get("kind") is not None and KINDS[p["kind"]].regression:
        _check_regression_files(ctx, task, inputs, p)
        return
    labels = p["labels"]
    train_path = inputs.get("train_file")
    known = set(labels) if labels is not None else None
    if train_path and not uris.is_gcs(train_path) and os.path.isfile(train_path):
        examples, whole = _read(ctx, train_path, p)
        if examples is not None and whole:
            found = {label for _, label in examples}
            loc = _loc(ctx, task, "labels") or _loc(ctx, task, "train_file")
            if not examples:
                ctx.c.error(f"{train_path}: no examples", _loc(ctx, task, "train_file"),
                            hint="the train file has a header but no rows")
            elif len(found) < 2 and labels is None:
                ctx.c.error(f"{train_path}: every example has the label {next(iter(found))!r}:"
                            " nothing to classify", _loc(ctx, task, "train_file"),
                            hint=f"check label_field ({p['label_field']!r}): it should name "
                                 "the column holding the class")
            unknown = sorted(found - set(labels)) if labels is not None else []
            if unknown:
                ctx.c.error(f"{task}: the training data has {len(found)} labels, "
                            f"{len(unknown)} of them not in {task}/classification_task.labels: "
                            f"{', '.join(map(repr, unknown[:5]))}", loc,
                            hint="add them to labels, or leave labels unset to read them from "
                                 "the data")
            if known is None:
                known = found
    for name, path in (inputs.get("dev_files") or {}).items():
        if uris.is_gcs(path) or not os.path.isfile(path) or path == train_path:
            continue
        examples, whole = _read(ctx, path, p)
        if examples is None:
            continue
        if whole and not examples:
            ctx.c.error(f"{path}: dev set {name!r} has no examples", ctx.loc(TASK, "dev_files",
                        task) or _loc(ctx, task, "dev_file"),
                        hint="the file has a header but no rows")
        if known is None:
            continue
        unseen: dict = {}
        for _, label in examples:
            if label not in known:
                unseen[label] = unseen.get(label, 0) + 1
        if unseen:
            shown = ", ".join(f"{k!r} ({v} example{'s' if v != 1 else ''})"
                              for k, v in sorted(unseen.items())[:5])
            ctx.c.error(f"{path}: dev set {name!r} has labels the model is never trained on: "
                        f"{shown}", _loc(ctx, task, "dev_files") or
                        _loc(ctx, task, "dev_file"),
                        hint=f"the training labels are {', '.join(map(repr, sorted(known)[:8]))}"
                             ": fix the dev labels (spelling, case), or give the task's full "
                             f"list in {task}/classification_task.labels")


def _check_regression_files(ctx: PlanContext, task: str, inputs: dict, p: dict) -> None:
    """A regression's local files read (or sampled) at compile time: their shape, and every
    label a number."""
    paths = {"train": inputs.get("train_file"), **(inputs.get("dev_files") or {})}
    for name, path in paths.items():
        if not path or uris.is_gcs(path) or not os.path.isfile(path):
            continue
        examples, whole = _read(ctx, path, p)
        if examples is not None and whole and not examples:
            ctx.c.error(f"{path}: {'the train file' if name == 'train' else f'dev set {name!r}'}"
                        " has no examples", _loc(ctx, task, "train_file"),
                        hint="the file has a header but no rows")
