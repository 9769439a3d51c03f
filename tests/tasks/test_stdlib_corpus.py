"""The quickstart corpus: size, determinism, disjoint splits, clean fine-tuning data."""

import json
import os

from runexp.tasks.sources import stdlib_corpus
from runexp.compiler.formats.classification_files import load_examples
from runexp.tasks.sources.sentences import split_sentences
from runexp.tasks.sources.text_documents import iter_documents


def test_splitter_drops_doctests_and_code():
    doc = ("Return the sum of the values. See e.g. the manual for details!\n\n"
           "    >>> add(1, 2)\n    3\n\n"
           "x = compute(a, b)\n\n"
           "Short.\n\nThe second paragraph spans\ntwo lines of text.")
    assert split_sentences(doc) == [
        "Return the sum of the values.", "See e.g. the manual for details!",
        "The second paragraph spans two lines of text."]


def test_size_and_summary(corpus_dir):
    with open(os.path.join(corpus_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["train"]["bytes"] >= 2_000_000
    assert os.path.getsize(os.path.join(corpus_dir, "train.txt")) == summary["train"]["bytes"]
    assert len(summary["labels"]) == 6


def test_deterministic(corpus_dir, tmp_path):
    corpus = stdlib_corpus.build_corpus(min_bytes=2_000_000, heldout_fraction=0.05,
                                        finetune_classes=6, seed=0)
    stdlib_corpus.write_corpus(corpus, str(tmp_path))
    for name in ("train.txt", "heldout.txt", "finetune_train.tsv", "finetune_dev.tsv"):
        with open(os.path.join(corpus_dir, name), "rb") as a, open(tmp_path / name, "rb") as b:
            assert a.read() == b.read(), name


def test_heldout_documents_and_sentences_disjoint(corpus_dir):
    def docs(name):
        return list(iter_documents([os.path.join(corpus_dir, name)]))
    train, heldout = docs("train.txt"), docs("heldout.txt")
    assert len(heldout) >= 10
    train_sentences = {s for d in train for s in d}
    assert not train_sentences & {s for d in heldout for s in d}


def test_finetune_dev_comes_from_heldout_only(corpus_dir):
    def examples(name):
        return load_examples(os.path.join(corpus_dir, name))
    train, dev = examples("finetune_train.tsv"), examples("finetune_dev.tsv")
    heldout = {s for d in iter_documents([os.path.join(corpus_dir, "heldout.txt")]) for s in d}
    assert all(texts[0] in heldout for texts, _ in dev)
    assert not {t for t, _ in train} & {t for t, _ in dev}
    counts = {}
    for _, label in train:
        counts[label] = counts.get(label, 0) + 1
    assert len(counts) == 6 and max(counts.values()) / len(train) < 0.3
    dev_labels = {label for _, label in dev}
    assert dev_labels == set(counts)


def test_too_little_text_is_a_clear_error():
    import pytest
    with pytest.raises(ValueError, match="fewer than min_bytes=90,000,000"):
        stdlib_corpus.build_corpus(min_bytes=90_000_000)
