"""Corpus text files, the bytes and lines their text formats' readers (tasks/sources/text_formats.py)
read: expanding globs, reading a file's lines by byte segments and counting bad input. The
documents of whole files in any text format are tasks/sources/text_documents.py's.

Bad input never crashes a run and is never dropped silently: ``InputIssues`` counts it, with
up to ``MAX_SAMPLES`` ``file:line`` samples of each kind. The kinds, what each means and what
to do are declared once, in compiler/specs/bad_input.py:

- ``non_utf8_lines``: lines with bytes that are not UTF-8; the bad bytes become U+FFFD, which
  BERT's tokenizer drops, and the rest of the line is kept.
- ``giant_lines``: lines longer than ``MAX_LINE_CHARS`` bytes (1 MiB of text; nobody's
  sentence; 64 MiB for a ``jsonl`` line): skipped without ever holding them in memory whole.
- ``empty_files``: files with no non-blank line (sample: ``file:0``).
- ``empty_documents``: documents whose lines give no token at all (counted by the shard
  builder, which tokenises; sample: the document's first line).
- ``jsonl`` only (``JSONL_ISSUE_KINDS``), each line skipped: ``invalid_json_lines`` (not a
  JSON object), ``missing_text_lines`` (no string in the text field), ``empty_text_lines``
  (only whitespace there).
- with a word segmenter (tasks/vocabulary/chinese_words.py): ``unsegmented_lines``, lines whose
  segmented words could not be lined up with their tokens (kept, with character masking).

The four kinds of every format are always in a summary; a format's own kinds are there when
its reader counted (tasks/sources/text_formats.py ``input_issues``), so sentence_lines summaries are
as before.

Usage:
    files = expand_globs(["data/*.txt"])
    issues = InputIssues()
    for k, text in iter_segment_lines(path, start, end, counter): ...  # lines starting there

Files are read as bytes, in segments (``iter_segment_lines``): the preprocess stage cuts a
split's files into byte ranges and reads each once (tasks/instances/pretraining_shards.py).

Stdlib only.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Optional

from runexp.compiler import globs
from runexp.compiler.specs.bad_input import BAD_INPUT_KINDS, EVERY_FORMAT, JSONL, counted_by
from runexp.tasks.sources import input_files

MAX_LINE_CHARS = 1 << 20
MAX_SAMPLES = 5
ISSUE_KINDS = counted_by(EVERY_FORMAT)
JSONL_ISSUE_KINDS = counted_by(JSONL)
ALL_ISSUE_KINDS = tuple(BAD_INPUT_KINDS)

# What each kind means and what to do about it (``InputIssues.describe``).
ISSUE_MEANINGS = {k.name: k.meaning for k in BAD_INPUT_KINDS.values()}


def _issue_order(kind: str) -> tuple:
    return (ALL_ISSUE_KINDS.index(kind) if kind in ALL_ISSUE_KINDS else len(ALL_ISSUE_KINDS),
            kind)


@dataclasses.dataclass
class InputIssues:
    """Counts and the first ``MAX_SAMPLES`` locations (in file order) of each kind of bad
    input: the four ``ISSUE_KINDS`` always, a format's own kinds once counted (or set up by
    tasks/sources/text_formats.py ``input_issues``)."""

    counts: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(ISSUE_KINDS, 0))
    samples: dict = dataclasses.field(
        default_factory=lambda: {k: [] for k in ISSUE_KINDS})

    @classmethod
    def with_kinds(cls, kinds: Iterable[str]) -> "InputIssues":
        """Issues with ``kinds`` (a format's own, tasks/sources/text_formats.py ``input_issues``)
        counted from zero too, so that a summary says none occurred."""
        issues = cls()
        for kind in kinds:
            issues.counts[kind] = 0
            issues.samples[kind] = []
        return issues

    def kinds(self) -> list[str]:
        return sorted(set(self.counts) | set(self.samples), key=_issue_order)

    def note(self, kind: str, path: str, line: int) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        samples = self.samples.setdefault(kind, [])
        if len(samples) < MAX_SAMPLES:
            samples.append((path, line))

    def add(self, other: "InputIssues") -> None:
        for kind in sorted(set(self.kinds()) | set(other.kinds()), key=_issue_order):
            self.counts[kind] = self.counts.get(kind, 0) + other.counts.get(kind, 0)
            merged = sorted(set(map(tuple, self.samples.get(kind, []) +
                                    other.samples.get(kind, []))))
            self.samples[kind] = merged[:MAX_SAMPLES]
        self.counts = {k: self.counts[k] for k in sorted(self.counts, key=_issue_order)}
        self.samples = {k: self.samples[k] for k in sorted(self.samples, key=_issue_order)}

    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> dict:
        """``{kind: {"count": n, "samples": ["file:line", ...]}}`` for every kind."""
        return {k: {"count": self.counts.get(k, 0),
                    "samples": [f"{p}:{n}" for p, n in sorted(self.samples.get(k, []))]}
                for k in self.kinds()}

    def describe(self) -> list[str]:
        """One warning line per kind that occurred: how many, where, what it means and
        what to do."""
        out = []
        for kind in self.kinds():
            if self.counts.get(kind):
                where = ", ".join(f"{p}:{n}" for p, n in sorted(self.samples.get(kind, [])))
                meaning = ISSUE_MEANINGS.get(kind)
                out.append(f"{self.counts[kind]:,} {kind.replace('_', ' ')} (e.g. {where})"
                           + (f": {meaning}" if meaning else ""))
        return out


def expand_globs(patterns: Iterable[str] | str) -> list[str]:
    """Files matching the patterns, sorted and deduplicated, with runexp's one glob semantics
    (the compiler's and gs:// listings' too; see compiler/globs.py): ``*``, ``?`` and
    ``[...]`` stay within one directory, ``**`` spans any number of them, wildcards skip
    names starting with ``.``, and an existing file named exactly by a pattern matches.

    A version of a gs:// object (``gs://bucket/key#generation``, tasks/sources/input_files.py: what
    the executor hands a stage that reads its corpus in place) is one file, as it is; files
    sort by their names, versions left out.

    Raises:
      FileNotFoundError: when a pattern matches nothing.
    """

    if isinstance(patterns, str):
        patterns = [patterns]
    files: set[str] = set()
    for pattern in patterns:
        if input_files.split_pinned(pattern)[1] is not None:
            files.add(pattern)
            continue
        matched = globs.expand_local(pattern)
        if not matched:
            raise FileNotFoundError(f"no file matches {pattern!r}")
        files.update(matched)
    return sorted(files, key=lambda f: (input_files.split_pinned(f)[0], f))


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
    with input_files.open_binary(path, end) as f:  # a local file, or a gs:// version
        size = f.size
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
