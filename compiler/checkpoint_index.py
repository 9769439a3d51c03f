"""The variables of a TensorFlow checkpoint, read from its ``.index`` without TensorFlow.

A checkpoint's ``<prefix>.index`` is a LevelDB-format table (TensorFlow's tensor bundle,
written uncompressed): a footer with the index block's handle and a magic number, data
blocks of prefix-compressed entries, each followed by a 5-byte trailer. Every key but the
empty one (the bundle header) is a variable's name; its value a ``BundleEntryProto``
(dtype = 1, shape = 2 as ``TensorShapeProto {dim = 2 {size = 1}}``). Reading this much lets
the dry run refuse a missing or corrupt checkpoint, and one whose shapes do not fit the
model, before any machine is paid for.

Standard library only (the compiler never imports TensorFlow).

Usage:
    variables = read_index("/ckpt/bert_model.ckpt")   # {"bert/embeddings/...": (1, [30522, 768])}
"""

from __future__ import annotations

import struct

_MAGIC = 0xdb4775248b80fb57
_FOOTER = 48
_TRAILER = 5


class CheckpointIndexError(ValueError):
    """The file is not a readable checkpoint index (truncated, corrupt, another format)."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise CheckpointIndexError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CheckpointIndexError("bad varint")


def _block(data: bytes, offset: int, size: int) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of the block at ``offset``."""
    if offset + size + _TRAILER > len(data):
        raise CheckpointIndexError("a block runs past the end of the file (truncated?)")
    if data[offset + size] != 0:
        raise CheckpointIndexError("compressed blocks are not supported")
    block = data[offset:offset + size]
    if len(block) < 4:
        raise CheckpointIndexError("block too short")
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * restarts
    if end < 0:
        raise CheckpointIndexError("bad restart count")
    entries, key, pos = [], b"", 0
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + length > end:
            raise CheckpointIndexError("bad block entry")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        entries.append((key, block[pos:pos + length]))
        pos += length
    return entries


def _fields(message: bytes):
    """(field number, wire type, value) of a protobuf message's fields."""
    pos = 0
    while pos < len(message):
        tag, pos = _varint(message, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(message, pos)
        elif wire == 2:
            length, pos = _varint(message, pos)
            value, pos = message[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = message[pos:pos + 4], pos + 4
        elif wire == 1:
            value, pos = message[pos:pos + 8], pos + 8
        else:
            raise CheckpointIndexError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _entry(value: bytes) -> tuple[int, list[int]]:
    """(dtype enum, shape) of a BundleEntryProto."""
    dtype, shape = 0, []
    for number, wire, field in _fields(value):
        if number == 1 and wire == 0:
            dtype = field
        elif number == 2 and wire == 2:
            for dim_number, dim_wire, dim in _fields(field):
                if dim_number == 2 and dim_wire == 2:
                    size = next((v for n, w, v in _fields(dim) if n == 1 and w == 0), 0)
                    shape.append(size - (1 << 64) if size >= 1 << 63 else size)
    return dtype, shape


def read_index(prefix: str) -> dict[str, tuple[int, list[int]]]:
    """{variable name: (dtype enum, shape)} of the checkpoint at ``prefix``.

    Raises:
      FileNotFoundError: ``<prefix>.index`` does not exist.
      CheckpointIndexError: it exists but is not a whole checkpoint index.
    """
    with open(prefix + ".index", "rb") as f:
        data = f.read()
    if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _MAGIC:
        raise CheckpointIndexError("not a TensorFlow checkpoint index (bad magic number: "
                                   "truncated, or another kind of file)")
    footer = data[len(data) - _FOOTER:]
    _, pos = _varint(footer, 0)            # metaindex offset
    _, pos = _varint(footer, pos)          # metaindex size
    index_offset, pos = _varint(footer, pos)
    index_size, pos = _varint(footer, pos)
    variables = {}
    for _, handle in _block(data, index_offset, index_size):
        offset, p = _varint(handle, 0)
        size, _ = _varint(handle, p)
        for key, value in _block(data, offset, size):
            if key:  # the empty key is the bundle header
                variables[key.decode("utf-8", "replace")] = _entry(value)
    return variables
