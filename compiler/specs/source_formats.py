"""The source formats of a pretraining task (``bert_pretraining_task.format``): one row each.

``SOURCE_FORMATS`` is the one list of them. The ``format`` setting's choices, the docs of the
source settings (which formats each applies to), the hints naming formats and the settings a
format's plan keeps all derive from it; the compiler and the preprocess and vocab stages ask a
format's row (or, for text, its reader class) what to do, never its name.

A text format's row names the class that reads its files (tasks/sources/text_formats.py
``TextReader``: a byte segment of a file as document text, sentences and document breaks).
A new text format is that class and its row here (and its line in README.md's table).

Stdlib only: the compiler imports it, never the reader classes.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

TEXT_FILES = "text files"      # the preprocess workers read byte ranges of train_files
TFDS_DATASET = "tfds dataset"  # a prepared TFDS dataset, read through seqio at run time
SEQIO_TASK = "seqio task"      # the user's registered seqio task, read at run time
RECORD_FILES = "record files"  # ready-made TFRecords (train_files), adopted as they are


@dataclasses.dataclass(frozen=True)
class SourceFormat:
    """One source format: what it reads and which SourceSpec settings besides ``format``
    apply to it (the others stay out of its plan)."""

    name: str
    reads: str                    # TEXT_FILES, TFDS_DATASET, SEQIO_TASK or RECORD_FILES
    doc: str                      # what the input is (docs/STAGES.md's table of formats)
    settings: tuple = ()          # the settings it reads besides format
    makes_instances: bool = True  # runexp cuts documents into BERT instances; else the
                                  # examples come ready-made (and need their vocab)
    reader: str = ""              # a text format's reader class, "module:Class" (imported
                                  # by tasks/sources/text_formats.py ``reader_class``, never here)

    @property
    def reads_text_files(self) -> bool:
        return self.reads == TEXT_FILES

    @property
    def reads_seqio(self) -> bool:
        return self.reads in (TFDS_DATASET, SEQIO_TASK)


_READERS = "runexp.tasks.sources.text_formats"
_SPLITS = ("train_split", "validation_split")

SOURCE_FORMATS: dict[str, SourceFormat] = {f.name: f for f in (
    SourceFormat("sentence_lines", TEXT_FILES,
                 "text files: one sentence per line, a blank line between documents "
                 "(google-research/bert's format)",
                 reader=f"{_READERS}:SentenceLines"),
    SourceFormat("paragraphs", TEXT_FILES,
                 "text files: running text, a blank line between documents; sentences found "
                 "by punctuation, hard-wrapped lines joined",
                 reader=f"{_READERS}:Paragraphs"),
    SourceFormat("jsonl", TEXT_FILES,
                 "text files: one JSON object per line, a document each, its text in "
                 "text_field",
                 ("text_field",), reader=f"{_READERS}:Jsonl"),
    SourceFormat("tfds", TFDS_DATASET,
                 "a prepared TFDS dataset, read with seqio.TfdsDataSource",
                 ("text_field", "tfds_name", "tfds_data_dir") + _SPLITS),
    SourceFormat("seqio_documents", SEQIO_TASK,
                 "the user's seqio task of raw documents (a gin import registers it)",
                 ("text_field", "seqio_task") + _SPLITS),
    SourceFormat("seqio_bert_features", SEQIO_TASK,
                 "the user's seqio task emitting BERT's features",
                 ("seqio_task",) + _SPLITS, makes_instances=False),
    SourceFormat("bert_tfrecord", RECORD_FILES,
                 "TFRecords written by google-research/bert's create_pretraining_data.py",
                 makes_instances=False),
)}

FORMATS = tuple(SOURCE_FORMATS)
TEXT_FORMATS = tuple(f.name for f in SOURCE_FORMATS.values() if f.reads_text_files)
DOCUMENT_FORMATS = tuple(f.name for f in SOURCE_FORMATS.values() if f.makes_instances)


def applies_to(setting: str) -> tuple[str, ...]:
    """The formats that read ``setting``."""
    return tuple(f.name for f in SOURCE_FORMATS.values() if setting in f.settings)


def listed(names: Iterable[str], quote: bool = False) -> str:
    """``a, b or c`` (``'a', 'b' or 'c'`` quoted)."""
    names = [repr(n) if quote else n for n in names]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
