"""Helpers for compiler tests: write small gin experiments into a temporary directory."""

import textwrap

import pytest


@pytest.fixture
def write(tmp_path):
    """write('name.gin', text) -> path; text is dedented. Also makes a tiny corpus file."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here.\nAnother one.\n\nA second document.\n")
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("Held out text.\n")

    def _write(name, text):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(textwrap.dedent(text).encode("utf-8") if isinstance(text, str) else text)
        return str(path)

    _write.dir = str(tmp_path)
    _write.corpus = str(corpus)
    _write.heldout = str(heldout)
    return _write


@pytest.fixture
def minimal(write):
    """A valid small experiment on local files; returns its path."""
    return write("exp.gin", f"""
        include 'runs/pretrain.gin'
        include 'models/bert_tiny.gin'
        OUTPUT_ROOT = '{write.dir}/out'
        CORPUS_FILES = '{write.corpus}'
        HELDOUT_FILES = '{write.heldout}'
        VOCAB_SIZE = 100
        BATCH_SIZE = 8
        TRAIN_STEPS = 20
        WARMUP_STEPS = 2
        CHECKPOINT_EVERY = 10
        """)
