"""Packing instances into rows: the algorithm's guarantees, and the packed layout of real
instances (each instance found again whole in its row)."""

import os

import numpy as np
import pytest

from runexp.tasks.instances.packing import (MAX_INSTANCES_PER_ROW, pack_batch, pack_lengths,
                                  packed_max_predictions, packing_stats)
from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, ShardStats, build_shard,
                                             cached_tokenizer, iter_shard_batches)

L, PRED = 128, 20


def check_groups(groups, lengths, length, k=MAX_INSTANCES_PER_ROW):
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(lengths)))  # every instance exactly once
    for g in groups:
        assert 1 <= len(g) <= k
        assert sum(lengths[i] for i in g) <= length
        assert list(g) == sorted(g)
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)


@pytest.mark.parametrize("seed", range(5))
def test_groups_fit_and_hold_every_instance_once(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, L + 1, size=500).tolist()
    groups = pack_lengths(lengths, L)
    check_groups(groups, lengths, L)
    assert pack_lengths(lengths, L) == groups  # deterministic


def test_short_instances_fill_rows_up_to_three():
    lengths = [40] * 30  # three fit in 128 (a fourth would too, but three is the limit)
    groups = pack_lengths(lengths, L)
    assert [len(g) for g in groups] == [3] * 10
    lengths = [30] * 8
    assert [len(g) for g in pack_lengths(lengths, L, max_instances=4)] == [4, 4]


def test_best_fit_pairs_complements():
    # Longest first, each into the fullest row it fits: 100+28, 90+38, 64+64.
    lengths = [28, 64, 100, 38, 90, 64]
    groups = pack_lengths(lengths, L)
    assert sorted(sorted(lengths[i] for i in g) for g in groups) == [[28, 100], [38, 90],
                                                                     [64, 64]]


def test_full_instances_stay_alone_and_bad_lengths_are_refused():
    assert pack_lengths([L, L, 5], L) == [(0,), (1,), (2,)]
    with pytest.raises(ValueError, match="instance 1 has 0 tokens"):
        pack_lengths([3, 0], L)
    with pytest.raises(ValueError, match="129 tokens"):
        pack_lengths([L + 1], L)


def test_prediction_slots_bound():
    assert packed_max_predictions(128, 20, 0.15) == 22
    assert packed_max_predictions(512, 80, 0.15) == 79
    assert packed_max_predictions(128, 5, 0.15) == 15  # 3 x 5 is the smaller bound
    # The bound holds every row: the most any row's instances can predict.
    for length in (128, 512):
        worst = 0
        for a in range(3, length - 5):
            for b in (3, length - a - 3):
                c = length - a - b
                k = sum(min(80, max(1, round(n * 0.15))) for n in (a, b, c))
                worst = max(worst, k)
        assert worst <= packed_max_predictions(length, 80, 0.15)


@pytest.fixture(scope="module")
def instances(small_corpus, spm_dir):
    config = PretrainingConfig.of(max_seq_length=L, max_predictions_per_seq=PRED,
                                  short_seq_prob=0.5, dupe_factor=1, random_seed=5)
    out, _ = build_shard([os.path.join(small_corpus, "train.txt")], spm_dir, config, "train",
                         0, 1)
    return {k: np.array([f[k] for f in out]) for k in out[0]}


def test_packed_rows_hold_each_instance_whole(instances, spm_dir):
    tok = cached_tokenizer(spm_dir)
    p = packed_max_predictions(L, PRED, 0.15)
    lengths = instances["input_mask"].sum(axis=1)
    groups = pack_lengths(lengths, L)
    rows = pack_batch(instances, L, p, groups=groups)
    check_groups(groups, lengths.tolist(), L)
    assert rows["input_ids"].shape == (len(groups), L)
    assert rows["masked_lm_ids"].shape == (len(groups), p)
    assert rows["next_sentence_labels"].shape == (len(groups), 3)
    for r, group in enumerate(groups):
        start = 0
        got_pos, got_ids = [], []
        for j, i in enumerate(group):
            n = int(lengths[i])
            span = slice(start, start + n)
            assert rows["input_ids"][r, span].tolist() == instances["input_ids"][i, :n].tolist()
            assert rows["segment_ids"][r, span].tolist() == \
                instances["segment_ids"][i, :n].tolist()
            assert rows["position_ids"][r, span].tolist() == list(range(n))
            assert rows["instance_ids"][r, span].tolist() == [j + 1] * n
            assert rows["input_ids"][r, start] == tok.cls_id
            assert rows["next_sentence_positions"][r, j] == start
            assert rows["next_sentence_labels"][r, j] == instances["next_sentence_labels"][i, 0]
            m = int(instances["masked_lm_weights"][i].sum())
            got_pos += (instances["masked_lm_positions"][i, :m] + start).tolist()
            got_ids += instances["masked_lm_ids"][i, :m].tolist()
            start += n
        m = len(got_pos)
        assert rows["masked_lm_positions"][r].tolist() == got_pos + [0] * (p - m)
        assert rows["masked_lm_ids"][r].tolist() == got_ids + [0] * (p - m)
        assert rows["masked_lm_weights"][r].tolist() == [1.0] * m + [0.0] * (p - m)
        assert rows["next_sentence_weights"][r].tolist() == \
            [1.0] * len(group) + [0.0] * (3 - len(group))
        pad = slice(start, L)
        for name in ("input_ids", "input_mask", "segment_ids", "position_ids", "instance_ids"):
            assert not rows[name][r, pad].any(), name
        assert rows["input_mask"][r, :start].all()
    stats = packing_stats(rows)
    assert stats["instances"] == len(lengths) and stats["tokens"] == lengths.sum()
    factor, fill = stats["instances"] / stats["rows"], stats["tokens"] / stats["slots"]
    unpacked_fill = lengths.sum() / (len(lengths) * L)
    assert 1.3 < factor <= 3 and fill > unpacked_fill and fill > 0.9


def test_too_many_predictions_for_the_slots_is_an_error(instances):
    with pytest.raises(ValueError, match="more than 5 positions"):
        pack_batch(instances, L, 5)


def build(corpus_file, vocab_dir, **params):
    config = PretrainingConfig.of(max_seq_length=L, max_predictions_per_seq=PRED,
                                  random_seed=5, **params)
    batches = list(iter_shard_batches([corpus_file], vocab_dir, config, "train", 0, 1,
                                      ShardStats()))
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}, config


def instance_spans(row_instance_ids):
    """(instance id, start, end) of each instance of a row."""
    out = []
    for j in range(1, MAX_INSTANCES_PER_ROW + 1):
        where = np.flatnonzero(row_instance_ids == j)
        if len(where):
            assert (np.diff(where) == 1).all()
            out.append((j, where[0], where[-1] + 1))
    return out


@pytest.mark.parametrize("wwm", [False, True], ids=["uniform", "whole_words"])
def test_static_masking_of_packed_rows_is_the_unpacked_instances(small_corpus, wordpiece_dir,
                                                                 wwm):
    """Packing reorders the same instances (masked before packing): the packed split holds
    exactly the unpacked split's instances, masks and labels, batch by batch."""
    corpus = os.path.join(small_corpus, "train.txt")
    flat, _ = build(corpus, wordpiece_dir, dupe_factor=2, whole_word_masking=wwm)
    rows, config = build(corpus, wordpiece_dir, dupe_factor=2, whole_word_masking=wwm,
                         packing=True)
    assert rows["masked_lm_ids"].shape[1] == config.predictions_per_row == 22

    def key(ids, labels):
        return tuple(ids.tolist()) + (int(labels),)

    unpacked = sorted(key(flat["input_ids"][i, :n], flat["next_sentence_labels"][i, 0])
                      for i, n in enumerate(flat["input_mask"].sum(axis=1)))
    packed = []
    for r in range(len(rows["input_ids"])):
        for j, a, b in instance_spans(rows["instance_ids"][r]):
            packed.append(key(rows["input_ids"][r, a:b], rows["next_sentence_labels"][r, j - 1]))
            w = rows["masked_lm_weights"][r] > 0
            mine = rows["masked_lm_positions"][r][w]
            mine = mine[(mine >= a) & (mine < b)]
            assert 0 < len(mine) <= PRED
    assert sorted(packed) == unpacked


def test_seqio_and_tensorflow_read_packed_records(small_corpus, wordpiece_dir, tmp_path):
    """The packed records, written as the preprocess stage writes them, parsed by
    TensorFlow's own parser with the layout's spec."""
    tf = pytest.importorskip("tensorflow")
    from runexp.tasks.cache.records import TFRecordWriter, encode_instance_batch
    rows, config = build(os.path.join(small_corpus, "train.txt"), wordpiece_dir, dupe_factor=1,
                         packing=True)
    path = str(tmp_path / "train.tfrecord")
    with TFRecordWriter(path) as writer:
        writer.write_batch(*encode_instance_batch(rows))
    p, k = config.predictions_per_row, MAX_INSTANCES_PER_ROW
    spec = {name: tf.io.FixedLenFeature([n], dtype) for name, n, dtype in (
        ("input_ids", L, tf.int64), ("input_mask", L, tf.int64), ("segment_ids", L, tf.int64),
        ("position_ids", L, tf.int64), ("instance_ids", L, tf.int64),
        ("masked_lm_positions", p, tf.int64), ("masked_lm_ids", p, tf.int64),
        ("masked_lm_weights", p, tf.float32), ("next_sentence_labels", k, tf.int64),
        ("next_sentence_positions", k, tf.int64), ("next_sentence_weights", k, tf.float32))}
    parsed = list(tf.data.TFRecordDataset(path).map(
        lambda r: tf.io.parse_single_example(r, spec)).as_numpy_iterator())
    assert len(parsed) == len(rows["input_ids"])
    for r, got in enumerate(parsed):
        assert set(got) == set(rows)
        for name, values in got.items():
            np.testing.assert_array_equal(values, rows[name][r], err_msg=name)


@pytest.fixture(scope="module", params=[False, True], ids=["uniform", "whole_words"])
def dynamic_rows(request, small_corpus, wordpiece_dir):
    """Packed rows left for training-time masking, and the same rows masked in TensorFlow
    (tasks/instances/dynamic_masking.py) with two different seeds."""
    tf = pytest.importorskip("tensorflow")
    from runexp.tasks.instances.dynamic_masking import mask_batch
    from runexp.tasks.instances.masking import MaskingConfig
    wwm = request.param
    rows, config = build(os.path.join(small_corpus, "train.txt"), wordpiece_dir,
                         dynamic_masking=True, packing=True, whole_word_masking=wwm,
                         short_seq_prob=0.3)
    spec = MaskingConfig.from_json(config.masking_spec(cached_tokenizer(wordpiece_dir)))
    n = len(rows["input_ids"])
    fn = tf.function(lambda f, s: mask_batch(f, s, spec))

    def mask(key):
        seeds = np.stack([np.full(n, key), np.arange(n)], axis=1).astype(np.int64)
        out = fn({k: tf.constant(v) for k, v in rows.items()}, tf.constant(seeds))
        return {k: v.numpy() for k, v in out.items()}

    return rows, mask(11), mask(11), mask(12), cached_tokenizer(wordpiece_dir), wwm


def test_dynamic_masks_of_packed_rows_stay_inside_each_instance(dynamic_rows):
    rows, masked, _, _, tok, wwm = dynamic_rows
    assert rows["masked_lm_ids"].shape[1] == 22 and not rows["masked_lm_weights"].any()
    assert "word_starts" not in masked
    checked = 0
    for r in range(len(rows["input_ids"])):
        w = masked["masked_lm_weights"][r] > 0
        m = int(w.sum())
        assert w.tolist() == [True] * m + [False] * (len(w) - m)
        positions = masked["masked_lm_positions"][r][:m]
        assert (np.diff(positions) > 0).all()
        ids = rows["input_ids"][r]
        np.testing.assert_array_equal(masked["masked_lm_ids"][r][:m], ids[positions])
        assert not np.isin(ids[positions], [tok.cls_id, tok.sep_id]).any()
        assert (rows["instance_ids"][r][positions] > 0).all()  # never padding
        changed = np.flatnonzero(masked["input_ids"][r] != ids)
        assert set(changed.tolist()) <= set(positions.tolist())
        for j, a, b in instance_spans(rows["instance_ids"][r]):
            mine = positions[(positions >= a) & (positions < b)]
            n = b - a
            candidates = int(np.sum(~np.isin(ids[a:b], [tok.cls_id, tok.sep_id])))
            k = min(PRED, max(1, round(n * 0.15)), candidates)
            if not wwm:  # exactly the unpacked instance's count
                assert len(mine) == k
            else:  # whole words while they fit: at most k, and never a word cut
                assert 0 < len(mine) <= k
                starts = rows["word_starts"][r]
                chosen = set(mine.tolist())
                for p in range(a + 2, b):  # a piece continuing a word goes with it
                    if not starts[p] and ids[p] not in (tok.cls_id, tok.sep_id) \
                            and ids[p - 1] not in (tok.cls_id, tok.sep_id):
                        assert (p in chosen) == (p - 1 in chosen), (r, p)
            checked += 1
    assert checked > 500


def test_dynamic_masks_of_packed_rows_are_a_function_of_the_seed(dynamic_rows):
    _, first, again, other, _, _ = dynamic_rows
    for name in first:
        np.testing.assert_array_equal(first[name], again[name], err_msg=name)
    assert (first["masked_lm_positions"] != other["masked_lm_positions"]).any()
