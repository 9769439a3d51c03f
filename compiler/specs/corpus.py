"""The corpus stage's settings (the built-in corpus made from the Python standard library)
and its summary."""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, setting
from runexp.compiler.specs.outputs import Summary, output


@dataclasses.dataclass(frozen=True)
class CorpusSpec(Spec):
    """`builtin_corpus` in gin: text every Python install has, split for pretraining,
    held-out evaluation and a small fine-tune task."""

    source: str = setting("python_stdlib_docstrings", "which built-in corpus", gin=None,
                          choices=("python_stdlib_docstrings",), shown=True)
    min_bytes: int = setting(2_000_000, "fail unless the train text has at least this many "
                                        "bytes", minimum=1)
    heldout_fraction: float = setting(0.05, "share of documents held out", minimum=0.0,
                                      maximum=1.0, shown=True)
    finetune_classes: int = setting(6, "labels of the fine-tune task (stdlib packages)",
                                    minimum=2, shown=True)
    seed: int = setting(12345, "seed of the splits")
    python_version: str = setting("", "the Python whose library is read (the running one)",
                                  gin=None)


@dataclasses.dataclass(frozen=True)
class CorpusText(Summary):
    """One text file of the corpus."""

    documents: Optional[int] = output("documents")
    sentences: Optional[int] = output("sentences (lines)")
    bytes: Optional[int] = output("bytes of text")


@dataclasses.dataclass(frozen=True)
class CorpusExamples(Summary):
    """The fine-tune task's examples."""

    train: Optional[int] = output("examples of finetune_train.tsv")
    dev: Optional[int] = output("examples of finetune_dev.tsv (from held-out documents)")


@dataclasses.dataclass(frozen=True)
class CorpusSummary(Summary):
    """The corpus stage's summary."""

    train: Optional[CorpusText] = output("train.txt", record=CorpusText)
    heldout: Optional[CorpusText] = output("heldout.txt", record=CorpusText)
    finetune_examples: Optional[CorpusExamples] = output("the fine-tune task's examples",
                                                         record=CorpusExamples)
    labels: Optional[list] = output("the fine-tune task's labels (stdlib packages)")

    def splits(self) -> dict:
        """The text files written, by name, train first."""
        return self.entries(CorpusText)
