"""Planning preprocess stages: one per bert_pretraining_task trained on."""

from __future__ import annotations

import os

from runexp.compiler import uris
from runexp.compiler.corpus_check import MAX_FILES, check_files
from runexp.compiler.plan import Stage
from runexp.compiler.specs import PreprocessSpec
from runexp.compiler.specs.source import APPLIES, TEXT_FORMATS, SourceSpec
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.tasks.shard_count import auto_num_shards

TASK = "bert_pretraining_task"


def plan_preprocess(ctx: PlanContext, task: str, vocab: Stage) -> Stage:
    b = StageBuilder(ctx.r)
    target = ctx.r.get("train", "task")
    if target == task:
        b.set("task", task, f"train.task @ {ctx.r.provenance('train', 'task').short()}")
    else:
        b.set("task", task, f"{target}/bert_pretraining_mixture.rates @ "
              f"{ctx.r.provenance('bert_pretraining_mixture', 'rates', target).short()}")
    p = b.take_spec(PreprocessSpec, TASK, task)
    if p["dynamic_masking"]:
        check_dynamic_masking(ctx, task, p)
    b.copy(vocab, "do_lower_case")
    check_masking(ctx, task, p)
    source = SourceSpec.pick(p)
    drop_unused_source_settings(ctx, task, b, source.format)
    if not source.makes_instances and vocab.params.get("vocab_path") is None:
        ctx.c.error(f"{task}: format {source.format!r} brings examples whose token ids are "
                    "those of the vocabulary they were made with, but no vocabulary is given",
                    ctx.loc(TASK, "format", task) or ctx.loc("vocab", "path"),
                    hint="set VOCAB to that vocab.txt (or SentencePiece .model)")
    if source.format in TEXT_FORMATS:
        inputs, fps, deps = text_inputs(ctx, task, p, b)
    elif source.format == "bert_tfrecord":
        from runexp.compiler.stages.example_files import bert_tfrecord_inputs
        inputs, fps, deps = bert_tfrecord_inputs(ctx, task, p, b)
    else:
        from runexp.compiler.stages.seqio_sources import seqio_source_inputs
        inputs, fps, deps = seqio_source_inputs(ctx, task, p, b)
    inputs["vocab_dir"] = vocab.output_dir
    fps["vocab"] = vocab.fingerprint
    deps = sorted(set(deps + [vocab.id]))
    return ctx.add(f"preprocess.{task}", "preprocess", b, inputs, fps, deps)


def drop_unused_source_settings(ctx: PlanContext, task: str, b: StageBuilder,
                                fmt: str) -> None:
    """Keeps the plan to the source settings its format reads; binding another is a
    mistake worth a warning (it changes nothing)."""
    for s in SourceSpec.settings():
        if s.name == "format" or s.name in APPLIES[fmt]:
            continue
        where = ctx.loc(TASK, s.name, task)
        if where is not None and b.params.get(s.name) != s.param.default:
            ctx.c.warn(f"{task}: {s.name} does not apply to format {fmt!r} and is ignored",
                       where, hint=f"remove it, or choose the format that reads it")
        b.params.pop(s.name, None)
        b.provenance.pop(s.name, None)


def text_inputs(ctx: PlanContext, task: str, p: dict, b: StageBuilder
                ) -> tuple[dict, dict, list]:
    """Inputs of the text formats: the train and validation globs, listed."""
    train = ctx.r.get(TASK, "train_files", task) or []
    held = ctx.r.get(TASK, "validation_files", task) or []
    loc_v = ctx.loc(TASK, "validation_files", task)
    if not train:
        ctx.c.error(f"{task}: format {p['format']!r} reads text files, but none are given "
                    f"({task}/bert_pretraining_task.train_files is empty)",
                    ctx.loc(TASK, "train_files", task) or ctx.loc(TASK, "format", task)
                    or ctx.loc("train", "task"),
                    hint="set CORPUS_FILES = ['corpus/*.txt'] (the task's train_files), or "
                         "choose a seqio source (format = 'tfds' or 'seqio_documents')")
    train_uris, f1, d1 = ctx.files(train, f"{task}.train_files",
                                   ctx.loc(TASK, "train_files", task))
    if p["num_shards"] == 0:
        b.set("num_shards", *auto_shards(ctx, train_uris))
    held_uris, f2, d2 = ctx.files(held, f"{task}.validation_files", loc_v)
    check_text(ctx, task, train_uris, ctx.loc(TASK, "train_files", task))
    check_text(ctx, task, held_uris, loc_v)
    if train and held and sorted(train_uris) == sorted(held_uris):
        ctx.c.warn("the held-out files are the training files: evaluation will measure "
                   "memorisation, not generalisation", loc_v,
                   hint="hold out documents the model never trains on")
    return ({"train_files": train_uris, "validation_files": held_uris},
            {"train": f1, "validation": f2}, d1 + d2)


def check_text(ctx: PlanContext, task: str, patterns: list, location) -> None:
    """Local corpus files sampled (compiler/corpus_check.py): a compressed or binary file is
    an error; an empty one a warning, an error when no file has text."""
    paths = [path for pattern in patterns if not uris.is_gcs(pattern)
             and not (ctx.corpus_stage is not None
                      and pattern.startswith(ctx.corpus_stage.output_dir))
             for path in uris.expand_local(pattern)]
    if not paths:
        return
    problems = check_files(paths)
    empty = [p for p in problems if p[1].startswith("no text")]
    for path, what, hint in problems:
        if (path, what, hint) in empty and len(empty) < min(len(paths), MAX_FILES):
            ctx.c.warn(f"{task}: {path}: {what}; it is skipped", location, hint=hint)
        else:
            ctx.c.error(f"{task}: {path}: {what}", location, hint=hint)


def check_masking(ctx: PlanContext, task: str, p: dict) -> None:
    mask, rnd = p["mask_token_prob"], p["random_token_prob"]
    if mask is not None and rnd is not None and mask + rnd > 1.0 + 1e-9:
        ctx.c.error(f"mask_token_prob + random_token_prob = {mask + rnd:g} exceeds 1",
                    ctx.loc(TASK, "random_token_prob", task),
                    hint="the rest of the masked positions keep their token: use e.g. 0.8 and 0.1")
    length, preds, prob = p["max_seq_length"], p["max_predictions_per_seq"], p["masked_lm_prob"]
    if length and preds and prob is not None:
        expected = round(length * prob)
        where = ctx.loc(TASK, "max_predictions_per_seq", task)
        if preds > length:
            ctx.c.error(f"max_predictions_per_seq ({preds}) exceeds max_seq_length ({length})",
                        where, hint=f"about max_seq_length x masked_lm_prob = {expected} is usual")
        elif preds < expected:
            ctx.c.warn(f"max_predictions_per_seq ({preds}) < max_seq_length x masked_lm_prob "
                       f"({expected}): fewer tokens than masked_lm_prob asks will be masked",
                       where, hint=f"set MAX_PREDICTIONS_PER_SEQ = {expected}")


def check_dynamic_masking(ctx: PlanContext, task: str, p: dict) -> None:
    loc = ctx.loc(TASK, "dynamic_masking", task)
    if p["ngram_max"] and p["ngram_max"] > 1:
        ctx.c.error(f"{task}: dynamic_masking masks single tokens or whole words, not "
                    f"n-grams (ngram_max = {p['ngram_max']})",
                    ctx.loc(TASK, "ngram_max", task) or loc,
                    hint="set ngram_max = 1, or dynamic_masking = False for static n-gram masks")
    dupe = p["dupe_factor"]
    if dupe and dupe > 1:
        ctx.c.warn(f"{task}: with dynamic_masking the train split is built in one pass; "
                   f"dupe_factor = {dupe} would only duplicate its instances (each epoch "
                   "draws new masks), so it applies to the validation split only",
                   ctx.loc(TASK, "dupe_factor", task) or loc,
                   hint=f"set {task}/bert_pretraining_task.dupe_factor = 1 to silence this")


def auto_shards(ctx: PlanContext, train_uris: list) -> tuple[int, str]:
    """Shards bound each worker's memory and set the parallelism (tasks/shard_count.py).
    Decided here from the corpus size, not from the machine's cores, so the output is the
    same anywhere."""
    size = 0
    for pattern in train_uris:
        if ctx.corpus_stage is not None and pattern.startswith(ctx.corpus_stage.output_dir):
            size += ctx.corpus_stage.params["min_bytes"] or 0
        elif uris.is_gcs(pattern):
            return auto_num_shards(None), "auto: gs:// corpus (size known at run time)"
        else:
            size += sum(os.path.getsize(p) for p in uris.expand_local(pattern))
    return auto_num_shards(size), (f"auto: {size / 1e6:.1f} MB of text: a shard per 8 MiB up "
                                   "to 64, then per 64 MiB up to 1024; a power of two, at least 4")
