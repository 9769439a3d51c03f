"""The corpus stage's settings: the built-in corpus made from the Python standard library."""

from __future__ import annotations

import dataclasses

from runexp.compiler.specs.base import Spec, setting


@dataclasses.dataclass(frozen=True)
class CorpusSpec(Spec):
    """`builtin_corpus` in gin: text every Python install has, split for pretraining,
    held-out evaluation and a small fine-tune task."""

    source: str = setting("python_stdlib_docstrings", "which built-in corpus", gin=None,
                          choices=("python_stdlib_docstrings",))
    min_bytes: int = setting(2_000_000, "fail unless the train text has at least this many "
                                        "bytes", minimum=1)
    heldout_fraction: float = setting(0.05, "share of documents held out", minimum=0.0,
                                      maximum=1.0)
    finetune_classes: int = setting(6, "labels of the fine-tune task (stdlib packages)",
                                    minimum=2)
    seed: int = setting(12345, "seed of the splits")
    python_version: str = setting("", "the Python whose library is read (the running one)",
                                  gin=None)
