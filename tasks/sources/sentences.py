"""Rule-based splitting of docstring prose into sentences.

Docstrings mix prose with doctests, code samples, tables and parameter lists. This module keeps
the prose: it drops doctest and code-like lines, joins the remaining lines of a paragraph and
splits them at sentence ends, guarding common abbreviations. Stdlib only.

Usage:
    for sentence in split_sentences(docstring):
        ...
"""

from __future__ import annotations

import re

# Abbreviations that end with a period but rarely end a sentence.
_ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf mr mrs dr st no fig al approx resp incl esp ca viz".split())

# A sentence ends at . ! ? (optionally followed by a closing quote or bracket), then whitespace,
# then something that can start a sentence.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9])")
_CODE_LINE = re.compile(
    r"^\s*(>>>|\.\.\.|\$ |#|@|def |class |import |from \S+ import|return |raise |if .*:$|for .*:$)"
    r"|[{};]\s*$|^\s*[-=~^*+#]{3,}\s*$|\w+\(.*\)\s*(->|=)|^\s*\w+\s*=\s*\S")
_MIN_CHARS = 25
_MIN_WORDS = 3


def _paragraphs(text: str) -> list[list[str]]:
    """Blank-line separated paragraphs, each a list of lines (indentation kept)."""
    paragraphs, current = [], []
    for line in text.expandtabs(4).splitlines():
        if line.strip():
            current.append(line.rstrip())
        elif current:
            paragraphs.append(current)
            current = []
    if current:
        paragraphs.append(current)
    return paragraphs


def _is_prose_line(line: str, base_indent: int) -> bool:
    stripped = line.strip()
    if len(line) - len(line.lstrip()) > base_indent + 2:
        return False  # indented block under prose: usually code or a literal block
    if _CODE_LINE.search(line):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in stripped)
    return letters >= 0.75 * len(stripped)


def _is_sentence(sentence: str) -> bool:
    if len(sentence) < _MIN_CHARS or len(sentence.split()) < _MIN_WORDS:
        return False
    if not (sentence[0].isalpha() or sentence[0] in "\"'(`"):
        return False
    letters = sum(c.isalpha() or c.isspace() for c in sentence)
    return letters >= 0.75 * len(sentence)


def _split_paragraph(text: str) -> list[str]:
    pieces = _SENTENCE_END.split(text)
    sentences: list[str] = []
    for piece in pieces:
        piece = piece.strip()
        if not piece:
            continue
        if sentences:
            last_word = sentences[-1].rsplit(None, 1)[-1].rstrip(".").lower()
            # Re-join splits after an abbreviation or a single initial ("J. Smith").
            if last_word in _ABBREVIATIONS or (len(last_word) == 1 and last_word.isalpha()):
                sentences[-1] = f"{sentences[-1]} {piece}"
                continue
        sentences.append(piece)
    return sentences


def split_sentences(docstring: str) -> list[str]:
    """Splits a docstring into prose sentences.

    Args:
      docstring: the cleaned docstring (``inspect.cleandoc`` / ``ast.get_docstring`` output).

    Returns:
      Sentences in order, whitespace-normalised, without doctests, code or short fragments.
    """
    out = []
    for lines in _paragraphs(docstring):
        base = min(len(l) - len(l.lstrip()) for l in lines)
        if lines[0].lstrip().startswith(">>>"):
            continue
        prose = [l.strip() for l in lines if _is_prose_line(l, base)]
        if len(prose) < len(lines) / 2:
            continue  # mostly code: the prose lines left are likely captions of it
        text = " ".join(prose)
        out.extend(s for s in _split_paragraph(" ".join(text.split())) if _is_sentence(s))
    return out
