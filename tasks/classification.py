"""Sentence and sentence-pair classification data: TSV (with a header) or JSONL.

Encoding follows google-research/bert's run_classifier.py: ``[CLS] a [SEP]`` or
``[CLS] a [SEP] b [SEP]``, the pair truncated by dropping the last token of the longer side
until it fits, zero padding, segment ids 0 for a and 1 for b.

Usage:
    examples = load_examples("dev.tsv", text_fields=["sentence"], label_field="label")
    arrays = encode_examples(examples, load_tokenizer(vocab_dir), labels, max_seq_length=128)
    arrays["input_ids"].shape  # (n, 128) int32; also input_mask, segment_ids, label_ids (n,)

Light: numpy, no TensorFlow.
"""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from runexp.compiler.errors import UserError


class DataFileError(UserError, ValueError):
    """A malformed line of a classification file: the message starts with file:line. A
    UserError, so a run reports it as bad input (exit 1, no traceback)."""

Example = tuple[tuple[str, ...], str]  # (texts in text_fields order, label)


def _load_tsv(path: str, text_fields: Sequence[str], label_field: str) -> list[Example]:
    examples = []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\r\n").split("\t")
        missing = [c for c in (*text_fields, label_field) if c not in header]
        if missing:
            raise DataFileError(f"{path}:1: the header {header} has no column(s) {missing}")
        columns = [header.index(c) for c in text_fields]
        label_column = header.index(label_field)
        for number, line in enumerate(f, start=2):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            row = line.split("\t")
            if len(row) != len(header):
                raise DataFileError(f"{path}:{number}: {len(row)} tab-separated fields, the header "
                                 f"has {len(header)}")
            examples.append((tuple(row[c] for c in columns), row[label_column]))
    return examples


def _load_jsonl(path: str, text_fields: Sequence[str], label_field: str) -> list[Example]:
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFileError(f"{path}:{number}: not JSON: {e.msg}") from None
            if not isinstance(row, dict):
                raise DataFileError(f"{path}:{number}: expected a JSON object")
            missing = [c for c in (*text_fields, label_field) if c not in row]
            if missing:
                raise DataFileError(f"{path}:{number}: missing field(s) {missing}")
            examples.append((tuple(str(row[c]) for c in text_fields), str(row[label_field])))
    return examples


def load_examples(path: str, text_fields: Sequence[str] = ("sentence",),
                  label_field: str = "label") -> list[Example]:
    """Reads ``.jsonl``/``.json`` (one object a line) or TSV with a header (anything else).

    Raises:
      ValueError: naming file:line, for a malformed row or a missing field.
    """
    if not 1 <= len(text_fields) <= 2:
        raise ValueError(f"text_fields must name one or two fields, got {list(text_fields)}")
    if path.endswith((".jsonl", ".json")):
        return _load_jsonl(path, text_fields, label_field)
    return _load_tsv(path, text_fields, label_field)


def labels_of(examples: Sequence[Example]) -> list[str]:
    """The sorted distinct labels of examples (when a task does not list them)."""
    return sorted({label for _, label in examples})


def _truncate_pair(a: list[int], b: list[int], max_length: int) -> None:
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()


def encode_examples(examples: Sequence[Example], tokenizer, labels: Sequence[str],
                    max_seq_length: int) -> dict[str, np.ndarray]:
    """Token ids, mask, segment ids (int32 [n, max_seq_length]) and label ids (int32 [n])."""
    label_ids = {label: i for i, label in enumerate(labels)}
    n = len(examples)
    input_ids = np.zeros((n, max_seq_length), np.int32)
    input_mask = np.zeros((n, max_seq_length), np.int32)
    segment_ids = np.zeros((n, max_seq_length), np.int32)
    label_array = np.zeros((n,), np.int32)
    for row, (texts, label) in enumerate(examples):
        if label not in label_ids:
            raise ValueError(f"example {row}: label {label!r} is not one of {list(labels)}")
        a = tokenizer.encode(texts[0])
        b = tokenizer.encode(texts[1]) if len(texts) > 1 else None
        if b is None:
            a = a[:max_seq_length - 2]
            tokens = [tokenizer.cls_id, *a, tokenizer.sep_id]
            segments = [0] * len(tokens)
        else:
            _truncate_pair(a, b, max_seq_length - 3)
            tokens = [tokenizer.cls_id, *a, tokenizer.sep_id, *b, tokenizer.sep_id]
            segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        input_ids[row, :len(tokens)] = tokens
        input_mask[row, :len(tokens)] = 1
        segment_ids[row, :len(tokens)] = segments
        label_array[row] = label_ids[label]
    return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids,
            "label_ids": label_array}
