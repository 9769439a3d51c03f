"""The documents of whole text files in any text format, as the format's reader
(tasks/sources/text_formats.py) gives them: the sentences preprocessing makes. The vocab stage reads
them, and samples them for training a vocabulary.

Usage:
    files = expand_globs(["data/*.txt"])                  # tasks/sources/text_files.py
    for document in iter_documents(files):               # a list of sentence strings
        ...
    issues = input_issues("jsonl")                       # tasks/sources/text_formats.py
    for path, line, document in iter_located_documents(files, issues, text_format="jsonl"):
        ...

Stdlib only.
"""

from __future__ import annotations

import random
from typing import Iterable, Iterator, Optional, Sequence

from runexp.compiler.specs.source import SourceSpec
from runexp.tasks.sources.text_files import InputIssues, ReadCounter
from runexp.tasks.sources.text_formats import reader_class


def iter_located_documents(files: Sequence[str], issues: Optional[InputIssues] = None,
                           counter: Optional[ReadCounter] = None,
                           text_format: str = SourceSpec.format,
                           text_field: str = SourceSpec.text_field
                           ) -> Iterator[tuple[str, int, list[str]]]:
    """Yields ``(path, first line number, sentences)`` for every document, in file order,
    as the format's reader gives them (tasks/sources/text_formats.py: the sentences preprocessing
    makes). sentence_lines: a document is a run of non-blank lines (stripped), a sentence
    each; lines longer than ``MAX_LINE_CHARS`` bytes are skipped (and counted); undecodable
    bytes become U+FFFD. A file's end ends a document.

    Args:
      files: text files, in order.
      issues: where to count bad input (None: not counted).
      counter: counts the bytes read.
      text_format, text_field: the files' format (compiler/specs/source.py).
    """

    read = reader_class(text_format)
    for path in files:
        reader = read(path, text_field=text_field, counter=counter, issues=issues, line_base=1)
        doc: list[str] = []
        first = 0
        for k, sentences, doc_break in reader:
            if k is not None and not first:
                first = k + 1
            doc.extend(sentences)
            if doc_break and first:
                yield path, first, doc
                doc, first = [], 0
        if first:
            yield path, first, doc
        if not reader.has_text and issues is not None:
            issues.note("empty_files", path, 0)


def iter_documents(files: Sequence[str], text_format: str = SourceSpec.format,
                   text_field: str = SourceSpec.text_field) -> Iterator[list[str]]:
    """Yields documents (lists of sentences: for sentence_lines the non-empty stripped
    lines); a file end ends a document."""
    for _, _, doc in iter_located_documents(files, text_format=text_format,
                                            text_field=text_field):
        yield doc


def sample_sentences(documents: Iterable[Sequence[str]], max_lines: int, seed: int
                     ) -> list[str]:
    """Up to ``max_lines`` sentences of ``documents``, a seeded reservoir sample kept in
    their order."""
    rng = random.Random(seed)
    reservoir: list[tuple[int, str]] = []
    n = 0
    for doc in documents:
        for line in doc:
            if len(reservoir) < max_lines:
                reservoir.append((n, line))
            else:
                j = rng.randrange(n + 1)
                if j < max_lines:
                    reservoir[j] = (n, line)
            n += 1
    return [line for _, line in sorted(reservoir)]


def sample_lines(files: Sequence[str], max_lines: int, seed: int,
                 text_format: str = SourceSpec.format,
                 text_field: str = SourceSpec.text_field) -> list[str]:
    """Up to ``max_lines`` sentences (sentence_lines: non-empty lines), a seeded reservoir
    sample kept in file order."""
    return sample_sentences(iter_documents(files, text_format, text_field), max_lines, seed)
