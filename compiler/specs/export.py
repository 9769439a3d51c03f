"""The export stage's settings and its summary: SavedModels, a Google-layout checkpoint,
bert_config.json, the vocabulary, a Hugging Face directory (runtime/export/artifacts.py)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, setting
from runexp.compiler.specs.outputs import Summary, output


@dataclasses.dataclass(frozen=True)
class ExportSpec(Spec):
    """`export` in gin (only `export.enabled`, which decides whether the stage exists)."""

    model: dict = setting(None, "the exported model's bert_config", gin=None)


@dataclasses.dataclass(frozen=True)
class ExportSummary(Summary):
    """The export stage's summary."""

    artifacts: dict = output("each directory's path, by the artifact's key (`encoder`, "
                             "`preprocessing`, `classifier`, `huggingface`: the rows of "
                             "runtime/export/artifacts.py)", spread=dict, named="artifact")
    point: Optional[str] = output("the sweep's point exported (its finetune stage's id)",
                                  optional=True)
    parameters: Optional[int] = output("the model's parameters")
    step: Optional[int] = output("the exported checkpoint's training step")
    seq_length: Optional[int] = output("the preprocessing's (and classifier's) sequence length")
    vocab_type: Optional[str] = output("wordpiece or sentencepiece")
    do_lower_case: Optional[bool] = output("whether text is lower-cased before tokenising")
    google_checkpoint: Optional[str] = output("the checkpoint's prefix, google-research/bert's "
                                              "layout")
    vocab_files: Optional[list] = output("the vocabulary files copied (vocab.txt, spm.model)")
