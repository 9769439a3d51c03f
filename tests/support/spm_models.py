"""SentencePiece models in other projects' layouts, trained on real text for the tests.

- ALBERT's (its released ``30k-clean.model``): ``pad_id=0 unk_id=1 eos_id=-1 bos_id=-1
  control_symbols=[CLS],[SEP],[MASK] user_defined_symbols=(,),",-,.,–,£,€``, unigram, on
  lower-cased text: ``<pad>`` 0, ``<unk>`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4.
- T5's: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, and no [CLS], [SEP] or [MASK].

Text: stdlib docstring and comment sentences (tasks/sources/stdlib_corpus.py, the quickstart's).
"""

from __future__ import annotations

import io
import itertools

from runexp.tasks.sources import stdlib_corpus

ALBERT_USER_DEFINED = ["(", ")", '"', "-", ".", "\u2013", "\u00a3", "\u20ac"]
ALBERT_ROLES = {"[PAD]": "<pad>", "[UNK]": "<unk>", "[CLS]": "[CLS]", "[SEP]": "[SEP]",
                "[MASK]": "[MASK]"}


def corpus_lines(step: int = 8, start: int = 0) -> list[str]:
    """The sentences of every ``step``-th stdlib module from ``start``."""
    out = []
    for _, path in itertools.islice(stdlib_corpus.iter_stdlib_modules(), start, None, step):
        docstrings, comments = stdlib_corpus.module_sentences(path)
        out += docstrings + comments
    return out


def train_albert_style(lines, path: str, vocab_size: int = 2000) -> bytes:
    """Trains a model with ALBERT's settings on ``lines`` lower-cased; writes it to ``path``
    and returns its bytes."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line.lower() for line in lines]), model_writer=model,
        vocab_size=vocab_size, model_type="unigram", pad_id=0, unk_id=1, eos_id=-1,
        bos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        user_defined_symbols=ALBERT_USER_DEFINED, character_coverage=0.99995,
        hard_vocab_limit=False, num_threads=2, minloglevel=2)
    with open(path, "wb") as f:
        f.write(model.getvalue())
    return model.getvalue()


def train_t5_style(lines, path: str, vocab_size: int = 500) -> None:
    """Trains a model in T5's layout (no [CLS], [SEP], [MASK]) and writes it to ``path``."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, num_threads=2,
        minloglevel=2)
    with open(path, "wb") as f:
        f.write(model.getvalue())
