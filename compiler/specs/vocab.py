"""The vocab stage's settings (adopt a vocabulary file, or train one) and its summary."""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, setting
from runexp.compiler.specs.outputs import Summary, output


# BERT's special tokens, ids 0..4 in the vocabularies runexp trains; an adopted vocab.txt
# must have them (anywhere: Google's have them at 0 and 100-103).
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclasses.dataclass(frozen=True)
class VocabSpec(Spec):
    """`vocab` in gin. An adopted vocab's plan carries only vocab_path, do_lower_case and
    vocab_size (counted in the file); a trained one's also the training settings."""

    vocab_path: Optional[str] = setting(None, "BERT vocab.txt or SentencePiece .model to adopt; "
                                              "None trains one", gin="path", shown=True)
    vocab_size: int = setting(30522, "vocabulary size to train", gin="size", minimum=16, shown=True)
    vocab_type: str = setting("wordpiece", "what to train: wordpiece (a BERT vocab.txt every BERT "
                                           "tokenizer reads alike) or sentencepiece (spm.model "
                                           "only, ALBERT-style)", gin="type",
                              choices=("wordpiece", "sentencepiece"), shown=True)
    do_lower_case: bool = setting(True, "lower-case (and strip accents) before tokenising",
                                  shown=True)
    model_type: str = setting("unigram", "SentencePiece model type (vocab_type = 'sentencepiece')",
                              choices=("unigram", "bpe"), shown=True)
    max_sentences: int = setting(1_000_000, "sentences sampled to train the vocab", minimum=1,
                                 shown=True)
    seed: int = setting(12345, "sampling seed")

    def _check_values(self, skip: tuple = ()) -> None:
        # An adopted vocab's size is counted in its file: the bounds are for training one.
        super()._check_values(skip + (("vocab_size",) if self.vocab_path else ()))


@dataclasses.dataclass(frozen=True)
class VocabSummary(Summary):
    """The vocab stage's summary (report.json holds more)."""

    vocab_size: Optional[int] = output("tokens in the vocabulary")
    unk_rate: Optional[float] = output("share of [UNK] pieces in the diagnostic text")
    pieces_per_word: Optional[float] = output("pieces per whitespace word there")
    type: Optional[str] = output("wordpiece or sentencepiece")
    diagnostics_on: Optional[str] = output("the diagnostic text: heldout, train sample, or no "
                                           "text (none given)")
    warning: Optional[str] = output("why the vocab looks wrong (an UNK rate over 1%), also "
                                    "printed", optional=True)
