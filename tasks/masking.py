"""BERT's masked-LM selection, faithful to google-research/bert's create_pretraining_data.py.

``num_to_predict = min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob)))``
positions are chosen among all tokens but [CLS] and [SEP], in a random order of candidate
groups (single pieces, or whole words when ``whole_word_masking``: a piece that does not start
a word joins the group of the piece before it). Each chosen position becomes [MASK] with
probability ``mask_token_prob``, a random vocab id with ``random_token_prob``, and stays as it
is otherwise. The random draws follow the reference order, so with the default shares
(0.8/0.1/0.1) a given ``random.Random`` state picks the same positions and replacements as
the reference.

One deliberate difference: the reference lets a "##" piece right after [SEP] join the word
before [SEP]; here a continuation joins only the group of the position just before it.

Usage:
    config = MaskingConfig(masked_lm_prob=0.15, max_predictions_per_seq=20, ...)
    output_ids, positions, labels = mask_tokens(ids, rng, config)
"""

from __future__ import annotations

import dataclasses
import random
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """What mask_tokens needs.

    Attributes:
      masked_lm_prob: share of tokens to predict.
      max_predictions_per_seq: most positions predicted per sequence.
      vocab_size: random replacements are drawn from ids [0, vocab_size).
      mask_id, cls_id, sep_id: special ids.
      mask_token_prob: share of chosen positions set to [MASK].
      random_token_prob: share set to a random id (the rest keep their token).
      whole_word_masking: mask all pieces of a word together.
      word_start: per id, whether it starts a word (needed for whole-word masking).
    """

    masked_lm_prob: float
    max_predictions_per_seq: int
    vocab_size: int
    mask_id: int
    cls_id: int
    sep_id: int
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1
    whole_word_masking: bool = False
    word_start: Sequence[bool] | None = None

    def __post_init__(self):
        if not (0 <= self.mask_token_prob and 0 <= self.random_token_prob
                and self.mask_token_prob + self.random_token_prob <= 1):
            raise ValueError("mask_token_prob and random_token_prob must be >= 0 and sum <= 1, "
                             f"got {self.mask_token_prob} and {self.random_token_prob}")
        if self.whole_word_masking and self.word_start is None:
            raise ValueError("whole_word_masking needs the word_start table")


def candidate_groups(tokens: Sequence[int], config: MaskingConfig) -> list[list[int]]:
    """Position groups that may be masked, in order ([CLS]/[SEP] excluded)."""
    groups: list[list[int]] = []
    specials = (config.cls_id, config.sep_id)
    word_start = config.word_start
    for i, token in enumerate(tokens):
        if token in specials:
            continue
        if (config.whole_word_masking and groups and groups[-1][-1] == i - 1
                and not word_start[token]):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def mask_tokens(tokens: Sequence[int], rng: random.Random,
                config: MaskingConfig) -> tuple[list[int], list[int], list[int]]:
    """Chooses and replaces masked positions.

    Args:
      tokens: ids of ``[CLS] A [SEP] B [SEP]``.
      rng: the shard's random generator (advanced).
      config: the masking configuration.

    Returns:
      (output ids, masked positions ascending, original ids at those positions).
    """
    groups = candidate_groups(tokens, config)
    rng.shuffle(groups)
    output = list(tokens)
    num_to_predict = min(config.max_predictions_per_seq,
                         max(1, int(round(len(tokens) * config.masked_lm_prob))))
    keep_share = 1.0 - config.mask_token_prob - config.random_token_prob
    # The reference draws "keep vs random" with probability 0.5 after missing [MASK].
    keep_given_not_mask = (keep_share / (1.0 - config.mask_token_prob)
                           if config.mask_token_prob < 1.0 else 0.0)
    chosen: list[int] = []
    covered: set[int] = set()
    for group in groups:
        if len(chosen) >= num_to_predict:
            break
        if len(chosen) + len(group) > num_to_predict:
            continue
        if any(i in covered for i in group):
            continue
        for i in group:
            covered.add(i)
            if rng.random() < config.mask_token_prob:
                output[i] = config.mask_id
            elif rng.random() >= keep_given_not_mask:
                output[i] = rng.randint(0, config.vocab_size - 1)
            chosen.append(i)
    chosen.sort()
    return output, chosen, [tokens[i] for i in chosen]
