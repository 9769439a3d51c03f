"""A Chinese pretraining experiment with jieba whole-word masking through the `runexp`
command: the dry run plans it, and the vocab and preprocess stages write records whose masks
cover jieba's words whole (decoded from the TFRecords and compared with jieba's segmentation
of the corpus)."""

import json
import random

import pytest
from tests.support.chinese_corpus import WordReference, check_whole_words, chinese_sentences

from runexp.compiler.exit_codes import EXIT_PENDING
from runexp.tasks.cache.inspect import decode_example
from runexp.tasks.cache.records import iter_records
from runexp.tasks.vocabulary.tokenizer import load_tokenizer
from tests.support.cli import run_cli

pytestmark = pytest.mark.e2e

pytest.importorskip("jieba")


@pytest.fixture
def experiment(tmp_path):
    lines = chinese_sentences()
    random.Random(1).shuffle(lines)
    train, held = lines[:6000], lines[6000:6400]
    for name, part in (("train.txt", train), ("held.txt", held)):
        (tmp_path / name).write_text("".join(
            "".join(line + "\n" for line in part[i:i + 8]) + "\n"
            for i in range(0, len(part), 8)), encoding="utf-8")
    path = tmp_path / "exp.gin"
    path.write_text(f"""
include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{tmp_path}/out'
CORPUS_FILES = '{tmp_path}/train.txt'
HELDOUT_FILES = '{tmp_path}/held.txt'
VOCAB_SIZE = 3000
BATCH_SIZE = 8
TRAIN_STEPS = 20
WARMUP_STEPS = 2
MAX_SEQ_LENGTH = 64
MAX_PREDICTIONS_PER_SEQ = 10
DUPE_FACTOR = 2
bert_pretraining_task.whole_word_masking = True
bert_pretraining_task.word_segmenter = 'jieba'
""", encoding="utf-8")
    return str(path), tmp_path, train + held


def test_dry_run_then_preprocess_masks_jieba_words_whole(experiment):
    gin, d, lines = experiment
    proc = run_cli("--dry_run", gin_file=gin)
    assert proc.returncode == EXIT_PENDING, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "word_segmenter = 'jieba'   # " in proc.stdout
    assert "whole_word_masking = True   # " in proc.stdout

    proc = run_cli("--until=preprocess", gin_file=gin)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = d / "out"
    summary = json.loads((out / "preprocess.pretrain" / "MANIFEST.json").read_text())["summary"]
    assert summary["bad_input"]["unsegmented_lines"] == {"count": 0, "samples": []}
    assert summary["train"]["instances"] > 1000
    tok = load_tokenizer(str(out / "vocab"))
    reference = WordReference(tok, lines)
    for split, least in (("train", 1000), ("validation", 50)):
        files = sorted((out / "preprocess.pretrain" / "pretrain").glob(f"{split}.tfrecord-*"))
        features = [decode_example(r) for r in iter_records(map(str, files))]
        counts = check_whole_words(features, reference)
        assert counts["split"] == 0 and counts["checked"] > 0.8 * len(features), counts
        assert counts["chinese_words"] > least, counts


@pytest.mark.slow
def test_the_whole_run_exports_a_huggingface_directory_with_runexps_numbers(experiment):
    """Trained to the end and exported: transformers reads export/huggingface/ with
    AutoTokenizer's ids equal to runexp's on held-out Chinese lines, and the encoder's
    outputs within 1e-4 of the encoder SavedModel's (tests/support/hf.py)."""
    from tests.support.hf import check_export_against_runexp

    gin, d, lines = experiment
    proc = run_cli(gin_file=gin)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    held = lines[6000:6300]
    figures = check_export_against_runexp(str(d / "out"), held, str(d / "hf_check"))
    assert figures["equal_lines"] == len(held) == 300
