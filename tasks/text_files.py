"""Corpus text files: one sentence per line, a blank line between documents.

Usage:
    files = expand_globs(["data/*.txt"])
    for document in iter_documents(files):   # a list of sentence strings
        ...

Stdlib only.
"""

from __future__ import annotations

import glob
import random
from typing import Iterable, Iterator, Sequence


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


def iter_documents(files: Sequence[str]) -> Iterator[list[str]]:
    """Yields documents (lists of non-empty stripped lines); a file end ends a document."""
    for path in files:
        doc: list[str] = []
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line:
                    doc.append(line)
                elif doc:
                    yield doc
                    doc = []
        if doc:
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
