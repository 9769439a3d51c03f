"""Corpus text files: one sentence per line, a blank line between documents.

Bad input never crashes a run and is never dropped silently: ``InputIssues`` counts it, with
up to ``MAX_SAMPLES`` ``file:line`` samples of each kind:

- ``non_utf8_lines``: lines with bytes that are not UTF-8; the bad bytes become U+FFFD, which
  BERT's tokenizer drops, and the rest of the line is kept.
- ``giant_lines``: lines longer than ``MAX_LINE_CHARS`` (1 MB of text; nobody's sentence):
  skipped without ever holding them in memory whole.
- ``empty_files``: files with no non-blank line (sample: ``file:0``).
- ``empty_documents``: documents whose lines give no token at all (counted by the shard
  builder, which tokenises; sample: the document's first line).

Usage:
    files = expand_globs(["data/*.txt"])
    for document in iter_documents(files):   # a list of sentence strings
        ...
    issues = InputIssues()
    for path, line, document in iter_located_documents(files, issues): ...

Stdlib only.
"""

from __future__ import annotations

import dataclasses
import glob
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
    """Files matching the patterns (``glob.glob`` semantics), sorted and deduplicated.

    Raises:
      FileNotFoundError: when a pattern matches nothing.
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    files: set[str] = set()
    for pattern in patterns:
        matched = glob.glob(pattern)
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


def iter_located_documents(files: Sequence[str], issues: Optional[InputIssues] = None,
                           wanted: Optional[Callable[[int], bool]] = None,
                           max_line_chars: int = MAX_LINE_CHARS
                           ) -> Iterator[tuple[str, int, list[str]]]:
    """Yields ``(path, first line number, lines)`` for every wanted document, in file order.

    A document is a run of non-blank lines (stripped); a file's end ends one. Lines longer
    than ``max_line_chars`` are skipped (and counted); undecodable bytes become U+FFFD.

    Args:
      files: text files, in order.
      issues: where to count bad input (None: not counted).
      wanted: ``wanted(document_index)``, the index counting every document of ``files``;
        other documents are skipped cheaply and their issues not counted (so shards reading
        the same files count each issue once). File issues are counted when it accepts
        document 0. None: every document.
    """
    index = 0
    file_issues = issues is not None and (wanted is None or wanted(0))
    for path in files:
        doc: list[str] = []
        in_doc = keep = False
        start = 0
        file_has_text = False
        with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as f:
            readline = f.readline
            lineno = 0
            while True:
                line = readline(max_line_chars + 1)
                if not line:
                    break
                lineno += 1
                if len(line) > max_line_chars and not line.endswith("\n"):
                    while line and not line.endswith("\n"):  # skip the rest of it
                        line = readline(max_line_chars)
                    file_has_text = True
                    if issues is not None and (keep if in_doc else
                                               wanted is None or wanted(index)):
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
