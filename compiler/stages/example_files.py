"""Planning a source of ready-made examples in files: ``bert_tfrecord``, the TFRecords
google-research/bert's ``create_pretraining_data.py`` writes, adopted as the task's cache.

The files are listed like text files (``ctx.files``: local globs, gs:// listings, changes
fingerprinted). Local files are looked at now, without TensorFlow (compiler/formats/example_peek.py):
the first records of each must be TFRecord framing holding BERT's seven features with the
lengths ``max_seq_length`` and ``max_predictions_per_seq`` say, and token ids below the
vocabulary's size. So "Can't parse serialized Example" an hour into training becomes a dry-run
error naming the file, what it holds and what is configured. gs:// files are checked at run
time (tasks/cache/example_sources.py checks every record of every file anyway).
"""

from __future__ import annotations

import os
from typing import Optional

from runexp.compiler import uris
from runexp.compiler.errors import Location
from runexp.compiler.formats.example_peek import (FramingError, check_features, max_token_id,
                                          parse_example, read_records)
from runexp.compiler.specs.source_formats import TEXT_FORMATS, listed
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.shard_count import auto_num_shards

TASK = "bert_pretraining_task"
PEEK_RECORDS = 2     # records read from the start of each local file
PEEK_FILES = 1024    # local files looked at (sorted), so a dry run stays quick


def bert_tfrecord_inputs(ctx: PlanContext, task: str, p: dict, b: StageBuilder
                         ) -> tuple[dict, dict, list]:
    """Inputs of ``bert_tfrecord``: the train and validation TFRecord globs, listed, and
    the first records of the local ones checked against the configuration."""
    train = ctx.r.get(TASK, "train_files", task) or []
    held = ctx.r.get(TASK, "validation_files", task) or []
    loc_t = ctx.loc(TASK, "train_files", task)
    loc_v = ctx.loc(TASK, "validation_files", task)
    if not train:
        ctx.c.error(f"{task}: format 'bert_tfrecord' reads TFRecord files, but "
                    f"{task}/bert_pretraining_task.train_files is not set",
                    ctx.loc(TASK, "format", task) or ctx.loc("train", "task"),
                    hint=f"set {task}/bert_pretraining_task.train_files = "
                         "['records/*.tfrecord'] (create_pretraining_data.py's output files)")
    if p["dynamic_masking"]:
        ctx.c.error(f"{task}: dynamic_masking masks at training time the unmasked examples "
                    "runexp makes, but format 'bert_tfrecord' brings examples already "
                    "masked", ctx.loc(TASK, "dynamic_masking", task) or ctx.loc(TASK, "format",
                                                                                task),
                    hint=f"set {task}/bert_pretraining_task.dynamic_masking = False, or give "
                         "the text and a text format")
    train_uris, f1, d1 = ctx.files(train, f"{task}.train_files", loc_t)
    held_uris, f2, d2 = ctx.files(held, f"{task}.validation_files", loc_v)
    if train and held and sorted(train_uris) == sorted(held_uris):
        ctx.c.warn("the held-out files are the training files: evaluation will measure "
                   "memorisation, not generalisation", loc_v,
                   hint="hold out records the model never trains on")
    check_local_records(ctx, task, p, [(u, loc_t) for u in train_uris]
                        + [(u, loc_v) for u in held_uris])
    if p["num_shards"] == 0:
        b.set("num_shards", *auto_shards(ctx, train_uris))
    return ({"train_files": train_uris, "validation_files": held_uris},
            {"train": f1, "validation": f2}, d1 + d2)


def _vocab_size(ctx: PlanContext) -> Optional[int]:
    """The adopted vocabulary's size, when the compiler counted it (a local vocab file)."""
    vocab = next((s for s in ctx.stages if s.kind == "vocab"), None)
    return vocab.params.get("vocab_size") if vocab is not None else None


def check_local_records(ctx: PlanContext, task: str, p: dict,
                        patterns: list[tuple[str, Optional[Location]]]) -> None:
    """Reads the first records of each local file: framing, features, lengths, token ids.
    One error per kind of problem, naming the first file that has it and how many more do."""
    seq, preds = p["max_seq_length"], p["max_predictions_per_seq"]
    vocab_size = _vocab_size(ctx)
    found: dict[str, list] = {}   # message -> [(file, hint, location), ...]
    checked = 0
    for pattern, where in patterns:
        if uris.is_gcs(pattern):
            continue  # checked at run time
        for path in uris.expand_local(pattern):
            if checked >= PEEK_FILES:
                return _report(ctx, task, found)
            checked += 1
            for message, hint, loc in _problems(ctx, task, path, seq, preds, vocab_size,
                                                where):
                found.setdefault(message, []).append((path, hint, loc))
    _report(ctx, task, found)


def _problems(ctx: PlanContext, task: str, path: str, seq: int, preds: int,
              vocab_size: Optional[int], where: Optional[Location]):
    """(message, hint, location) of each problem of one file's first records."""
    try:
        records = read_records(path, PEEK_RECORDS)
    except FramingError as e:
        yield (f"not a TFRecord file ({e})",
               "bert_tfrecord reads the TFRecord files create_pretraining_data.py writes; for "
               f"text, choose format = {listed(TEXT_FORMATS, quote=True)}", where)
        return
    except OSError as e:
        yield f"cannot be read: {e.strerror or e}", "check the file's permissions", where
        return
    for i, record in enumerate(records):
        try:
            features = parse_example(record)
        except ValueError as e:
            yield (f"record {i} is not a tf.train.Example ({e})",
                   "bert_tfrecord reads the tf.train.Examples create_pretraining_data.py "
                   "writes", where)
            return
        mismatches = check_features(features, seq, preds)
        for m in mismatches:
            loc = ctx.loc(TASK, m.setting, task) if m.setting else None
            yield f"holds examples that do not fit: {m.message}", m.hint, loc or where
        if mismatches:
            return
        top = max_token_id(features)
        if vocab_size is not None and top >= vocab_size:
            yield (f"holds token id {top}, but the vocabulary has {vocab_size} tokens "
                   f"(ids 0 to {vocab_size - 1})",
                   "the records were made with another vocabulary: set VOCAB to the vocab.txt "
                   "they were made with", ctx.loc("vocab", "path") or where)
            return


def _report(ctx: PlanContext, task: str, found: dict[str, list]) -> None:
    for message, files in found.items():
        path, hint, loc = files[0]
        more = f" (and {len(files) - 1} more file{'s' if len(files) > 2 else ''})" \
            if len(files) > 1 else ""
        ctx.c.error(f"{task}: {path}{more}: {message}", loc, hint=hint)


def auto_shards(ctx: PlanContext, train_uris: list) -> tuple[int, str]:
    """The cache's shard count, from the records' size as for text (compiler/shard_count.py):
    shards are what input hosts divide among themselves."""
    size = 0
    for pattern in train_uris:
        if uris.is_gcs(pattern):
            listing = ctx.gcs.objects(pattern)
            if isinstance(listing, str):
                return auto_num_shards(None), "auto: gs:// records (size known at run time)"
            size += sum(o["size"] for o in listing.values())
        else:
            size += sum(os.path.getsize(f) for f in uris.expand_local(pattern))
    return auto_num_shards(size), (f"auto: {size / 1e6:.1f} MB of records: a shard per "
                                   "8 MiB up to 64, then per 64 MiB up to 1024; a power of "
                                   "two, at least 4")
