"""Sentences of running text: where a paragraph's lines are joined, and where it is cut.

The ``paragraphs`` and ``jsonl`` text formats (tasks/sources/text_formats.py) give BERT sentences,
which it pairs into segments A and B; this module finds them by punctuation:

- ``。！？｡`` (CJK), ``؟`` (Arabic), ``۔`` (Urdu), ``।॥`` (Devanagari) end a sentence
  wherever they are, with the closing quotes and brackets right after them (``」』”）``);
- ``. ! ? …`` end one when whitespace follows and the next word does not start with a
  lower-case letter; a ``.`` does not after a known abbreviation (``Dr.``, ``e.g.``), a
  single letter (initials: ``J. Smith``), dotted short parts (``U.S.``, ``Ph.D.``) or
  ``No.``/``Fig.``/``p.`` before a number; decimals (``3.14``) have no space after their
  point. ``!`` and ``?`` right before a CJK character end one too.

A line break is a space, except between two CJK characters (Chinese and Japanese are
written without spaces, so hard-wrapped CJK text is joined with nothing).

Each cut is decided by the characters around it alone (the Latin letters right before the
punctuation, the first character after the whitespace): never by what came before in the
paragraph. So the lines between two sentence ends split alike whoever reads them, which is
what lets the preprocess stage read a file in byte ranges (``ends_before`` tells a range
where the first sentence it owns begins). The one rule with a memory is ``MAX_RUN_CHARS``:
a run of lines with no sentence end (a list, a table, unpunctuated text) is cut at the end
of the line where it reaches that length, so the text held stays bounded; a run starts at
a sentence end, so readers starting at one agree on these cuts too. Hyphens at line ends
are kept ("hard-" + "wrapped" is "hard- wrapped": a hyphen may belong to the word).

Pure functions and a small streaming class, standard library only.

Usage:
    split_text("我爱北京。天安门很大！你呢？")     # ['我爱北京。', '天安门很大！', '你呢？']
    split_paragraph(["It was hard", "wrapped. So", "it goes."])  # 2 sentences
    splitter = ParagraphSplitter()
    for line in lines_of_a_paragraph:
        sentences.extend(splitter.add_line(line))
    sentences.extend(splitter.end())
"""

from __future__ import annotations

import re
from typing import Iterable

# About a 512-token segment's text: a longer "sentence" would mostly be truncated anyway.
MAX_RUN_CHARS = 2_000

_STRONG = "。！？｡؟۔।॥"
_WEAK = ".!?…"
_CLOSERS = "\"'”’»)\\]}」』）》〉】〕〗〙〛｣"
_TERMINAL = re.compile(f"([{_STRONG}{_WEAK}]+)[{_CLOSERS}]*")
_STRONG_SET = frozenset(_STRONG)
_TERMINAL_SET = frozenset(_STRONG + _WEAK)
_CLOSER_SET = frozenset(_CLOSERS.replace("\\", ""))
_NON_SPACE = re.compile(r"\S")

# A period after these does not end a sentence.
ABBREVIATIONS = frozenset("""
    mr mrs ms dr prof sr jr st mt rev hon gen col lt sgt capt cmdr gov sen rep pres supt
    vs cf viz approx incl esp ca al dept univ assn
    jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
# ... nor after these when a number follows ("No. 5", "Fig. 3", "pp. 12").
NUMBER_ABBREVIATIONS = frozenset("no nos fig figs vol vols p pp ch sec art eq eqs ex".split())


def _no_space(ch: str) -> bool:
    """Scripts written without spaces between words (CJK ideographs, kana, CJK and
    full-width punctuation)."""
    cp = ord(ch)
    return (0x3000 <= cp <= 0x30FF or 0x3400 <= cp <= 0x4DBF or 0x4E00 <= cp <= 0x9FFF
            or 0xF900 <= cp <= 0xFAFF or 0xFF00 <= cp <= 0xFFEF or 0x31F0 <= cp <= 0x31FF
            or 0x20000 <= cp <= 0x3134F)


def _latin_letter(ch: str) -> bool:
    return ch.isalpha() and ord(ch) < 0x250


def _word_before(text: str, pos: int) -> str:
    """The Latin letters and dots right before ``pos`` ("e.g" before the last "." of
    "e.g."), lower-cased: what the abbreviation rules look at."""
    i = pos
    while i > 0 and (text[i - 1] == "." or _latin_letter(text[i - 1])):
        i -= 1
    return text[i:pos].strip(".").lower()


def _weak_end(text: str, terminal: str, start: int, following: str) -> bool:
    """Whether ``terminal`` (``. ! ? …`` and the like, at ``start`` in ``text``) ends a
    sentence when ``following`` is the first character after the whitespace after it."""
    if following.islower():
        return False
    if terminal != ".":
        return True
    word = _word_before(text, start)
    if not word:
        return True
    if "." in word:  # U.S., e.g., Ph.D.: dotted short parts; not example.com
        return not all(len(part) <= 2 for part in word.split("."))
    if len(word) == 1 or word in ABBREVIATIONS:
        return False
    return not (word in NUMBER_ABBREVIATIONS and following.isdigit())


def split_line(text: str) -> list[str]:
    """The sentences of one line of text (or of a paragraph already joined into one line),
    in order. The last piece is returned too, although whether the sentence ends there is
    only known with the next line (``ends_before``). Pieces are stripped and non-empty."""
    pieces = []
    start = 0
    n = len(text)
    for m in _TERMINAL.finditer(text):
        end = m.end()
        if end >= n:
            break
        if _STRONG_SET.intersection(m.group(1)):
            cut = True
        else:
            nxt = text[end]
            if nxt.isspace():
                following = _NON_SPACE.search(text, end)
                cut = following is not None and _weak_end(text, m.group(1), m.start(),
                                                           following.group())
            else:
                cut = "." not in m.group(1) and _no_space(nxt)
        if cut:
            piece = text[start:end].strip()
            if piece:
                pieces.append(piece)
            start = end
    piece = text[start:].strip()
    if piece:
        pieces.append(piece)
    return pieces


def ends_before(previous: str, following: str) -> bool:
    """Whether a sentence ends between two lines (stripped, non-empty) of a paragraph:
    decided by the end of ``previous`` and the first character of ``following`` alone
    (as ``split_line`` decides on the lines joined)."""
    i = len(previous)
    while i and previous[i - 1] in _CLOSER_SET:
        i -= 1
    j = i
    while j and previous[j - 1] in _TERMINAL_SET:
        j -= 1
    if j == i:
        return False
    if _STRONG_SET.intersection(previous[j:i]):
        return True
    return _weak_end(previous, previous[j:i], j, following[0])


def join(previous: str, following: str) -> str:
    """Two lines of one sentence: with a space, or none between two CJK characters."""
    if _no_space(previous[-1]) and _no_space(following[0]):
        return previous + following
    return previous + " " + following


class ParagraphSplitter:
    """Sentences of a paragraph read line by line, with at most one unfinished sentence
    held (bounded by ``max_run_chars`` plus a line)."""

    __slots__ = ("carry", "max_run_chars")

    def __init__(self, max_run_chars: int = MAX_RUN_CHARS):
        self.carry = ""
        self.max_run_chars = max_run_chars

    def add_line(self, line: str) -> list[str]:
        """Takes the paragraph's next line (stripped, non-empty); returns the sentences it
        completes."""
        pieces = split_line(line)
        if not pieces:
            return []
        out = []
        if self.carry:
            if ends_before(self.carry, line):
                out.append(self.carry)
            else:
                pieces[0] = join(self.carry, pieces[0])
        out.extend(pieces[:-1])
        self.carry = pieces[-1]
        if len(self.carry) >= self.max_run_chars:
            out.append(self.carry)
            self.carry = ""
        return out

    def end(self) -> list[str]:
        """The paragraph ended (or a sentence end known otherwise): the sentence held."""
        out = [self.carry] if self.carry else []
        self.carry = ""
        return out


def split_paragraph(lines: Iterable[str], max_run_chars: int = MAX_RUN_CHARS) -> list[str]:
    """The sentences of a paragraph given as lines (hard-wrapped or not); blank lines are
    skipped."""
    splitter = ParagraphSplitter(max_run_chars)
    out = []
    for line in lines:
        line = line.strip()
        if line:
            out.extend(splitter.add_line(line))
    out.extend(splitter.end())
    return out


def split_text(text: str) -> list[str]:
    """The sentences of a document's text (the ``jsonl`` format): every line break ends a
    paragraph, so a sentence never spans one."""
    out = []
    for line in text.splitlines():
        out.extend(split_line(line.strip()))
    return out
