"""The preprocess stage for ready-made BERT examples: ``bert_tfrecord`` files and
``seqio_bert_features`` tasks, checked and cached as they are (no instances made here).

``bert_tfrecord``: every record of every file (train_files, validation_files) is read by
TensorFlow (framing and CRCs checked) and parsed with the features google-research/bert's
``run_pretraining.py`` parses (tasks/cache/records.py's ``feature_spec``: the same ones runexp
writes). A record that does not parse is one UserError naming the file and the record, with
what was expected and what was found (compiler/formats/example_peek.py says it, in the words of the
dry run). Valid records are copied byte for byte into runexp's shards.

``seqio_bert_features``: the user's task (registered by a module the gin file imports) is
read with ``get_dataset(split=..., sequence_length=None, use_cached=False, shuffle=False)``.
Its ``element_spec`` must hold BERT's seven features: ids int32 or int64, weights float32,
shapes ``[max_seq_length]``, ``[max_predictions_per_seq]``, ``next_sentence_labels`` a scalar
or ``[1]``; anything else is one UserError naming the task, its module and the contract. The
examples are encoded (tasks/cache/example_proto.py) into a spill file, then split into shards.

Both: values checked and counted (tasks/cache/example_cache.py), shards staged, then moved into the
cache with info, stats and COMPLETED last.

Heavy module: imports TensorFlow (and seqio for seqio_bert_features).

Usage (runtime/stages/preprocess.py):
    summary = cache_examples(ctx, config, records.task_cache_dir(ctx.work_dir, config.task))
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Mapping

import numpy as np
import tensorflow as tf

from runexp.compiler import uris
from runexp.compiler.errors import Problem, UserError
from runexp.compiler.specs.source_formats import TEXT_FORMATS, listed
from runexp.compiler.formats.example_peek import (BERT_FEATURES, check_features, expected_features,
                                          parse_example)
from runexp.tasks.cache import records
from runexp.tasks.cache.example_cache import SplitCounts, ShardSplitter, ValueChecks, commit
from runexp.compiler.shard_count import auto_num_shards
from runexp.tasks.instances.pretraining_shards import cached_tokenizer
from runexp.tasks.sources.text_files import expand_globs

STAGING_DIR = ".examples-staging"  # under the stage directory, beside the cache
BATCH = 1024
SPLITS = ("train", "validation")


def cache_examples(ctx, config, cache_dir: str) -> dict:
    """Checks and caches the ready-made examples of ``config.source`` into ``cache_dir``
    (module docstring). Returns the stage summary."""

    start = time.monotonic()
    staging = os.path.join(ctx.work_dir, STAGING_DIR)
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    checks = ValueChecks(cached_tokenizer(ctx.inputs["vocab_dir"]).vocab_size,
                         config.max_seq_length)
    try:
        if config.source.makes_instances:
            raise ValueError(f"format {config.source.format!r} is not one of ready-made "
                             "examples")
        if config.source.reads_seqio:
            num_shards, counts = _cache_seqio_task(ctx, config, staging, checks)
        else:  # TFRecord files
            num_shards, counts = _adopt_tfrecords(ctx, config, staging, checks)
        commit(staging, cache_dir, num_shards, config.max_seq_length,
               config.masking.max_predictions_per_seq, counts)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    seconds = time.monotonic() - start
    size = sum(c.input_bytes for c in counts.values())
    summary: dict = {split: c.summary() for split, c in counts.items()}
    summary.update(num_shards=num_shards, seconds=round(seconds, 2),
                   mb_per_s=round(size / 1e6 / max(seconds, 1e-6), 1))
    return summary


# --- bert_tfrecord ---------------------------------------------------------------------------

def _expand(patterns) -> list[str]:
    """The files of the planned globs, sorted: local ones with runexp's glob semantics,
    gs:// ones (an output root on local disk) through TensorFlow."""

    files = set()
    for pattern in patterns or ():
        if uris.is_gcs(pattern):
            found = tf.io.gfile.glob(pattern)
            if not found:
                raise UserError(f"no file matches {pattern!r}")
            files.update(found)
        else:
            try:
                files.update(expand_globs([pattern]))
            except FileNotFoundError as e:
                raise UserError(str(e)) from e
    return sorted(files)


def _size(path: str) -> int:
    return tf.io.gfile.stat(path).length if uris.is_gcs(path) else os.path.getsize(path)


def parse_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """tf.io.parse_example's spec of BERT's pretraining features (records.feature_spec)."""
    return {name: tf.io.FixedLenFeature(shape, tf.as_dtype(dtype)) for name, (shape, dtype)
            in records.feature_spec(max_seq_length, max_predictions_per_seq).items()}


def _adopt_tfrecords(ctx, config, staging: str, checks: ValueChecks
                     ) -> tuple[int, dict[str, SplitCounts]]:
    seq, preds = config.max_seq_length, config.masking.max_predictions_per_seq
    spec = parse_spec(seq, preds)
    files = {split: _expand(ctx.inputs.get(f"{split}_files")) for split in SPLITS}
    files = {split: f for split, f in files.items() if f or split == "train"}
    sizes = {split: [_size(f) for f in fs] for split, fs in files.items()}
    num_shards = config.num_shards or auto_num_shards(sum(sizes["train"]))
    counts = {}
    for split, paths in files.items():
        c = counts[split] = SplitCounts(files=len(paths), input_bytes=sum(sizes[split]))
        out = ShardSplitter(staging, split, num_shards, c.input_bytes)
        try:
            for path in paths:
                t0, before = time.monotonic(), c.examples
                _adopt_file(path, spec, seq, preds, checks, c, out)
                ctx.progress(f"{split}: {c.examples - before:,} examples from {path} "
                             f"({time.monotonic() - t0:.1f}s)")
            out.close()
        finally:
            out.abort()
        if not c.examples:
            raise UserError(Problem(
                f"the {split} files ({', '.join(paths)}) hold no examples",
                hint="create_pretraining_data.py writes no example for documents shorter "
                     "than a sentence pair: check its input"))
    return num_shards, counts


def _adopt_file(path: str, spec: dict, seq: int, preds: int, checks: ValueChecks,
                counts: SplitCounts, out: ShardSplitter) -> None:
    """Reads, checks, counts and writes one TFRecord file's records."""
    ds = tf.data.TFRecordDataset(path, buffer_size=8 << 20).batch(BATCH).prefetch(2)
    it = iter(ds)
    index = 0
    while True:
        try:
            raw = next(it)
        except StopIteration:
            break
        except tf.errors.DataLossError as e:
            raise UserError(Problem(
                f"{path}: damaged, or not a TFRecord file (at or after record {index}): "
                f"{e.message.strip()}",
                hint="bert_tfrecord reads the TFRecord files create_pretraining_data.py "
                     f"writes; for text, choose format = {listed(TEXT_FORMATS, quote=True)}"
                     )) from e
        try:
            parsed = tf.io.parse_example(raw, spec)
        except tf.errors.InvalidArgumentError as e:
            raise parse_error(path, index, raw.numpy().tolist(), seq, preds, e) from e
        batch = {k: v.numpy() for k, v in parsed.items()}
        checks.check(batch, lambda i: f"{path}: record {index + i}")
        counts.add(batch)
        out.write(raw.numpy().tolist())
        index += len(batch["input_ids"])


def parse_error(path: str, first: int, batch: list, seq: int, preds: int,
                error: Exception) -> UserError:
    """The UserError of a batch TensorFlow could not parse: the first record that does not
    fit, in the dry run's words (compiler/formats/example_peek.py)."""
    for i, record in enumerate(batch):
        try:
            mismatches = check_features(parse_example(record), seq, preds)
        except ValueError as e:
            return UserError(Problem(f"{path}: record {first + i} is not a tf.train.Example "
                                     f"({e})", hint="bert_tfrecord reads the tf.train.Examples "
                                     "create_pretraining_data.py writes"))
        if mismatches:
            m = mismatches[0]
            return UserError(Problem(f"{path}: record {first + i} does not fit: {m.message}",
                                     hint=m.hint))
    message = getattr(error, "message", str(error)).strip().splitlines()[0]
    return UserError(Problem(f"{path}: records {first} to {first + len(batch) - 1} do not "
                             f"parse as BERT's pretraining features: {message}",
                             hint="bert_tfrecord reads google-research/bert's "
                                  "create_pretraining_data.py output"))


# --- seqio_bert_features ---------------------------------------------------------------------

_ID_DTYPES = (tf.int32, tf.int64)


def contract(seq: int, preds: int) -> str:
    """What a seqio_bert_features task's examples must be, in one line."""
    parts = []
    for name, (kind, length) in expected_features(seq, preds).items():
        dtype = "float32" if kind == "float" else "int32 or int64"
        shape = "[] or [1]" if name == "next_sentence_labels" else f"[{length}]"
        parts.append(f"{name} {dtype} {shape}")
    return ("get_dataset(split, sequence_length=None, use_cached=False, shuffle=False) must "
            "give per example " + "; ".join(parts) + " (google-research/bert's features, "
            "padded to max_seq_length and max_predictions_per_seq)")


def check_element_spec(spec, seq: int, preds: int) -> list[str]:
    """How a dataset's element_spec differs from BERT's features ([] when it fits)."""
    if not isinstance(spec, Mapping):
        return [f"its examples are {type(spec).__name__}, not dicts of features"]
    problems = []
    for name, (kind, length) in expected_features(seq, preds).items():
        s = spec.get(name)
        if s is None:
            problems.append(f"no feature {name!r}")
            continue
        if not isinstance(s, tf.TensorSpec):
            problems.append(f"{name} is a {type(s).__name__}, expected a dense tensor")
            continue
        ok = (s.dtype == tf.float32) if kind == "float" else (s.dtype in _ID_DTYPES)
        if not ok:
            want = "float32" if kind == "float" else "int32 or int64"
            problems.append(f"{name} is {s.dtype.name}, expected {want}")
        shapes = [[], [1]] if name == "next_sentence_labels" else [[length]]
        if not any(s.shape.is_compatible_with(shape) for shape in shapes):
            have = s.shape.as_list() if s.shape.rank is not None else "unknown"
            want = " or ".join(str(x) for x in shapes)
            problems.append(f"{name} has shape {have}, expected {want}")
    return problems


def _seqio_task(name: str, modules) -> tuple[object, str]:
    """The user's registered task (or mixture) and how to name it in messages."""
    import seqio

    from runexp.tasks.sources import seqio_sources

    seqio_sources.import_user_modules(modules)
    what = f"seqio task {name!r} ({seqio_sources.registered_by(name)})"
    try:
        return seqio.get_mixture_or_task(name), what
    except ValueError as e:
        raise UserError(Problem(f"{what} is not registered",
                                hint="the module registering it (seqio.TaskRegistry.add) "
                                     "must be imported by the gin file: import "
                                     "my_project.tasks")) from e


def _cache_seqio_task(ctx, config, staging: str, checks: ValueChecks
                      ) -> tuple[int, dict[str, SplitCounts]]:
    source = config.source
    seq, preds = config.max_seq_length, config.masking.max_predictions_per_seq
    task, what = _seqio_task(source.seqio_task, ctx.inputs.get("modules") or ())
    wanted = {"train": source.train_split, "validation": source.validation_split}
    spills, counts = {}, {}
    for split in SPLITS:
        if not wanted[split]:
            continue
        label = f"{what} split {wanted[split]!r}"
        if wanted[split] not in task.splits:
            raise UserError(Problem(f"{label}: the task has no such split (its splits: "
                                    f"{', '.join(task.splits)})",
                                    hint="set train_split / validation_split to one of them"))
        spills[split] = os.path.join(staging, f"{split}.spill")
        counts[split] = c = SplitCounts()
        t0 = time.monotonic()
        _spill_task_split(task, wanted[split], label, seq, preds, checks, c, spills[split])
        if not c.examples:
            raise UserError(f"{label} gave no examples")
        ctx.progress(f"{split}: {c.examples:,} examples from {label} "
                     f"({time.monotonic() - t0:.1f}s)")
    num_shards = config.num_shards or auto_num_shards(counts["train"].input_bytes)
    for split, spill in spills.items():
        out = ShardSplitter(staging, split, num_shards, counts[split].input_bytes)
        try:
            batch = []
            for record in records.iter_records([spill]):
                batch.append(record)
                if len(batch) == BATCH:
                    out.write(batch)
                    batch = []
            if batch:
                out.write(batch)
            out.close()
        finally:
            out.abort()
        os.remove(spill)
    return num_shards, counts


def _spill_task_split(task, split: str, label: str, seq: int, preds: int,
                      checks: ValueChecks, counts: SplitCounts, spill: str) -> None:
    """Reads one split of the user's task, checks it and writes it as TFRecords to
    ``spill``."""
    try:
        ds = task.get_dataset(split=split, sequence_length=None, use_cached=False,
                              shuffle=False, num_epochs=1)
    except Exception as e:  # the user's source or preprocessors
        raise UserError(Problem(f"{label}: get_dataset failed: {type(e).__name__}: {e}",
                                hint=contract(seq, preds))) from e
    problems = check_element_spec(ds.element_spec, seq, preds)
    if problems:
        raise UserError(Problem(f"{label} does not give BERT's features as format "
                                f"'seqio_bert_features' needs: {'; '.join(problems)}",
                                hint=contract(seq, preds)))
    shapes = {name: [length] for name, (_, length) in expected_features(seq, preds).items()}
    names = list(BERT_FEATURES)
    ds = ds.map(lambda ex: {k: ex[k] for k in names}).batch(BATCH).prefetch(2)
    index = 0
    with records.TFRecordWriter(spill) as writer:
        it = ds.as_numpy_iterator()
        while True:
            try:
                raw = next(it)
            except StopIteration:
                break
            except tf.errors.OpError as e:
                raise UserError(Problem(f"{label}: reading examples {index} to "
                                        f"{index + BATCH - 1} failed: {e.message.strip()}",
                                        hint=contract(seq, preds))) from e
            n = len(raw["input_ids"])
            batch = {k: v.reshape(n, -1) for k, v in raw.items()}
            for name, shape in shapes.items():
                if batch[name].shape[1:] != tuple(shape):
                    raise UserError(Problem(
                        f"{label}: examples {index} to {index + n - 1}: {name} has "
                        f"{batch[name].shape[1]} values, expected {shape[0]}",
                        hint=contract(seq, preds)))
            checks.check(batch, lambda i: f"{label}: example {index + i}")
            data, offsets = records.encode_instance_batch(
                {k: v if k == "masked_lm_weights" else v.astype(np.int64)
                 for k, v in batch.items()})
            writer.write_batch(data, offsets)
            counts.add(batch)
            counts.input_bytes += len(data) + 16 * n
            index += n
