"""Sentence and sentence-pair classification (or regression) data, encoded for the model.

Encoding follows google-research/bert's run_classifier.py: ``[CLS] a [SEP]`` or
``[CLS] a [SEP] b [SEP]``, the pair truncated by dropping the last token of the longer side
until it fits, zero padding, segment ids 0 for a and 1 for b. The files are read by
compiler/formats/classification_files.py (the compiler checks them with the same reader).

Usage:
    examples = load_examples("dev.tsv", text_fields=["sentence"], label_field="label")
    arrays = encode_examples(examples, load_tokenizer(vocab_dir), labels, max_seq_length=128)
    arrays["input_ids"].shape  # (n, 128) int32; also input_mask, segment_ids, label_ids (n,)

Light: numpy, no TensorFlow.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from runexp.compiler.formats.classification_files import Example


def label_values(examples: Sequence[Example]) -> np.ndarray:
    """A regression's labels as float32 [n]."""
    return np.array([float(label) for _, label in examples], np.float32)


def labels_of(examples: Sequence[Example]) -> list[str]:
    """The sorted distinct labels of examples (when a task does not list them)."""
    return sorted({label for _, label in examples})


def _truncate_pair(a: list[int], b: list[int], max_length: int) -> None:
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()


def encode_examples(examples: Sequence[Example], tokenizer, labels: Optional[Sequence[str]],
                    max_seq_length: int, regression: bool = False) -> dict[str, np.ndarray]:
    """Token ids, mask, segment ids (int32 [n, max_seq_length]) and label ids (int32 [n]),
    or for a ``regression`` (``labels`` unused) the scores as label_values (float32 [n])."""
    label_ids = {label: i for i, label in enumerate(labels or ())}
    n = len(examples)
    input_ids = np.zeros((n, max_seq_length), np.int32)
    input_mask = np.zeros((n, max_seq_length), np.int32)
    segment_ids = np.zeros((n, max_seq_length), np.int32)
    label_array = np.zeros((n,), np.int32)
    for row, (texts, label) in enumerate(examples):
        if not regression and label not in label_ids:
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
        if not regression:
            label_array[row] = label_ids[label]
    arrays = {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}
    if regression:
        return {**arrays, "label_values": label_values(examples)}
    return {**arrays, "label_ids": label_array}
