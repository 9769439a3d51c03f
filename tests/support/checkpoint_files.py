"""Checkpoint files for compiler tests, without TensorFlow and without gigabytes of weights.

``write_index(prefix, {name: shape})`` writes ``<prefix>.index`` in TensorFlow's tensor
bundle format (one uncompressed LevelDB-format data block, every variable float32 at offset
0 of shard 0) and an empty ``<prefix>.data-00000-of-00001``: enough for the compiler's
checks and for ``tf.train.list_variables`` (tests/compiler/test_checkpoint_index.py reads
what this writes with TensorFlow itself), not for loading weights.
"""

from __future__ import annotations

import os
import struct

import google_crc32c

_MAGIC = 0xdb4775248b80fb57


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _entry(shape) -> bytes:
    dims = b"".join(_field(2, _int_field(1, d)) for d in shape)
    return _int_field(1, 1) + _field(2, dims)  # DT_FLOAT, TensorShapeProto


def _block(entries) -> bytes:
    body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
    return body + struct.pack("<II", 0, 1)  # one restart point, at 0


def _with_trailer(block: bytes) -> bytes:
    crc = google_crc32c.value(block + b"\x00")
    masked = (((crc >> 15) | (crc << 17)) + 0xa282ead8) & 0xFFFFFFFF
    return block + b"\x00" + struct.pack("<I", masked)


def write_index(prefix: str, variables: dict) -> str:
    """``variables``: name -> shape. Returns ``prefix``."""
    header = _int_field(1, 1) + _field(3, _int_field(1, 1))  # num_shards 1, version 1
    entries = [(b"", header)] + [(name.encode(), _entry(shape))
                                 for name, shape in sorted(variables.items())]
    data = _with_trailer(_block(entries))
    meta_offset = len(data)
    meta = _with_trailer(_block([]))
    index_offset = meta_offset + len(meta)
    index = _with_trailer(_block([(entries[-1][0] + b"\xff",
                                   _varint(0) + _varint(len(data) - 5))]))
    handles = (_varint(meta_offset) + _varint(len(meta) - 5) + _varint(index_offset)
               + _varint(len(index) - 5))
    footer = handles + b"\x00" * (40 - len(handles)) + struct.pack("<Q", _MAGIC)
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    with open(prefix + ".index", "wb") as f:
        f.write(data + meta + index + footer)
    open(prefix + ".data-00000-of-00001", "wb").close()
    return prefix


def bert_variables(layers: int, hidden: int, intermediate: int, vocab: int,
                   positions: int = 512, types: int = 2) -> dict:
    """The shapes google-research/bert's checkpoints pin the model by (a subset of names)."""
    out = {"bert/embeddings/word_embeddings": [vocab, hidden],
           "bert/embeddings/position_embeddings": [positions, hidden],
           "bert/embeddings/token_type_embeddings": [types, hidden]}
    for i in range(layers):
        out[f"bert/encoder/layer_{i}/intermediate/dense/kernel"] = [hidden, intermediate]
    return out
