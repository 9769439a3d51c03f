"""The evaluate stage's settings: held-out MLM/NSP metrics of the pretrained encoder."""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, setting


@dataclasses.dataclass(frozen=True)
class EvaluateSpec(Spec):
    """`evaluate` in gin (plus `evaluate.enabled`, which decides whether the stage exists)."""

    model: dict = setting(None, "the encoder's bert_config (the pretrain stage's)", gin=None)
    batch_size: int = setting(64, "evaluation batch size", minimum=1)
    max_examples: Optional[int] = setting(None, "cap on evaluated examples", minimum=1)
    max_seq_length: int = setting(128, "tokens per example (the preprocess stage's)", gin=None)
    max_predictions_per_seq: int = setting(20, "masked positions per example (the preprocess "
                                               "stage's)", gin=None)
