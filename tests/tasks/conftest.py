"""Shared real data for the tasks tests: the stdlib corpus, a small slice of it, vocabs."""

import itertools
import json
import os

import pytest

from runexp.tasks.sources import stdlib_corpus
from runexp.tasks.vocabulary import vocab_dir
from runexp.tasks.sources.text_documents import iter_documents, sample_lines


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    """The quickstart corpus, written as the corpus stage writes it."""
    out = str(tmp_path_factory.mktemp("corpus"))
    corpus = stdlib_corpus.build_corpus(min_bytes=2_000_000, heldout_fraction=0.05,
                                        finetune_classes=6, seed=0)
    summary = stdlib_corpus.write_corpus(corpus, out)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f)
    return out


@pytest.fixture(scope="session")
def small_corpus(corpus_dir, tmp_path_factory):
    """About 300 KB of the train documents, and 30 KB of held-out text."""
    out = tmp_path_factory.mktemp("small")
    for name, budget in (("train.txt", 300_000), ("heldout.txt", 30_000)):
        docs, size = [], 0
        for doc in iter_documents([os.path.join(corpus_dir, name)]):
            docs.append("".join(s + "\n" for s in doc))
            size += len(docs[-1])
            if size >= budget:
                break
        (out / name).write_text("\n".join(docs), encoding="utf-8")
    return str(out)


@pytest.fixture(scope="session")
def spm_dir(small_corpus, tmp_path_factory):
    """A 2000-piece unigram SentencePiece vocab trained on the small corpus, lower-cased."""
    out = str(tmp_path_factory.mktemp("spm"))
    lines = sample_lines([os.path.join(small_corpus, "train.txt")], 50_000, seed=0)
    vocab_dir.train_sentencepiece(lines, out, vocab_size=2000, do_lower_case=True,
                                  model_type="unigram")
    heldout = list(itertools.chain(*iter_documents([os.path.join(small_corpus, "heldout.txt")])))
    vocab_dir.write_report(out, "sentencepiece", True, heldout)
    return out


@pytest.fixture(scope="session")
def wordpiece_dir(small_corpus, tmp_path_factory):
    """A 2000-token WordPiece vocab.txt trained on the small corpus, lower-cased (what the
    vocab stage trains by default)."""
    out = str(tmp_path_factory.mktemp("wordpiece"))
    lines = sample_lines([os.path.join(small_corpus, "train.txt")], 50_000, seed=0)
    vocab_dir.train_vocab("wordpiece", lines, out, vocab_size=2000, do_lower_case=True)
    vocab_dir.write_report(out, "wordpiece", True, ["Return the value of the attribute."])
    return out
