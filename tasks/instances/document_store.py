"""A shard's documents as flat token arrays (``DocumentStore``), and where random next
segments come from (``TokenSource``): what tasks/instances/pretraining_instances.py builds instances
from."""

from __future__ import annotations

import array
from typing import Sequence

import numpy as np


class DocumentStore:
    """A shard's documents as one flat token array (int32 when built document by document;
    any integer dtype when given whole, e.g. uint16 from the preprocess stage's spill).

    ``sentence_starts[s]`` is the offset of sentence ``s`` (one extra entry at the end);
    ``doc_starts[d]`` is the first sentence of document ``d`` (one extra entry at the end).
    ``continuation_bit`` (0: none): a bit set in the stored value of a token that continues
    a segmented word (Chinese words, tasks/vocabulary/chinese_words.py); its id is the value without
    it (``ids``).
    """

    def __init__(self):
        self._tokens = array.array("i")
        self.sentence_starts = [0]
        self.doc_starts = [0]
        self._flat: np.ndarray | None = None
        self.continuation_bit = 0

    @classmethod
    def from_arrays(cls, tokens: np.ndarray, sentence_starts: Sequence[int],
                    doc_starts: Sequence[int], continuation_bit: int = 0) -> "DocumentStore":
        """A store over given arrays (not copied): tokens, sentence starts (offsets into
        tokens, with the end), document starts (sentence indices, with the end)."""
        store = cls()
        store._tokens = None
        store._flat = np.asarray(tokens)
        store.sentence_starts = sentence_starts
        store.doc_starts = doc_starts
        store.continuation_bit = continuation_bit
        return store

    def _appendable(self) -> array.array:
        if self._tokens is None:
            raise TypeError("a store made from arrays is read-only")
        return self._tokens

    def add_document(self, sentences: Sequence[Sequence[int]]) -> None:
        """Adds a document (its sentences; empty ones are dropped, as the reference does)."""
        tokens, starts = self._appendable(), self.sentence_starts
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
        store_tokens = self._appendable()
        doc_of_line = np.repeat(np.arange(len(doc_lines)), doc_lines)
        kept = line_counts > 0
        sentences = np.bincount(doc_of_line[kept], minlength=len(doc_lines))
        base = len(store_tokens)
        store_tokens.frombytes(np.ascontiguousarray(tokens, np.int32).tobytes())
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
        return len(self.tokens)

    @property
    def tokens(self) -> np.ndarray:
        if self._flat is None:
            self._flat = np.frombuffer(self._tokens, dtype=np.int32) if self._tokens else \
                np.zeros(0, np.int32)
        return self._flat

    def ids(self, tokens: np.ndarray | None = None) -> np.ndarray:
        """Token ids of stored values (default: all of them), without the continuation
        bit."""
        tokens = self.tokens if tokens is None else tokens
        return tokens & (self.continuation_bit - 1) if self.continuation_bit else tokens

    def document(self, d: int) -> list[list[int]]:
        s0, s1 = self.doc_starts[d], self.doc_starts[d + 1]
        st = self.sentence_starts
        tokens = self.tokens
        return [self.ids(tokens[st[s]:st[s + 1]]).tolist() for s in range(s0, s1)]


class TokenSource:
    """Where random next segments come from: the tokens of a whole split and its sentence
    starts (split-wide token offsets, with the end). This class reads them from arrays; the
    preprocess stage's subclass reads them from its spill files (split_reader). Token
    values carry the store's ``continuation_bit``, as the store's do."""

    continuation_bit = 0

    def __init__(self, tokens: np.ndarray, sentence_starts: np.ndarray,
                 continuation_bit: int = 0):
        self.tokens = tokens
        self.sentence_starts = sentence_starts
        self.continuation_bit = continuation_bit

    @classmethod
    def of_store(cls, store: DocumentStore) -> "TokenSource":
        """A store's own documents as the source (the store is the whole split)."""
        return cls(store.tokens, np.asarray(store.sentence_starts, np.int64),
                   store.continuation_bit)

    def offset_windows(self, first: np.ndarray, width: int) -> np.ndarray:
        """``sentence_starts[first + j]`` for j < width, per row ([n, width] int64; entries
        past the end are unspecified)."""
        idx = first[:, None] + np.arange(width)[None, :]
        return np.take(self.sentence_starts, idx, mode="clip").astype(np.int64)

    def token_windows(self, start: np.ndarray, width: int) -> np.ndarray:
        """``tokens[start + j]`` for j < width, per row ([n, width]; entries past the end are
        unspecified)."""
        idx = start[:, None] + np.arange(width)[None, :]
        return np.take(self.tokens, idx, mode="clip")

    def extents(self, first: np.ndarray, doc_end: np.ndarray, target: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """The reference's random next segment: sentences from ``first`` on until they
        reach ``target`` tokens (at least one sentence) or the document ends (sentence
        ``doc_end``). Returns its token offset and length, per row."""
        n = len(first)
        if not n:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        # Every sentence has a token, so max(target, 1) sentences always reach the target.
        need = np.minimum(doc_end - first, np.maximum(target, 1))
        cols = np.arange(int(need.max()) + 1)
        windows = self.offset_windows(first, len(cols))
        offsets = np.take_along_axis(windows, np.minimum(cols[None, :], need[:, None]), axis=1)
        length = offsets - offsets[:, :1]
        reached = (length >= target[:, None]) & (cols[None, :] >= 1)
        last = np.where(reached.any(axis=1), reached.argmax(axis=1), need)
        return offsets[:, 0], length[np.arange(n), last]
