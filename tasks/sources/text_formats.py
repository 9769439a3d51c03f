"""The text formats: a byte segment of a file as document text, sentences and document
breaks, one class per format (``TextReader``), named by its row of compiler/specs/
source_formats.py. The preprocess stage (by byte ranges, tasks/instances/split_index.py) and the vocab
stage (whole files, tasks/sources/text_documents.py ``iter_located_documents``) read every format through
the same events, so they see the same sentences:

- ``sentence_lines`` (``SentenceLines``): one sentence a line, a blank line between
  documents; a line over 1 MiB is skipped (``giant_lines``) and ends nothing.
- ``paragraphs`` (``Paragraphs``): running text, a blank line between documents; the lines
  of a paragraph are joined where a sentence goes on and cut at sentence ends
  (tasks/sources/sentence_split.py). A line over 1 MiB is skipped (``giant_lines``) and ends a
  sentence, not the document.
- ``jsonl`` (``Jsonl``): one JSON object a line, one document each, its text in
  ``text_field`` (a key, or a dotted path such as ``meta.body`` when no key is named so);
  every line break of the text ends a paragraph. Lines may be up to 64 MiB (a book). Bad
  lines are skipped and counted (tasks/sources/text_files.py ``InputIssues``):
  ``invalid_json_lines``, ``missing_text_lines``, ``empty_text_lines``; blank lines are
  ignored.

Byte ranges (``paragraphs``). Preprocessing cuts files anywhere and reads the pieces in
parallel, so a sentence may straddle a cut. A segment counts the lines that start in it
(their numbers and bad input), but reads the text between two sentence ends: from the first
one found among the lines starting at or after its start (a blank or giant line, or two
lines with ``ends_before`` between them) to the first one found the same way after its end.
It reads on past its end for that (small reads, doubling) and skips its own lines before
the first. Both neighbours find the same place from the same lines, and the splitting
restarts there holding nothing, as a whole-file reader's does at a sentence end: so the
sentences, and the instances made of them, do not depend on where the cuts are. Text with
no sentence end for a long way (no punctuation, no blank line) is read by fewer ranges;
the output stays the same. (A line of the other two formats is a sentence or a document
by itself: their segments are their own lines.)

A new text format is a ``TextReader`` subclass yielding these events from ``_lines`` (each
line of the segment, stripped and repaired) and its row in compiler/specs/source_formats.py.

Usage:
    read = reader_class("paragraphs")
    for k, sentences, doc_break in read(path, start, end, issues=issues):
        ...  # k: line k (from the segment's start) is document text, or None;
             # sentences: the ones completed; doc_break: a document ends after them
"""

from __future__ import annotations

import importlib
import json
import re
from typing import Iterator, Optional

from runexp.compiler.specs.source import SourceSpec
from runexp.compiler.specs.source_formats import SOURCE_FORMATS, TEXT_FORMATS
from runexp.tasks.sources import input_files, sentence_split
from runexp.tasks.sources.text_files import (JSONL_ISSUE_KINDS, MAX_LINE_CHARS, InputIssues,
                                     ReadCounter, _fix_line, iter_segment_lines)

MAX_JSONL_LINE_BYTES = 64 << 20
_AHEAD_READ = 1 << 8  # first read past a segment's end (doubling up to 1 MiB)

Event = tuple[Optional[int], list, bool]


def reader_class(text_format: str) -> type["TextReader"]:
    """The class reading ``text_format``'s files (its row's, compiler/specs/
    source_formats.py)."""
    fmt = SOURCE_FORMATS.get(text_format)
    if fmt is None or not fmt.reads_text_files:
        raise ValueError(f"not a text format: {text_format!r} (one of "
                         f"{', '.join(TEXT_FORMATS)}); seqio sources are read through seqio")
    module, _, name = fmt.reader.partition(":")
    return getattr(importlib.import_module(module), name)


def input_issues(text_format: str) -> InputIssues:
    """Bad-input counts for ``text_format``'s files: the kinds of every format and its
    reader's own (``issue_kinds``), each from zero."""
    return InputIssues.with_kinds(reader_class(text_format).issue_kinds)


def document_text(obj, text_field: str):
    """The value of ``text_field`` in a JSON object: the key itself, else a dotted path
    (``meta.body``); None when missing."""
    if text_field in obj:
        return obj[text_field]
    for part in text_field.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


_SURROGATE = re.compile("[\ud800-\udfff]")


def _fix_text(text: str) -> Optional[str]:
    """The text with each lone surrogate (a JSON escape such as \\ud800 without its pair)
    as U+FFFD, or None when there is none."""
    fixed = _SURROGATE.sub("\ufffd", text)
    return None if fixed == text else fixed


class TextReader:
    """The events of the lines a segment ``[start, end)`` of a text file owns (module
    docstring), in order: ``(k, sentences, doc_break)``. A subclass per text format.

    After iterating: ``lines`` (lines starting in the segment) and ``has_text`` (one of them
    is not blank). Issues are noted as ``(path, k + line_base)``.
    """

    issue_kinds: tuple = ()  # its own kinds of bad input (input_issues)
    max_line_bytes = MAX_LINE_CHARS

    def __init__(self, path: str, start: int = 0, end: Optional[int] = None,
                 text_field: str = SourceSpec.text_field,
                 counter: Optional[ReadCounter] = None, issues: Optional[InputIssues] = None,
                 line_base: int = 0):
        self.path, self.start, self.end = path, start, end
        self.text_field = text_field
        self.counter, self.issues, self.line_base = counter, issues, line_base
        self.lines = 0
        self.has_text = False

    def __iter__(self) -> Iterator[Event]:
        raise NotImplementedError

    def _note(self, kind: str, k: int) -> None:
        if self.issues is not None:
            self.issues.note(kind, self.path, k + self.line_base)

    def _lines(self, size: Optional[int] = None) -> Iterator[tuple[int, Optional[str], bool]]:
        """``(k, text, ahead)``: text stripped and repaired, "" for a blank line, None for a
        giant one; ``ahead``: a line past the segment's end (read on, not counted), read
        when the file's ``size`` is given."""
        for k, line in iter_segment_lines(self.path, self.start, self.end, self.counter,
                                          self.max_line_bytes):
            self.lines = k + 1
            if line is None:
                self.has_text = True
                self._note("giant_lines", k)
            else:
                line = line.strip()
                if line:
                    self.has_text = True
                    if not line.isascii():
                        fixed = _fix_line(line)
                        if fixed is not None:
                            line = fixed
                            self._note("non_utf8_lines", k)
            yield k, line, False
        if size is None or self.end >= size:
            return
        k, pos, step = self.lines, self.end, _AHEAD_READ
        while pos < size:
            stop = min(size, pos + step)
            for _, line in iter_segment_lines(self.path, pos, stop, self.counter,
                                              self.max_line_bytes):
                if line is not None:
                    line = line.strip()
                    if not line.isascii():
                        line = _fix_line(line) or line
                yield k, line, True
                k += 1
            pos, step = stop, min(2 * step, 1 << 20)


class SentenceLines(TextReader):
    """``sentence_lines``: each non-blank line a sentence, a blank line a document break; a
    giant line is skipped (counted) and breaks nothing."""

    def __iter__(self) -> Iterator[Event]:
        for k, text, _ in self._lines():
            if text:
                yield k, [text], False
            elif text is not None:
                yield None, [], True


class Paragraphs(TextReader):
    """``paragraphs``: a paragraph's lines joined and cut at sentence ends; reads on past
    the segment's end to the next sentence end (module docstring)."""

    def __iter__(self) -> Iterator[Event]:
        size = input_files.size(self.path)
        self.end = size if self.end is None else min(self.end, size)
        splitter = sentence_split.ParagraphSplitter()
        ends_before = sentence_split.ends_before
        skipping = self.start > 0  # a file's start is a sentence end; elsewhere, find one
        previous = None            # the line before, while skipping
        ahead_previous = None      # the line before, past the end
        stopped = False
        for k, text, ahead in self._lines(size):
            if ahead:
                if not text or (ahead_previous is not None
                                and ends_before(ahead_previous, text)):
                    stopped = True  # where the next segment's text starts
                    break
                ahead_previous = text
            if skipping:
                if text and (previous is None or not ends_before(previous, text)):
                    previous = text  # the end of a sentence an earlier segment reads
                    continue
                skipping = False
            if text is None:
                yield None, splitter.end(), False
            elif not text:
                yield None, splitter.end(), True
            else:
                yield k, splitter.add_line(text), False
        yield None, splitter.end(), not stopped


class Jsonl(TextReader):
    """``jsonl``: each line a JSON object, a document; bad lines skipped and counted."""

    issue_kinds = JSONL_ISSUE_KINDS
    max_line_bytes = MAX_JSONL_LINE_BYTES

    def __iter__(self) -> Iterator[Event]:
        yield None, [], True
        for k, text, _ in self._lines():
            if not text:
                continue
            doc = self._document(text, k)
            if doc is None:
                continue
            sentences = sentence_split.split_text(doc)
            if not sentences:
                self._note("empty_text_lines", k)
                continue
            yield k, sentences, True

    def _document(self, line: str, k: int) -> Optional[str]:
        if line[0] == "\ufeff":  # a byte order mark, which json refuses
            line = line[1:]
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict):
            self._note("invalid_json_lines", k)
            return None
        text = document_text(obj, self.text_field)
        if not isinstance(text, str):
            self._note("missing_text_lines", k)
            return None
        if not text.isascii():
            fixed = _fix_text(text)
            if fixed is not None:
                text = fixed
                self._note("non_utf8_lines", k)
        return text
