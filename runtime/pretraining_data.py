"""tf.data reader of the preprocess stage's TFRecords (google-research/bert's features).

The pipeline is deterministic for a seed: files in sorted order, a seeded shuffle buffer,
repeat, batch with drop_remainder. A resumed run skips the batches already consumed and
so sees exactly the stream an uninterrupted run would have seen (distributed iterators
cannot be checkpointed, the count of batches can).

Usage:
    ds = pretraining_dataset(data_dir, "train", batch_size=32, max_seq_length=128,
                             max_predictions_per_seq=20, seed=1, skip_batches=step)
"""

from __future__ import annotations

import glob
import os

import tensorflow as tf

from runexp.tasks import records


def feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict:
    """google-research/bert's ``run_pretraining.py`` feature spec, from the one definition of
    the record layout (tasks/records.py)."""
    return {name: tf.io.FixedLenFeature(shape, getattr(tf, dtype)) for name, (shape, dtype)
            in records.feature_spec(max_seq_length, max_predictions_per_seq).items()}


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


def pretraining_dataset(data_dir: str, split: str, batch_size: int, max_seq_length: int,
                        max_predictions_per_seq: int, seed: int = 0, training: bool = True,
                        skip_batches: int = 0, shuffle_buffer: int = 10_000,
                        max_examples: int | None = None) -> tf.data.Dataset:
    """Batches of int32 features (``next_sentence_labels`` [batch, 1]).

    Args:
      data_dir: the preprocess stage's directory.
      split: "train" or "validation".
      batch_size: global batch size; the last partial batch is dropped when training.
      training: shuffle (seeded) and repeat forever; otherwise one ordered pass.
      skip_batches: batches to skip from the start of the stream (resume).
      max_examples: read at most this many examples (evaluation).
    """
    files = split_files(data_dir, split)
    spec = feature_spec(max_seq_length, max_predictions_per_seq)
    ds = tf.data.TFRecordDataset(files)  # one reader, files in order: deterministic
    if max_examples is not None:
        ds = ds.take(max_examples)
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = ds.batch(batch_size, drop_remainder=training)
    if skip_batches:
        # Skipping before parsing costs reading the records only.
        ds = ds.skip(skip_batches)
    ds = ds.map(lambda s: _parse_batch(s, spec), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)
