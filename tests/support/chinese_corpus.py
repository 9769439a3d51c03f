"""Chinese text for tests, from what this machine has: the zh_CN translations of its system
programs (gettext catalogs, read with the standard library), about 45,000 messages.

``chinese_sentences(min_cjk=0.3)`` gives the translated messages that are mostly Chinese,
one line each, with printf-style placeholders and markup removed, deduplicated and sorted
(so the corpus is the same on every run).
"""

from __future__ import annotations

import gettext
import glob
import re

CATALOGS = "/usr/share/locale/zh_CN/LC_MESSAGES/*.mo"
_PLACEHOLDER = re.compile(r"%[-+ #0-9.*]*[a-zA-Z]|\{[^}]*\}|<[^>]*>|\\[nt]")
_CJK = re.compile(r"[\u4e00-\u9fff]")


def chinese_sentences(min_cjk: float = 0.3) -> list[str]:
    out = set()
    for path in sorted(glob.glob(CATALOGS)):
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except (OSError, gettext.error, UnicodeDecodeError):
            continue
        for key, text in catalog.items():
            if not key or not isinstance(text, str):
                continue  # the catalog's header
            for line in _PLACEHOLDER.sub(" ", text).splitlines():
                line = " ".join(line.split())
                if len(line) >= 6 and len(_CJK.findall(line)) >= min_cjk * len(line):
                    out.add(line)
    return sorted(out)


# --- Chinese whole words: a reference to check masks against ---------------------------------

def _is_cjk(ch: str) -> bool:
    """BERT's CJK ideographs (google-research/bert's tokenization._is_chinese_char)."""
    cp = ord(ch)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def jieba_cut(line: str) -> list[str]:
    import jieba
    return jieba.lcut(line)


def reference_continues(tokenizer, line: str, words: list[str]):
    """Per token of ``tokenizer.tokenize(line)``: whether it is the 2nd..nth character of a
    word in ``words`` (a segmentation of ``line``) made of two or more CJK characters. Walks
    the token strings and the words' characters side by side (each CJK character is a token
    of its own); None for a line with an [UNK] (which token is which character is then not
    in the strings)."""
    import unicodedata
    tokens = tokenizer.tokenize(line)
    if "[UNK]" in tokens:
        return None
    chars = []
    for word in words:
        cjk = [c for c in word if _is_cjk(c)]
        whole = len(word) > 1 and len(cjk) == len(word)
        chars += [(c, whole and i > 0) for i, c in enumerate(cjk)]
    out, at = [], 0
    for token in tokens:
        if len(token) == 1 and _is_cjk(token):
            char, continues = chars[at]
            if tokenizer.do_lower_case:
                char = unicodedata.normalize("NFD", char.lower())
            assert token == char, (line, token, char)
            out.append(continues)
            at += 1
        else:
            out.append(False)
    assert at == len(chars), line
    return out


class WordReference:
    """The token stream of ``lines`` (in order, as the split's index holds them) with, per
    token, whether it continues a jieba word (-1: unknown, a line with an [UNK]); locates an
    instance's segments in it to tell which masks cover whole words."""

    def __init__(self, tokenizer, lines):
        import numpy as np
        self.tokenizer = tokenizer
        ids, flags = [], []
        for line in lines:
            line_ids = tokenizer.encode(line)
            ref = reference_continues(tokenizer, line, jieba_cut(line))
            ids += line_ids
            flags += [-1] * len(line_ids) if ref is None else [int(c) for c in ref]
        self.ids = np.asarray(ids, np.int32)
        self.flags = np.asarray(flags, np.int8)
        self._bytes = self.ids.tobytes()
        table = tokenizer.word_start_table()
        self.piece_starts = np.asarray(table, bool)

    def flags_of(self, segment):
        """The flags of ``segment`` (token ids) where it occurs in the stream; None when it
        does not occur, occurs with different flags, or has unknown ones."""
        import numpy as np
        key = np.asarray(segment, np.int32).tobytes()
        found, at = None, self._bytes.find(key)
        while at >= 0:
            if at % 4 == 0:
                flags = self.flags[at // 4:at // 4 + len(segment)]
                if (flags < 0).any() or (found is not None and (found != flags).any()):
                    return None
                found = flags
            at = self._bytes.find(key, at + 1)
        return found

    def segments(self, ids, n):
        """(start, end) of segment A and, in a pair, B, in an instance of ``n`` tokens."""
        seps = [p for p in range(n) if ids[p] == self.tokenizer.sep_id]
        bounds = [(1, seps[0])]
        if len(seps) > 1:
            bounds.append((seps[0] + 1, seps[1]))
        return bounds

    def word_starts(self, ids, n):
        """Per position, whether a maskable word starts there (the masking's rule: a piece
        continuing a WordPiece word or a jieba word joins the one before, and the first
        piece of a segment starts a word); None when a segment is not located."""
        starts = [False] * len(ids)
        for a, b in self.segments(ids, n):
            flags = self.flags_of(ids[a:b])
            if flags is None:
                return None
            for j, p in enumerate(range(a, b)):
                starts[p] = j == 0 or (bool(self.piece_starts[ids[p]]) and not flags[j])
        return starts


def original_ids(f):
    ids = list(f["input_ids"])
    for pos, label, w in zip(f["masked_lm_positions"], f["masked_lm_ids"],
                             f["masked_lm_weights"]):
        if w:
            ids[pos] = label
    return ids


def check_whole_words(features, reference):
    """For statically masked instances: every word (reference.word_starts) is masked whole
    or not at all. Returns counts: instances checked and skipped, masked words, masked
    Chinese words of two or more characters, and words cut by the mask (0 when right)."""
    counts = dict(checked=0, skipped=0, words=0, chinese_words=0, split=0, chars_in_words=0)
    is_cjk_token = [len(t) == 1 and _is_cjk(t) for t in
                    (reference.tokenizer.id_to_token(i)
                     for i in range(reference.tokenizer.vocab_size))]
    for f in features:
        ids = original_ids(f)
        n = sum(f["input_mask"])
        starts = reference.word_starts(ids, n)
        if starts is None:
            counts["skipped"] += 1
            continue
        counts["checked"] += 1
        chosen = {p for p, w in zip(f["masked_lm_positions"], f["masked_lm_weights"]) if w}
        words, current = [], None
        for p in range(1, n):
            if ids[p] == reference.tokenizer.sep_id:
                current = None
                continue
            if starts[p] or current is None:
                current = []
                words.append(current)
            current.append(p)
        for word in words:
            masked = [p in chosen for p in word]
            if any(masked) and not all(masked):
                counts["split"] += 1
            elif all(masked):
                counts["words"] += 1
                if len(word) > 1 and all(is_cjk_token[ids[p]] for p in word):
                    counts["chinese_words"] += 1
                    counts["chars_in_words"] += len(word)
    return counts
