"""Pretraining records in google-research/bert's format and seqio's cache layout.

Features (BERT's run_pretraining.py reads exactly these):
  input_ids, input_mask, segment_ids     int64 [max_seq_length]
  masked_lm_positions, masked_lm_ids     int64 [max_predictions_per_seq]
  masked_lm_weights                      float [max_predictions_per_seq]
  next_sentence_labels                   int64 [1]
  word_starts                            int64 [max_seq_length], dynamically masked splits
                                         only: 1 where a maskable word starts

A packed split (``packing``: several instances a row) has more: ``position_ids``,
``instance_ids`` and per-instance ``next_sentence_*`` (tasks/instances/packing.py, its layout).

A split masked at training time (``dynamic_masking``) has the same features with
unmasked ``input_ids`` and empty ``masked_lm_*`` (zeros), plus ``word_starts``; the task
cache's ``masking.json`` says which splits those are and how to mask them
(tasks/instances/dynamic_masking.py; the task's seqio preprocessor does, tasks/cache/seqio_tasks.py).

Cache layout (seqio 0.0.20's: a task's cache dir is ``<cache root>/<task name>/``, with
``:`` in a name making subdirectories; ``seqio.Task.cache_dir`` finds it under each global
cache dir by its ``COMPLETED`` file; the preprocess stage's directory is the cache root):
  <split>.tfrecord-<i:05d>-of-<n:05d>   TFRecord files
  info.<split>.json                     {"num_shards", "features": {name: {"shape", "dtype"}},
                                         "seqio_version"}
  stats.<split>.json                    {"examples", "<feature>_tokens", ...}
  masking.json                          (dynamic masking only) how the train split is masked
  COMPLETED                             empty, written last: the cache is whole

Integer features are declared "int32" in info.json (seqio's convention: stored as int64, cast
back on reading) and shapes are fixed, so seqio parses them with ``FixedLenFeature``.

TFRecord framing (length, masked CRC-32C of the length, data, masked CRC-32C of the data) is
written here too, so workers need no TensorFlow. Light module.

Usage:
    with TFRecordWriter(shard_path(out_dir, "train", 0, 4)) as w:
        w.write(encode_instance_features(features))
        w.write_batch(*encode_instance_batch(batch))   # many at once
    write_info(out_dir, "train", num_shards=4, max_seq_length=128, max_predictions_per_seq=20)
"""

from __future__ import annotations

import json
import os
import struct
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

from runexp.compiler.formats.tfrecord_crc import masked_crc
from runexp.tasks.cache.example_proto import encode_example, encode_examples

if TYPE_CHECKING:  # annotations only: numpy is not imported for them
    import numpy as np

SEQIO_VERSION_WRITTEN = "0.0.20"  # the seqio whose reader this layout was checked against
FLOAT_FEATURES = frozenset({"masked_lm_weights", "next_sentence_weights"})


def feature_spec(max_seq_length: int, max_predictions_per_seq: int,
                 word_starts: bool = False, packed: int = 0) -> dict[str, tuple]:
    """name -> (shape, dtype name as stored in the tf.train.Example); ``word_starts`` for a
    split masked at training time; ``packed``: up to that many instances a row
    (tasks/instances/packing.py; ``max_predictions_per_seq`` is then the row's), 0 for one."""
    spec = {
        "input_ids": ([max_seq_length], "int64"),
        "input_mask": ([max_seq_length], "int64"),
        "segment_ids": ([max_seq_length], "int64"),
        "masked_lm_positions": ([max_predictions_per_seq], "int64"),
        "masked_lm_ids": ([max_predictions_per_seq], "int64"),
        "masked_lm_weights": ([max_predictions_per_seq], "float32"),
        "next_sentence_labels": ([1], "int64"),
    }
    if packed:
        spec.update({
            "position_ids": ([max_seq_length], "int64"),
            "instance_ids": ([max_seq_length], "int64"),
            "next_sentence_labels": ([packed], "int64"),
            "next_sentence_positions": ([packed], "int64"),
            "next_sentence_weights": ([packed], "float32"),
        })
    if word_starts:
        spec["word_starts"] = ([max_seq_length], "int64")
    return spec


def encode_instance_features(features: Mapping[str, Sequence]) -> bytes:
    """Serialised tf.train.Example of one instance's padded features."""
    return encode_example(features, FLOAT_FEATURES)


def encode_instance_batch(batch: Mapping[str, np.ndarray]) -> tuple[bytes, np.ndarray]:
    """Serialised Examples of a batch of padded features (arrays [batch, n]) and offsets."""
    return encode_examples(batch, FLOAT_FEATURES)



_U32 = struct.Struct("<I")


class TFRecordWriter:
    """Writes a TFRecord file; the file appears under its name only when closed cleanly."""

    def __init__(self, path: str):
        self.path = path
        self._tmp = path + ".tmp"
        self._f = open(self._tmp, "wb")
        self._headers: dict[int, bytes] = {}  # length -> framed header (few distinct lengths)

    def write(self, record: bytes) -> None:
        header = struct.pack("<Q", len(record))
        self._f.write(header + struct.pack("<I", masked_crc(header)) + record
                      + struct.pack("<I", masked_crc(record)))

    def write_batch(self, data: bytes, offsets) -> None:
        """Writes records ``data[offsets[i]:offsets[i + 1]]`` (``encode_examples`` output)."""
        out = []
        append = out.append
        pack = _U32.pack
        headers = self._headers
        bounds = offsets.tolist() if hasattr(offsets, "tolist") else list(offsets)
        for start, end in zip(bounds, bounds[1:]):
            n = end - start
            header = headers.get(n)
            if header is None:
                h = struct.pack("<Q", n)
                header = headers[n] = h + pack(masked_crc(h))
            record = data[start:end]
            append(header)
            append(record)
            append(pack(masked_crc(record)))
        self._f.write(b"".join(out))

    def close(self) -> None:
        self._f.close()
        os.replace(self._tmp, self.path)

    def __enter__(self) -> "TFRecordWriter":
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None:
            self.close()
        else:
            self._f.close()
            os.remove(self._tmp)


def iter_records(files: Iterable[str], skip_data: bool = False) -> Iterator[bytes | None]:
    """The records of TFRecord files, in order (framing read, CRCs not checked). With
    ``skip_data`` only the length headers are read, and None stands for each record."""
    for path in files:
        with open(path, "rb") as f:
            while True:
                header = f.read(12)
                if len(header) < 12:
                    break
                (length,) = struct.unpack("<Q", header[:8])
                if skip_data:
                    f.seek(length + 4, os.SEEK_CUR)
                    yield None
                    continue
                data = f.read(length)
                f.read(4)
                if len(data) < length:
                    raise ValueError(f"{path}: truncated record")
                yield data


def count_records(files: Iterable[str]) -> int:
    """TFRecord records in files (reads the length headers only)."""
    return sum(1 for _ in iter_records(files, skip_data=True))


COMPLETED_FILE = "COMPLETED"


def task_cache_dir(cache_root: str, task: str) -> str:
    """``<cache_root>/<task>``: where seqio looks for a task's cache under a global cache dir
    (``seqio.utils.get_task_dir_from_name``: each ``:`` of the name is a subdirectory)."""
    return os.path.join(cache_root, *task.split(":"))


def write_completed(cache_dir: str) -> None:
    """Marks a task's cache whole (seqio only uses a cache dir with this file); write it
    last."""
    with open(os.path.join(cache_dir, COMPLETED_FILE), "w"):
        pass


def cached_tasks(cache_root: str) -> dict[str, str]:
    """Task name -> cache dir of every whole task cache under ``cache_root`` (a preprocess
    stage directory holds one), sorted by name."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(cache_root):
        dirnames.sort()
        if dirpath != cache_root and COMPLETED_FILE in filenames and any(
                f.startswith("info.") and f.endswith(".json") for f in filenames):
            found[os.path.relpath(dirpath, cache_root).replace(os.sep, ":")] = dirpath
    return dict(sorted(found.items()))


def task_cache_of(data_dir: str) -> tuple[str, str]:
    """(task name, cache dir) of the one task a preprocess stage directory caches; a clear
    error when there is none or more than one."""
    found = cached_tasks(data_dir)
    if len(found) != 1:
        what = f"{len(found)} ({', '.join(found)})" if found else "none"
        raise FileNotFoundError(f"{data_dir} should hold one task's seqio cache "
                                f"(<task>/{COMPLETED_FILE}), found {what}: run the "
                                "preprocess stage first")
    return next(iter(found.items()))


def has_split(cache_dir: str, split: str) -> bool:
    """Whether a task cache holds ``split``."""
    return os.path.exists(info_path(cache_dir, split))


def shard_path(out_dir: str, split: str, index: int, num_shards: int) -> str:
    """seqio's cached shard name: ``<split>.tfrecord-00000-of-00004``."""
    return os.path.join(out_dir, f"{split}.tfrecord-{index:05d}-of-{num_shards:05d}")


def info_path(out_dir: str, split: str) -> str:
    return os.path.join(out_dir, f"info.{split}.json")


def stats_path(out_dir: str, split: str) -> str:
    return os.path.join(out_dir, f"stats.{split}.json")


def seqio_dtype(stored: str) -> str:
    """The dtype a seqio task declares: int64 features are int32 in seqio's convention."""
    return "int32" if stored == "int64" else stored


def write_info(out_dir: str, split: str, num_shards: int, max_seq_length: int,
               max_predictions_per_seq: int, word_starts: bool = False, packed: int = 0) -> None:
    """Writes ``info.<split>.json`` as seqio's cache writer does (fixed shapes);
    ``word_starts`` for a split masked at training time; ``packed`` as feature_spec."""
    features = {name: {"shape": shape, "dtype": seqio_dtype(dtype)} for name, (shape, dtype)
                in feature_spec(max_seq_length, max_predictions_per_seq, word_starts,
                                packed).items()}
    info = {"num_shards": num_shards, "features": features,
            "seqio_version": SEQIO_VERSION_WRITTEN}
    _write_json(info_path(out_dir, split), info)


MASKING_FILE = "masking.json"


def write_masking(out_dir: str, spec: Mapping) -> None:
    """Writes ``masking.json``: the splits masked at training time and how to mask them
    (pretraining_shards.PretrainingConfig.masking_spec)."""
    _write_json(os.path.join(out_dir, MASKING_FILE), dict(spec))


def read_masking(data_dir: str, split: str = "train") -> dict | None:
    """The masking spec when ``split`` of the task cache ``data_dir`` (``<stage dir>/<task>``)
    is masked at training time, else None (statically masked records)."""
    path = os.path.join(data_dir, MASKING_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    return spec if split in spec.get("splits", ()) else None


def write_stats(out_dir: str, split: str, stats: Mapping[str, int | float]) -> None:
    """Writes ``stats.<split>.json``; seqio requires the ``examples`` count."""
    if "examples" not in stats:
        raise ValueError("stats need an 'examples' count")
    _write_json(stats_path(out_dir, split), dict(stats))


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
