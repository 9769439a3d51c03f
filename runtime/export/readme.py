"""The export directory's README.md: what each file is and how each consumer loads it, with
this export's own vocabulary type, casing, sequence length and labels filled in. The files
and how to load each are the rows of runtime/export/artifacts.py; this is the page around
them."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence


@dataclasses.dataclass(frozen=True)
class ExportFacts:
    """What the README states about one export."""

    step: int
    parameters: int
    layers: int
    hidden: int
    vocab_type: str                  # "wordpiece" or "sentencepiece"
    do_lower_case: bool
    seq_length: int
    seq_length_source: str           # why this length, one phrase
    vocab_files: Sequence[str]       # copied next to the checkpoint
    labels: Optional[Sequence[str]] = None       # a fine-tuned export's label names
    text_fields: Optional[Sequence[str]] = None  # its task's text fields
    task: str = ""
    special_ids: Optional[dict] = None          # {"[CLS]": 2, ...}
    huggingface_files: Sequence[str] = ()       # written into huggingface/

    @property
    def finetuned(self) -> bool:
        return self.labels is not None


def specials(f: ExportFacts) -> str:
    """The special tokens' ids, for the README's text: "`[CLS]` 2, `[SEP]` 3"."""
    ids = f.special_ids or {}
    return ", ".join(f"`{token}` {i}" for token, i in ids.items()) or "see spm.model"


def _files_table(f: ExportFacts, artifacts: Sequence) -> str:
    return "\n".join(["| path | what |", "| --- | --- |"]
                     + [f"| `{a.path}` | {a.describe(f)} |" for a in artifacts])


def render(f: ExportFacts, artifacts: Sequence) -> str:
    """README.md's text: what the export holds, then each of ``artifacts``
    (runtime/export/artifacts.py ARTIFACTS) that it has: what it is, how to load it."""
    present = [a for a in artifacts if a.present(f)]
    spm = f.vocab_type == "sentencepiece"
    lower = "True" if f.do_lower_case else "False"
    vocab = ("SentencePiece (`spm.model`"
             + (", text lower-cased before it" if f.do_lower_case else ", cased") + ")"
             if spm else "WordPiece (`vocab.txt`, google-research/bert's tokenizer, "
             + ("uncased: lower-cased, accents stripped" if f.do_lower_case else "cased")
             + ")")
    what = (f"the encoder and classifier fine-tuned on {f.task or 'the task'} "
            f"(labels {', '.join(f.labels)}; text field(s) "
            f"{', '.join(f.text_fields or ())})" if f.finetuned
            else "the pretrained encoder")
    intro = f"""# runexp export

This directory holds {what}, at training step {f.step}: {f.layers} layers, hidden size
{f.hidden}, {f.parameters:,} parameters.

- Vocabulary: {vocab}; `do_lower_case = {lower}`.
- Sequence length of `preprocessing/`{' and `classifier/`' if f.finetuned else ''}:
  {f.seq_length} ({f.seq_length_source}). The encoder itself takes any length up to
  `max_position_embeddings` in `bert_config.json`.

{_files_table(f, present)}
"""
    return "\n".join([intro] + [text for text in (a.readme(f) for a in present) if text])
