"""BERT's WordPiece tokenizer, faithful to google-research/bert's ``tokenization.FullTokenizer``.

BasicTokenizer: drop NUL, U+FFFD and control characters, map whitespace to spaces, put spaces
around CJK ideographs, split on whitespace, then per token lower-case and strip accents (NFD,
drop combining marks) when ``do_lower_case``, and split off every punctuation character.
WordpieceTokenizer: greedy longest-match-first against the vocab, continuation pieces prefixed
with ``##``; a word longer than 200 characters or with no full segmentation is ``[UNK]``.

The result for a whitespace-separated chunk depends on that chunk only, so results are cached
per chunk (and, for new chunks, per word): pure Python, but most of a corpus is dictionary
look-ups. ``encode_lines`` (the preprocess hot path) encodes thousands of lines per call, with
the look-ups done by C-level ``map`` over one split of all of them.

Usage:
    tok = WordPieceTokenizer(load_vocab("vocab.txt"), do_lower_case=True)
    tok.tokenize("Héllo, world!")  # ['hello', ',', 'world', '!']
"""

from __future__ import annotations

import re
import unicodedata
from itertools import chain
from typing import Sequence

import numpy as np

UNK = "[UNK]"
_LINE_BREAK = "\x00"  # a chunk clean_text never leaves in text: separates lines
_LINE_BREAK_IDS = (-1,)  # the caches' entry for line separators
_MAX_CHARS_PER_WORD = 200
_CACHE_LIMIT = 1 << 18  # entries (~50 MB); a cache is cleared when it grows past this


def load_vocab(path: str) -> dict[str, int]:
    """Reads a BERT vocab.txt: line i (stripped) is the token of id i."""
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            token = line.strip()
            vocab[token] = i  # a duplicated token keeps its last id, as BERT's load_vocab does
    return vocab


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    """google-research/bert's rule: control and format characters (Cc, Cf) are deleted;
    private-use and unassigned ones are kept (and become [UNK])."""
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    # BERT treats all non-letter/number ASCII as punctuation ("$", "^", "`" included).
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


_KEEP = object()
_CHAR_FIXES: dict[str, object] = {}  # char -> "" (dropped), " " (whitespace) or _KEEP


def _char_fix(ch: str) -> object:
    cp = ord(ch)
    if cp == 0 or cp == 0xFFFD or _is_control(ch):
        return ""
    if _is_whitespace(ch) and ch != " ":
        return " "
    return _KEEP


def clean_text(text: str) -> str:
    """Removes invalid and control characters and maps whitespace to spaces.

    Decided once per distinct character (cached), applied with ``str.translate``."""
    if text.isascii() and text.isprintable():
        return text  # the common case, two C scans
    table = None
    fixes = _CHAR_FIXES
    for ch in set(text):
        fix = fixes.get(ch)
        if fix is None:
            fix = fixes[ch] = _char_fix(ch)
        if fix is not _KEEP:
            if table is None:
                table = {}
            table[ord(ch)] = fix
    return text.translate(table) if table else text


# In ASCII, BERT's punctuation is exactly these ranges: !-/ :-@ [-` {-~.
_ASCII_SPLIT = re.compile(r"[!-/:-@\[-`{-~]|[^!-/:-@\[-`{-~]+")


def _basic_chunk(chunk: str, do_lower_case: bool) -> list[str]:
    """BasicTokenizer on one whitespace-free chunk of cleaned text."""
    if chunk.isascii():  # no accents, no CJK: lower-case and split off punctuation
        return _ASCII_SPLIT.findall(chunk.lower() if do_lower_case else chunk)
    if not chunk.isascii():
        chunk = "".join(f" {ch} " if _is_cjk(ord(ch)) else ch for ch in chunk)
    words = []
    for token in chunk.split():
        if do_lower_case:
            token = token.lower()
            if not token.isascii():
                token = "".join(c for c in unicodedata.normalize("NFD", token)
                                if unicodedata.category(c) != "Mn")
        current: list[str] = []
        for ch in token:
            if _is_punctuation(ch):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(ch)
            else:
                current.append(ch)
        if current:
            words.append("".join(current))
    return words


class WordPieceTokenizer:
    """BasicTokenizer + WordpieceTokenizer over a vocab dict, with a per-chunk cache."""

    def __init__(self, vocab: dict[str, int], do_lower_case: bool = True,
                 unk_token: str = UNK):
        self.vocab = vocab
        self.do_lower_case = do_lower_case
        self.unk_token = unk_token
        self._cache: dict[str, tuple[str, ...]] = {}
        self._id_cache: dict[str, tuple[int, ...]] = {}
        self._word_ids: dict[str, tuple[int, ...]] = {}
        self._longest = max((len(t[2:]) if t.startswith("##") else len(t) for t in vocab),
                            default=0)

    def basic_tokenize(self, text: str) -> list[str]:
        """Words and punctuation, as BERT's BasicTokenizer returns them."""
        return [w for chunk in clean_text(text).split()
                for w in _basic_chunk(chunk, self.do_lower_case)]

    def wordpiece(self, word: str) -> list[str]:
        """Greedy longest-match-first split of one basic token."""
        if len(word) > _MAX_CHARS_PER_WORD:
            return [self.unk_token]
        pieces = []
        start, n = 0, len(word)
        longest = self._longest
        while start < n:
            # No vocab entry is longer than ``longest`` characters: shorter tries only.
            end = min(n, start + longest)
            while start < end:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            else:
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces

    def _pieces(self, chunk: str) -> tuple[str, ...]:
        return tuple(p for w in _basic_chunk(chunk, self.do_lower_case)
                     for p in self.wordpiece(w))

    def _chunk(self, chunk: str) -> tuple[str, ...]:
        pieces = self._cache.get(chunk)
        if pieces is None:
            pieces = self._pieces(chunk)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[chunk] = pieces
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """Word pieces of ``text`` (FullTokenizer.tokenize)."""
        out: list[str] = []
        for chunk in clean_text(text).split():
            out.extend(self._chunk(chunk))
        return out

    def encode(self, text: str) -> list[int]:
        """Ids of ``tokenize(text)`` (the hot path): per whitespace-separated chunk, a cache of
        ids; a chunk not seen before is split into words, looked up in a second cache (chunks
        differ mostly in the punctuation around the same words)."""
        cache = self._id_cache
        get = cache.get
        out: list[int] = []
        extend = out.extend
        for chunk in clean_text(text).split():
            ids = get(chunk)
            if ids is None:
                ids = self._chunk_ids(chunk)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[chunk] = ids
            extend(ids)
        return out

    def encode_lines(self, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``encode`` of many lines at once: (all ids, int32; ids per line, int32).

        The lines are joined around a separator chunk and split once, and every chunk is
        looked up in the chunk cache with C-level ``map``: no Python step per chunk. Chunks
        not seen before are found with one set difference and encoded first."""
        if not len(lines):
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        cache = self._id_cache
        if _LINE_BREAK not in cache:
            cache[_LINE_BREAK] = _LINE_BREAK_IDS
        lower = self.do_lower_case
        # Printable ASCII lines are lower-cased here, before the split, when the vocab is
        # uncased (as BERT does per chunk, which is the same for ASCII): "The" and "the" are
        # then one chunk, one cache entry. Other lines are cleaned; their chunks lower-case
        # in _chunk_ids.
        text = f" {_LINE_BREAK} ".join(
            [(line.lower() if lower else line) if line.isascii() and line.isprintable()
             else clean_text(line) for line in lines])
        chunks = text.split()
        try:
            found = list(map(cache.__getitem__, chunks))
        except KeyError:
            missing = set(chunks).difference(cache)
            if len(cache) + len(missing) > _CACHE_LIMIT:
                cache.clear()
                cache[_LINE_BREAK] = _LINE_BREAK_IDS
                missing = set(chunks).difference(cache)
            for chunk in missing:
                cache[chunk] = self._chunk_ids(chunk)
            found = list(map(cache.__getitem__, chunks))
        ids = np.fromiter(chain.from_iterable(found), np.int32)
        breaks = np.flatnonzero(ids == -1)
        counts = np.diff(breaks, prepend=-1, append=len(ids)) - 1
        return ids[ids != -1], counts.astype(np.int32)

    def _encode_words(self, words: list[str]) -> list[int]:
        cache = self._word_ids
        out: list[int] = []
        for word in words:
            ids = cache.get(word)
            if ids is None:
                ids = self._word_miss(word)
            out.extend(ids)
        return out

    def _word_miss(self, word: str) -> tuple[int, ...]:
        vocab = self.vocab
        ids = tuple([vocab[p] for p in self.wordpiece(word)])
        if len(self._word_ids) >= _CACHE_LIMIT:
            self._word_ids.clear()
        self._word_ids[word] = ids
        return ids

    def _chunk_ids(self, chunk: str) -> tuple[int, ...]:
        """Ids of a chunk not seen before, through a second cache of words: chunks differ
        mostly in the punctuation around the same words."""
        if chunk.isascii() and chunk.isalnum():  # one word (no punctuation, no accents)
            word = chunk.lower() if self.do_lower_case else chunk
            ids = self._word_ids.get(word)
            return self._word_miss(word) if ids is None else ids
        return tuple(self._encode_words(_basic_chunk(chunk, self.do_lower_case)))
