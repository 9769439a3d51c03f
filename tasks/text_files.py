"""Corpus text files: one sentence per line, a blank line between documents.

Bad input never crashes a run and is never dropped silently: ``InputIssues`` counts it, with
up to ``MAX_SAMPLES`` ``file:line`` samples of each kind:

- ``non_utf8_lines``: lines with bytes that are not UTF-8; the bad bytes become U+FFFD, which
  BERT's tokenizer drops, and the rest of the line is kept.
- ``giant_lines``: lines longer than ``MAX_LINE_CHARS`` bytes (1 MiB of text; nobody's
  sentence): skipped without ever holding them in memory whole.
- ``empty_files``: files with no non-blank line (sample: ``file:0``).
- ``empty_documents``: documents whose lines give no token at all (counted by the shard
  builder, which tokenises; sample: the document's first line).

Usage:
    files = expand_globs(["data/*.txt"])
    for document in iter_documents(files):   # a list of sentence strings
        ...
    issues = InputIssues()
    for path, line, document in iter_located_documents(files, issues): ...
    for k, text in iter_segment_lines(path, start, end, counter): ...  # lines starting there

Files are read as bytes, in segments (``iter_segment_lines``): the preprocess stage cuts a
split's files into byte ranges and reads each once (tasks/pretraining_shards.py).

Stdlib only.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Callable, Iterable, Iterator, Optional, Sequence

MAX_LINE_CHARS = 1 << 20
MAX_SAMPLES = 5
ISSUE_KINDS = ("non_utf8_lines", "giant_lines", "empty_files", "empty_documents")


@dataclasses.dataclass
class InputIssues:
    """Counts and the first ``MAX_SAMPLES`` locations (in file order) of each kind of bad input."""

    counts: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(ISSUE_KINDS, 0))
    samples: dict = dataclasses.field(
        default_factory=lambda: {k: [] for k in ISSUE_KINDS})

    def note(self, kind: str, path: str, line: int) -> None:
        self.counts[kind] += 1
        if len(self.samples[kind]) < MAX_SAMPLES:
            self.samples[kind].append((path, line))

    def add(self, other: "InputIssues") -> None:
        for kind in ISSUE_KINDS:
            self.counts[kind] += other.counts[kind]
            merged = sorted(set(map(tuple, self.samples[kind] + other.samples[kind])))
            self.samples[kind] = merged[:MAX_SAMPLES]

    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> dict:
        """``{kind: {"count": n, "samples": ["file:line", ...]}}`` for every kind."""
        return {k: {"count": self.counts[k],
                    "samples": [f"{p}:{n}" for p, n in sorted(self.samples[k])]}
                for k in ISSUE_KINDS}

    def describe(self) -> list[str]:
        """One warning line per kind that occurred."""
        out = []
        for kind in ISSUE_KINDS:
            if self.counts[kind]:
                where = ", ".join(f"{p}:{n}" for p, n in sorted(self.samples[kind]))
                out.append(f"{self.counts[kind]:,} {kind.replace('_', ' ')} (e.g. {where})")
        return out


def expand_globs(patterns: Iterable[str] | str) -> list[str]:
    """Files matching the patterns, sorted and deduplicated, with runexp's one glob semantics
    (the compiler's and gs:// listings' too; see compiler/globs.py): ``*``, ``?`` and
    ``[...]`` stay within one directory, ``**`` spans any number of them, wildcards skip
    names starting with ``.``, and an existing file named exactly by a pattern matches.

    Raises:
      FileNotFoundError: when a pattern matches nothing.
    """
    from runexp.compiler import globs  # stdlib only

    if isinstance(patterns, str):
        patterns = [patterns]
    files: set[str] = set()
    for pattern in patterns:
        matched = globs.expand_local(pattern)
        if not matched:
            raise FileNotFoundError(f"no file matches {pattern!r}")
        files.update(matched)
    return sorted(files)


def _fix_line(line: str) -> Optional[str]:
    """The line with undecodable bytes as U+FFFD, or None when it decoded cleanly."""
    try:
        line.encode("utf-8")
        return None
    except UnicodeEncodeError:  # lone surrogates: the bytes surrogateescape kept
        return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class ReadCounter:
    """Bytes the readers here got from input files (all reads, skipped bytes included)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


_BLOCK = 1 << 20      # read size inside a segment
_TAIL_READ = 1 << 8   # first read size past a segment's end (doubling), to finish its last line


def iter_segment_lines(path: str, start: int = 0, end: Optional[int] = None,
                       counter: Optional[ReadCounter] = None,
                       max_line_bytes: int = MAX_LINE_CHARS
                       ) -> Iterator[tuple[int, Optional[str]]]:
    """Yields ``(k, text)`` for the lines of a file that start in bytes ``[start, end)``.

    ``k`` counts those lines (0, 1, ...); ``text`` is the line without its newline, decoded as
    UTF-8 with undecodable bytes kept as lone surrogates (``surrogateescape``), or None for a
    line longer than ``max_line_bytes`` (skipped, never held in memory whole).

    A line belongs to the segment holding its first byte: a segment starting inside a line
    skips the rest of it (reading no further than its own end), and its own last line is
    read to the end, past ``end``. So segments cutting a file anywhere yield each line
    exactly once, and read each byte once, except for the part of a line straddling a cut
    (read by both sides) and the byte before each cut. Reads stop at ``end`` exactly, then go
    on in small reads (256 bytes, doubling), so little past the last line is read.
    ``counter`` counts every byte read.
    """
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        end = size if end is None else min(end, size)
        if start >= end:
            return
        pos = start
        tail_read = _TAIL_READ

        def read() -> bytes:
            nonlocal pos, tail_read
            if pos < end:
                n = min(_BLOCK, end - pos)
            else:
                n, tail_read = tail_read, min(2 * tail_read, _BLOCK)
            chunk = f.read(n)
            pos += len(chunk)
            if counter is not None:
                counter.bytes += len(chunk)
            return chunk

        def skip_line() -> Optional[bytes]:
            """Reads to the end of the current line; the bytes after it (None at EOF)."""
            while True:
                chunk = read()
                if not chunk:
                    return None
                nl = chunk.find(b"\n")
                if nl >= 0:
                    return chunk[nl + 1:]

        data = b""
        base = start
        if start > 0:
            # A line starts in [start, end) where a newline is in [start - 1, end - 1): look
            # for the first one there, and no further (a giant line spanning whole segments
            # is read by its own segment only).
            f.seek(start - 1)
            pos = start - 1
            while True:
                chunk = f.read(min(_BLOCK, end - 1 - pos))
                pos += len(chunk)
                if counter is not None:
                    counter.bytes += len(chunk)
                if not chunk:
                    return
                nl = chunk.find(b"\n")
                if nl >= 0:
                    data = chunk[nl + 1:]
                    base = pos - len(data)
                    break
        k = 0
        while True:
            i = 0
            while base + i < end:
                nl = data.find(b"\n", i)
                if nl < 0:
                    break
                line = data[i:nl]
                yield k, (None if len(line) > max_line_bytes
                          else line.decode("utf-8", "surrogateescape"))
                k += 1
                i = nl + 1
            else:
                return  # the next line starts at or past the end: the next segment's
            data, base = data[i:], base + i
            if len(data) > max_line_bytes:  # an unfinished line, already too long
                yield k, None
                k += 1
                rest = skip_line()
                if rest is None:
                    return
                data, base = rest, pos - len(rest)
                continue
            chunk = read()
            if not chunk:  # end of file: a last line without a newline
                if data:
                    yield k, data.decode("utf-8", "surrogateescape")
                return
            data += chunk


def iter_located_documents(files: Sequence[str], issues: Optional[InputIssues] = None,
                           wanted: Optional[Callable[[int], bool]] = None,
                           max_line_chars: int = MAX_LINE_CHARS,
                           counter: Optional[ReadCounter] = None
                           ) -> Iterator[tuple[str, int, list[str]]]:
    """Yields ``(path, first line number, lines)`` for every wanted document, in file order.

    A document is a run of non-blank lines (stripped); a file's end ends one. Lines longer
    than ``max_line_chars`` bytes are skipped (and counted); undecodable bytes become U+FFFD.

    Args:
      files: text files, in order.
      issues: where to count bad input (None: not counted).
      wanted: ``wanted(document_index)``, the index counting every document of ``files``;
        other documents are skipped cheaply and their issues not counted. File issues are
        counted when it accepts document 0. None: every document.
      counter: counts the bytes read.
    """
    index = 0
    file_issues = issues is not None and (wanted is None or wanted(0))
    for path in files:
        doc: list[str] = []
        in_doc = keep = False
        start = 0
        file_has_text = False
        for k, line in iter_segment_lines(path, 0, None, counter, max_line_chars):
            lineno = k + 1
            if line is None:
                file_has_text = True
                if issues is not None and (keep if in_doc else wanted is None or wanted(index)):
                    issues.note("giant_lines", path, lineno)
                continue
            line = line.strip()
            if line:
                if not in_doc:
                    in_doc, start, file_has_text = True, lineno, True
                    keep = wanted is None or wanted(index)
                if not keep:
                    continue
                if not line.isascii():
                    fixed = _fix_line(line)
                    if fixed is not None:
                        line = fixed
                        if issues is not None:
                            issues.note("non_utf8_lines", path, lineno)
                doc.append(line)
            elif in_doc:
                if keep:
                    yield path, start, doc
                    doc = []
                index += 1
                in_doc = False
        if in_doc:
            if keep:
                yield path, start, doc
            index += 1
        if not file_has_text and file_issues:
            issues.note("empty_files", path, 0)


def iter_documents(files: Sequence[str]) -> Iterator[list[str]]:
    """Yields documents (lists of non-empty stripped lines); a file end ends a document."""
    for _, _, doc in iter_located_documents(files):
        yield doc


def sample_lines(files: Sequence[str], max_lines: int, seed: int) -> list[str]:
    """Up to ``max_lines`` non-empty lines, a seeded reservoir sample kept in file order."""
    rng = random.Random(seed)
    reservoir: list[tuple[int, str]] = []
    n = 0
    for doc in iter_documents(files):
        for line in doc:
            if len(reservoir) < max_lines:
                reservoir.append((n, line))
            else:
                j = rng.randrange(n + 1)
                if j < max_lines:
                    reservoir[j] = (n, line)
            n += 1
    return [line for _, line in sorted(reservoir)]
