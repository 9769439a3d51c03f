"""The kinds of bad input the preprocess stage counts, declared once: the keys of its
summary's ``bad_input`` (and of ``stats.<split>.json``), which reader counts each, the
report's name for it, and what it means and what to do (the WARNING progress lines).

Bad input never fails a run and is never dropped silently (tasks/sources/text_files.py
``InputIssues`` counts it; tasks/sources/text_formats.py's readers and tasks/vocabulary/chinese_words.py note
it). Standard library only.

Usage:
    BAD_INPUT_KINDS["giant_lines"].label        # the report's row
    counted_by(EVERY_FORMAT)                     # the kinds every summary holds
"""

from __future__ import annotations

import dataclasses

# Which readers count a kind.
EVERY_FORMAT = "every format"  # always in a summary, from zero
JSONL = "jsonl"  # the jsonl reader's own, in a summary when that reader ran
WORD_SEGMENTER = "a word segmenter"  # counted when a word segmenter ran


@dataclasses.dataclass(frozen=True)
class BadInputKind:
    """Attributes:
      name: the key in the summary's ``bad_input``.
      counted: which readers count it (EVERY_FORMAT, JSONL, WORD_SEGMENTER).
      label: what the report calls it: what it is and what was done.
      meaning: what was done and what to do about it (the WARNING progress line).
    """

    name: str
    counted: str
    label: str
    meaning: str


BAD_INPUT_KINDS: dict[str, BadInputKind] = {k.name: k for k in (
    BadInputKind("non_utf8_lines", EVERY_FORMAT, "lines not in UTF-8 (bad bytes replaced)",
                 "bytes that are not UTF-8 became U+FFFD and were dropped, the rest of each "
                 "line kept; re-encode the files as UTF-8 (iconv -t UTF-8)"),
    BadInputKind("giant_lines", EVERY_FORMAT,
                 "giant lines, over 1 MiB; 64 MiB for jsonl (skipped)",
                 "lines over 1 MiB (64 MiB for jsonl) were skipped; break them up: one "
                 "sentence, paragraph or JSON object per line"),
    BadInputKind("empty_files", EVERY_FORMAT, "empty files",
                 "files with no text were read; check how they were written, or leave them "
                 "out of the globs"),
    BadInputKind("empty_documents", EVERY_FORMAT, "documents without a token",
                 "documents that give no token at all were left out; check that the text is "
                 "what the vocab reads (encoding, language)"),
    BadInputKind("invalid_json_lines", JSONL,
                 "jsonl lines that are not a JSON object (skipped)",
                 "jsonl lines that are not a JSON object were skipped; each line must be one "
                 "object such as {\"text\": \"...\"}"),
    BadInputKind("missing_text_lines", JSONL,
                 "jsonl lines without a string in the text field (skipped)",
                 "jsonl objects without a string in the text field were skipped; set "
                 "text_field to the key holding the text (a dotted path such as meta.body "
                 "for a nested one)"),
    BadInputKind("empty_text_lines", JSONL,
                 "jsonl lines whose text is only whitespace (skipped)",
                 "jsonl objects whose text is empty were skipped; leave them out when "
                 "writing the files if that is expected"),
    BadInputKind("unsegmented_lines", WORD_SEGMENTER,
                 "lines whose Chinese words could not be lined up with their tokens "
                 "(character masking kept)",
                 "lines whose segmented Chinese words could not be lined up with BERT's "
                 "characters keep character masking; please report one"),
)}


def counted_by(counted: str) -> tuple[str, ...]:
    """The kinds those readers count, in the table's order."""
    return tuple(k.name for k in BAD_INPUT_KINDS.values() if k.counted == counted)
