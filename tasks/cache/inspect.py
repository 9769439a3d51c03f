"""What ``runexp inspect`` shows: decoded pretraining examples and length statistics.

Reads a preprocess stage's TFRecords (the task's seqio cache, ``<stage dir>/<task>/``), a
directory of them, or any file of google-research/bert's records, with a small parser of the tf.train.Example wire format, so no TensorFlow is imported and the
command answers in about a second. Masked positions are marked by what happened to them
(all three kinds are predicted, with loss weight 1):

    [MASK→fox]   replaced by [MASK]; the original token was "fox"
    {cat→fox}    replaced by the random token "cat"; the original was "fox"
    <fox>        kept as it was (the reference's 10% "keep" share)

Usage:
    print(inspect_examples("runexp_output/preprocess.wiki", "runexp_output/vocab", "train", 5))
"""

from __future__ import annotations

import glob
import os
import struct

import numpy as np

from runexp.compiler.formats.protobuf_wire import fields, read_varint
from runexp.tasks.cache.records import iter_records
from runexp.tasks.vocabulary.tokenizer import load_tokenizer
from runexp.tasks.cache.records import cached_tasks, read_masking

MAX_STATS_RECORDS = 200_000  # length statistics read at most this many records
_ONE_F32 = struct.pack("<f", 1.0)


def records_dir(data_dir: str) -> str:
    """Where a directory's records are: a preprocess stage directory's task cache
    (``<stage dir>/<task>/``), else the directory itself."""

    found = cached_tasks(data_dir) if os.path.isdir(data_dir) else {}
    return next(iter(found.values())) if len(found) == 1 else data_dir


def record_files(data_dir: str, split: str) -> list[str]:
    """The split's shards in a stage directory (or ``data_dir`` itself when it is a file)."""
    if os.path.isfile(data_dir):
        return [data_dir]
    data_dir = records_dir(data_dir)
    files = sorted(glob.glob(os.path.join(data_dir, f"{split}.tfrecord-*")))
    if not files:
        raise FileNotFoundError(f"no {split}.tfrecord-* files in {data_dir}")
    return [f for f in files if not f.endswith(".tmp")]


def example_payloads(record: bytes) -> dict[str, tuple[str, list]]:
    """Feature name -> ("int64" | "float", list of (wire type, value) items of its list)."""
    out = {}
    for f1, _, features in fields(record):
        if f1 != 1:
            continue
        for f2, _, entry in fields(features):
            if f2 != 1:
                continue
            name, feature = None, b""
            for f3, _, value in fields(entry):
                if f3 == 1:
                    name = value.decode("utf-8")
                elif f3 == 2:
                    feature = value
            for kind_field, _, lst in fields(feature):
                kind = {1: "bytes", 2: "float", 3: "int64"}.get(kind_field)
                out[name] = (kind, [(w, v) for _, w, v in fields(lst)])
    return out


def decode_example(record: bytes) -> dict[str, list]:
    """A tf.train.Example of int64 and float lists as Python lists (packed or not)."""
    out: dict[str, list] = {}
    for name, (kind, items) in example_payloads(record).items():
        values: list = []
        for wire, value in items:
            if kind == "int64":
                if wire == 2:  # packed
                    i = 0
                    while i < len(value):
                        v, i = read_varint(value, i)
                        values.append(v - (1 << 64) if v >= 1 << 63 else v)
                else:
                    values.append(value - (1 << 64) if value >= 1 << 63 else value)
            elif kind == "float":
                raw = value if wire == 2 else value
                values.extend(np.frombuffer(raw, "<f4").tolist())
        out[name] = values
    return out


def _packed_lists(record: bytes) -> dict[bytes, bytes]:
    """Feature name (bytes) -> its list's packed payload, by a direct walk of the layout every
    writer of these records uses (one packed list per feature); {} if the record differs."""
    out = {}
    try:
        if record[0] != 0x0A:
            return {}
        _, i = read_varint(record, 1)  # Features length
        n = len(record)
        while i < n:
            if record[i] != 0x0A:
                return {}
            entry_len, i = read_varint(record, i + 1)
            end = i + entry_len
            key_len, j = read_varint(record, i + 1)  # entry: 0a keylen key
            key = record[j:j + key_len]
            j += key_len
            _, j = read_varint(record, j + 1)        # 12 feature length
            _, j = read_varint(record, j + 1)        # tag (12 float / 1a int64), list length
            if j < end:
                payload_len, j = read_varint(record, j + 1)  # 0a packed length
                out[key] = record[j:j + payload_len]
            else:
                out[key] = b""
            i = end
    except IndexError:
        return {}
    return out


def _fast_lengths(record: bytes) -> tuple[int, int, int, int]:
    """(real tokens, segment-B tokens, masked positions, pair label) without decoding ids;
    relies on 0/1 masks taking one byte each and weights being packed 1.0/0.0 floats."""
    lists = _packed_lists(record)
    if not lists or b"input_mask" not in lists:  # another layout: decode fully
        f = decode_example(record)
        return (sum(f["input_mask"]), sum(f["segment_ids"]),
                sum(1 for w in f["masked_lm_weights"] if w > 0),
                f.get("next_sentence_labels", [0])[0])
    weights = lists.get(b"masked_lm_weights", b"")
    label = lists.get(b"next_sentence_labels", b"\x00")
    return (lists[b"input_mask"].count(1), lists.get(b"segment_ids", b"").count(1),
            weights.count(_ONE_F32), label[0] if label else 0)


def _token(tokenizer, i: int) -> str:
    try:
        return tokenizer.id_to_token(int(i))
    except (KeyError, IndexError):
        return f"<id {i}?>"


def format_example(features: dict[str, list], tokenizer) -> list[str]:
    """Lines showing one example: segments with masked positions marked."""
    ids = features["input_ids"]
    n = sum(features["input_mask"])
    marks = {}
    for pos, label, w in zip(features["masked_lm_positions"], features["masked_lm_ids"],
                             features["masked_lm_weights"]):
        if w > 0:
            marks[pos] = label
    mask_id = tokenizer.mask_id
    instances = features.get("instance_ids")  # a packed row (tasks/instances/packing.py)
    segments: dict[int, list[str]] = {0: [], 1: []}
    lines: list[str] = []
    for p in range(n):
        if instances is not None and p and instances[p] != instances[p - 1]:
            lines += _segment_lines(segments, instances[p - 1])
            segments = {0: [], 1: []}
        now = ids[p]
        if p in marks:
            original = _token(tokenizer, marks[p])
            if now == mask_id:
                text = f"[MASK→{original}]"
            elif now == marks[p]:
                text = f"<{original}>"
            else:
                text = f"{{{_token(tokenizer, now)}→{original}}}"
        else:
            text = _token(tokenizer, now)
        segments[features["segment_ids"][p] if p < len(features["segment_ids"]) else 0].append(text)
    return lines + _segment_lines(segments, instances[n - 1] if instances is not None and n
                                  else None)


def _segment_lines(segments: dict[int, list[str]], instance=None) -> list[str]:
    """An instance's A and B; ``instance``: its number in a packed row."""
    head = f"  [{instance}] " if instance is not None else "  "
    lines = [head + "A: " + " ".join(segments[0])]
    if segments[1]:
        lines.append(head + "B: " + " ".join(segments[1]))
    return lines


def _percentiles(values: np.ndarray) -> str:
    p = np.percentile(values, [10, 50, 90, 99])
    return (f"mean {values.mean():.1f}, p10 {p[0]:.0f}, p50 {p[1]:.0f}, p90 {p[2]:.0f}, "
            f"p99 {p[3]:.0f}, min {values.min()}, max {values.max()}")


def inspect_examples(data_dir: str, vocab_dir: str, split: str, n: int) -> str:
    """Decoded examples (the first ``n`` of the split) and length statistics, as text.

    Args:
      data_dir: a preprocess stage directory (or one TFRecord file).
      vocab_dir: the vocab stage directory the data was made with.
      split: "train" or "validation".
      n: examples to show.
    """
    tokenizer = load_tokenizer(vocab_dir)
    files = record_files(data_dir, split)
    out = [f"{data_dir} / {split}: {len(files)} shard(s); the first {n} example(s)",
           "  marks: [MASK→x] masked (original x), {y→x} random token y (original x), "
           "<x> kept; all are predicted", ""]
    if os.path.isdir(data_dir) and read_masking(records_dir(data_dir), split) is not None:
        out[-1:] = ["  this split is masked at training time (dynamic_masking): shown unmasked, "
                    "with 0 predicted", ""]
    lengths, seg_b, masked, labels = [], [], [], []
    pair_data = capped = False
    max_len = 0
    for i, record in enumerate(iter_records(files)):
        if i == 0:
            max_len = len(decode_example(record)["input_mask"])
        if i < n:
            features = decode_example(record)
            real = sum(features["input_mask"])
            m = sum(1 for w in features["masked_lm_weights"] if w > 0)
            label = features.get("next_sentence_labels", [0])[0]
            if "instance_ids" in features:  # a packed row: its instances' labels
                k = int(sum(features["next_sentence_weights"]))
                label = "s " + ", ".join(str(x) for x in features["next_sentence_labels"][:k])
                real = f"{k} instance(s), {real}"
            out.append(f"example {i + 1}: {real} tokens, {m} predicted, next-sentence label "
                       f"{label}")
            out.extend(format_example(features, tokenizer))
            out.append("")
        if i >= MAX_STATS_RECORDS:
            capped = True
            if i >= n:
                break
            continue
        a, b, c, d = _fast_lengths(record)
        lengths.append(a)
        seg_b.append(b)
        masked.append(c)
        labels.append(d)
        pair_data = pair_data or b > 0
    if not lengths:
        return "\n".join(out + ["no examples"])
    lengths_a = np.asarray(lengths)
    seg_b_a = np.asarray(seg_b)
    masked_a = np.asarray(masked)
    over = f"the first {MAX_STATS_RECORDS:,}" if capped else f"all {len(lengths):,}"
    out.append(f"statistics over {over} examples:")
    out.append(f"  real tokens per example: {_percentiles(lengths_a)}")
    out.append(f"  predicted per example:   {_percentiles(masked_a)}  "
               f"({masked_a.sum() / max(lengths_a.sum(), 1):.2%} of real tokens)")
    if pair_data:
        seg_a = lengths_a - seg_b_a - 2
        out.append(f"  segment A tokens: mean {seg_a.mean():.1f}; segment B tokens: mean "
                   f"{(seg_b_a - 1).mean():.1f}; label 1 (random next / swapped): "
                   f"{np.mean(labels):.1%}")
    else:
        out.append("  single segments (no sentence-pair objective)")
    out.append(f"  at max_seq_length ({max_len}): {np.mean(lengths_a == max_len):.1%}; under "
               f"half of it: {np.mean(lengths_a < max_len / 2):.1%}")
    return "\n".join(out)
