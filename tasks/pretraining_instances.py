"""BERT pretraining instances, faithful to google-research/bert's create_pretraining_data.py.

A document is a list of sentences, each a list of token ids. For each document, segments are
accumulated up to a target length (``max_seq_length - 3``, or with ``short_seq_prob`` a random
length in [2, max]); the chunk is cut at a random sentence boundary into A and B. With
``random_next_prob`` (always when the chunk has one sentence) B is instead taken from a random
other document, and the chunk's unused sentences are put back. The pair is truncated from the
front or the back at random, laid out as ``[CLS] A [SEP] B [SEP]``, and masked (masking.py).

``create_instances`` runs the reference's outer loop for one shard: shuffle the documents,
``dupe_factor`` passes with fresh masks, shuffle the instances.

Usage:
    config = InstanceConfig(max_seq_length=128, ..., masking=MaskingConfig(...))
    for instance in create_instances(documents, config, random.Random(seed)):
        features = to_features(instance, 128, 20)  # input_ids, ..., next_sentence_labels
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable, Sequence, TypeVar

from runexp.tasks.masking import MaskingConfig, mask_tokens

Document = Sequence[Sequence[int]]
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    """Attributes: as the reference script's flags of the same names."""

    max_seq_length: int
    short_seq_prob: float
    random_next_prob: float
    dupe_factor: int
    masking: MaskingConfig


@dataclasses.dataclass
class Instance:
    tokens: list[int]
    segment_ids: list[int]
    masked_lm_positions: list[int]
    masked_lm_labels: list[int]
    is_random_next: bool


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: random.Random) -> None:
    """Truncates the longer list one token at a time, from the front or back at random."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def create_instances_from_document(documents: Sequence[Document], document_index: int,
                                   config: InstanceConfig,
                                   rng: random.Random) -> list[Instance]:
    """The instances of one document (reference: create_instances_from_document)."""
    document = documents[document_index]
    masking = config.masking
    max_num_tokens = config.max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    chunk: list[Sequence[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        chunk.append(segment)
        chunk_length += len(segment)
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for seg in chunk[:a_end] for t in seg]
            tokens_b: list[int] = []
            if len(chunk) == 1 or rng.random() < config.random_next_prob:
                is_random_next = True
                target_b_length = target_seq_length - len(tokens_a)
                # Ten tries for another document (the reference's number); one-document
                # corpora fall back to the same document.
                for _ in range(10):
                    random_index = rng.randint(0, len(documents) - 1)
                    if random_index != document_index:
                        break
                random_document = documents[random_index]
                for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
                    tokens_b.extend(random_document[j])
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(chunk) - a_end  # put the unused segments back
            else:
                is_random_next = False
                tokens_b = [t for seg in chunk[a_end:] for t in seg]
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            tokens = [masking.cls_id, *tokens_a, masking.sep_id, *tokens_b, masking.sep_id]
            segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
            tokens, positions, labels = mask_tokens(tokens, rng, masking)
            instances.append(Instance(tokens, segment_ids, positions, labels, is_random_next))
            chunk = []
            chunk_length = 0
        i += 1
    return instances


def to_features(instance: Instance, max_seq_length: int,
                max_predictions_per_seq: int) -> dict[str, list]:
    """The padded feature lists of google-research/bert's records (pad id 0)."""
    n = len(instance.tokens)
    pad = max_seq_length - n
    m = len(instance.masked_lm_positions)
    mpad = max_predictions_per_seq - m
    return {
        "input_ids": instance.tokens + [0] * pad,
        "input_mask": [1] * n + [0] * pad,
        "segment_ids": instance.segment_ids + [0] * pad,
        "masked_lm_positions": instance.masked_lm_positions + [0] * mpad,
        "masked_lm_ids": instance.masked_lm_labels + [0] * mpad,
        "masked_lm_weights": [1.0] * m + [0.0] * mpad,
        "next_sentence_labels": [1 if instance.is_random_next else 0],
    }


def create_instances(documents: list[Document], config: InstanceConfig, rng: random.Random,
                     transform: Callable[[Instance], T] = lambda x: x) -> list[T]:
    """All instances of a shard: shuffled documents, dupe_factor passes, shuffled output.

    Args:
      documents: the shard's non-empty documents (shuffled in place).
      config: instance and masking configuration.
      rng: the shard's generator.
      transform: applied to each instance as it is made (e.g. serialisation), so the shard
        holds compact records rather than Python lists while it waits for the final shuffle.

    Returns:
      ``transform(instance)`` for every instance, in the reference's shuffled order.
    """
    rng.shuffle(documents)
    out = []
    for _ in range(config.dupe_factor):
        for index in range(len(documents)):
            out.extend(transform(x) for x in
                       create_instances_from_document(documents, index, config, rng))
    rng.shuffle(out)
    return out
