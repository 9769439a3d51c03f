"""A look at the start of each local corpus file before anything runs: is it text?

Reads at most SAMPLE_BYTES of each file (and of at most MAX_FILES files of a glob), so the
dry run stays fast on a corpus of thousands of files. What it refuses would otherwise cost a
vocab, a preprocess and hours of pretraining on garbage, with every stage marked COMPLETED:

- a file of another kind: compressed (gzip, bzip2, xz, zstd, zip) or binary (NUL bytes, or
  mostly bytes that are not UTF-8 text);
- no usable text: empty, only blank lines, or (for line formats) no line break in a large
  sample, i.e. not one sentence/paragraph/JSON object per line.

Standard library only.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

SAMPLE_BYTES = 1 << 16
MAX_FILES = 200

_MAGIC = {b"\x1f\x8b": ("gzip", "gunzip"), b"BZh": ("bzip2", "bunzip2"),
          b"\xfd7zXZ\x00": ("xz", "unxz"), b"\x28\xb5\x2f\xfd": ("zstd", "unzstd"),
          b"PK\x03\x04": ("zip", "unzip")}


def _problem(path: str, sample: bytes, size: int) -> Optional[tuple[str, str]]:
    """(what is wrong, what to do) of one file, from its first bytes; None if it is text."""
    for magic, (kind, tool) in _MAGIC.items():
        if sample.startswith(magic):
            return (f"{kind}-compressed, not text",
                    f"decompress it first ({tool} {os.path.basename(path)}) and point the "
                    "task at the text")
    if b"\x00" in sample:
        return ("binary data, not text (it has NUL bytes)",
                "give text files: one sentence (or paragraph, or JSON object) per line")
    text = sample.decode("utf-8", "replace")
    if sample and text.count("\ufffd") > 0.3 * len(text):
        return ("mostly not UTF-8 text",
                "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)")
    if not text.strip():
        return ("no text: the file is empty" if size == 0 else "no text: only blank lines",
                "remove it from the glob, or fill it")
    if size > SAMPLE_BYTES and "\n" not in text:
        return (f"no line break in its first {SAMPLE_BYTES // 1024} KB: not one sentence, "
                "paragraph or JSON object per line",
                "put one sentence per line (a blank line between documents), or choose "
                "format = 'paragraphs' after breaking the text into lines")
    return None


def check_files(paths: Iterable[str]) -> list[tuple[str, str, str]]:
    """(path, what is wrong, hint) for each file sampled that is not usable text."""
    out = []
    for n, path in enumerate(paths):
        if n >= MAX_FILES:
            break
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                sample = f.read(SAMPLE_BYTES)
        except OSError as e:
            out.append((path, f"cannot be read ({e.strerror})", "check its permissions"))
            continue
        problem = _problem(path, sample, size)
        if problem:
            out.append((path, *problem))
    return out
