"""``tf.train.Example`` bytes without TensorFlow: the protobuf wire format, written by hand.

An Example with only int64 and float lists is a handful of length-delimited fields:

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }   # entries: key = 1, value = 2
    Feature   { FloatList float_list = 2; Int64List int64_list = 3; }
    Int64List { repeated int64 value = 1 [packed]; }  # varints
    FloatList { repeated float value = 1 [packed]; }  # little-endian fixed32

Encoding this directly is several times faster than building proto objects, and keeps
TensorFlow out of the worker processes. Map entries are written in sorted key order, so the
bytes are deterministic. Tests check that TensorFlow parses them.

``encode_examples`` writes the same bytes for a whole batch with a few numpy operations
(varints as byte columns, the bytes each row uses selected by a mask), the preprocess hot path.

Usage:
    data = encode_example({"input_ids": [2, 17, 3]}, float_features={"masked_lm_weights"})
    data, offsets = encode_examples({"input_ids": ids_2d}, float_features=())
"""

from __future__ import annotations

import struct
from typing import Collection, Mapping, Sequence

import numpy as np

_VARINT_TABLE_SIZE = 1 << 16


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives are 10-byte two's complement varints
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


_VARINTS: list[bytes] = []  # _varint(i) for small i, built on first use (20 ms)


def _packed_varints(values: Sequence[int]) -> bytes:
    table = _VARINTS
    if not table:
        table.extend(_varint(i) for i in range(_VARINT_TABLE_SIZE))
    try:
        return b"".join([table[v] for v in values])
    except IndexError:  # a value past the table (negative indexes would be wrong too)
        return b"".join([_varint(v) for v in values])


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def encode_feature_int64(values: Sequence[int]) -> bytes:
    """Feature{int64_list: Int64List{value: values}}."""
    if any(v < 0 for v in values):
        packed = b"".join([_varint(v) for v in values])
    else:
        packed = _packed_varints(values)
    return _length_delimited(3, _length_delimited(1, packed) if values else b"")


def encode_feature_float(values: Sequence[float]) -> bytes:
    """Feature{float_list: FloatList{value: values}}."""
    packed = struct.pack(f"<{len(values)}f", *values)
    return _length_delimited(2, _length_delimited(1, packed) if values else b"")


def encode_example(features: Mapping[str, Sequence], float_features: Collection[str] = ()
                   ) -> bytes:
    """Serialised ``tf.train.Example`` of int64 (default) and float features."""
    entries = []
    for key in sorted(features):
        values = features[key]
        feature = (encode_feature_float(values) if key in float_features
                   else encode_feature_int64(values))
        entry = _length_delimited(1, key.encode("utf-8")) + _length_delimited(2, feature)
        entries.append(_length_delimited(1, entry))
    return _length_delimited(1, b"".join(entries))


# --- Batches: the same bytes for many examples at once, in numpy ---------------------------

_SMALL = 1 << 16  # values below this are encoded by table look-up (1 to 3 bytes)
_small_tables: list = []


def _small_varint_tables() -> tuple[np.ndarray, np.ndarray]:
    """For every value below 2**16: its varint's bytes packed little-endian in a uint32, and
    a uint32 whose bytes are 1 where the varint has a byte (a bool mask by ``view``)."""
    if not _small_tables:
        v = np.arange(_SMALL, dtype=np.int64)
        nbytes = 1 + (v >= 1 << 7) + (v >= 1 << 14)
        packed = np.zeros(_SMALL, np.uint32)
        for j in range(3):
            byte = ((v >> (7 * j)) & 0x7F) | ((nbytes > j + 1) << 7)
            packed |= (byte.astype(np.uint32) << (8 * j)) * (nbytes > j)
        used = np.zeros(_SMALL, np.uint32)  # byte j is 1 when the varint has a byte j
        for j in range(3):
            used |= (nbytes > j).astype(np.uint32) << (8 * j)
        _small_tables.extend([packed.astype("<u4"), used.astype("<u4")])
    return _small_tables[0], _small_tables[1]


def _varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Varints of non-negative integer ``values`` [batch, n]: bytes [batch, n * w] and which
    of them are used (None: all; w: the most bytes any value needs)."""
    batch, n = values.shape
    if values.size and int(values.min()) < 0:
        raise ValueError("batch encoding takes non-negative integers only")
    top = int(values.max()) if values.size else 0
    if top < 1 << 7:
        return values.astype(np.uint8), None
    if top < _SMALL:
        packed, used = _small_varint_tables()
        # Four bytes a value (the fourth never used), both by table look-up: views, no copies.
        data = np.take(packed, values).view(np.uint8).reshape(batch, n * 4)
        return data, np.take(used, values).view(np.bool_).reshape(batch, n * 4)
    values = values.astype(np.int64)
    width = max(1, (top.bit_length() + 6) // 7)
    nbytes = np.ones(values.shape, np.int64)
    for j in range(1, width):
        nbytes += values >= (1 << (7 * j))
    out = np.empty((batch, n, width), np.uint8)
    for j in range(width):
        out[:, :, j] = ((values >> (7 * j)) & 0x7F) | ((nbytes > j + 1) << 7)
    used = np.arange(width)[None, None, :] < nbytes[:, :, None]
    return out.reshape(batch, n * width), used.reshape(batch, n * width)


def _varint_len(values: np.ndarray) -> np.ndarray:
    """Bytes of each non-negative value's varint."""
    n = np.ones(values.shape, np.int64)
    for j in range(1, 10):
        more = values >= (1 << (7 * j))
        if not more.any():
            break
        n += more
    return n


class _Parts:
    """Byte columns of every row, with the bytes each row uses; concatenated in order."""

    def __init__(self, batch: int):
        self.batch = batch
        self.data: list[np.ndarray] = []
        self.used: list[np.ndarray] = []

    def const(self, raw: bytes) -> None:
        arr = np.frombuffer(raw, np.uint8)[None, :]
        self.block(np.broadcast_to(arr, (self.batch, len(raw))), None)

    def varint(self, values: np.ndarray) -> None:
        data, used = _varint_bytes(values.reshape(self.batch, 1))
        self.block(data, used)

    def block(self, data: np.ndarray, used: np.ndarray | None) -> None:
        self.data.append(data)
        self.used.append(used)

    def join(self, lengths: np.ndarray) -> tuple[bytes, np.ndarray]:
        """The used bytes of every row, rows concatenated; ``lengths``: bytes per row."""
        data = np.concatenate(self.data, axis=1)
        used = np.ones(data.shape, bool)
        col = 0
        for d, u in zip(self.data, self.used):
            if u is not None:
                used[:, col:col + d.shape[1]] = u
            col += d.shape[1]
        offsets = np.zeros(self.batch + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # np.compress on flat arrays: several times faster than data[used] on 2-D arrays.
        return np.compress(used.ravel(), data.ravel()).tobytes(), offsets


def encode_examples(features: Mapping[str, np.ndarray], float_features: Collection[str] = ()
                    ) -> tuple[bytes, np.ndarray]:
    """Serialised ``tf.train.Example``s of a batch, the bytes ``encode_example`` gives per row.

    A feature whose values all take one byte (masks, segment ids, positions, labels) or are
    floats has the same length in every row, so its headers are one constant; only the
    features with multi-byte varints (token ids) need per-row lengths.

    Args:
      features: name -> [batch, n] array (n >= 1); int features non-negative.
      float_features: names stored as float lists (float32).

    Returns:
      (all records concatenated, offsets [batch + 1]: record i is ``data[o[i]:o[i + 1]]``).
    """
    keys = sorted(features)
    batch = len(features[keys[0]])
    encoded = []  # per feature: (key bytes, tag, packed data, used or None)
    for key in keys:
        values = np.asarray(features[key]).reshape(batch, -1)
        if values.shape[1] == 0:
            raise ValueError(f"feature {key!r} is empty; batch encoding needs values")
        if key in float_features:
            data = np.ascontiguousarray(values, dtype="<f4").view(np.uint8)
            encoded.append((key.encode("utf-8"), b"\x12", data, None))
        else:
            data, used = _varint_bytes(values)
            encoded.append((key.encode("utf-8"), b"\x1a", data, used))
    features_len = 0
    layout = []
    for kb, tag, data, used in encoded:
        key_part = b"\x0a" + _varint(len(kb)) + kb + b"\x12"
        if used is None:  # the same lengths in every row: one constant header
            plen = data.shape[1]
            lst = b"\x0a" + _varint(plen)
            feat = tag + _varint(len(lst) + plen)
            entry_len = len(key_part) + len(_varint(len(feat) + len(lst) + plen)) + len(feat) \
                + len(lst) + plen
            head = (b"\x0a" + _varint(entry_len) + key_part
                     + _varint(len(feat) + len(lst) + plen) + feat + lst)
            layout.append((head, data))
            features_len = features_len + len(head) + plen
        else:
            plen = used.sum(axis=1)
            list_len = 1 + _varint_len(plen) + plen           # Int64List
            feat_len = 1 + _varint_len(list_len) + list_len   # Feature
            entry_len = len(key_part) + _varint_len(feat_len) + feat_len
            layout.append((key_part, tag, data, used, plen, list_len, feat_len, entry_len))
            features_len = features_len + 1 + _varint_len(entry_len) + entry_len
    features_len = np.broadcast_to(features_len, (batch,))
    parts = _Parts(batch)
    parts.const(b"\x0a")
    parts.varint(features_len)
    for item in layout:
        if len(item) == 2:
            head, data = item
            parts.const(head)
            parts.block(data, None)
            continue
        key_part, tag, data, used, plen, list_len, feat_len, entry_len = item
        parts.const(b"\x0a")
        parts.varint(entry_len)
        parts.const(key_part)
        parts.varint(feat_len)
        parts.const(tag)
        parts.varint(list_len)
        parts.const(b"\x0a")
        parts.varint(plen)
        parts.block(data, used)
    return parts.join(1 + _varint_len(features_len) + features_len)
