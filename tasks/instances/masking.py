"""BERT's masked-LM selection, with the distribution of google-research/bert's
create_pretraining_data.py, vectorised over batches of instances.

Per instance of ``n`` tokens, ``k = min(max_predictions_per_seq, max(1, round(n *
masked_lm_prob)))`` positions are predicted (fewer when there are fewer candidates), chosen
uniformly among all tokens but [CLS] and [SEP] -- the reference shuffles the candidates and
takes the first ``k``, which is the same distribution. Each chosen position independently
becomes [MASK] with probability ``mask_token_prob``, a uniformly random vocab id with
``random_token_prob`` (the reference: 0.8, then 0.5 of the remaining 0.2), and keeps its
token otherwise. Every chosen position gets loss weight 1 (the keep-original share included,
unlike seqio/t5's "BERT-like" objectives).

Word-level selection (which pieces start a word: per id, the vocab's ``word_start`` table,
a WordPiece ``##`` piece or a SentencePiece piece without "▁" continuing one; or per
position, ``mask_batch``'s ``word_starts``: Chinese words of a word segmenter, whose 2nd..nth
characters continue them too, tasks/vocabulary/chinese_words.py):

- ``whole_word_masking``: candidate groups are words (a piece that does not start a word
  joins the piece just before it); groups are taken in random order while they fit in ``k``,
  as google-research/bert's later ``do_whole_word_mask`` (vectorised over the batch: one
  step per word rank). One deliberate difference: a ``##``
  piece right after [SEP] starts a group of its own instead of joining the word before [SEP].
- ``ngram_max > 1``: n-gram masking over whole words (ALBERT / SpanBERT-lite; a per-instance
  loop, about 4x slower than the default): for each word
  in random order, ``n`` is drawn with ``p(n) ∝ 1/n`` for ``n = 1..ngram_max``; the span is
  the ``n`` words starting there, cut at the segment's end; when it does not fit in the
  remaining budget, shorter spans are tried (as ALBERT does); spans overlapping an earlier
  one are skipped. Spans never cross [SEP].

Usage:
    config = MaskingConfig(MaskingSpec(), vocab_size=30522, mask_id=4, cls_id=2, sep_id=3)
    ids, positions, labels, counts = mask_batch(ids, lengths, candidates, segment_ids,
                                                config, np_rng, py_rng)
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from runexp.compiler.specs.preprocess import MaskingSpec


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """A masking spec with the vocabulary's ids it needs.

    Attributes:
      spec: the settings (MaskingSpec: compiler/specs/preprocess.py).
      vocab_size: random replacements are drawn from ids [0, vocab_size).
      mask_id, cls_id, sep_id: special ids.
      word_start: per id, whether it starts a word (word-level masking from token ids; at
        training time the records carry ``word_starts`` instead).
    """

    spec: MaskingSpec
    vocab_size: int
    mask_id: int
    cls_id: int
    sep_id: int
    word_start: Optional[Sequence[bool]] = dataclasses.field(default=None, compare=False)

    def to_json(self) -> dict:
        """The fields of masking.json (records.write_masking) that say how to mask (not
        ``word_segmenter``: the records' ``word_starts`` carry its words)."""
        params = {k: v for k, v in self.spec.to_params().items() if k != "word_segmenter"}
        return {**params, "vocab_size": self.vocab_size, "mask_id": self.mask_id,
                "cls_id": self.cls_id, "sep_id": self.sep_id}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MaskingConfig":
        names = MaskingSpec.param_names()
        return cls(MaskingSpec.from_params({k: v for k, v in d.items() if k in names}),
                   d["vocab_size"], d["mask_id"], d["cls_id"], d["sep_id"])


def num_to_predict(lengths: np.ndarray, num_candidates: np.ndarray,
                   config: MaskingConfig) -> np.ndarray:
    """The reference's ``min(max_predictions, max(1, round(n * masked_lm_prob)))``, per row,
    capped by the candidates there are (numpy rounds half to even, as Python's round)."""
    k = np.minimum(config.spec.max_predictions_per_seq,
                   np.maximum(1, np.round(lengths * config.spec.masked_lm_prob).astype(np.int64)))
    return np.minimum(k, num_candidates)


def _choose_uniform(candidates: np.ndarray, k: np.ndarray, width: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Per row, ``k`` candidate positions chosen uniformly, ascending, in a [batch, width]
    array padded with ``L`` (the row length).

    Each candidate gets a uniform float32 key; the ``k`` smallest are chosen (a threshold from
    a SIMD row sort, cheaper than a partition). Exact key ties at the threshold (about one row
    in 10^5) are broken by position."""
    batch, length = candidates.shape
    keys = rng.random((batch, length), dtype=np.float32)
    keys[~candidates] = 2.0
    rows = np.arange(batch)
    threshold = np.sort(keys, axis=1)[rows, np.maximum(k, 1) - 1]
    pos = np.arange(length, dtype=np.int32)[None, :]
    picked = np.sort(np.where(keys <= threshold[:, None], pos, length), axis=1)
    if picked.shape[1] < width:
        picked = np.pad(picked, ((0, 0), (0, width - length)), constant_values=length)
    return np.where(np.arange(width)[None, :] < k[:, None], picked[:, :width], length)


def group_starts(candidates: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Where a maskable word starts, the grouping rule of whole-word masking: a piece that
    does not start a word (``starts`` False) joins the piece before it, unless that one is
    not maskable (e.g. [SEP]), which makes it start a group of its own."""
    after_candidate = np.zeros_like(candidates)
    after_candidate[:, 1:] = candidates[:, :-1]
    return candidates & (starts | ~after_candidate)


def _choose_whole_words(starts: np.ndarray, candidates: np.ndarray, k: np.ndarray, width: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Whole-word masking for a batch (as ``_select_words`` with ngram_max 1, vectorised):
    the words of each row in a uniformly random order, each taken when it still fits in
    ``k``. ``starts``: per position, whether its token starts a word (``mask_batch``).
    Returns positions as ``_choose_uniform`` does."""
    batch, length = candidates.shape
    rows = np.arange(batch)
    starts = group_starts(candidates, starts)
    word = np.cumsum(starts, axis=1, dtype=np.int32) - 1   # word index of each position
    words = starts.sum(axis=1)
    flat = (rows[:, None] * length + word)[candidates]
    sizes = np.bincount(flat, minlength=batch * length).reshape(batch, length)
    keys = rng.random((batch, length), dtype=np.float32)
    keys[np.arange(length)[None, :] >= words[:, None]] = 2.0
    order = np.argsort(keys, axis=1)
    total = np.zeros(batch, np.int64)
    taken = np.zeros((batch, length), bool)
    for r in range(int(words.max(initial=0))):
        w = order[:, r]
        size = sizes[rows, w]
        ok = (r < words) & (total + size <= k)
        taken[rows[ok], w[ok]] = True
        total += np.where(ok, size, 0)
        if np.all((total >= k) | (r + 1 >= words)):
            break
    chosen = candidates & taken[rows[:, None], np.maximum(word, 0)]
    pos = np.arange(length, dtype=np.int32)[None, :]
    picked = np.sort(np.where(chosen, pos, length), axis=1)
    if picked.shape[1] < width:
        picked = np.pad(picked, ((0, 0), (0, width - length)), constant_values=length)
    return picked[:, :width]


def _word_groups(row_starts: np.ndarray, row_candidates: np.ndarray,
                 row_segments: np.ndarray) -> list[tuple[int, list[int]]]:
    """(segment, positions) per word among the candidates, in order: a piece that does not
    start a word (``row_starts``, per position) joins the group of the position just before
    it."""
    groups: list[tuple[int, list[int]]] = []
    positions = np.flatnonzero(row_candidates).tolist()
    starts = row_starts[positions].tolist()
    segments = row_segments[positions].tolist()
    last = -2
    for j, pos in enumerate(positions):
        if groups and last == pos - 1 and not starts[j]:
            groups[-1][1].append(pos)
        else:
            groups.append((segments[j], [pos]))
        last = pos
    return groups


def _select_words(groups: list[tuple[int, list[int]]], k: int, config: MaskingConfig,
                  rng: random.Random) -> list[int]:
    """Whole-word or n-gram selection of at most ``k`` positions (module docstring)."""
    order = list(range(len(groups)))
    rng.shuffle(order)
    chosen: list[int] = []
    covered: set[int] = set()
    ngram_max = config.spec.ngram_max
    if ngram_max > 1:
        weights = [1.0 / n for n in range(1, ngram_max + 1)]
        cumulative = np.cumsum(weights).tolist()
    for g in order:
        if len(chosen) >= k:
            break
        if ngram_max == 1:
            span = groups[g][1]
        else:
            segment = groups[g][0]
            longest = 1
            while (longest < ngram_max and g + longest < len(groups)
                   and groups[g + longest][0] == segment):
                longest += 1
            u = rng.random() * cumulative[longest - 1]
            n = 1
            while cumulative[n - 1] <= u and n < longest:
                n += 1
            span = [p for h in range(g, g + n) for p in groups[h][1]]
            while len(chosen) + len(span) > k and n > 1:
                n -= 1
                span = [p for h in range(g, g + n) for p in groups[h][1]]
        if len(chosen) + len(span) > k:
            continue
        if any(p in covered for p in span):
            continue
        covered.update(span)
        chosen.extend(span)
    chosen.sort()
    return chosen


def mask_batch(ids: np.ndarray, lengths: np.ndarray, candidates: np.ndarray,
               segment_ids: np.ndarray, config: MaskingConfig, rng: np.random.Generator,
               py_rng: Optional[random.Random] = None, word_starts: Optional[np.ndarray] = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Chooses and replaces the masked positions of a batch of instances.

    Args:
      ids: [batch, max_seq_length] input ids (changed in place and returned).
      lengths: [batch] real tokens per row.
      candidates: [batch, max_seq_length] bool, positions that may be masked.
      segment_ids: [batch, max_seq_length] (word-level spans stay in one segment).
      config: the masking configuration.
      rng: numpy generator (selection and replacements).
      py_rng: Python generator for the word-level loop (default: seeded from ``rng``).
      word_starts: [batch, max_seq_length] bool, whether each position's token starts a
        word (word-level masking); default: ``config.word_start`` of its id. Given when
        words are more than WordPiece pieces (Chinese words from a word segmenter:
        tasks/vocabulary/chinese_words.py).

    Returns:
      (ids, positions [batch, max_predictions] ascending then 0-padded,
       labels [batch, max_predictions] original ids then 0, counts [batch]).
    """
    batch, length = ids.shape
    if config.spec.word_level and word_starts is None:
        if config.word_start is None:
            raise ValueError("whole_word_masking and ngram_max > 1 need the word_start table")
        word_starts = np.asarray(config.word_start, dtype=bool)[ids]
    width = config.spec.max_predictions_per_seq
    k = num_to_predict(lengths, candidates.sum(axis=1), config)
    if not config.spec.word_level:
        chosen = _choose_uniform(candidates, k, width, rng)
    elif config.spec.ngram_max == 1:  # whole words
        chosen = _choose_whole_words(word_starts, candidates, k, width, rng)
    else:
        if py_rng is None:
            py_rng = random.Random(int(rng.integers(1 << 62)))
        chosen = np.full((batch, width), length, dtype=np.int32)
        for r in range(batch):
            groups = _word_groups(word_starts[r], candidates[r], segment_ids[r])
            picked = _select_words(groups, int(k[r]), config, py_rng)
            chosen[r, :len(picked)] = picked
    valid = chosen < length
    counts = valid.sum(axis=1)
    positions = np.where(valid, chosen, 0)
    rows = np.arange(batch)[:, None]
    labels = np.where(valid, ids[rows, positions], 0)
    u = rng.random((batch, width))
    replacement = np.where(
        u < config.spec.mask_token_prob, config.mask_id,
        np.where(u < config.spec.mask_token_prob + config.spec.random_token_prob,
                 rng.integers(0, config.vocab_size, (batch, width), dtype=np.int32), labels))
    rows, cols = np.nonzero(valid)
    ids[rows, positions[rows, cols]] = replacement[rows, cols]
    return ids, positions, labels, counts
