"""Packed pretraining rows: several BERT instances in one row of ``max_seq_length`` tokens,
so that a training step pays for real tokens rather than padding (issue 27).

Packed feature layout (a row of length ``L``; ``K = MAX_INSTANCES_PER_ROW`` = 3 instances at
most; ``P`` predictions per row, ``packed_max_predictions``):

  input_ids, input_mask, segment_ids  int [L]  the instances one after the other, each its own
                                               ``[CLS] A [SEP] B [SEP]`` with its own segment
                                               ids (0 for [CLS] A [SEP], 1 for B [SEP]); then
                                               padding (0)
  position_ids                        int [L]  0, 1, ... from each instance's [CLS]; 0 on padding
  instance_ids                        int [L]  k for the k-th instance of the row (1..K); 0 on
                                               padding. Attention goes from token i to token j
                                               only when instance_ids[i] == instance_ids[j] != 0
  masked_lm_positions, masked_lm_ids  int [P]  every prediction of the row, row positions,
  masked_lm_weights                 float [P]  ascending (instance by instance), then 0
  next_sentence_labels                int [K]  each instance's pair label; 0 for an empty slot
  next_sentence_positions             int [K]  the row position of each instance's [CLS]; 0 for
                                               an empty slot
  next_sentence_weights             float [K]  1.0 for a real instance, 0.0 for an empty slot
  word_starts                         int [L]  (dynamically masked splits only) as unpacked

Unpacked records keep exactly google-research/bert's features (records.py); a cache is packed
when its info file has ``instance_ids``.

``P``: a row's instances together predict at most ``sum_i min(max_predictions_per_seq,
max(1, round(n_i * masked_lm_prob)))`` positions, where ``sum_i n_i <= L``; each term is at
most ``n_i * masked_lm_prob + 1`` (``+ 0.5`` from rounding, or 1 when the product rounds to
0), so ``P = min(K * max_predictions_per_seq, floor(L * masked_lm_prob) + K)`` always holds
them: 22 rather than 60 at L = 128 (0.15, 20), 79 rather than 240 at 512 (0.15, 80). The
masked-LM logits, the largest activation at 512, grow with ``P``.

The algorithm (``pack_lengths``): Graphcore's shortest-pack-first histogram packing (SPFHP,
Krell et al. 2021, "Efficient Sequence Packing without Cross-contamination"), over a window
of instances: lengths longest first, each into the open row with the least room that still
fits it (a new row when none does); a row is closed when full or holding K instances. The
histogram form and this one make the same rows up to which of two equal-length instances
goes where; here ties go by the instances' order, so the rows depend on the lengths and
their order only (no random draw: packing is deterministic given the preprocess seed, which
made the instances and their order). Rows come out in the order of their first instance
(the instances are already shuffled), each row's instances in their own order.

Usage:
    groups = pack_lengths(lengths, max_seq_length=128)          # [(0, 5), (1,), (2, 3, 4)]
    rows = pack_batch(batch, max_seq_length=128, max_predictions=22)   # unpacked -> packed
    stats = packing_stats(rows)                # instances, rows, tokens (factor and fill)

Light: numpy only.
"""

from __future__ import annotations

import bisect
from typing import Mapping, Sequence

import numpy as np

from runexp.compiler.specs.preprocess import (MAX_INSTANCES_PER_ROW,  # noqa: F401 (re-exported)
                                              packed_max_predictions)
# Features a packed row has besides the unpacked ones (records.feature_spec).
PACKED_FEATURES = ("position_ids", "instance_ids", "next_sentence_positions",
                   "next_sentence_weights")


def pack_lengths(lengths: Sequence[int], max_seq_length: int,
                 max_instances: int = MAX_INSTANCES_PER_ROW) -> list[tuple[int, ...]]:
    """Groups of instance indices, each fitting one row (SPFHP, module docstring).

    Args:
      lengths: real tokens of each instance (1..max_seq_length).
      max_seq_length: a row's tokens.
      max_instances: instances per row at most.

    Returns:
      Every index exactly once, in groups of at most ``max_instances`` whose lengths sum to at
      most ``max_seq_length``; groups ordered by their first index, indices ascending in each.
    """
    lengths = [int(n) for n in lengths]
    for i, n in enumerate(lengths):
        if not 0 < n <= max_seq_length:
            raise ValueError(f"instance {i} has {n} tokens: packing needs 1..{max_seq_length}")
    rows: list[list[int]] = []
    spaces: list[int] = []                 # sorted rooms that have an open row
    open_rows: dict[int, list[int]] = {}   # room -> open rows with that room, oldest first
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    for i in order:
        n = lengths[i]
        k = bisect.bisect_left(spaces, n)
        if k < len(spaces):  # the open row with the least room that fits
            room = spaces[k]
            bucket = open_rows[room]
            r = bucket.pop(0)
            if not bucket:
                del open_rows[room]
                spaces.pop(k)
            rows[r].append(i)
        else:
            r, room = len(rows), max_seq_length
            rows.append([i])
        room -= n
        if room > 0 and len(rows[r]) < max_instances:
            if room not in open_rows:
                open_rows[room] = []
                bisect.insort(spaces, room)
            open_rows[room].append(r)
    return sorted(tuple(sorted(row)) for row in rows)


def pack_batch(batch: Mapping[str, np.ndarray], max_seq_length: int, max_predictions: int,
               max_instances: int = MAX_INSTANCES_PER_ROW,
               groups: Sequence[Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """Packs unpacked instances (masked, or left for training-time masking with
    ``word_starts``) into rows of the packed layout (module docstring).

    Args:
      batch: google-research/bert's features of ``n`` instances (records.py), arrays
        ``[n, max_seq_length]``, ``[n, max_predictions_per_seq]`` and ``[n, 1]``; and
        ``word_starts`` for a dynamically masked split.
      max_seq_length: the instances' and the rows' length.
      max_predictions: ``P``, the rows' prediction slots.
      groups: which instances go together (default: ``pack_lengths`` of their lengths).

    Returns:
      The rows' features: int32 arrays but ``masked_lm_weights`` and
      ``next_sentence_weights`` (float32).
    """
    input_mask = np.asarray(batch["input_mask"])
    lengths = input_mask.sum(axis=1).astype(np.int64)
    if groups is None:
        groups = pack_lengths(lengths, max_seq_length, max_instances)
    rows, length, k = len(groups), max_seq_length, max_instances
    members = np.full((rows, k), -1, np.int64)  # instance index per slot, -1: empty
    for r, group in enumerate(groups):
        if not 0 < len(group) <= k:
            raise ValueError(f"row {r} has {len(group)} instances, not 1..{k}")
        members[r, :len(group)] = group
    present = members >= 0
    safe = np.where(present, members, 0)
    slot_len = np.where(present, lengths[safe], 0)
    starts = np.cumsum(slot_len, axis=1) - slot_len
    if np.any(slot_len.sum(axis=1) > length):
        raise ValueError(f"a row's instances have more than {length} tokens")

    pos = np.arange(length)[None, :]
    out = {name: np.zeros((rows, length), np.int32)
           for name in ("input_ids", "input_mask", "segment_ids", "position_ids",
                        "instance_ids")}
    per_token = ["input_ids", "segment_ids"]
    if "word_starts" in batch:
        out["word_starts"] = np.zeros((rows, length), np.int32)
        per_token.append("word_starts")
    for j in range(k):
        inside = (pos >= starts[:, j:j + 1]) & (pos < starts[:, j:j + 1] + slot_len[:, j:j + 1])
        src = np.clip(pos - starts[:, j:j + 1], 0, length - 1)
        inst = safe[:, j:j + 1]
        for name in per_token:
            values = np.asarray(batch[name])[inst, src]
            out[name] = np.where(inside, values, out[name]).astype(np.int32)
        out["position_ids"] = np.where(inside, src, out["position_ids"]).astype(np.int32)
        out["instance_ids"] = np.where(inside, j + 1, out["instance_ids"]).astype(np.int32)
    out["input_mask"] = (out["instance_ids"] > 0).astype(np.int32)

    weights = np.asarray(batch["masked_lm_weights"]) > 0
    counts = np.where(present, weights.sum(axis=1)[safe], 0)  # predictions per slot
    if np.any(counts.sum(axis=1) > max_predictions):
        raise ValueError(f"a row's instances predict more than {max_predictions} positions")
    positions = np.zeros((rows, max_predictions), np.int32)
    ids = np.zeros((rows, max_predictions), np.int32)
    first = np.cumsum(counts, axis=1) - counts  # each slot's first prediction slot
    width = weights.shape[1]
    col = np.arange(width)[None, :]
    for j in range(k):
        valid = col < counts[:, j:j + 1]  # an instance's predictions come first, ascending
        r_idx, c_idx = np.nonzero(valid)
        inst = safe[r_idx, j]
        target = first[r_idx, j] + c_idx
        positions[r_idx, target] = np.asarray(batch["masked_lm_positions"])[inst, c_idx] \
            + starts[r_idx, j]
        ids[r_idx, target] = np.asarray(batch["masked_lm_ids"])[inst, c_idx]
    out["masked_lm_positions"] = positions
    out["masked_lm_ids"] = ids
    out["masked_lm_weights"] = (np.arange(max_predictions)[None, :]
                                < counts.sum(axis=1)[:, None]).astype(np.float32)
    labels = np.asarray(batch["next_sentence_labels"]).reshape(len(lengths), -1)[:, 0]
    out["next_sentence_labels"] = np.where(present, labels[safe], 0).astype(np.int32)
    out["next_sentence_positions"] = np.where(present, starts, 0).astype(np.int32)
    out["next_sentence_weights"] = present.astype(np.float32)
    return out


def packing_stats(rows: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Counts of packed rows: ``rows``, ``instances`` (real slots), ``tokens`` (real) and
    ``slots`` (rows x length): factor = instances / rows, fill = tokens / slots."""
    mask = np.asarray(rows["input_mask"])
    return {"rows": int(len(mask)),
            "instances": int(np.asarray(rows["next_sentence_weights"]).sum()),
            "tokens": int(mask.sum()), "slots": int(mask.size)}
