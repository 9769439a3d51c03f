"""Local corpora are sampled in the dry run: compressed, binary or empty text is stopped
before a vocab, a preprocess and a pretraining are spent on it."""

import gzip

import pytest
from tests.support.cli import errors_of

from runexp.compiler.planner import compile_experiment

TEXT = "The first sentence of a document.\nAnd its second one.\n\nAnother document.\n"


def _experiment(write, corpus):
    return write("e.gin", f"""include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{write.dir}/out'
CORPUS_FILES = '{corpus}'
VOCAB_SIZE = 100
""")


# Every xdist worker must collect the same test ids: the gzip bytes carry no timestamp,
# and a case is named by its file, not by its bytes.
UNUSABLE = [
    ("c.txt.gz", gzip.compress(TEXT.encode(), mtime=0), "gzip-compressed, not text", "gunzip c.txt.gz"),
    ("b.bin", b"\x00\x01\x02binary\x00", "binary data, not text", "give text files"),
    ("l.txt", bytes(range(128, 256)) * 4, "mostly not UTF-8 text", "convert it to UTF-8"),
    ("e.txt", b"", "no text: the file is empty", "remove it from the glob"),
    ("blank.txt", b"\n\n  \n", "no text: only blank lines", "remove it from the glob"),
    ("one-line.txt", b"word " * 20000, "no line break in its first 64 KB",
     "one sentence per line"),
]


@pytest.mark.parametrize("name,content,what,hint", UNUSABLE, ids=[row[0] for row in UNUSABLE])
def test_unusable_corpus_is_one_error(write, name, content, what, hint):
    path = write(f"corpus/{name}", content)
    text = errors_of(_experiment(write, path))
    assert f"error: pretrain: {path}: {what}" in text
    assert hint in text
    assert "e.gin:4" in text  # where the corpus was named


def test_an_empty_file_among_text_files_is_a_warning(write):
    write("corpus/a.txt", TEXT)
    write("corpus/empty.txt", "")
    plan = compile_experiment([_experiment(write, f"{write.dir}/corpus/*.txt")]).plan
    assert any("empty.txt: no text: the file is empty; it is skipped" in w
               for w in plan.warnings)
