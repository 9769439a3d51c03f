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

from runexp.compiler.formats.protobuf_wire import fields, read_varint

_MAGIC = 0xdb4775248b80fb57
_FOOTER = 48
_TRAILER = 5


class CheckpointIndexError(ValueError):
    """The file is not a readable checkpoint index (truncated, corrupt, another format)."""


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
        shared, pos = read_varint(block, pos)
        unshared, pos = read_varint(block, pos)
        length, pos = read_varint(block, pos)
        if shared > len(key) or pos + unshared + length > end:
            raise CheckpointIndexError("bad block entry")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        entries.append((key, block[pos:pos + length]))
        pos += length
    return entries


def _entry(value: bytes) -> tuple[int, list[int]]:
    """(dtype enum, shape) of a BundleEntryProto."""
    dtype, shape = 0, []
    for number, wire, field in fields(value):
        if number == 1 and wire == 0:
            dtype = field
        elif number == 2 and wire == 2:
            for dim_number, dim_wire, dim in fields(field):
                if dim_number == 2 and dim_wire == 2:
                    size = next((v for n, w, v in fields(dim) if n == 1 and w == 0), 0)
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
    _, pos = read_varint(footer, 0)            # metaindex offset
    _, pos = read_varint(footer, pos)          # metaindex size
    index_offset, pos = read_varint(footer, pos)
    index_size, pos = read_varint(footer, pos)
    variables = {}
    try:
        blocks = _block(data, index_offset, index_size)
    except ValueError as e:  # the wire reader's (truncated varint, ...)
        raise CheckpointIndexError(str(e)) from None
    for _, handle in blocks:
        offset, p = read_varint(handle, 0)
        size, _ = read_varint(handle, p)
        for key, value in _block(data, offset, size):
            if key:  # the empty key is the bundle header
                variables[key.decode("utf-8", "replace")] = _entry(value)
    return variables
