"""BERT's WordPiece tokenizer, faithful to google-research/bert's ``tokenization.FullTokenizer``.

BasicTokenizer: drop NUL, U+FFFD and control characters, map whitespace to spaces, put spaces
around CJK ideographs, split on whitespace, then per token lower-case and strip accents (NFD,
drop combining marks) when ``do_lower_case``, and split off every punctuation character.
WordpieceTokenizer: greedy longest-match-first against the vocab, continuation pieces prefixed
with ``##``; a word longer than 200 characters or with no full segmentation is ``[UNK]``.

The result for a whitespace-separated chunk depends on that chunk only, so results are cached
per chunk: pure Python, but most of a corpus is dictionary look-ups.

Usage:
    tok = WordPieceTokenizer(load_vocab("vocab.txt"), do_lower_case=True)
    tok.tokenize("Héllo, world!")  # ['hello', ',', 'world', '!']
"""

from __future__ import annotations

import re
import unicodedata

UNK = "[UNK]"
_MAX_CHARS_PER_WORD = 200
_CACHE_LIMIT = 1 << 20  # entries; the cache is cleared when it grows past this
_PLAIN_ASCII = re.compile(r"[\x20-\x7e\t\n\r]*\Z")


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
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch).startswith("C")


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


def clean_text(text: str) -> str:
    """Removes invalid and control characters and maps whitespace to spaces."""
    if _PLAIN_ASCII.match(text):
        return text  # str.split() treats \t\n\r as BERT does
    out = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or _is_control(ch):
            continue
        out.append(" " if _is_whitespace(ch) else ch)
    return "".join(out)


def _basic_chunk(chunk: str, do_lower_case: bool) -> list[str]:
    """BasicTokenizer on one whitespace-free chunk of cleaned text."""
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
        while start < n:
            end = n
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

    def _chunk(self, chunk: str) -> tuple[str, ...]:
        pieces = self._cache.get(chunk)
        if pieces is None:
            pieces = tuple(p for w in _basic_chunk(chunk, self.do_lower_case)
                           for p in self.wordpiece(w))
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
