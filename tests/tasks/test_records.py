"""Hand-encoded tf.train.Example records parse with TensorFlow and BERT's feature spec."""

import os

import numpy as np
import pytest

from runexp.tasks.cache.example_proto import encode_example, encode_examples
from runexp.tasks.instances.pretraining_shards import PretrainingConfig, build_shard
from runexp.tasks.cache.records import TFRecordWriter, encode_instance_features

tf = pytest.importorskip("tensorflow")

L, P = 64, 10


def reference_spec():
    # As in google-research/bert run_pretraining.py input_fn_builder.
    return {
        "input_ids": tf.io.FixedLenFeature([L], tf.int64),
        "input_mask": tf.io.FixedLenFeature([L], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([L], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([P], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([P], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([P], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def test_bytes_equal_tensorflow_proto():
    features = {"a": [0, 1, 127, 128, 300, 70000, 2**40, -1], "b": [], "w": [1.0, 0.5, 0.0]}
    ours = encode_example(features, float_features={"w"})
    proto = tf.train.Example.FromString(ours)
    assert list(proto.features.feature["a"].int64_list.value) == features["a"]
    assert list(proto.features.feature["w"].float_list.value) == features["w"]
    assert list(proto.features.feature["b"].int64_list.value) == []
    # Same values through TF's own serializer parse back identically.
    assert tf.train.Example.FromString(proto.SerializeToString()) == proto


def test_shard_records_parse_with_reference_spec(small_corpus, spm_dir, tmp_path):
    config = PretrainingConfig.of(max_seq_length=L, max_predictions_per_seq=P, dupe_factor=1,
                               random_seed=3)
    files = [os.path.join(small_corpus, "heldout.txt")]
    features, _ = build_shard(files, spm_dir, config, "validation", 0, 1)
    path = str(tmp_path / "x.tfrecord")
    with TFRecordWriter(path) as writer:
        for f in features:
            writer.write(encode_instance_features(f))
    parsed = list(tf.data.TFRecordDataset(path).map(
        lambda r: tf.io.parse_single_example(r, reference_spec())).as_numpy_iterator())
    assert len(parsed) == len(features) > 10
    for got, want in zip(parsed, features):
        for name, values in want.items():
            assert got[name].tolist() == values, name


def test_batch_encoding_gives_the_same_bytes_and_framing(tmp_path):
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": rng.integers(0, 3_000_000, (300, 17)),  # 1- to 4-byte varints
        "input_mask": rng.integers(0, 2, (300, 17)),
        "masked_lm_weights": rng.random((300, 5)).astype(np.float32),
        "next_sentence_labels": rng.integers(0, 2, (300, 1)),
        "wide": rng.integers(0, 1 << 40, (300, 40)),  # long lists: 2-byte length varints
    }
    batch["input_ids"][:, :3] = [0, 127, 128]
    data, offsets = encode_examples(batch, {"masked_lm_weights"})
    assert len(offsets) == 301
    for i in range(300):
        row = {k: v[i].tolist() for k, v in batch.items()}
        assert data[offsets[i]:offsets[i + 1]] == encode_example(row, {"masked_lm_weights"}), i
    one, many = str(tmp_path / "one.tfrecord"), str(tmp_path / "many.tfrecord")
    with TFRecordWriter(one) as w:
        for i in range(300):
            w.write(data[offsets[i]:offsets[i + 1]])
    with TFRecordWriter(many) as w:
        w.write_batch(data, offsets[:101])
        w.write_batch(data, offsets[100:])
    assert open(one, "rb").read() == open(many, "rb").read()
    assert sum(1 for _ in tf.data.TFRecordDataset(many)) == 300  # TF checks the CRCs
