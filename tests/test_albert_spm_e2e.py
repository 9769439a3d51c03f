"""The quickstart pipeline over an adopted SentencePiece model in ALBERT's layout (``<pad>``
0, ``<unk>`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4; tests/support/spm_models.py), through the
``runexp`` command: the plan names the roles, preprocessing packs and masks with those ids,
pretraining and fine-tuning run, and every export (encoder, preprocessing, classifier,
README) gives and documents the ids runexp trained on.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from tests.support.cli import QUICKSTART_SHORT, QUICKSTART_STAGES as STAGES, output, run_cli
from tests.support.spm_models import ALBERT_ROLES, corpus_lines, train_albert_style

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("albert_quickstart"))
    model = os.path.join(str(tmp_path_factory.mktemp("albert")), "30k-clean.model")
    model_bytes = train_albert_style(corpus_lines(), model)
    proc = run_cli(gin_file="quickstart.gin", root=root,
                   params=[f"VOCAB='{model}'", *QUICKSTART_SHORT], timeout=1800)
    assert proc.returncode == 0, output(proc)
    return root, proc, model_bytes


@pytest.mark.slow
def test_every_stage_completes_and_the_plan_names_the_roles(finished):
    root, _, _ = finished
    for stage in STAGES:
        assert os.path.isfile(os.path.join(root, stage, "COMPLETED")), stage
    plan = json.load(open(os.path.join(root, "plan.json")))
    vocab = next(s for s in plan["stages"] if s["id"] == "vocab")
    assert vocab["provenance"]["vocab_size"] == (
        "counted in 30k-clean.model; roles [PAD]=<pad> (0), [UNK]=<unk> (1), [CLS]=[CLS] (2), "
        "[SEP]=[SEP] (3), [MASK]=[MASK] (4)")
    report = json.load(open(os.path.join(root, "vocab", "report.json")))
    assert report["special_pieces"] == ALBERT_ROLES and report["unk_rate"] < 0.01
    metrics = json.load(open(os.path.join(root, "evaluate", "metrics.json")))
    assert 0.0 <= metrics["mlm_accuracy"] <= 1.0


@pytest.mark.slow
def test_pretraining_examples_use_the_models_ids(finished):
    """[CLS] a [SEP] b [SEP], masks with [MASK] (4), padding 0 (<pad>)."""
    import tensorflow as tf

    root, _, _ = finished
    files = glob.glob(os.path.join(root, "preprocess.pretrain", "**", "train.tfrecord-*"),
                      recursive=True)
    assert files
    examples = 0
    masked = replaced = 0
    for record in tf.data.TFRecordDataset(files).take(200):
        f = tf.train.Example.FromString(record.numpy()).features.feature
        ids = np.array(f["input_ids"].int64_list.value)
        mask = np.array(f["input_mask"].int64_list.value)
        n = int(mask.sum())
        assert ids[0] == 2 and ids[n - 1] == 3 and (ids[n:] == 0).all()
        assert list(ids[:n]).count(3) == 2  # the pair objective's [SEP]s
        assert not (ids[1:n] == 0).any() and not (ids[1:n] == 2).any()
        weights = np.array(f["masked_lm_weights"].float_list.value) > 0
        positions = np.array(f["masked_lm_positions"].int64_list.value)[weights]
        targets = np.array(f["masked_lm_ids"].int64_list.value)[weights]
        assert (targets > 4).all()  # real pieces, never a special one
        masked += len(positions)
        replaced += int((ids[positions] == 4).sum())
        examples += 1
    assert examples == 200 and 0.7 < replaced / masked < 0.9  # BERT's 80% [MASK]


@pytest.mark.slow
def test_exports_give_the_ids_runexp_trained_on(finished):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - registers the SentencePiece ops the models use

    from runexp.compiler.formats.classification_files import load_examples
    from runexp.tasks.vocabulary.tokenizer import load_tokenizer

    root, _, model_bytes = finished
    out = os.path.join(root, "export")
    tokenizer = load_tokenizer(os.path.join(root, "vocab"))
    heldout = [line for line in open(os.path.join(root, "corpus", "heldout.txt"),
                                     encoding="utf-8").read().splitlines() if line][:300]

    encoder = tf.saved_model.load(os.path.join(out, "encoder"))
    with open(encoder.sp_model_file.asset_path.numpy().decode(), "rb") as f:
        assert f.read() == model_bytes

    preprocessing = tf.saved_model.load(os.path.join(out, "preprocessing"))
    assert preprocessing.tokenize(tf.constant(heldout)).to_list() == [
        tokenizer.encode(line) for line in heldout]
    packed = preprocessing(tf.constant(heldout[:20]))
    for line, ids, mask in zip(heldout, packed["input_word_ids"].numpy(),
                               packed["input_mask"].numpy()):
        pieces = tokenizer.encode(line)[:62]
        assert list(ids[:len(pieces) + 2]) == [2, *pieces, 3]
        assert (ids[mask == 0] == 0).all()
    outputs = encoder(dict(packed))
    assert outputs["pooled_output"].shape[0] == 20

    ft_dir = os.path.join(root, "finetune.stdlib_package")
    scores = json.load(open(os.path.join(ft_dir, "metrics.json")))
    dev = load_examples(os.path.join(root, "corpus", "finetune_dev.tsv"),
                        scores.get("text_fields") or ["sentence"], "label")
    classifier = tf.saved_model.load(os.path.join(out, "classifier"))
    got = classifier.signatures["classify_text"](text=tf.constant([t[0] for t, _ in dev]))
    with open(os.path.join(ft_dir, "predictions.dev.tsv"), encoding="utf-8") as f:
        want = [row.split("\t")[1] for row in f.read().splitlines()[1:]]
    assert [x.decode() for x in got["label"].numpy()] == want  # packed as fine-tuning did

    readme = open(os.path.join(out, "README.md"), encoding="utf-8").read()
    assert "`[PAD]` 0, `[UNK]` 1, `[CLS]` 2, `[SEP]` 3, `[MASK]` 4" in readme


@pytest.mark.slow
def test_huggingface_export_reproduces_runexp(finished, tmp_path):
    """The SentencePiece (ALBERT-layout) export's huggingface/: AutoTokenizer's ids equal
    runexp's on held-out lines, the encoder and classifier outputs within 1e-4."""
    from tests.support.hf import check_export_against_runexp

    root, _, _ = finished
    lines = [line for line in corpus_lines(step=8, start=5) if line.strip()][:300]
    figures = check_export_against_runexp(root, lines, str(tmp_path))
    assert figures["equal_lines"] == len(lines) == 300
