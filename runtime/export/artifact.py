"""What one export artifact is (``Artifact``: what it is, how it is loaded, how it is
written) and what its methods are given. The rows of the export, built-in and new, are in
runtime/export/artifacts.py ``ARTIFACTS``; a new one subclasses ``Artifact`` in its own
module, importing this one (light) and its heavy libraries inside ``write``."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

from runexp.runtime.export.readme import ExportFacts


@dataclasses.dataclass(frozen=True)
class Snippet:
    """A paragraph of the report's "Loading them": ``text`` (`code` in backticks; a side
    note when ``note``), then ``code``."""

    text: str = ""
    code: str = ""
    note: bool = False


@dataclasses.dataclass(frozen=True)
class Where:
    """What the report's snippets know of an export: where its files are, the sequence
    length of the experiment, whether the vocabulary is SentencePiece."""

    at: Callable[[str], str]  # a path in the export -> its full path
    seq_length: int
    sentencepiece: bool


@dataclasses.dataclass
class ExportJob:
    """What the writers get: the restored model, where to write, and the facts the README
    states (a writer may add to them: ``write`` returns the fields it learnt)."""

    model: Any  # BertPretrainer, or BertClassifier for a fine-tuned export
    config: Any  # its BertConfig
    out: str  # the export directory
    vocab_dir: str  # the vocab stage's directory
    vocab_path: str  # the file that is the vocabulary (vocab.txt or spm.model) in it
    facts: ExportFacts

    def path(self, artifact: "Artifact") -> str:
        return os.path.join(self.out, artifact.path.rstrip("/"))


class Artifact:
    """One thing the export stage writes.

    Attributes:
      path: where, under the export directory: ``encoder/`` for a directory,
        ``bert_model.ckpt.*`` for a checkpoint's files.
      key: the export summary's key holding its path (None: not in the summary).
      note: what it is, in one line (the report's artifacts table).
      said: its name in the stage's closing progress line (None: ``path``; "": left out).
    """

    path: str = ""
    key: Optional[str] = None
    note: str = ""
    said: Optional[str] = None

    def present(self, facts: ExportFacts) -> bool:
        """Whether an export with these facts has it."""
        return True

    def describe(self, facts: ExportFacts) -> str:
        """What it is: the README's files table."""
        return self.note

    def readme(self, facts: ExportFacts) -> str:
        """How to load it: a section of the README ("" for none)."""
        return ""

    def snippets(self, where: Where) -> list[Snippet]:
        """How to load it: the report's paragraphs."""
        return []

    def write(self, job: ExportJob) -> Optional[dict]:
        """Writes it; returns facts it learnt (ExportFacts fields), if any."""
        raise NotImplementedError
