"""BERT pretraining instances with the distribution of google-research/bert's
create_pretraining_data.py, planned in Python and built in numpy batches.

The reference, per document: a target length (``max_seq_length - 3``, or with
``short_seq_prob`` a random length in [2, max]); sentences accumulate into a chunk until the
target is reached or the document ends; the chunk is cut at a random sentence boundary into A
and B; with ``random_next_prob`` (always when the chunk has one sentence) B is instead taken
from a random sentence of another document onwards until it reaches the remaining target,
and the chunk's unused sentences are put back. The pair is truncated one token at a time
from the longer side, front or back at random, laid out as ``[CLS] A [SEP] B [SEP]`` and
masked. ``dupe_factor`` passes over the documents, then the instances are shuffled.

Here the same happens in two steps, so that only a few Python operations are spent per
instance:

1. ``plan_instances``: the sentence-level decisions above, per document, as token ranges of
   a flat token array (A and B are each a contiguous run of sentences). ``dupe_factor``
   passes, block by block: a block (a run of documents) can have its own seed, so that its
   instances do not depend on which other documents are planned with it. A random next B
   is drawn from the whole split (its document index: ``split_doc_starts``) and kept as
   (first sentence, document end, target): its extent needs sentence lengths that another
   shard may hold. The caller shuffles the plan: that is the output order.
2. ``build_batch``: for a slice of the plan, in numpy: random next segments resolved and
   read from a ``TokenSource`` (the split's tokens: arrays, or the preprocess stage's spill
   files), truncation (which side loses how many tokens is decided by the lengths alone; how
   many of them come off the front is Binomial(k, 1/2), exactly the reference's coin
   flips), layout, masking (masking.py).

With ``dynamic_masking`` step 2 stops before masking: the instance keeps its tokens, empty
``masked_lm_*`` and a ``word_starts`` feature, and is masked at training time
(dynamic_masking.py), each time it is seen.

Every random choice has the reference's distribution, but the draws differ, so outputs are
equal to the reference's in distribution, not byte for byte
(tests/tasks/test_parity_reference.py compares both on the same corpus). One deliberate
difference: the reference tries ten times to draw a random document other than the current
one and then takes whatever it drew; here it is always another one (when there are two).

Pair objectives (``pair_objective``):
  - "nsp": next-sentence prediction as above; label 1 = B is random.
  - "sop": sentence-order prediction (ALBERT): B is always the true continuation of A, and
    the two are swapped with probability 1/2; label 1 = swapped. A one-sentence chunk is cut
    at a random token inside the sentence (ALBERT instead takes a random document's text
    there, which would mix next-sentence examples into the task); a one-token chunk gives no
    instance.
  - "none": single segments ``[CLS] A [SEP]`` up to ``max_seq_length - 2`` tokens, label 0.

Usage:
    store = DocumentStore(); store.add_document([[17, 18], [19]]); ...
    plan = plan_instances(store, config, random.Random(seed))   # the store is the split
    plan.reorder(np.random.default_rng(seed).permutation(len(plan)))
    batch = build_batch(store, plan, np.arange(len(plan)), config, np.random.default_rng(0))
    batch["input_ids"]  # [n, max_seq_length] int32, and the other features of records.py
"""

from __future__ import annotations

import array
import dataclasses
import random
from typing import Sequence

import numpy as np

from runexp.tasks.instances.document_store import DocumentStore, TokenSource
from runexp.tasks.instances.masking import MaskingConfig, group_starts, mask_batch

PAIR_OBJECTIVES = ("nsp", "sop", "none")


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    """Attributes: as the reference script's flags of the same names, plus pair_objective."""

    max_seq_length: int
    short_seq_prob: float
    random_next_prob: float
    dupe_factor: int
    masking: MaskingConfig
    pair_objective: str
    dynamic_masking: bool  # leave masks to training time (needs masking.word_start)

    def __post_init__(self):
        if self.pair_objective not in PAIR_OBJECTIVES:
            raise ValueError(f"pair_objective must be one of {PAIR_OBJECTIVES}, "
                             f"got {self.pair_objective!r}")
        if self.max_seq_length < 5:
            raise ValueError(f"max_seq_length must be at least 5, got {self.max_seq_length}")

    @property
    def pairs(self) -> bool:
        return self.pair_objective != "none"

    @property
    def max_num_tokens(self) -> int:
        return self.max_seq_length - (3 if self.pairs else 2)


@dataclasses.dataclass
class InstancePlan:
    """Token ranges of A and B in the store's flat array, and the pair label, per instance.

    A random next B (``b_end > 0``) is not resolved yet: ``b_start`` is the split-wide index
    of its first sentence, ``b_end`` the end of its document (sentence index), ``b_target``
    the tokens it should reach (TokenSource.extents); ``b_len`` is 0.
    """

    a_start: np.ndarray
    a_len: np.ndarray
    b_start: np.ndarray
    b_len: np.ndarray
    label: np.ndarray
    b_end: np.ndarray
    b_target: np.ndarray

    def __len__(self) -> int:
        return len(self.label)

    def take(self, order: np.ndarray) -> "InstancePlan":
        return InstancePlan(*(getattr(self, f.name)[order] for f in dataclasses.fields(self)))

    def reorder(self, order: np.ndarray) -> None:
        """``take`` in place, one field at a time (less memory at its peak)."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name)[order])


def plan_instances(store: DocumentStore, config: InstanceConfig, rng: random.Random,
                   blocks: Sequence[tuple] | None = None,
                   split_doc_starts: Sequence[int] | None = None) -> InstancePlan:
    """The sentence-level decisions for ``dupe_factor`` passes, in document order (the
    caller shuffles).

    Args:
      store: the documents to plan.
      rng: the generator; reseeded per block when blocks give seeds.
      blocks: ``(seed, first, end, first_id)``: runs of the store's documents ``[first,
        end)``, whose split-wide document indices start at ``first_id``. Each block's
        ``dupe_factor`` passes draw from ``rng`` seeded with ``seed`` (None: not reseeded),
        so a block's instances do not depend on which other blocks share the store.
        Default: one block of every document, ``rng`` as given.
      split_doc_starts: the split's document starts (split-wide sentence indices, with the
        end), where random next segments are drawn from: any document but the current one.
        Default: the store's own documents (then the store is the whole split).
    """
    sd = store.doc_starts if split_doc_starts is None else split_doc_starts
    code = "i" if store.num_tokens < 2**31 else "q"  # offsets into the flat token array
    code_b = "i" if max(store.num_tokens, sd[-1]) < 2**31 else "q"  # or split sentences
    a_start, a_len = array.array(code), array.array(code)
    b_start, b_len = array.array(code_b), array.array(code)
    b_end, b_target = array.array(code_b), array.array("i")
    label = array.array("b")
    st = store.sentence_starts
    doc_starts = store.doc_starts
    if blocks is None:
        blocks = [(None, 0, store.num_documents, 0)]
    num_split_docs = len(sd) - 1
    max_num_tokens = config.max_num_tokens
    short_prob, next_prob = config.short_seq_prob, config.random_next_prob
    objective = config.pair_objective
    rnd = rng.random
    for seed, first_doc, end_doc, first_id in blocks:
        if seed is not None:
            rng.seed(seed)
        for _pass in range(config.dupe_factor):
            for d in range(first_doc, end_doc):
                s_first, s_end = doc_starts[d], doc_starts[d + 1]
                target = max_num_tokens
                if rnd() < short_prob:
                    target = 2 + int(rnd() * (max_num_tokens - 1))  # randint(2, max)
                chunk = s_first
                i = s_first
                while i < s_end:
                    if i == s_end - 1 or st[i + 1] - st[chunk] >= target:
                        n = i - chunk + 1
                        if objective == "none":
                            a_start.append(st[chunk])
                            a_len.append(st[i + 1] - st[chunk])
                            b_start.append(0)
                            b_len.append(0)
                            label.append(0)
                            b_end.append(0)
                            b_target.append(0)
                        else:
                            a_end = chunk + 1 + (int(rnd() * (n - 1)) if n >= 2 else 0)
                            a0, a1 = st[chunk], st[a_end]
                            if objective == "sop":
                                if n == 1:
                                    length = a1 - a0
                                    if length < 2:
                                        chunk = i + 1
                                        i += 1
                                        continue
                                    a1 = a0 + 1 + int(rnd() * (length - 1))
                                    b0, b1 = a1, a0 + length
                                else:
                                    b0, b1 = a1, st[i + 1]
                                if rnd() < 0.5:
                                    a0, a1, b0, b1 = b0, b1, a0, a1
                                    label.append(1)
                                else:
                                    label.append(0)
                                b_start.append(b0)
                                b_len.append(b1 - b0)
                                b_end.append(0)
                                b_target.append(0)
                            elif n == 1 or rnd() < next_prob:
                                # Another document of the split, uniformly (the reference
                                # tries ten times to avoid this one), a uniform sentence of
                                # it, and on until the target: resolved at build time.
                                this = first_id + d - first_doc
                                if num_split_docs > 1:
                                    r = int(rnd() * (num_split_docs - 1))
                                    r += r >= this
                                else:
                                    r = this
                                r_first, r_end = sd[r], sd[r + 1]
                                b_start.append(r_first + int(rnd() * (r_end - r_first)))
                                b_len.append(0)
                                b_end.append(r_end)
                                b_target.append(target - (a1 - a0))
                                i = a_end - 1  # put the unused sentences back
                                label.append(1)
                            else:
                                b_start.append(a1)
                                b_len.append(st[i + 1] - a1)
                                b_end.append(0)
                                b_target.append(0)
                                label.append(0)
                            a_start.append(a0)
                            a_len.append(a1 - a0)
                        chunk = i + 1
                    i += 1
    return InstancePlan(*(np.frombuffer(x, dtype=x.typecode) if len(x)
                          else np.zeros(0, x.typecode)
                          for x in (a_start, a_len, b_start, b_len, label, b_end, b_target)))


def truncation(la: np.ndarray, lb: np.ndarray, max_num_tokens: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Tokens the reference's ``truncate_seq_pair`` removes from A and from B.

    It trims the longer list (B on ties) one token at a time, so the split depends on the
    lengths only: first the longer side down to the other's length (B to one below A's),
    then alternately.
    """
    excess = np.maximum(0, la + lb - max_num_tokens)
    a_longer = la > lb
    first = np.where(a_longer, np.minimum(excess, la - lb), np.minimum(excess, lb - la + 1))
    rest = excess - first
    up, down = (rest + 1) // 2, rest // 2
    return np.where(a_longer, first + down, up), np.where(a_longer, up, first + down)


def build_batch(store: DocumentStore, plan: InstancePlan, index: np.ndarray | slice,
                config: InstanceConfig, rng: np.random.Generator,
                py_rng: random.Random | None = None,
                source: TokenSource | None = None) -> dict[str, np.ndarray]:
    """The padded features (records.py) of ``plan`` rows ``index`` (indices or a slice),
    truncated and masked. Random next segments are read from ``source`` (default: the
    store's own documents).

    Integer features are int32 arrays [len(index), n] (records store them as int64)."""
    if isinstance(index, slice):
        p = InstancePlan(*(getattr(plan, f.name)[index].astype(np.int64)
                           for f in dataclasses.fields(plan)))
    else:
        p = plan.take(index)
        p = InstancePlan(*(getattr(p, f.name).astype(np.int64) for f in dataclasses.fields(p)))
    batch, length = len(p), config.max_seq_length
    masking = config.masking
    tokens = store.tokens
    remote = p.b_end > 0  # random next segments: token offsets in the source, not the store
    if remote.any():
        if source is None:
            source = TokenSource.of_store(store)
        p.b_start[remote], p.b_len[remote] = source.extents(
            p.b_start[remote], p.b_end[remote], p.b_target[remote])
    if config.pairs:
        ka, kb = truncation(p.a_len, p.b_len, config.max_num_tokens)
    else:
        ka, kb = np.maximum(0, p.a_len - config.max_num_tokens), np.zeros_like(p.a_len)
    a0 = (p.a_start + rng.binomial(ka, 0.5))[:, None]  # int64: split offsets may be large
    b0 = (p.b_start + rng.binomial(kb, 0.5))[:, None]
    la = (p.a_len - ka).astype(np.int32)[:, None]
    lb = (p.b_len - kb).astype(np.int32)[:, None]
    pos = np.arange(length, dtype=np.int32)[None, :]
    rows = np.arange(batch)
    in_a = (pos >= 1) & (pos <= la)
    if config.pairs:
        n = la + lb + 3
        seg_b = (pos >= la + 2) & (pos < n)          # B and the last [SEP]
        candidates = in_a | seg_b
        candidates[rows, n[:, 0] - 1] = False
        src = pos + np.where(seg_b, b0 - la - 2, a0 - 1)
        segment_ids = seg_b.astype(np.int32)
    else:
        n = la + 2
        candidates = in_a
        src = pos + (a0 - 1)
        segment_ids = np.zeros((batch, length), np.int32)
    if len(tokens):
        ids = np.where(candidates, np.take(tokens, src, mode="clip"), 0).astype(np.int32)
    else:
        ids = np.zeros((batch, length), np.int32)
    if remote.any():  # B's tokens (at most max_num_tokens of them) from the source
        rows_b = np.flatnonzero(remote)
        width = config.max_num_tokens
        window = source.token_windows(b0[rows_b, 0], width)
        at = np.clip(pos - la[rows_b] - 2, 0, width - 1)
        ids[rows_b] = np.where(candidates[rows_b] & seg_b[rows_b],
                               np.take_along_axis(window, at, axis=1), ids[rows_b])
    starts = None  # per position, with segmented words: whether a word starts there
    bit = store.continuation_bit
    if bit:
        continues = (ids & bit) != 0
        ids &= bit - 1
        if masking.word_start is not None:
            starts = np.asarray(masking.word_start, dtype=bool)[ids] & ~continues
    ids[:, 0] = masking.cls_id
    ids[rows, la[:, 0] + 1] = masking.sep_id
    ids[rows, n[:, 0] - 1] = masking.sep_id
    input_mask = (pos < n).astype(np.int32)
    if config.dynamic_masking:
        return _unmasked_features(ids, input_mask, segment_ids, candidates, p.label, masking,
                                  starts)
    ids, positions, labels, counts = mask_batch(ids, n[:, 0], candidates, segment_ids, masking,
                                                rng, py_rng, starts)
    weights = (np.arange(masking.spec.max_predictions_per_seq)[None, :] < counts[:, None])
    return {
        "input_ids": ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": labels.astype(np.int32),
        "masked_lm_weights": weights.astype(np.float32),
        "next_sentence_labels": p.label[:, None].astype(np.int32),
    }


def _unmasked_features(ids, input_mask, segment_ids, candidates, label,
                       masking: MaskingConfig, starts: np.ndarray | None = None
                       ) -> dict[str, np.ndarray]:
    """An instance left for masking at training time: the layout of a masked one with
    empty predictions, plus ``word_starts`` (records.py; ``starts``: as ``word_starts``)."""
    batch, width = len(ids), masking.spec.max_predictions_per_seq
    table = np.asarray(masking.word_start, dtype=bool)
    starts = group_starts(candidates, table[ids] if starts is None else starts)
    return {
        "input_ids": ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": np.zeros((batch, width), np.int32),
        "masked_lm_ids": np.zeros((batch, width), np.int32),
        "masked_lm_weights": np.zeros((batch, width), np.float32),
        "next_sentence_labels": label[:, None].astype(np.int32),
        "word_starts": starts.astype(np.int32),
    }
