"""A look at the first records of a TFRecord file of BERT pretraining examples, without
TensorFlow: the framing, the ``tf.train.Example`` wire format, and what google-research/bert's
``run_pretraining.py`` expects of it.

Why here: a dry run should say that records made with ``--max_seq_length=512`` do not fit
``MAX_SEQ_LENGTH = 128`` (TensorFlow would say "Can't parse serialized Example" an hour into
the run), and the compiler never imports TensorFlow (nor numpy). The runtime uses the same
checks to explain a record TensorFlow failed to parse (tasks/cache/example_sources.py), so both say
it in the same words.

TFRecord framing, per record: uint64 length, masked CRC-32C of those 8 bytes, the data,
masked CRC-32C of the data (little-endian). A text file read this way fails the first CRC.

Example wire format (tasks/cache/example_proto.py writes it): Example{features = 1}, Features{map
feature = 1: entries {key = 1, value = 2}}, Feature{bytes_list = 1, float_list = 2,
int64_list = 3}, each list {repeated value = 1} (packed or not).

Standard library only.

Usage:
    records = read_records("train-00000.tfrecord", limit=2)   # FramingError if not TFRecord
    features = parse_example(records[0])                      # name -> (kind, values)
    for problem in check_features(features, max_seq_length=128, max_predictions_per_seq=20):
        print(problem.message, problem.hint)
"""

from __future__ import annotations

import dataclasses
import struct
from typing import BinaryIO, Optional

from runexp.compiler.formats.protobuf_wire import fields, read_varint
from runexp.compiler.formats.tfrecord_crc import masked_crc

INT64, FLOAT, BYTES, EMPTY = "int64", "float", "bytes", "empty"

# What google-research/bert's run_pretraining.py parses (tasks/cache/records.py writes the same):
# name -> (kind, length: "seq" = max_seq_length, "pred" = max_predictions_per_seq, or 1).
BERT_FEATURES = {
    "input_ids": (INT64, "seq"),
    "input_mask": (INT64, "seq"),
    "segment_ids": (INT64, "seq"),
    "masked_lm_positions": (INT64, "pred"),
    "masked_lm_ids": (INT64, "pred"),
    "masked_lm_weights": (FLOAT, "pred"),
    "next_sentence_labels": (INT64, 1),
}
TOKEN_FEATURES = ("input_ids", "masked_lm_ids")  # values are ids of the vocabulary


class FramingError(ValueError):
    """The bytes are not TFRecord framing (``offset``: where the bad record starts)."""

    def __init__(self, offset: int, why: str):
        self.offset = offset
        self.why = why
        super().__init__(f"bad TFRecord framing at byte {offset}: {why}")


def read_records(f: BinaryIO | str, limit: int, size: Optional[int] = None) -> list[bytes]:
    """Up to ``limit`` records from the start of a TFRecord file (a path or a binary file),
    both CRCs checked. ``size``: the file's size, when known (a record said to be longer than
    what is left is bad framing, caught before reading it).

    Raises:
      FramingError: the bytes are not TFRecord records (a text file, a truncated record).
    """
    if isinstance(f, str):
        import os

        with open(f, "rb") as fh:
            return read_records(fh, limit, os.path.getsize(f))
    out, offset = [], 0
    while len(out) < limit:
        header = f.read(12)
        if not header:
            break
        if len(header) < 12:
            raise FramingError(offset, f"{len(header)} bytes where a 12-byte record header "
                                       "belongs")
        length_bytes, (crc,) = header[:8], struct.unpack("<I", header[8:])
        if masked_crc(length_bytes) != crc:
            raise FramingError(offset, "the length's checksum does not match")
        (length,) = struct.unpack("<Q", length_bytes)
        if size is not None and offset + 16 + length > size:
            raise FramingError(offset, f"a record of {length:,} bytes runs past the end of the "
                                       f"file ({size:,} bytes)")
        data = f.read(length)
        tail = f.read(4)
        if len(data) < length or len(tail) < 4:
            raise FramingError(offset, "truncated record")
        if masked_crc(data) != struct.unpack("<I", tail)[0]:
            raise FramingError(offset, "the data's checksum does not match")
        out.append(data)
        offset += 16 + length
    return out


# --- tf.train.Example, decoded ---------------------------------------------------------------

def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _feature(buf: bytes) -> tuple[str, list]:
    kind, values = EMPTY, []
    for field, _, payload in fields(buf):
        kind = {1: BYTES, 2: FLOAT, 3: INT64}.get(field, kind)
        values = []
        for f, wire, v in fields(payload):
            if f != 1:
                continue
            if kind == INT64 and wire == 2:  # packed varints
                pos = 0
                while pos < len(v):
                    x, pos = read_varint(v, pos)
                    values.append(_signed(x))
            elif kind == INT64:
                values.append(_signed(v))
            elif kind == FLOAT and wire == 2:  # packed fixed32
                values.extend(struct.unpack(f"<{len(v) // 4}f", v))
            elif kind == FLOAT:
                values.append(struct.unpack("<f", v)[0])
            else:
                values.append(bytes(v))
    return kind, values


def parse_example(data: bytes) -> dict[str, tuple[str, list]]:
    """name -> (kind: int64, float, bytes or empty, values) of a serialised tf.train.Example.

    Raises:
      ValueError: the bytes are not a tf.train.Example.
    """
    out = {}
    for field, wire, features in fields(data):
        if field != 1 or wire != 2:
            raise ValueError(f"field {field} (wire type {wire}) is not one of an Example")
        for f, w, entry in fields(features):
            if f != 1 or w != 2:
                raise ValueError(f"field {f} is not one of Features")
            key, value = None, b""
            for ef, _, ev in fields(entry):
                if ef == 1:
                    key = bytes(ev).decode("utf-8", "replace")
                elif ef == 2:
                    value = ev
            if key is None:
                raise ValueError("a feature map entry without a key")
            out[key] = _feature(value)
    return out


# --- What BERT's pretraining expects ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One way a record differs from what the configuration expects."""

    message: str   # "input_ids has 512 values, expected 128 (max_seq_length)"
    hint: str
    setting: str = ""  # the setting the records disagree with, when one does
    found: Optional[int] = None  # the records' value of that setting


def expected_features(max_seq_length: int, max_predictions_per_seq: int
                      ) -> dict[str, tuple[str, int]]:
    """name -> (kind, length) of the features a pretraining record must have."""
    sizes = {"seq": max_seq_length, "pred": max_predictions_per_seq}
    return {name: (kind, sizes.get(length, length)) for name, (kind, length)
            in BERT_FEATURES.items()}


_REMAKE = "create_pretraining_data.py"
_SETTINGS = {"seq": ("max_seq_length", "MAX_SEQ_LENGTH"),
             "pred": ("max_predictions_per_seq", "MAX_PREDICTIONS_PER_SEQ")}


def check_features(features: dict[str, tuple[str, list]], max_seq_length: int,
                   max_predictions_per_seq: int) -> list[Mismatch]:
    """How one parsed record (``parse_example``) differs from what pretraining with these
    shapes parses; [] when it fits. A length off in several features of one group (the three
    per-token features, the three per-prediction ones) is one mismatch."""
    problems: list[Mismatch] = []
    missing = [n for n in BERT_FEATURES if n not in features]
    if missing:
        have = ", ".join(sorted(features)) or "none"
        problems.append(Mismatch(
            f"no feature {', '.join(missing)} (the record has: {have})",
            f"bert_tfrecord reads google-research/bert's {_REMAKE} output: "
            + ", ".join(BERT_FEATURES)))
    configured = {"seq": max_seq_length, "pred": max_predictions_per_seq}
    reported = set()
    for name, (kind, group) in BERT_FEATURES.items():
        if name not in features:
            continue
        have_kind, values = features[name]
        want_kind = kind
        if have_kind not in (want_kind, EMPTY):
            problems.append(Mismatch(
                f"{name} holds {have_kind} values, expected {want_kind} values",
                f"bert_tfrecord reads google-research/bert's {_REMAKE} output "
                "(masked_lm_weights floats, every other feature int64)"))
            continue
        want = configured.get(group, group)
        if len(values) == want:
            continue
        if group in _SETTINGS:
            if group in reported:
                continue
            reported.add(group)
            setting, macro = _SETTINGS[group]
            flag = f"--{setting}"
            problems.append(Mismatch(
                f"{name} has {len(values)} values, expected {want} ({setting} = {want})",
                f"the records were made with {flag}={len(values)}: set {macro} = "
                f"{len(values)}, or remake them with {_REMAKE} {flag}={want}",
                setting, len(values)))
        else:
            problems.append(Mismatch(
                f"{name} has {len(values)} values, expected {want}",
                f"google-research/bert writes one {name} value per example"))
    return problems


def max_token_id(features: dict[str, tuple[str, list]]) -> int:
    """The largest vocabulary id in a parsed record (-1 when it has none)."""
    top = -1
    for name in TOKEN_FEATURES:
        kind, values = features.get(name, (EMPTY, []))
        if kind == INT64 and values:
            top = max(top, max(values))
    return top
