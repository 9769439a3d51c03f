"""Chinese words for whole-word masking (Chinese-BERT-wwm), from a word segmenter.

BERT's BasicTokenizer makes every CJK ideograph a word of its own, so each is one WordPiece
token (the character, or [UNK]), and whole-word masking by WordPiece words masks Chinese one
character at a time. Chinese-BERT-wwm (Cui et al., 2019) masks the words a Chinese word
segmenter finds instead: all the characters of a word together. Here the segmenter is jieba
(``word_segmenter = 'jieba'``, the ``chinese`` extra: pip install 'jieba>=0.42,<0.43').

``continuations`` runs on the lines the preprocess stage tokenises once (tasks/instances/split_index.py)
and says, per token, whether it continues a segmented word: the 2nd..nth character of a
word of two or more characters, every one of them a CJK ideograph (BERT's ``_is_cjk``: a
word mixing Chinese with Latin letters or digits, such as "T恤", is left to WordPiece, as
Chinese-BERT-wwm's ``is_chinese`` test does). The alignment goes through BERT's basic
tokenisation: the line's CJK characters, in order, are its single-character CJK tokens
(a character missing from the vocab is [UNK]: lines with an [UNK] are aligned through the
basic tokenizer's words). A line whose CJK characters do not line up with its tokens (never
seen: a safety net) gets no mark, so its characters are masked one by one, and is counted
(``UNSEGMENTED``, an input issue of the preprocess summary).

A token that continues a segmented word does not start a word for masking
(pretraining_instances.build_batch): its word is the segmenter's; WordPiece ``##`` pieces
still join the piece before them.

Usage:
    words = word_segmenter("jieba", tokenizer)   # a WordPiece tokenizer (tasks/vocabulary/tokenizer.py)
    ids, counts = tokenizer.encode_lines(lines)
    continues, unsegmented = words.continuations(lines, ids, counts)

Light: no TensorFlow; imports jieba when a segmenter is made.
"""

from __future__ import annotations

import functools
import logging
import re
import warnings
from typing import Sequence

import numpy as np

from runexp.compiler.specs.bad_input import WORD_SEGMENTER, counted_by
from runexp.tasks.vocabulary.wordpiece import WordPieceTokenizer, _is_cjk

SEGMENTERS = ("jieba",)
# The input issue kind (compiler/specs/bad_input.py) of lines whose words could not be
# aligned.
(UNSEGMENTED,) = counted_by(WORD_SEGMENTER)
INSTALL_HINT = "pip install 'jieba>=0.42,<0.43' (or runexp[chinese])"

# BERT's CJK ideographs (wordpiece._is_cjk), as a character class.
_CJK_CLASS = ("\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f"
              "\U0002b740-\U0002b81f\U0002b820-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f")
_ALL_CJK = re.compile(f"[{_CJK_CLASS}]+")
_CJK = re.compile(f"[{_CJK_CLASS}]")


@functools.lru_cache(maxsize=None)
def _jieba():
    """jieba's segmenter, its dictionary loaded once per process (quietly)."""
    try:
        with warnings.catch_warnings():  # its pkg_resources import warns (setuptools)
            warnings.simplefilter("ignore")
            import jieba
    except ImportError as e:
        raise ImportError(f"word_segmenter 'jieba' needs jieba: {INSTALL_HINT}") from e
    jieba.setLogLevel(logging.WARNING)  # not its "Building prefix dict ..." lines
    segmenter = jieba.Tokenizer()
    segmenter.initialize()
    return segmenter


def char_continuations(words: Sequence[str]) -> list[bool]:
    """Per CJK character of the segmented text ``words`` (in order): whether it continues a
    word (the 2nd..nth character of an all-CJK word of two or more characters)."""
    out: list[bool] = []
    for word in words:
        if word.isascii():
            continue
        if len(word) > 1 and _ALL_CJK.fullmatch(word):
            out.append(False)
            out.extend([True] * (len(word) - 1))
        else:
            out.extend([False] * len(_CJK.findall(word)))
    return out


class ChineseWords:
    """Per token, whether it continues a Chinese word of the segmenter (module docstring)."""

    def __init__(self, tokenizer, segmenter: str = "jieba"):
        if segmenter not in SEGMENTERS:
            raise ValueError(f"unknown word segmenter {segmenter!r} (known: {SEGMENTERS})")
        vocab = getattr(tokenizer, "vocab", None)
        if not isinstance(vocab, dict):
            raise ValueError(f"word_segmenter {segmenter!r} needs a WordPiece vocab (BERT's "
                             "tokenizer splits CJK text into characters; SentencePiece does "
                             "not)")
        self._cut = _jieba().lcut
        self._tokenizer = tokenizer  # kept alive: word_segmenter's cache is keyed by its id
        self._unk = tokenizer.unk_id
        self._basic = WordPieceTokenizer(vocab, tokenizer.do_lower_case)
        table = np.zeros(tokenizer.vocab_size, bool)
        for token, i in vocab.items():
            if len(token) == 1 and _is_cjk(ord(token)):
                table[i] = True
        self._cjk_token = table

    def _cjk_positions(self, line: str, count: int) -> np.ndarray | None:
        """Offsets (within the line's tokens) of the tokens that are CJK characters, from
        BERT's basic words; None when the words do not give ``count`` tokens."""
        positions, at = [], 0
        for word in self._basic.basic_tokenize(line):
            if len(word) == 1 and _is_cjk(ord(word)):
                positions.append(at)
                at += 1
            else:
                at += len(self._basic.wordpiece(word))
        return np.asarray(positions, np.int64) if at == count else None

    def continuations(self, lines: Sequence[str], ids: np.ndarray, counts: np.ndarray
                      ) -> tuple[np.ndarray, list[int]]:
        """For ``encode_lines(lines)`` = (ids, counts): per token, whether it continues a
        segmented word (bool [len(ids)]); and the indices of the lines left unmarked because
        their characters did not line up."""
        n = len(lines)
        continues = np.zeros(len(ids), bool)
        if not len(ids):
            return continues, []
        line_of = np.repeat(np.arange(n), counts)
        cjk = self._cjk_token[ids]
        per_line = np.bincount(line_of[cjk], minlength=n)
        unk_lines = set(np.flatnonzero(
            np.bincount(line_of[ids == self._unk], minlength=n)).tolist())
        line_start = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        aligned = np.ones(n, bool)  # lines whose CJK tokens take ``values``, in order
        values: list[bool] = []
        unsegmented: list[int] = []
        cut = self._cut
        for i in range(n):
            if not per_line[i] and i not in unk_lines:
                continue  # no CJK character
            chars = char_continuations(cut(lines[i]))
            if i in unk_lines:  # [UNK] may be a character or a word: align by basic words
                aligned[i] = False
                at = self._cjk_positions(lines[i], int(counts[i]))
                if at is not None and len(at) == len(chars):
                    continues[line_start[i] + at] = chars
                else:
                    unsegmented.append(i)
            elif len(chars) == per_line[i]:
                values.extend(chars)
            else:
                aligned[i] = False
                unsegmented.append(i)
        continues[cjk & aligned[line_of]] = values
        return continues, unsegmented


_SEGMENTERS: dict[tuple, ChineseWords] = {}


def word_segmenter(name: str, tokenizer) -> ChineseWords:
    """The segmenter ``name`` over ``tokenizer`` (one per tokenizer and process)."""
    key = (name, id(tokenizer))
    if key not in _SEGMENTERS:
        _SEGMENTERS[key] = ChineseWords(tokenizer, name)
    return _SEGMENTERS[key]
