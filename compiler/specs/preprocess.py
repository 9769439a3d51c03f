"""The preprocess stage's settings (how a corpus becomes BERT pretraining examples) and its
summary.

`bert_pretraining_task` in gin; a task's scope is its name (`wiki/bert_pretraining_task.*`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from runexp.compiler.specs.base import Spec, nested, setting
from runexp.compiler.specs.outputs import Summary, output
from runexp.compiler.specs.runner import RunnerSpec
from runexp.compiler.specs.source import SourceSpec

_ONE_MODEL = "same: one model reads every task's examples"

# In a preprocess stage with keep_split_index: the tokenised splits (tasks/instances/split_index.py),
# <stage dir>/split_index/<split>/, which a later pretraining phase's preprocess stage reads
# (its input split_index_dir).
SPLIT_INDEX_DIR = "split_index"
_AT_ONCE = "same_if_dynamic: a batch of examples masked at training time is masked at once"
# Packing (tasks/instances/packing.py): instances per packed row at most, as Graphcore's and NVIDIA's
# packed BERT.
MAX_INSTANCES_PER_ROW = 3


def packed_max_predictions(max_seq_length: int, max_predictions_per_seq: int,
                           masked_lm_prob: float,
                           max_instances: int = MAX_INSTANCES_PER_ROW) -> int:
    """The prediction slots of a packed row: enough for any row (tasks/instances/packing.py), and
    fewer than ``max_instances x max_predictions_per_seq`` (the row's tokens bound them)."""
    bound = int(max_seq_length * masked_lm_prob + 1e-6) + max_instances  # floor: both >= 0
    return max(1, min(max_instances * max_predictions_per_seq, bound))


@dataclasses.dataclass(frozen=True)
class MaskingSpec(Spec):
    """Which positions are predicted and what they are replaced with (BERT's 80/10/10)."""

    max_predictions_per_seq: int = setting(20, "masked positions per example", minimum=1,
                                           mixture=_ONE_MODEL, phase=True, shown=True)
    masked_lm_prob: float = setting(0.15, "share of tokens masked", minimum=0.0, maximum=1.0,
                                    mixture=_AT_ONCE, shown=True)
    mask_token_prob: float = setting(0.8, "of masked positions, share replaced by [MASK]",
                                     minimum=0.0, maximum=1.0, mixture=_AT_ONCE)
    random_token_prob: float = setting(0.1, "of masked positions, share replaced by a random "
                                            "token", minimum=0.0, maximum=1.0, mixture=_AT_ONCE)
    whole_word_masking: bool = setting(False, "mask whole words", mixture=_AT_ONCE, shown=True)
    ngram_max: int = setting(1, "mask whole-word n-grams up to this length (p ~ 1/n); 1: single "
                                "words", minimum=1)
    word_segmenter: str = setting("", "what a whole word is: '' a WordPiece word (## pieces "
                                      "join the piece before); 'jieba' also a Chinese word "
                                      "jieba finds (its characters are masked together, as "
                                      "Chinese-BERT-wwm; WordPiece vocabs)",
                                  choices=("", "jieba"), shown=True)

    def __post_init__(self):
        if self.mask_token_prob + self.random_token_prob > 1 + 1e-9:
            raise ValueError("MaskingSpec: mask_token_prob + random_token_prob must be at most 1, "
                             f"got {self.mask_token_prob} + {self.random_token_prob}")
        if self.word_segmenter and not self.word_level:
            raise ValueError("MaskingSpec: word_segmenter finds the words of whole-word masking: "
                             "set whole_word_masking = True (or ngram_max > 1)")

    @property
    def word_level(self) -> bool:
        """Masks choose words, not pieces (needs a table of word-start ids)."""
        return bool(self.whole_word_masking) or self.ngram_max > 1


@dataclasses.dataclass(frozen=True)
class PreprocessSpec(Spec):
    """One bert_pretraining_task: instances, pairing and masking of its corpus."""

    task: str = setting("", "the task's name (its gin scope)", gin=None, shown=True)
    source: SourceSpec = nested(SourceSpec, "where the documents or examples come from")
    max_seq_length: int = setting(128, "tokens per example", minimum=8, mixture=_ONE_MODEL,
                                  phase=True, shown=True)
    masking: MaskingSpec = nested(MaskingSpec, "which positions are predicted, and how")
    dupe_factor: int = setting(5, "static masks per instance (times each document is used)",
                               minimum=1, shown=True)
    short_seq_prob: float = setting(0.1, "share of shorter target lengths", minimum=0.0,
                                    maximum=1.0)
    random_next_prob: float = setting(0.5, "share of random next segments", minimum=0.0,
                                      maximum=1.0)
    pair_objective: str = setting("nsp", "next-sentence (nsp), sentence-order (sop) or single "
                                         "segments", choices=("nsp", "sop", "none"), shown=True)
    dynamic_masking: bool = setting(False, "mask the train split at training time, anew each "
                                           "epoch (RoBERTa); validation stays statically masked",
                                    mixture="same: a batch mixes the tasks' examples", shown=True)
    random_seed: int = setting(12345, "seed of instance creation and masking")
    packing: bool = setting(False, "pack up to 3 instances into each train row (attention "
                                   "stays within an instance; validation stays unpacked): "
                                   "fewer padding tokens per step", mixture=_ONE_MODEL,
                            phase=True)
    num_shards: int = setting(0, "output shards per split (0: chosen from the corpus size)",
                              minimum=0)
    num_workers: int = setting(0, "worker processes (0: one per core)", minimum=0)
    execution: RunnerSpec = nested(RunnerSpec, "where the shards are built: local worker "
                                               "processes or Apache Beam (not in the "
                                               "fingerprint: the records are the same)")
    do_lower_case: bool = setting(True, "lower-case before tokenising (the vocab's setting)",
                                  gin=None)
    keep_split_index: bool = setting(False, "keep the tokenised splits in split_index/: a "
                                            "later pretraining phase makes its examples from "
                                            "them", gin=None)

    def __post_init__(self):
        if self.dynamic_masking and self.masking.ngram_max > 1:
            raise ValueError("PreprocessSpec: dynamic_masking does not do n-gram masking: use "
                             "ngram_max = 1")

    def is_dynamic(self, split: str) -> bool:
        """Only the train split is masked at training time; validation keeps static masks,
        so evaluations stay comparable across runs."""
        return bool(self.dynamic_masking) and split == "train"

    def is_packed(self, split: str) -> bool:
        """Only the train split is packed; validation keeps one instance a row, so held-out
        numbers compare with unpacked runs."""
        return bool(self.packing) and split == "train"

    @property
    def predictions_per_row(self) -> int:
        """Prediction slots of a train row: packed_max_predictions when packed."""
        m = self.masking
        if not self.packing:
            return m.max_predictions_per_seq
        return packed_max_predictions(self.max_seq_length, m.max_predictions_per_seq,
                                      m.masked_lm_prob)


@dataclasses.dataclass(frozen=True)
class PackedRows(Summary):
    """A packed split's rows (tasks/instances/pretraining_shards.py packing_summary)."""

    instances: Optional[int] = output("instances packed")
    rows: Optional[int] = output("rows they fill")
    factor: Optional[float] = output("instances a row")
    fill: Optional[float] = output("real tokens over row tokens")
    unpacked_fill: Optional[float] = output("the same with one instance a row")


@dataclasses.dataclass(frozen=True)
class SplitCounts(Summary):
    """One split's examples."""

    documents: Optional[int] = output("documents read", optional=True)
    instances: Optional[int] = output("instances (examples) written")
    tokens: Optional[int] = output("tokens in them")
    masked: Optional[int] = output("masked positions (0 when masked at training time)")
    packing: Optional[PackedRows] = output("a packed split's rows", record=PackedRows,
                                           optional=True)
    input_bytes: Optional[int] = output("ready-made examples: bytes read", optional=True)
    files: Optional[int] = output("ready-made examples: files read", optional=True)


@dataclasses.dataclass(frozen=True)
class InputIssue(Summary):
    """One kind of bad input (compiler/specs/bad_input.py)."""

    count: Optional[int] = output("how many")
    samples: Optional[list] = output("up to 5 of them, file:line (file:0 for a whole file)")

    @classmethod
    def _from_value(cls, value: Any) -> "InputIssue":
        return cls(count=value)  # an early summary's bare count


@dataclasses.dataclass(frozen=True)
class PreprocessSummary(Summary):
    """The preprocess stage's summary: the splits built and what they cost."""

    train: Optional[SplitCounts] = output("the train split", record=SplitCounts,
                                          optional=True)
    validation: Optional[SplitCounts] = output("the validation split", record=SplitCounts,
                                               optional=True)
    num_shards: Optional[int] = output("ready-made examples: shards cached", optional=True)
    dynamic_masking: Optional[bool] = output("true when the train split is masked at "
                                             "training time", optional=True)
    unk_rate: Optional[float] = output("share of [UNK] tokens in the documents",
                                       optional=True)
    input_bytes: Optional[int] = output("bytes of text in the splits", optional=True)
    input_bytes_read: Optional[int] = output("bytes read by all workers together",
                                             optional=True)
    read_per_input_byte: Optional[float] = output("their ratio", optional=True)
    split_index_bytes: Optional[int] = output("with keep_split_index: the tokenised splits' "
                                              "bytes", optional=True)
    bad_input: Optional[dict] = output("each kind of bad input (compiler/specs/bad_input.py) "
                                       "counted", each=InputIssue, optional=True,
                                       named="kind")
    seconds: Optional[float] = output("seconds building the splits")
    mb_per_s: Optional[float] = output("ready-made examples: MB read a second", optional=True)

    def splits(self) -> dict:
        """The splits built, by name, train first."""
        return self.entries(SplitCounts)
