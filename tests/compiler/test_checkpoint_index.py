"""Init checkpoints checked in the dry run from their .index (compiler/formats/checkpoint_index.py):
missing, corrupt, or shaped for another model, each one error with file:line and a hint."""

import os

import pytest
from tests.support.checkpoint_files import bert_variables, write_index
from tests.support.cli import errors_of
from tests.compiler.test_finetune_plans import _experiment, release  # noqa: F401 - a fixture

from runexp.compiler.formats.checkpoint_index import CheckpointIndexError, read_index


def test_reads_what_tensorflow_writes(tmp_path):
    tf = pytest.importorskip("tensorflow")
    prefix = str(tmp_path / "model.ckpt")
    shapes = {"bert/embeddings/word_embeddings": [50, 8], "global_step": [],
              "bert/encoder/layer_3/attention/self/query/kernel": [8, 8],
              "int_counter": [3]}
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(shapes),
                      shape_and_slices=[""] * len(shapes),
                      tensors=[tf.zeros(s, tf.int64 if n == "int_counter" else tf.float32)
                               for n, s in shapes.items()])
    ours = read_index(prefix)
    assert {n: s for n, (_, s) in ours.items()} == dict(tf.train.list_variables(prefix))
    assert ours["int_counter"][0] == 9 and ours["global_step"][0] == 1  # DT_INT64, DT_FLOAT


def test_the_test_writer_is_what_tensorflow_reads(tmp_path):
    tf = pytest.importorskip("tensorflow")
    prefix = write_index(str(tmp_path / "bert_model.ckpt"), bert_variables(2, 16, 64, 30))
    assert dict(tf.train.list_variables(prefix)) == bert_variables(2, 16, 64, 30)


def test_truncated_or_foreign_index_is_refused(tmp_path):
    prefix = write_index(str(tmp_path / "m.ckpt"), bert_variables(1, 4, 8, 10))
    data = open(prefix + ".index", "rb").read()
    open(prefix + ".index", "wb").write(data[:-10])
    with pytest.raises(CheckpointIndexError, match="bad magic number"):
        read_index(prefix)


def test_missing_checkpoint_names_the_ones_that_exist(write, release):
    path = _experiment(write, release)
    text = open(path).read().replace("bert_model.ckpt'", "model.ckpt'")
    text = errors_of(write("e2.gin", text))
    assert "e2.gin:5: error: no checkpoint at" in text
    assert "model.ckpt.index does not exist" in text
    assert f"hint: checkpoints in {release}: {release}/bert_model.ckpt" in text


def test_corrupt_index_is_one_error(write, release):
    with open(f"{release}/bert_model.ckpt.index", "r+b") as f:
        f.truncate(100)
    text = errors_of(_experiment(write, release))
    assert "cannot be read" in text and "bad magic number" in text
    assert "hint: copy the checkpoint again" in text


def test_shapes_that_do_not_fit_the_model(write, release):
    write_index(f"{release}/bert_model.ckpt", bert_variables(24, 1024, 4096, vocab=8))
    text = errors_of(_experiment(write, release))
    assert "the init checkpoint does not fit the model" in text
    assert "num_hidden_layers: checkpoint 24, model 12" in text
    assert "hidden_size: checkpoint 1024, model 768" in text


def test_another_vocabulary_says_to_use_the_checkpoints_vocab(write, release):
    os.remove(f"{release}/bert_config.json")
    write_index(f"{release}/bert_model.ckpt", bert_variables(12, 768, 3072, vocab=30522))
    text = errors_of(_experiment(write, release))
    assert "vocab_size: checkpoint 30522, model 8" in text
    assert "hint: use the vocab the checkpoint was trained with" in text
