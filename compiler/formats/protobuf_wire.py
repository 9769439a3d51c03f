"""The protobuf wire format, read without protobuf or TensorFlow: varints and a message's
fields. What the compiler and the light tasks/ modules need to look into a tf.train.Example
(compiler/formats/example_peek.py, tasks/cache/inspect.py) or a checkpoint's index entries
(compiler/formats/checkpoint_index.py) before anything heavy is imported.

Standard library only. Malformed input raises ValueError.

Usage:
    for number, wire_type, value in fields(message):   # value: int (varint) or bytes
        ...
"""

from __future__ import annotations

from typing import Iterator


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the varint at ``pos``."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(message: bytes) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of each field: an int for varints, bytes for the
    length-delimited (2), 32-bit (5) and 64-bit (1) types."""
    pos = 0
    while pos < len(message):
        key, pos = read_varint(message, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(message, pos)
        elif wire == 2:
            length, pos = read_varint(message, pos)
            if pos + length > len(message):
                raise ValueError("truncated field")
            value, pos = message[pos:pos + length], pos + length
        elif wire in (5, 1):
            size = 4 if wire == 5 else 8
            if pos + size > len(message):
                raise ValueError("truncated field")
            value, pos = message[pos:pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value
