"""The evaluate stage's settings and its summary: held-out MLM/NSP metrics of the
pretrained encoder, against the majority-token baseline."""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, setting
from runexp.compiler.specs.outputs import Summary, output


@dataclasses.dataclass(frozen=True)
class EvaluateSpec(Spec):
    """`evaluate` in gin (plus `evaluate.enabled`, which decides whether the stage exists)."""

    model: dict = setting(None, "the encoder's bert_config (the pretrain stage's)", gin=None)
    batch_size: int = setting(64, "evaluation batch size", minimum=1, shown=True)
    max_examples: Optional[int] = setting(None, "cap on evaluated examples", minimum=1, shown=True)
    max_seq_length: int = setting(128, "tokens per example (the preprocess stage's)", gin=None)
    max_predictions_per_seq: int = setting(20, "masked positions per example (the preprocess "
                                               "stage's)", gin=None)


@dataclasses.dataclass(frozen=True)
class HeldOutScores(Summary):
    """One evaluation: of the held-out split, or of one member of a mixture."""

    mlm_accuracy: Optional[float] = output("masked-LM accuracy on the held-out split")
    mlm_loss: Optional[float] = output("masked-LM loss (nats per masked token)")
    nsp_accuracy: Optional[float] = output("next-sentence (pair objective) accuracy")
    examples: Optional[int] = output("held-out examples evaluated")
    majority_token_accuracy: Optional[float] = output(
        "the baseline: accuracy of always predicting the train split's most frequent masked "
        "token (a mixture: each member's own, pooled)")
    majority_token_id: Optional[int] = output("that token's id (not for a mixture's pool)",
                                              optional=True)


@dataclasses.dataclass(frozen=True)
class EvaluateSummary(HeldOutScores):
    """The evaluate stage's summary (and its metrics.json): a mixture's scores pool every
    member's held-out examples, and ``tasks`` holds each member's own."""

    tasks: Optional[dict] = output("a mixture's members' own scores", each=HeldOutScores,
                                   optional=True, named="task")
    step: Optional[int] = output("the evaluated checkpoint's training step")
