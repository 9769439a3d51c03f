"""Planning preprocess stages: one per bert_pretraining_task trained on, per pretraining
phase (compiler/stages/phases.py)."""

from __future__ import annotations

import importlib.util
import os
from typing import Optional

from runexp.compiler import uris
from runexp.compiler.corpus_check import MAX_FILES, check_files
from runexp.compiler.plan import Stage
from runexp.compiler.specs import PreprocessSpec
from runexp.compiler.specs.preprocess import SPLIT_INDEX_DIR
from runexp.compiler.specs.source import SourceSpec
from runexp.compiler.specs.source_formats import DOCUMENT_FORMATS, SOURCE_FORMATS
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.stages.phases import SINGLE, Phase
from runexp.compiler.stages.runner import check_corpus_reachable, check_runner
from runexp.compiler.shard_count import auto_num_shards
from runexp.compiler.stages.example_files import bert_tfrecord_inputs
from runexp.compiler.stages.seqio_sources import seqio_source_inputs

TASK = "bert_pretraining_task"


def plan_preprocess(ctx: PlanContext, task: str, vocab: Stage, phase: Phase = SINGLE,
                    first: Optional[Stage] = None) -> Stage:
    """The task's preprocess stage of ``phase``; a phase after the first makes its examples
    from ``first`` (the task's first-phase stage)'s tokenised splits."""
    b = StageBuilder(ctx.r)
    target = ctx.r.get("train", "task")
    if target == task:
        b.set("task", task, f"train.task @ {ctx.r.provenance('train', 'task').short()}")
    else:
        b.set("task", task, f"{target}/bert_pretraining_mixture.rates @ "
              f"{ctx.r.provenance('bert_pretraining_mixture', 'rates', target).short()}")
    p = b.take_spec(PreprocessSpec, TASK, task)
    phase.apply(b, "preprocess")
    if p["dynamic_masking"]:
        check_dynamic_masking(ctx, task, p)
    b.copy(vocab, "do_lower_case")
    check_masking(ctx, task, p, phase)
    check_word_segmenter(ctx, task, b, vocab)
    check_runner(ctx, task, b)  # where the shards are built (compiler/stages/runner.py)
    source = SourceSpec.pick(p)
    drop_unused_source_settings(ctx, task, b, source.format)
    check_packing(ctx, task, b, source, phase)
    if phase.count > 1 and not source.makes_instances:
        ctx.c.error(f"{task}: format {source.format!r} brings ready-made examples of one "
                    "length, but train.phases trains at several: each phase's examples are "
                    "made from the documents", phase.location,
                    hint=f"give the task a text or document source "
                         f"({', '.join(DOCUMENT_FORMATS)}), or train in one phase")
    if first is not None:
        return _plan_later_phase(ctx, task, b, vocab, phase, first)
    if phase.count > 1:
        b.set("keep_split_index", True, f"train.phases @ {phase.where}: the later phases make "
                                        "their examples from this phase's tokenised splits")
    if not source.makes_instances and vocab.params.get("vocab_path") is None:
        ctx.c.error(f"{task}: format {source.format!r} brings examples whose token ids are "
                    "those of the vocabulary they were made with, but no vocabulary is given",
                    ctx.loc(TASK, "format", task) or ctx.loc("vocab", "path"),
                    hint="set VOCAB to that vocab.txt (or SentencePiece .model)")
    if source.reads_text_files:
        inputs, fps, deps = text_inputs(ctx, task, p, b)
        check_corpus_reachable(ctx, task, b.params, inputs)
    elif source.reads_seqio:
        inputs, fps, deps = seqio_source_inputs(ctx, task, p, b)
    else:  # ready-made TFRecords
        inputs, fps, deps = bert_tfrecord_inputs(ctx, task, p, b)
    inputs["vocab_dir"] = vocab.output_dir
    fps["vocab"] = vocab.fingerprint
    deps = sorted(set(deps + [vocab.id]))
    return ctx.add(f"preprocess.{task}", "preprocess", b, inputs, fps, deps)


def _plan_later_phase(ctx: PlanContext, task: str, b: StageBuilder, vocab: Stage, phase: Phase,
                      first: Stage) -> Stage:
    """A phase after the first: its examples are made from the tokenised splits the first
    phase's stage kept (``<first>/split_index/<split>``), so it reads no corpus byte. Those
    splits are fingerprinted by the first stage's fingerprint (the source, the vocab and
    the casing they were made with)."""
    if b.params["num_shards"] == 0:
        b.copy(first, "num_shards")
    inputs = {"split_index_dir": uris.join(first.output_dir, SPLIT_INDEX_DIR),
              "vocab_dir": vocab.output_dir}
    fps = {"split_index": first.fingerprint, "vocab": vocab.fingerprint}
    return ctx.add(f"preprocess.{task}{phase.suffix}", "preprocess", b, inputs, fps,
                   sorted({first.id, vocab.id}))


def drop_unused_source_settings(ctx: PlanContext, task: str, b: StageBuilder,
                                fmt: str) -> None:
    """Keeps the plan to the source settings its format reads; binding another is a
    mistake worth a warning (it changes nothing)."""
    for s in SourceSpec.settings():
        if s.name == "format" or s.name in SOURCE_FORMATS[fmt].settings:
            continue
        where = ctx.loc(TASK, s.name, task)
        if where is not None and b.params.get(s.name) != s.param.default:
            ctx.c.warn(f"{task}: {s.name} does not apply to format {fmt!r} and is ignored",
                       where, hint="remove it, or choose the format that reads it")
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


def check_masking(ctx: PlanContext, task: str, p: dict, phase: Phase = SINGLE) -> None:
    mask, rnd = p["mask_token_prob"], p["random_token_prob"]
    if mask is not None and rnd is not None and mask + rnd > 1.0 + 1e-9:
        ctx.c.error(f"mask_token_prob + random_token_prob = {mask + rnd:g} exceeds 1",
                    ctx.loc(TASK, "random_token_prob", task),
                    hint="the rest of the masked positions keep their token: use e.g. 0.8 and 0.1")
    length, preds, prob = p["max_seq_length"], p["max_predictions_per_seq"], p["masked_lm_prob"]
    if length and preds and prob is not None:
        expected = round(length * prob)
        where = phase.loc(ctx, "max_predictions_per_seq", TASK, "max_predictions_per_seq", task)
        if preds > length:
            ctx.c.error(f"{phase.label}max_predictions_per_seq ({preds}) exceeds max_seq_length "
                        f"({length})", where,
                        hint=f"about max_seq_length x masked_lm_prob = {expected} is usual")
        elif preds < expected:
            ctx.c.warn(f"{phase.label}max_predictions_per_seq ({preds}) < max_seq_length x "
                       f"masked_lm_prob "
                       f"({expected}): fewer tokens than masked_lm_prob asks will be masked",
                       where, hint=f"set 'max_predictions_per_seq': {expected} in phase "
                                   f"{phase.number}" if phase.sets("max_predictions_per_seq")
                       or phase.sets("max_seq_length")
                       else f"set MAX_PREDICTIONS_PER_SEQ = {expected}")


def check_packing(ctx: PlanContext, task: str, b: StageBuilder, source: SourceSpec,
                  phase: Phase) -> None:
    """Packing (tasks/instances/packing.py) packs the instances the stage makes; off, it is left out
    of the plan (as the plans made before it existed, whose fingerprints stay the same)."""
    if not b.params.get("packing"):
        b.params.pop("packing", None)
        b.provenance.pop("packing", None)
        return
    if not source.makes_instances:
        ctx.c.error(f"{task}: packing packs the instances the preprocess stage makes, but "
                    f"format {source.format!r} brings ready-made examples, cached as they are",
                    phase.loc(ctx, "packing", TASK, "packing", task),
                    hint=f"give the task a text or document source "
                         f"({', '.join(DOCUMENT_FORMATS)}), or remove packing")


def check_word_segmenter(ctx: PlanContext, task: str, b: StageBuilder, vocab: Stage) -> None:
    """A word segmenter (Chinese whole words, tasks/vocabulary/chinese_words.py) needs whole-word
    masking, a WordPiece vocab and its package. Unset, it is left out of the plan (as the
    plans made before it existed, whose fingerprints stay the same)."""
    p = b.params
    segmenter = p.get("word_segmenter")
    if not segmenter:
        p.pop("word_segmenter", None)
        b.provenance.pop("word_segmenter", None)
        return
    loc = ctx.loc(TASK, "word_segmenter", task)
    if not p["whole_word_masking"] and (p["ngram_max"] or 1) <= 1:
        ctx.c.error(f"{task}: word_segmenter = {segmenter!r} finds the words whole-word "
                    "masking masks, but whole_word_masking is False",
                    ctx.loc(TASK, "whole_word_masking", task) or loc,
                    hint=f"set {task}/bert_pretraining_task.whole_word_masking = True, or "
                         "word_segmenter = ''")
    adopted = vocab.params.get("vocab_path")
    if vocab.params.get("vocab_type") == "sentencepiece" or (
            adopted is not None and adopted.endswith(".model")):
        ctx.c.error(f"{task}: word_segmenter = {segmenter!r} marks Chinese words in the "
                    "characters BERT's WordPiece tokenizer splits CJK text into; a "
                    "SentencePiece vocab does not split it so", loc,
                    hint="use a WordPiece vocab.txt (Google's Chinese vocab, or vocab.type = "
                         "'wordpiece'), or word_segmenter = ''")
    if importlib.util.find_spec(segmenter) is None:
        ctx.c.error(f"{task}: word_segmenter = {segmenter!r} needs the {segmenter} package, "
                    "which is not installed", loc,
                    hint="pip install 'jieba>=0.42,<0.43' (or runexp[chinese])")


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
    """Shards bound each worker's memory and set the parallelism (compiler/shard_count.py).
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
