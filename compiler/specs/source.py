"""Where a pretraining task's text (or examples) comes from: a nested part of PreprocessSpec.

Every source ends in the same place: the preprocess stage writes the task's seqio cache, so
pretraining, evaluation and `runexp.tasks.register` read every source alike.

Text sources, read in byte ranges by the preprocess workers (`train_files` globs):
- ``sentence_lines``: one sentence per line, a blank line between documents
  (google-research/bert's ``create_pretraining_data.py`` format);
- ``paragraphs``: running text, a blank line between documents; sentences are found by
  punctuation (Latin ``. ! ?``, CJK ``。！？``, Arabic ``؟``), lines broken mid-sentence joined;
- ``jsonl``: one JSON object per line, a document each, its text in ``text_field``.

seqio sources, read through seqio at run time (no `train_files`):
- ``tfds``: a TFDS dataset (``tfds_name``, ``tfds_data_dir``) read with
  ``seqio.TfdsDataSource``; documents in ``text_field``;
- ``seqio_documents``: a seqio task of the user's (``seqio_task``, registered by a module the
  gin file imports) whose examples are documents in a string feature ``text_field``;
  runexp makes BERT instances from them;
- ``seqio_bert_features``: a seqio task of the user's that already emits BERT's features
  (``input_ids``, ``input_mask``, ``segment_ids``, ``masked_lm_positions``,
  ``masked_lm_ids``, ``masked_lm_weights``, ``next_sentence_labels``); cached as it is.

Examples made elsewhere:
- ``bert_tfrecord``: TFRecords written by google-research/bert's
  ``create_pretraining_data.py`` (`train_files` globs), adopted as they are: checked against
  ``max_seq_length`` and ``max_predictions_per_seq`` and copied into the task's cache.
"""

from __future__ import annotations

import dataclasses

from runexp.compiler.specs.base import Spec, setting
from runexp.compiler.specs.source_formats import (FORMATS, SOURCE_FORMATS, SourceFormat,
                                                  applies_to, listed)


def _for(doc: str, name: str) -> str:
    """A setting's doc, with the formats it applies to (compiler/specs/source_formats.py)."""
    return f"{doc} ({', '.join(applies_to(name))})"


@dataclasses.dataclass(frozen=True)
class SourceSpec(Spec):
    """Where a bert_pretraining_task's documents or examples come from (module docstring)."""

    format: str = setting("sentence_lines", f"the input's format: {listed(FORMATS)}",
                          choices=FORMATS, shown=True)
    text_field: str = setting("text", _for("the field holding a document's text",
                                           "text_field"))
    tfds_name: str = setting("", _for("TFDS dataset as name[/config][:version]", "tfds_name"))
    tfds_data_dir: str = setting("", _for("TFDS data directory ('' : TFDS's default)",
                                          "tfds_data_dir"))
    seqio_task: str = setting("", _for("name of the user's registered seqio task",
                                       "seqio_task"))
    train_split: str = setting("train", _for("the source's split read as train",
                                             "train_split"))
    validation_split: str = setting("", _for("the source's split read as validation "
                                             "('': none)", "validation_split"))

    @property
    def source_format(self) -> SourceFormat:
        """The format's row (compiler/specs/source_formats.py)."""
        return SOURCE_FORMATS[self.format]

    @property
    def reads_text_files(self) -> bool:
        return self.source_format.reads_text_files

    @property
    def reads_seqio(self) -> bool:
        return self.source_format.reads_seqio

    @property
    def makes_instances(self) -> bool:
        """runexp cuts documents into BERT instances (needs a vocabulary); else the examples
        come ready-made."""
        return self.source_format.makes_instances
