"""``runexp inspect``'s backend: decoded examples with visible masks, and length statistics."""

import os
import re

import numpy as np
import pytest

from runexp.tasks.cache import inspect
from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, ShardJob,
                                             build_shard, cached_tokenizer, write_shard)
from runexp.tasks.cache.records import shard_path


@pytest.fixture(scope="module")
def data_dir(small_corpus, wordpiece_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("inspect"))
    config = PretrainingConfig.of(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1,
                               random_seed=4)
    files = (os.path.join(small_corpus, "heldout.txt"),)
    for shard in range(2):
        write_shard(ShardJob(files, wordpiece_dir, config, "validation", shard, 2,
                             shard_path(out, "validation", shard, 2)))
    return out, config, files


def test_decoder_reads_back_what_was_written(data_dir, wordpiece_dir):
    out, config, files = data_dir
    want, _ = build_shard(files, wordpiece_dir, config, "validation", 0, 2)
    got = [inspect.decode_example(r) for r in inspect.iter_records(
        [shard_path(out, "validation", 0, 2)])]
    assert got == want and len(got) > 20


def test_marks_masked_random_and_kept_positions(data_dir, wordpiece_dir):
    out, config, files = data_dir
    tok = cached_tokenizer(wordpiece_dir)
    text = inspect.inspect_examples(out, wordpiece_dir, "validation", 40)
    examples = re.findall(r"^example \d+: .*$", text, re.M)
    assert len(examples) == 40
    masked = re.findall(r"\[MASK→([^\]]+)\]", text)
    random_ = re.findall(r"\{([^}→]+)→([^}]+)\}", text)
    kept = re.findall(r"<([^>\s]+)>", text)
    # 40 examples x ~9 predictions: ~290 [MASK], ~36 random, ~36 kept.
    assert len(masked) > 150 and len(random_) > 5 and len(kept) > 5
    assert all(now != orig for now, orig in random_)
    assert "  A: [CLS] " in text and "  B: " in text
    # The first example, checked against the features themselves.
    first = inspect.decode_example(next(inspect.iter_records(
        [shard_path(out, "validation", 0, 2)])))
    lines = inspect.format_example(first, tok)
    marks = sum(w > 0 for w in first["masked_lm_weights"])
    assert sum(lines[0].count(s) + lines[-1].count(s) for s in ("→", "<")) >= marks


def test_length_statistics(data_dir, wordpiece_dir):
    out, config, files = data_dir
    text = inspect.inspect_examples(out, wordpiece_dir, "validation", 1)
    feats = []
    for shard in range(2):
        feats += build_shard(files, wordpiece_dir, config, "validation", shard, 2)[0]
    lengths = np.array([sum(f["input_mask"]) for f in feats])
    assert f"statistics over all {len(feats):,} examples" in text
    assert f"real tokens per example: mean {lengths.mean():.1f}" in text
    assert f"max {lengths.max()}" in text
    labels = np.mean([f["next_sentence_labels"][0] for f in feats])
    assert f"label 1 (random next / swapped): {labels:.1%}" in text
    assert "at max_seq_length (64)" in text


def test_missing_split_is_a_clear_error(data_dir, wordpiece_dir):
    with pytest.raises(FileNotFoundError, match="train.tfrecord"):
        inspect.inspect_examples(data_dir[0], wordpiece_dir, "train", 3)


def test_reads_tensorflow_written_records(tmp_path, wordpiece_dir):
    tf = pytest.importorskip("tensorflow")
    tok = cached_tokenizer(wordpiece_dir)
    ids = [tok.cls_id, 40, tok.mask_id, 42, tok.sep_id, 43, 44, tok.sep_id] + [0] * 2
    feature = {
        "input_ids": ids, "input_mask": [1] * 8 + [0] * 2, "segment_ids": [0] * 5 + [1] * 3 + [0] * 2,
        "masked_lm_positions": [2, 3, 5], "masked_lm_ids": [41, 42, 50],
        "masked_lm_weights": [1.0, 1.0, 1.0], "next_sentence_labels": [1]}
    example = tf.train.Example(features=tf.train.Features(feature={
        k: (tf.train.Feature(float_list=tf.train.FloatList(value=v)) if k == "masked_lm_weights"
            else tf.train.Feature(int64_list=tf.train.Int64List(value=v)))
        for k, v in feature.items()}))
    path = str(tmp_path / "peer.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        w.write(example.SerializeToString())
    assert inspect.decode_example(next(inspect.iter_records([path]))) == feature
    text = inspect.inspect_examples(path, wordpiece_dir, "train", 1)
    t = tok.id_to_token
    assert f"[MASK→{t(41)}] <{t(42)}>" in text and f"{{{t(43)}→{t(50)}}}" in text
