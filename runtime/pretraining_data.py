"""Pretraining batches through seqio: the tasks the preprocess stage cached, read with
``get_dataset(..., use_cached=True, shard_info=...)``.

Each data dir is a preprocess stage directory (a seqio cache root holding one task's cache,
tasks/cache/records.py); its task is registered from the cache (tasks/cache/seqio_tasks.py) and read
through seqio.

The training stream is deterministic for a seed and read by position (stream version 2,
``STREAM_VERSION``): position ``p`` of a host's stream is a record of the task's seqio cache
chosen by a seeded permutation per epoch (runtime/data_order.py), read by random access
(tasks/cache/record_index.py: byte offsets of the cached records), parsed as seqio parses its
cache (the info file's features and dtypes), then passed through the task's own seqio
preprocessors after its cache placeholder (``Task.preprocess_postcache`` with the stream's
seed: dynamic masking keyed by ``p``), and batched with drop_remainder. A resume at batch
``N`` starts at position ``N * batch_size`` and reads nothing before it: its cost does not
grow with ``N`` (bench/resume.py), and its batches are byte-equal to those an uninterrupted
run read there. Why not ``get_dataset``: seqio's cached read is a sequential stream (files
interleaved, repeated, a shuffle buffer), so the only way to a position is to replay every
example before it, hours at a real run's length; the task stays registered and its cache,
its info file and its preprocessors are seqio's. tf.data's checkpointable iterators were the
alternative: their state holds the 10k-example shuffle buffer (megabytes per host) and they
are not saved by the distributed iterators the trainer uses.

Stream version 1 (``pretraining_dataset(..., stream=1)``) is seqio's sequential stream: files
shuffled with the seed, repeated, dynamically masked, shuffled with a 10k buffer; a resume
skips the batches consumed by reading them. A run that started with it resumes with it
(``stream_of_run``: the version is recorded in the stage's work dir).

- Dynamic masking is the task's seqio preprocessor (tasks/cache/seqio_tasks.py): an example's mask
  comes from ``[key, position]``, its position in the task's stream, so a skip to batch N
  gives the masks an uninterrupted run gave there, and each epoch gives an example a new mask.
- Packed rows (tasks/instances/packing.py): a packed train split's records are rows of up to three
  instances, with their own features (``instance_ids``, ...; the model reads them,
  runtime/model.py); positions, batches and resumes count rows. ``packing_factor``: instances
  a row, from the stage's stats.
- Mixtures: several data dirs with rates are also a registered ``seqio.Mixture`` (members
  in the order given: the pretrain stage sorts them by task name, so the stream never depends
  on how a gin file listed them). Version 2 picks the member of every position by a seeded
  schedule whose per-member positions at any point are a formula
  (runtime/mixture_schedule.py), each member read by position as above; version 1 lets seqio
  sample the members' streams by rate with the seed.
- Hosts: ``shard_info`` (``seqio.ShardInfo(index, num_shards)``) reads one input host's share
  (version 2: a contiguous range of the split's records, data_order.py; version 1: seqio
  shards the cached files, or the examples when there are fewer files than hosts); host
  ``i > 0`` seeds its stream with ``seed + 7919 i`` so hosts never draw alike. Each host's
  stream resumes alone.

Usage:
    ds = pretraining_dataset(data_dir, "train", batch_size=32, max_seq_length=128,
                             max_predictions_per_seq=20, seed=1, skip_batches=step)
    ds = pretraining_dataset([wiki_dir, books_dir], "train", ..., rates=[0.7, 0.3])
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import seqio
import tensorflow as tf

from runexp.runtime.data_order import ExampleOrder, order_seed, stable_seed
from runexp.runtime.mixture_schedule import MixtureSchedule
from runexp.tasks.cache import records, seqio_tasks
from runexp.tasks.cache.record_index import RecordIndex

# The training stream's definition (module docstring): 1 seqio's sequential stream, replayed
# to resume; 2 read by position.
STREAM_VERSION = 2
STREAM_FILE = "data_stream.json"
_READ_CHUNK = 256  # records read (and parsed) at once
_FOREVER = 1 << 62


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


def packing_factor(data_dirs: Sequence[str], rates: Optional[Sequence[float]] = None
                   ) -> float:
    """Instances a train record holds, as the preprocess stages counted them (packed rows,
    tasks/instances/packing.py: their stats' ``instances`` over ``rows``; 1 unpacked); a mixture's
    members weighted by their rates."""
    factors = []
    for d in data_dirs:
        _, cache_dir = records.task_cache_of(d)
        with open(records.stats_path(cache_dir, "train"), encoding="utf-8") as f:
            stats = json.load(f)
        factors.append(stats["instances"] / stats["rows"] if stats.get("rows") else 1.0)
    weights = [float(r) for r in (rates or [1.0] * len(factors))]
    return sum(w * f for w, f in zip(weights, factors)) / sum(weights)


def split_predictions(data_dir: str, split: str) -> int:
    """The prediction slots of a split's records: ``max_predictions_per_seq``, or a packed
    split's per row (tasks/instances/packing.py)."""
    _, cache_dir = records.task_cache_of(data_dir)
    with open(records.info_path(cache_dir, split), encoding="utf-8") as f:
        return json.load(f)["features"]["masked_lm_ids"]["shape"][0]


def host_seed(seed: int, shard_info: Optional[seqio.ShardInfo]) -> int:
    """The seed of one input host's stream (module docstring)."""
    return seed + 7919 * (shard_info.index if shard_info else 0)


def pretraining_dataset(data_dir: str | Sequence[str], split: str, batch_size: int,
                        max_seq_length: int, max_predictions_per_seq: int, seed: int = 0,
                        training: bool = True, skip_batches: int = 0,
                        shuffle_buffer: int = 10_000, max_examples: int | None = None,
                        rates: Optional[Sequence[float]] = None,
                        shard_info: Optional[seqio.ShardInfo] = None,
                        mixture: Optional[str] = None,
                        stream: int = STREAM_VERSION) -> tf.data.Dataset:
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
      shuffle_buffer: examples in the shuffle buffer (one task; stream version 1 only).
      max_examples: read at most this many examples (of each member).
      rates: sampling rates of the members when training on several (default: equal).
      shard_info: this input host's share (None: everything).
      mixture: the name to register a mixture under (default: made from its tasks' names).
      stream: the training stream's version (module docstring).
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
    if stream not in (1, STREAM_VERSION):
        raise ValueError(f"data stream version {stream}: this runexp reads versions 1 and "
                         f"{STREAM_VERSION}")
    mixture_name = mixture or "+".join(names)
    if training and len(names) > 1:
        _register_mixture(mixture_name, names, rates)
    if training and stream == STREAM_VERSION:
        ds = _stream_by_position(names, split, seed, rates, shard_info,
                                 start=skip_batches * batch_size)
        return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    if training:
        ds = _sequential_stream(names, mixture_name, split, seed, shard_info, shuffle_buffer)
    else:
        ds = _ordered_pass(names, split, seed, shard_info, max_examples)
    ds = ds.batch(batch_size, drop_remainder=training)
    if skip_batches:  # version 1 resumes by reading the batches it skips
        ds = ds.skip(skip_batches)
    return ds.prefetch(tf.data.AUTOTUNE)


def _register_mixture(mixture: str, names: Sequence[str],
                      rates: Optional[Sequence[float]]) -> None:
    """Registers the tasks ``names`` as the seqio Mixture ``mixture``, sampled by ``rates``
    (default: equal), normalised."""
    weights = [float(r) for r in (rates or [1.0] * len(names))]
    weights = [w / sum(weights) for w in weights]
    # seqio samples members in its own (task name) order: rates go with their task.
    seqio_tasks.register_pretraining_mixture(mixture, dict(zip(names, weights)))


def _cached(name: str, split: str, seed: int, shard_info: Optional[seqio.ShardInfo],
            **options) -> tf.data.Dataset:
    """seqio's read of a registered task's or mixture's cache (this host's share)."""
    return seqio.get_mixture_or_task(name).get_dataset(
        sequence_length=None, split=split, use_cached=True, seed=seed, shard_info=shard_info,
        **options)


def _sequential_stream(names: Sequence[str], mixture: str, split: str, seed: int,
                       shard_info: Optional[seqio.ShardInfo],
                       shuffle_buffer: int) -> tf.data.Dataset:
    """Stream version 1: seqio's seeded stream, repeated forever, of one task (shuffled in
    a buffer of ``shuffle_buffer``) or of the mixture (its members sampled by rate)."""
    if len(names) == 1:
        return _cached(names[0], split, seed, shard_info, shuffle=True,
                       shuffle_buffer_size=shuffle_buffer, num_epochs=None)
    return _cached(mixture, split, seed, shard_info, shuffle=True, num_epochs=None,
                   log_mixing_proportions=False)


def _ordered_pass(names: Sequence[str], split: str, seed: int,
                  shard_info: Optional[seqio.ShardInfo],
                  max_examples: Optional[int]) -> tf.data.Dataset:
    """One ordered pass: each task's examples (at most ``max_examples`` of each), one task
    after the other."""
    ds = None
    for name in names:
        member = _cached(name, split, seed, shard_info, shuffle=False, num_epochs=1)
        if max_examples is not None:
            member = member.take(max_examples)
        ds = member if ds is None else ds.concatenate(member)
    return ds


def _stream_by_position(names: Sequence[str], split: str, seed: int,
                        rates: Optional[Sequence[float]],
                        shard_info: Optional[seqio.ShardInfo], start: int) -> tf.data.Dataset:
    """Examples of a host's stream from position ``start`` on (stream version 2): one task's,
    or a mixture's members interleaved by their schedule."""
    host, hosts = (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)
    if len(names) == 1:
        return _task_by_position(names[0], split, seed, host, hosts, start)
    # The schedule's members in task name order: the stream never depends on how they were
    # listed.
    weights = dict(zip(names, [float(r) for r in (rates or [1.0] * len(names))]))
    members = sorted(names)
    schedule = MixtureSchedule([weights[m] for m in members],
                               stable_seed("mixture", seed, *members))
    starts = schedule.member_positions(start)
    streams = [_task_by_position(m, split, seed, host, hosts, int(s))
               for m, s in zip(members, starts)]
    return tf.data.Dataset.choose_from_datasets(streams, schedule.choices(start))


def _task_by_position(name: str, split: str, seed: int, host: int, hosts: int,
                      start: int) -> tf.data.Dataset:
    """One task's examples on one host from position ``start`` of its stream on: records by
    number (data_order.py), read by offset, parsed as seqio parses its cache, then the task's
    preprocessors after its cache placeholder (dynamic masking keyed by the position)."""
    task = seqio.get_mixture_or_task(name)
    cache_dir = task.cache_dir
    with open(records.info_path(cache_dir, split), encoding="utf-8") as f:
        info = json.load(f)
    files = [records.shard_path(cache_dir, split, i, info["num_shards"])
             for i in range(info["num_shards"])]
    index = RecordIndex.open(cache_dir, split, files)
    cached = task.get_cached_stats(split)["examples"]
    if index.size != cached:
        raise ValueError(f"{cache_dir}: {index.size} {split} records in its files, "
                         f"{cached} in its stats file")
    order = ExampleOrder(index.size, order_seed(name, seed), host, hosts)
    # seqio's cached features: integers stored as int64 and declared int32 (cast back).
    declared = {k: tf.as_dtype(v["dtype"]) for k, v in info["features"].items()}
    description = {k: tf.io.FixedLenFeature(
        v["shape"], tf.int64 if declared[k] in (tf.int32, tf.int64, tf.bool) else declared[k])
        for k, v in info["features"].items()}

    def read(positions):
        serialized = tf.numpy_function(index.read, [order.records(positions)], tf.string)
        serialized.set_shape(positions.shape)
        example = tf.io.parse_example(serialized, description)
        example = {k: tf.cast(v, declared[k]) for k, v in example.items()}
        example[seqio_tasks.STREAM_POSITION] = positions
        return example

    ds = tf.data.Dataset.range(start, _FOREVER).batch(_READ_CHUNK)
    ds = ds.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
    ds = task.preprocess_postcache(ds, sequence_length=None, seed=seed)
    return ds.map(lambda ex: {k: v for k, v in ex.items()
                              if k != seqio_tasks.STREAM_POSITION})


def stream_of_run(work_dir: str, resumed: bool) -> int:
    """The stream version a training stage's run reads (module docstring): a fresh run
    records ``STREAM_VERSION`` in ``work_dir/data_stream.json`` (synced with the stage's
    other files, before its first checkpoint's pointer); a resumed one reads it back, and
    one without the file started before streams had versions: version 1."""
    path = os.path.join(work_dir, STREAM_FILE)
    if resumed:
        if not os.path.exists(path):
            return 1
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["stream"])
    os.makedirs(work_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"stream": STREAM_VERSION}, f)
    os.replace(tmp, path)
    return STREAM_VERSION


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
