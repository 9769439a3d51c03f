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
   passes; then the plan is shuffled: that is the output order.
2. ``build_batch``: for a slice of the plan, in numpy: truncation (which side loses how many
   tokens is decided by the lengths alone; how many of them come off the front is
   Binomial(k, 1/2), exactly the reference's coin flips), layout, masking (masking.py).

With ``dynamic_masking`` step 2 stops before masking: the instance keeps its tokens, empty
``masked_lm_*`` and a ``word_starts`` feature, and is masked at training time
(dynamic_masking.py), each time it is seen.

Every random choice has the reference's distribution, but the draws differ, so outputs are
equal to the reference's in distribution, not byte for byte
(tests/tasks/test_parity_reference.py compares both on the same corpus).

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
    plan = plan_instances(store, config, random.Random(seed))
    batch = build_batch(store, plan, np.arange(len(plan)), config, np.random.default_rng(0))
    batch["input_ids"]  # [n, max_seq_length] int32, and the other features of records.py
"""

from __future__ import annotations

import array
import dataclasses
import random
from typing import Sequence

import numpy as np

from runexp.tasks.masking import MaskingConfig, mask_batch

PAIR_OBJECTIVES = ("nsp", "sop", "none")


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    """Attributes: as the reference script's flags of the same names, plus pair_objective."""

    max_seq_length: int
    short_seq_prob: float
    random_next_prob: float
    dupe_factor: int
    masking: MaskingConfig
    pair_objective: str = "nsp"
    dynamic_masking: bool = False  # leave masks to training time (needs masking.word_start)

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


class DocumentStore:
    """A shard's documents as one flat int32 token array (about 4 bytes per token).

    ``sentence_starts[s]`` is the offset of sentence ``s`` (one extra entry at the end);
    ``doc_starts[d]`` is the first sentence of document ``d`` (one extra entry at the end).
    """

    def __init__(self):
        self._tokens = array.array("i")
        self.sentence_starts = [0]
        self.doc_starts = [0]
        self._flat: np.ndarray | None = None

    def add_document(self, sentences: Sequence[Sequence[int]]) -> None:
        """Adds a document (its sentences; empty ones are dropped, as the reference does)."""
        tokens, starts = self._tokens, self.sentence_starts
        for ids in sentences:
            if ids:
                tokens.extend(ids)
                starts.append(len(tokens))
        if len(starts) - 1 > self.doc_starts[-1]:
            self.doc_starts.append(len(starts) - 1)
        self._flat = None

    def add_encoded(self, tokens: np.ndarray, line_counts: np.ndarray,
                    doc_lines: np.ndarray) -> np.ndarray:
        """Adds documents given in bulk: all their ids, the ids per line, the lines per
        document. Empty lines are dropped, and documents left without a line are skipped.

        Returns:
          the number of sentences (non-empty lines) of each given document.
        """
        doc_of_line = np.repeat(np.arange(len(doc_lines)), doc_lines)
        kept = line_counts > 0
        sentences = np.bincount(doc_of_line[kept], minlength=len(doc_lines))
        base = len(self._tokens)
        self._tokens.frombytes(np.ascontiguousarray(tokens, np.int32).tobytes())
        self.sentence_starts.extend((base + np.cumsum(line_counts[kept])).tolist())
        first = self.doc_starts[-1]
        self.doc_starts.extend((first + np.cumsum(sentences[sentences > 0])).tolist())
        self._flat = None
        return sentences

    @property
    def num_documents(self) -> int:
        return len(self.doc_starts) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_starts) - 1

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> np.ndarray:
        if self._flat is None:
            self._flat = np.frombuffer(self._tokens, dtype=np.int32) if self._tokens else \
                np.zeros(0, np.int32)
        return self._flat

    def document(self, d: int) -> list[list[int]]:
        s0, s1 = self.doc_starts[d], self.doc_starts[d + 1]
        st = self.sentence_starts
        return [self._tokens[st[s]:st[s + 1]].tolist() for s in range(s0, s1)]


@dataclasses.dataclass
class InstancePlan:
    """Token ranges of A and B in the store's flat array, and the pair label, per instance."""

    a_start: np.ndarray
    a_len: np.ndarray
    b_start: np.ndarray
    b_len: np.ndarray
    label: np.ndarray

    def __len__(self) -> int:
        return len(self.label)

    def take(self, order: np.ndarray) -> "InstancePlan":
        return InstancePlan(*(getattr(self, f.name)[order] for f in dataclasses.fields(self)))


def plan_instances(store: DocumentStore, config: InstanceConfig,
                   rng: random.Random) -> InstancePlan:
    """The sentence-level decisions for ``dupe_factor`` passes, in a shuffled order."""
    code = "i" if store.num_tokens < 2**31 else "q"  # offsets into the flat token array
    a_start, a_len = array.array(code), array.array(code)
    b_start, b_len = array.array(code), array.array(code)
    label = array.array("b")
    st = store.sentence_starts
    doc_starts = store.doc_starts
    num_docs = store.num_documents
    max_num_tokens = config.max_num_tokens
    short_prob, next_prob = config.short_seq_prob, config.random_next_prob
    objective = config.pair_objective
    rnd = rng.random
    for _pass in range(config.dupe_factor):
        for d in range(num_docs):
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
                        a_start.append(st[chunk]); a_len.append(st[i + 1] - st[chunk])
                        b_start.append(0); b_len.append(0); label.append(0)
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
                        elif n == 1 or rnd() < next_prob:
                            target_b = target - (a1 - a0)
                            for _try in range(10):  # the reference's ten tries
                                r = int(rnd() * num_docs)
                                if r != d:
                                    break
                            r_first, r_end = doc_starts[r], doc_starts[r + 1]
                            j = r_first + int(rnd() * (r_end - r_first))
                            b0 = st[j]
                            while j < r_end - 1 and st[j + 1] - b0 < target_b:
                                j += 1
                            b1 = st[j + 1]
                            i = a_end - 1  # put the unused sentences back
                            label.append(1)
                        else:
                            b0, b1 = a1, st[i + 1]
                            label.append(0)
                        a_start.append(a0); a_len.append(a1 - a0)
                        b_start.append(b0); b_len.append(b1 - b0)
                    chunk = i + 1
                i += 1
    plan = InstancePlan(*(np.frombuffer(x, dtype=x.typecode) if len(x) else np.zeros(0, np.int32)
                          for x in (a_start, a_len, b_start, b_len, label)))
    order = list(range(len(plan)))
    rng.shuffle(order)
    return plan.take(np.asarray(order, dtype=np.int64))


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
                py_rng: random.Random | None = None) -> dict[str, np.ndarray]:
    """The padded features (records.py) of ``plan`` rows ``index`` (indices or a slice),
    truncated and masked.

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
    if config.pairs:
        ka, kb = truncation(p.a_len, p.b_len, config.max_num_tokens)
    else:
        ka, kb = np.maximum(0, p.a_len - config.max_num_tokens), np.zeros_like(p.a_len)
    a0 = (p.a_start + rng.binomial(ka, 0.5)).astype(np.int32)[:, None]
    b0 = (p.b_start + rng.binomial(kb, 0.5)).astype(np.int32)[:, None]
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
    ids[:, 0] = masking.cls_id
    ids[rows, la[:, 0] + 1] = masking.sep_id
    ids[rows, n[:, 0] - 1] = masking.sep_id
    input_mask = (pos < n).astype(np.int32)
    if config.dynamic_masking:
        return _unmasked_features(ids, input_mask, segment_ids, candidates, p.label, masking)
    ids, positions, labels, counts = mask_batch(ids, n[:, 0], candidates, segment_ids, masking,
                                                rng, py_rng)
    weights = (np.arange(masking.max_predictions_per_seq)[None, :] < counts[:, None])
    return {
        "input_ids": ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": labels.astype(np.int32),
        "masked_lm_weights": weights.astype(np.float32),
        "next_sentence_labels": p.label[:, None].astype(np.int32),
    }


def word_starts(ids: np.ndarray, candidates: np.ndarray, word_start: np.ndarray) -> np.ndarray:
    """Where a maskable word starts: masking.py's grouping rule (a piece that does not start a
    word joins the piece before it, unless that one is not maskable, e.g. [SEP])."""
    after_candidate = np.zeros_like(candidates)
    after_candidate[:, 1:] = candidates[:, :-1]
    return candidates & (word_start[ids] | ~after_candidate)


def _unmasked_features(ids, input_mask, segment_ids, candidates, label,
                       masking: MaskingConfig) -> dict[str, np.ndarray]:
    """An instance left for masking at training time: the layout of a masked one with
    empty predictions, plus ``word_starts`` (records.py)."""
    batch, width = len(ids), masking.max_predictions_per_seq
    starts = word_starts(ids, candidates, np.asarray(masking.word_start, dtype=bool))
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
