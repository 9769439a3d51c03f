"""Classification (or regression) data files: TSV (with a header, or without one and its
columns declared, split on tabs only as GLUE's files are read) or JSONL. Each bad row is one
error naming file:line. Standard library only: the compiler checks the files with this reader
in a dry run, and tasks/sources/classification.py encodes what it reads.
"""

from __future__ import annotations

import json
import math
from typing import Optional, Sequence

from runexp.compiler.errors import Location, Problem, UserError


class DataFileError(UserError, ValueError):
    """A malformed line of a classification file, as one error: ``file:line: what is
    wrong`` and a hint. A UserError, so a run reports it as bad input (exit 1, no
    traceback); the compiler reports it in the dry run for local files."""

    def __init__(self, path: str, line: int, what: str, hint: str, source: str = ""):
        self.path, self.line, self.what, self.hint = path, line, what, hint
        super().__init__(Problem(what, Location(path, line, 0, source[:200]), hint))


Example = tuple[tuple[str, ...], str]  # (texts in text_fields order, label)

def _lines(path: str, max_rows: Optional[int]):
    """(line number, text) of a file's lines, decoded as UTF-8 one by one (a bad byte is
    an error at its line, not a traceback)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if max_rows is not None and number > max_rows + 1:
                return
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFileError(path, number, f"not UTF-8 text (byte {raw[e.start]:#04x} "
                                    f"at column {e.start + 1})",
                                    "save the file as UTF-8") from None


def _load_tsv(path: str, text_fields: Sequence[str], label_field: str,
              max_rows: Optional[int] = None,
              columns: Optional[Sequence[str]] = None) -> list[tuple[int, Example]]:
    """(line number, example) of each row, split on tabs only: no quoting, as GLUE's files are read (google-research/bert's
    csv reader with quotechar=None): MRPC's texts hold unbalanced double quotes."""
    examples = []
    lines = _lines(path, max_rows)
    if columns is None:
        first = next(lines, None)
        if first is None:
            raise DataFileError(path, 1, "empty file: no header and no examples",
                                "a TSV needs a header line naming its columns, then one "
                                "example per line")
        # A byte-order mark is no part of the first column's name (GLUE's MRPC files have one).
        header_line = first[1].lstrip("\ufeff").rstrip("\r\n")
        header, where = header_line.split("\t"), "the header"
    else:
        header_line, header, where = "", list(columns), "the declared columns"
    missing = [c for c in (*text_fields, label_field) if c not in header]
    if missing:
        names, found = ", ".join(map(repr, missing)), ", ".join(map(repr, header))
        if columns is None:
            raise DataFileError(path, 1, f"the header has no column {names} (it has {found})",
                                "the first line must name the columns (tab-separated), and "
                                "text_fields and label_field must be among them", header_line)
        raise DataFileError(path, 1, f"the declared columns have no {names} (they are "
                            f"{found})", "text_fields and label_field must be among columns")
    text_columns = [header.index(c) for c in text_fields]
    label_column = header.index(label_field)
    for number, line in lines:
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        row = line.split("\t")
        if len(row) != len(header):
            raise DataFileError(path, number, f"{len(row)} tab-separated fields, {where} "
                                f"{'has' if columns is None else 'are'} {len(header)}",
                                "one example per line with a field per "
                                f"{'header ' if columns is None else 'declared '}column, "
                                "separated by tabs (a tab inside a text must be removed)", line)
        examples.append((number, (tuple(row[c] for c in text_columns), row[label_column])))
    return examples


def _load_jsonl(path: str, text_fields: Sequence[str], label_field: str,
                max_rows: Optional[int] = None) -> list[tuple[int, Example]]:
    examples = []
    for number, line in _lines(path, max_rows):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFileError(path, number, f"not JSON: {e.msg}",
                                "one JSON object per line", line.rstrip("\r\n")) from None
        if not isinstance(row, dict):
            raise DataFileError(path, number, "expected a JSON object",
                                "one JSON object per line, e.g. "
                                '{"sentence": "...", "label": "pos"}', line.rstrip("\r\n"))
        missing = [c for c in (*text_fields, label_field) if c not in row]
        if missing:
            raise DataFileError(path, number, f"missing field {', '.join(map(repr, missing))} "
                                f"(it has {', '.join(map(repr, row))})",
                                "every line needs the text_fields and the label_field",
                                line.rstrip("\r\n"))
        examples.append((number, (tuple(str(row[c]) for c in text_fields),
                                  str(row[label_field]))))
    return examples


def load_examples(path: str, text_fields: Sequence[str] = ("sentence",),
                  label_field: str = "label", max_rows: Optional[int] = None,
                  columns: Optional[Sequence[str]] = None, numeric_labels: bool = False
                  ) -> list[Example]:
    """Reads ``.jsonl``/``.json`` (one object a line) or TSV (anything else): with a header,
    or without one when ``columns`` names its columns; with ``max_rows``, only the first
    rows (a sample, for checks). ``numeric_labels``: every label must be a finite number
    (a regression's scores); they stay strings here.

    Raises:
      DataFileError: naming file:line, for a malformed row, a missing field, a label that is
        not a number, or bad bytes.
    """
    if not 1 <= len(text_fields) <= 2:
        raise ValueError(f"text_fields must name one or two fields, got {list(text_fields)}")
    if path.endswith((".jsonl", ".json")):
        numbered = _load_jsonl(path, text_fields, label_field, max_rows)
    else:
        numbered = _load_tsv(path, text_fields, label_field, max_rows, columns)
    if numeric_labels:
        for number, (_, label) in numbered:
            if not _is_number(label):
                raise DataFileError(path, number, f"the label {label!r} ({label_field}) is "
                                    "not a number",
                                    "a regression task's labels are numbers (e.g. STS-B's "
                                    "scores, 0 to 5): check label_field, or make the task a "
                                    "classification (its kind)")
    return [example for _, example in numbered]


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False
