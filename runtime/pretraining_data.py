"""Pretraining batches through seqio: the tasks the preprocess stage cached, read with
``get_dataset(..., use_cached=True, shard_info=...)``.

Each data dir is a preprocess stage directory (a seqio cache root holding one task's cache,
tasks/records.py); its task is registered from the cache (tasks/seqio_tasks.py) and read by
seqio. Nothing here opens a record file.

The stream is deterministic for a seed: training reads seqio's stream of the task (files
shuffled with the seed, repeated, dynamically masked when the train split is stored unmasked,
then shuffled with the seed) and batches it with drop_remainder. A resumed run skips the
batches already consumed and so sees exactly the stream an uninterrupted run would have seen
(distributed iterators cannot be checkpointed, the count of batches can).

- Dynamic masking is the task's seqio preprocessor (tasks/seqio_tasks.py): an example's mask
  comes from ``[key, position]``, its position in the task's stream, so a skip to batch N
  gives the masks an uninterrupted run gave there, and each epoch gives an example a new mask.
- Mixtures: several data dirs with rates are a ``seqio.Mixture`` (members in the order given:
  the pretrain stage sorts them by task name, so the stream never depends on how a gin file
  listed them); seqio samples the members' streams by rate with the seed.
- Hosts: ``shard_info`` (``seqio.ShardInfo(index, num_shards)``) reads one input host's share
  (seqio shards the cached files, or the examples when there are fewer files than hosts);
  host ``i > 0`` seeds its stream with ``seed + 7919 i`` so hosts never draw alike.

Usage:
    ds = pretraining_dataset(data_dir, "train", batch_size=32, max_seq_length=128,
                             max_predictions_per_seq=20, seed=1, skip_batches=step)
    ds = pretraining_dataset([wiki_dir, books_dir], "train", ..., rates=[0.7, 0.3])
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

import seqio
import tensorflow as tf

from runexp.tasks import records, seqio_tasks


def register_data(data_dirs: Sequence[str]) -> list[str]:
    """Registers the task each preprocess stage directory caches; their names, in order."""
    names = [seqio_tasks.register_cached_pretraining_task(d) for d in data_dirs]
    if len(set(names)) != len(names):
        raise ValueError(f"the data dirs {list(data_dirs)} cache tasks {names}: a mixture's "
                         "members need different names")
    return names


def has_split(data_dir: str, split: str) -> bool:
    """Whether the task a preprocess stage directory caches has ``split``."""
    return records.has_split(records.task_cache_of(data_dir)[1], split)


def host_seed(seed: int, shard_info: Optional[seqio.ShardInfo]) -> int:
    """The seed of one input host's stream (module docstring)."""
    return seed + 7919 * (shard_info.index if shard_info else 0)


def pretraining_dataset(data_dir: str | Sequence[str], split: str, batch_size: int,
                        max_seq_length: int, max_predictions_per_seq: int, seed: int = 0,
                        training: bool = True, skip_batches: int = 0,
                        shuffle_buffer: int = 10_000, max_examples: int | None = None,
                        rates: Optional[Sequence[float]] = None,
                        shard_info: Optional[seqio.ShardInfo] = None,
                        mixture: Optional[str] = None) -> tf.data.Dataset:
    """Batches of int32 features (``next_sentence_labels`` [batch, 1]), masked.

    Args:
      data_dir: a preprocess stage directory, or a list of them (a mixture).
      split: "train" or "validation".
      batch_size: examples per batch (this host's); the last partial batch is dropped when
        training.
      max_seq_length, max_predictions_per_seq: the shapes expected (checked against the
        cache).
      seed: the stream's seed (shuffling, mixture sampling, dynamic masks).
      training: shuffle (seeded) and repeat forever; otherwise one ordered pass (the members
        of a list one after the other).
      skip_batches: batches to skip from the start of the stream (resume).
      shuffle_buffer: examples in the shuffle buffer (one task).
      max_examples: read at most this many examples (of each member).
      rates: sampling rates of the members when training on several (default: equal).
      shard_info: this input host's share (None: everything).
      mixture: the name to register a mixture under (default: made from its tasks' names).
    """
    dirs = [data_dir] if isinstance(data_dir, str) else list(data_dir)
    if rates is not None and len(rates) != len(dirs):
        raise ValueError(f"{len(rates)} rates for {len(dirs)} data dirs")
    if training and max_examples is not None:
        raise ValueError("max_examples is for an ordered pass (training=False)")
    for d in dirs:
        _check_shapes(d, split, max_seq_length, max_predictions_per_seq)
    names = register_data(dirs)
    seed = host_seed(seed, shard_info)
    common = dict(sequence_length=None, split=split, use_cached=True, seed=seed,
                  shard_info=shard_info)
    if training:
        if len(names) == 1:
            ds = seqio.get_mixture_or_task(names[0]).get_dataset(
                shuffle=True, shuffle_buffer_size=shuffle_buffer, num_epochs=None, **common)
        else:
            weights = [float(r) for r in (rates or [1.0] * len(names))]
            weights = [w / sum(weights) for w in weights]
            name = mixture or "+".join(names)
            # seqio samples members in its own (task name) order: rates go with their task.
            seqio_tasks.register_pretraining_mixture(name, dict(zip(names, weights)))
            ds = seqio.get_mixture_or_task(name).get_dataset(
                shuffle=True, num_epochs=None, log_mixing_proportions=False, **common)
    else:
        ds = None
        for name in names:
            member = seqio.get_mixture_or_task(name).get_dataset(
                shuffle=False, num_epochs=1, **common)
            if max_examples is not None:
                member = member.take(max_examples)
            ds = member if ds is None else ds.concatenate(member)
    ds = ds.batch(batch_size, drop_remainder=training)
    if skip_batches:
        ds = ds.skip(skip_batches)
    return ds.prefetch(tf.data.AUTOTUNE)


def _check_shapes(data_dir: str, split: str, max_seq_length: int,
                  max_predictions_per_seq: int) -> None:
    """A clear error when a stage directory's cache lacks ``split`` or has other shapes."""
    _, cache_dir = records.task_cache_of(data_dir)
    if not records.has_split(cache_dir, split):
        raise FileNotFoundError(f"no {split} split in {cache_dir}: run the preprocess stage "
                                "with its files")
    with open(records.info_path(cache_dir, split), encoding="utf-8") as f:
        features = json.load(f)["features"]
    have = (features["input_ids"]["shape"][0], features["masked_lm_ids"]["shape"][0])
    if have != (max_seq_length, max_predictions_per_seq):
        raise ValueError(f"{cache_dir} holds examples of {have[0]} tokens with {have[1]} "
                         f"predictions, not {max_seq_length} and {max_predictions_per_seq}")
