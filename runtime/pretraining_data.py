"""tf.data reader of the preprocess stage's TFRecords (google-research/bert's features).

The pipeline is deterministic for a seed: files in sorted order, a seeded shuffle buffer,
repeat, batch with drop_remainder. A resumed run skips the batches already consumed and
so sees exactly the stream an uninterrupted run would have seen (distributed iterators
cannot be checkpointed, the count of batches can).

Two extensions keep that guarantee:

- Dynamic masking: a split the preprocess stage left unmasked (``masking.json``, see
  tasks/records.py) is masked batch by batch (tasks/dynamic_masking.py). Each example's
  mask is drawn from ``[key, position]``: ``key`` from the seed, the task's random_seed
  and its member index, ``position`` its index in the member's (shuffled, repeated)
  stream, numbered before batching and skipping. So a skip to batch N gives the masks an
  uninterrupted run gave there, and each epoch gives an example a new mask.
- Mixtures: several data dirs with rates; each member stream is shuffled and repeated on
  its own, then ``sample_from_datasets`` picks members with a fixed seed, before batching
  and skipping. Members are taken in the order given (the pretrain stage sorts them by
  task name, so the stream never depends on how a gin file listed them).

Usage:
    ds = pretraining_dataset(data_dir, "train", batch_size=32, max_seq_length=128,
                             max_predictions_per_seq=20, seed=1, skip_batches=step)
    ds = pretraining_dataset([wiki_dir, books_dir], "train", ..., rates=[0.7, 0.3])
"""

from __future__ import annotations

import glob
import hashlib
import os
from typing import Optional, Sequence

import tensorflow as tf

from runexp.tasks import records
from runexp.tasks.dynamic_masking import DynamicMasking, mask_batch

# Masking parameters that must agree between the members of a dynamically masked mixture
# (one batch is masked at once).
_SHARED_MASKING = ("masked_lm_prob", "max_predictions_per_seq", "mask_token_prob",
                   "random_token_prob", "whole_word_masking", "vocab_size", "mask_id",
                   "cls_id", "sep_id")


def feature_spec(max_seq_length: int, max_predictions_per_seq: int,
                 word_starts: bool = False) -> dict:
    """google-research/bert's ``run_pretraining.py`` feature spec, from the one definition of
    the record layout (tasks/records.py); ``word_starts`` for a dynamically masked split."""
    return {name: tf.io.FixedLenFeature(shape, getattr(tf, dtype)) for name, (shape, dtype)
            in records.feature_spec(max_seq_length, max_predictions_per_seq,
                                    word_starts).items()}


def split_files(data_dir: str, split: str) -> list[str]:
    """``<data_dir>/<split>.tfrecord-*``, sorted; a clear error when there are none."""
    files = sorted(glob.glob(os.path.join(data_dir, f"{split}.tfrecord-*")))
    if not files:
        raise FileNotFoundError(f"no {split}.tfrecord-* files in {data_dir}: run the "
                                "preprocess stage first")
    return files


def _parse_batch(serialized, spec):
    parsed = tf.io.parse_example(serialized, spec)
    # int64 is what tf.train.Example stores; int32 is what the model (and TPUs) want.
    return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}


def mask_key(seed: int, random_seed: int, member: int) -> int:
    """The first half of every mask seed of a member's stream (stable across platforms)."""
    digest = hashlib.sha256(f"{seed}:{random_seed}:{member}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # a non-negative int64


def dynamic_masking_of(data_dirs: Sequence[str], split: str) -> Optional[dict]:
    """The masking spec of ``split`` when its records are masked at training time (the same
    for every member), None when they carry static masks."""
    specs = [records.read_masking(d, split) for d in data_dirs]
    if all(s is None for s in specs):
        return None
    if any(s is None for s in specs):
        raise ValueError(f"the {split} split is masked at training time in some of "
                         f"{list(data_dirs)} but not all")
    for d, s in zip(data_dirs[1:], specs[1:]):
        differ = [k for k in _SHARED_MASKING if s.get(k) != specs[0].get(k)]
        if differ:
            raise ValueError(f"{d} is masked at training time with other parameters "
                             f"({', '.join(differ)}) than {data_dirs[0]}")
    return specs[0]


def _member(data_dir: str, split: str, index: int, seed: int, training: bool,
            shuffle_buffer: int, max_examples: Optional[int],
            masking: Optional[dict]) -> tf.data.Dataset:
    """One member's records ({"record"} and, when masked dynamically, {"mask_seed"})."""
    ds = tf.data.TFRecordDataset(split_files(data_dir, split))  # one reader: deterministic
    if max_examples is not None:
        ds = ds.take(max_examples)
    if training:
        # Member 0 keeps the plain seed: a single task's stream is what it always was.
        ds = ds.shuffle(shuffle_buffer, seed=seed + 7919 * index,
                        reshuffle_each_iteration=True).repeat()
    if masking is None:
        return ds.map(lambda r: {"record": r})
    key = tf.constant(mask_key(seed, int(masking.get("random_seed", 0)), index), tf.int64)
    return ds.enumerate().map(lambda i, r: {"record": r, "mask_seed": tf.stack([key, i])})


def pretraining_dataset(data_dir: str | Sequence[str], split: str, batch_size: int,
                        max_seq_length: int, max_predictions_per_seq: int, seed: int = 0,
                        training: bool = True, skip_batches: int = 0,
                        shuffle_buffer: int = 10_000, max_examples: int | None = None,
                        rates: Optional[Sequence[float]] = None) -> tf.data.Dataset:
    """Batches of int32 features (``next_sentence_labels`` [batch, 1]), masked.

    Args:
      data_dir: the preprocess stage's directory, or a list of them (a mixture).
      split: "train" or "validation".
      batch_size: global batch size; the last partial batch is dropped when training.
      training: shuffle (seeded) and repeat forever; otherwise one ordered pass (the
        members of a list one after the other).
      skip_batches: batches to skip from the start of the stream (resume).
      max_examples: read at most this many examples (of each member).
      rates: sampling rates of the members when training on several (default: equal).
    """
    dirs = [data_dir] if isinstance(data_dir, str) else list(data_dir)
    if rates is not None and len(rates) != len(dirs):
        raise ValueError(f"{len(rates)} rates for {len(dirs)} data dirs")
    masking = dynamic_masking_of(dirs, split)
    members = [_member(d, split, i, seed, training, shuffle_buffer, max_examples, masking)
               for i, d in enumerate(dirs)]
    if len(members) == 1:
        ds = members[0]
    elif training:
        weights = [float(r) for r in (rates or [1.0] * len(dirs))]
        total = sum(weights)
        ds = tf.data.Dataset.sample_from_datasets(
            members, weights=[w / total for w in weights], seed=seed,
            stop_on_empty_dataset=False)
    else:
        ds = members[0]
        for m in members[1:]:
            ds = ds.concatenate(m)
    ds = ds.batch(batch_size, drop_remainder=training)
    if skip_batches:
        # Skipping before parsing and masking costs reading the records only.
        ds = ds.skip(skip_batches)
    spec = feature_spec(max_seq_length, max_predictions_per_seq, masking is not None)
    config = DynamicMasking.from_dict(masking) if masking is not None else None

    def finish(batch):
        features = _parse_batch(batch["record"], spec)
        if config is not None:
            features = mask_batch(features, batch["mask_seed"], config)
        return features

    ds = ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)
