"""Ready-made BERT examples into a task's seqio cache: the checks on their values, their
counts, the shard files, and the cache made whole only at the end.

Why a module of its own: both sources of ready-made examples (``bert_tfrecord`` files and
``seqio_bert_features`` tasks, tasks/cache/example_sources.py) end here, so they are checked,
counted, sharded and cached alike, in runexp's layout (tasks/cache/records.py).

- ``ValueChecks``: what parsing with fixed shapes cannot see but training would trip on:
  token ids outside the vocabulary (an embedding lookup out of range), masked positions
  past ``max_seq_length``, an input_mask other than 0 or 1, a negative segment id, a pair
  label other than 0 or 1; one UserError naming the first such example.
- ``SplitCounts``: examples, tokens, masked positions, random-next labels, input bytes.
- ``ShardSplitter``: records in their order into ``num_shards`` files, a record going to
  shard ``floor(offset * num_shards / total_bytes)`` by where it starts in the input, so the
  files are balanced by size in one pass with one file open. Written into a staging
  directory; ``commit`` moves every split's shards into the cache, writes info and stats,
  and COMPLETED last: an error before leaves nothing in the cache.

Light module: numpy, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from runexp.compiler.errors import Problem, UserError
from runexp.tasks.cache import records


@dataclasses.dataclass
class SplitCounts:
    """What a split's stats.json and the stage summary report."""

    examples: int = 0
    tokens: int = 0        # non-padding input tokens (input_mask)
    masked: int = 0        # predicted positions (masked_lm_weights > 0)
    random_next: int = 0   # pair label 1
    input_bytes: int = 0   # of the records read (bert_tfrecord) or written (seqio)
    files: int = 0

    def add(self, batch: Mapping[str, np.ndarray]) -> None:
        self.examples += len(batch["input_ids"])
        self.tokens += int(np.count_nonzero(batch["input_mask"]))
        self.masked += int(np.count_nonzero(batch["masked_lm_weights"]))
        self.random_next += int(np.count_nonzero(batch["next_sentence_labels"]))

    def stats(self) -> dict:
        """stats.<split>.json: seqio's ``examples`` and ``<feature>_tokens``, and runexp's
        counts (the names the text formats' stats use)."""
        return {"examples": self.examples, "input_ids_tokens": self.tokens,
                "masked_lm_ids_tokens": self.masked, "instances": self.examples,
                "tokens": self.tokens, "masked": self.masked,
                "random_next": self.random_next, "input_bytes": self.input_bytes,
                "input_files": self.files}

    def summary(self) -> dict:
        return {"instances": self.examples, "tokens": self.tokens, "masked": self.masked,
                "input_bytes": self.input_bytes, "files": self.files}


class ValueChecks:
    """Checks a batch of parsed features (name -> [batch, n] arrays) before it is cached."""

    def __init__(self, vocab_size: int, max_seq_length: int):
        self.vocab_size = vocab_size
        self.max_seq_length = max_seq_length

    def check(self, batch: Mapping[str, np.ndarray], where: Callable[[int], str]) -> None:
        """Raises one UserError for the first bad value; ``where(i)`` names example i."""
        rules = [
            (("input_ids", "masked_lm_ids"), 0, self.vocab_size,
             f"token ids run from 0 to {self.vocab_size - 1} in the vocabulary",
             "the examples were made with another vocabulary: set VOCAB to the one they "
             "were made with"),
            (("masked_lm_positions",), 0, self.max_seq_length,
             f"positions run from 0 to {self.max_seq_length - 1} (max_seq_length)",
             "masked_lm_positions index into input_ids"),
            (("input_mask",), 0, 2, "input_mask is 0 (padding) or 1",
             "google-research/bert's input_mask is 1 for each token, 0 for padding"),
            (("segment_ids",), 0, 1 << 31, "segment ids are not negative",
             "segment_ids is 0 for the first segment, 1 for the second"),
            (("next_sentence_labels",), 0, 2, "the pair label is 0 (next) or 1 (random)",
             "google-research/bert's next_sentence_labels is 0 or 1"),
        ]
        for names, low, high, rule, hint in rules:
            for name in names:
                flat = batch[name].reshape(len(batch[name]), -1)
                bad = (flat < low) | (flat >= high)
                rows = np.flatnonzero(bad.any(axis=1))
                if rows.size:
                    row = int(rows[0])
                    value = flat[row][bad[row]][0]
                    raise UserError(Problem(f"{where(row)}: {name} holds {value}, but {rule}",
                                            hint=hint))


class ShardSplitter:
    """Writes one split's records, in order, into ``num_shards`` staged files (module
    docstring); ``offset`` counts the input bytes of the records seen so far."""

    def __init__(self, staging_dir: str, split: str, num_shards: int, total_bytes: int):
        self.dir = staging_dir
        self.split = split
        self.num_shards = num_shards
        self.total = max(1, total_bytes)
        self.offset = 0
        self._shard = -1
        self._writer: Optional[records.TFRecordWriter] = None

    def path(self, shard: int) -> str:
        return records.shard_path(self.dir, self.split, shard, self.num_shards)

    def _open(self, shard: int) -> None:
        while self._shard < shard:  # a shard no record starts in stays an empty file
            if self._writer is not None:
                self._writer.close()
            self._shard += 1
            self._writer = records.TFRecordWriter(self.path(self._shard))

    def write(self, batch: Sequence[bytes]) -> None:
        """Writes ``batch`` (serialised Examples, each 16 bytes more when framed)."""
        sizes = [len(r) + 16 for r in batch]
        starts = list(itertools.accumulate([self.offset] + sizes[:-1]))
        self.offset += sum(sizes)
        shards = [min(self.num_shards - 1, s * self.num_shards // self.total) for s in starts]
        i = 0
        for shard, group in itertools.groupby(shards):
            n = len(list(group))
            chunk = batch[i:i + n]
            i += n
            self._open(shard)
            offsets = list(itertools.accumulate([0] + [len(r) for r in chunk]))
            self._writer.write_batch(b"".join(chunk), offsets)

    def close(self) -> None:
        """Closes the last shard and makes the empty ones left."""
        self._open(self.num_shards - 1)
        self._writer.close()
        self._writer = None

    def abort(self) -> None:
        """After an error: the open shard is closed and its partial file removed."""
        if self._writer is not None:
            self._writer.__exit__(RuntimeError, None, None)
            self._writer = None


def commit(staging_dir: str, cache_dir: str, num_shards: int, max_seq_length: int,
           max_predictions_per_seq: int, counts: Mapping[str, SplitCounts]) -> None:
    """Moves every split's staged shards into the cache, writes info and stats per split,
    then COMPLETED (seqio uses a cache only when it is whole)."""
    for split in counts:
        for shard in range(num_shards):
            os.replace(records.shard_path(staging_dir, split, shard, num_shards),
                       records.shard_path(cache_dir, split, shard, num_shards))
    for split, c in counts.items():
        records.write_info(cache_dir, split, num_shards, max_seq_length,
                           max_predictions_per_seq)
        records.write_stats(cache_dir, split, c.stats())
    records.write_completed(cache_dir)
    shutil.rmtree(staging_dir, ignore_errors=True)
