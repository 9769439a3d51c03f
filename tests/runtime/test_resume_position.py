"""A resumed stream starts at its position without reading what came before, exactly.

Real seqio tasks over real TFRecord caches (written by tf.io.TFRecordWriter or by the
preprocess stage), read by runtime/pretraining_data.py: the batches after a resume at batch S
are byte-equal to those an uninterrupted stream gives at S, for static and dynamic (plain
and whole-word) masking, a mixture, two input hosts, a second phase's longer sequences, and
across epoch boundaries (caches of a few dozen examples make epochs a few batches long).
"""

import json
import os

import numpy as np
import pytest
import seqio
import tensorflow as tf

from tests.support.runtime import TINY_MODEL, make_ctx, pretrain_params, write_pretraining_records
from runexp.runtime import pretraining_data
from runexp.runtime.data_order import ExampleOrder
from runexp.runtime.mixture_schedule import MixtureSchedule
from runexp.runtime.stages import pretrain
from runexp.tasks.cache.record_index import RecordIndex, index_paths
from runexp.tasks.cache.records import task_cache_of

BATCH = 8


def _static(tmp_path, name, examples=50, seq=32, preds=5, seed=1):
    d = str(tmp_path / name)
    write_pretraining_records(d, "train", examples, TINY_MODEL["vocab_size"], seq, preds,
                              seed=seed)
    return d


def _stage(root, name, vocab_dir, **params):
    from tests.runtime.test_stage_preprocess import run_stage

    out, _ = run_stage(root, name, vocab_dir, num_workers=1, **params)
    return str(out)


@pytest.fixture(scope="module")
def dynamic_dirs(tmp_path_factory):
    """Preprocess stage dirs masked at training time: whole words, single tokens, and a
    second phase's 64-token sequences."""
    from tests.runtime.test_stage_preprocess import make_inputs

    root = tmp_path_factory.mktemp("resume_dynamic")
    vocab_dir = make_inputs(root)
    return {
        "whole_words": _stage(root, "ww", vocab_dir, dynamic_masking=True),
        "tokens": _stage(root, "tok", vocab_dir, dynamic_masking=True,
                         whole_word_masking=False, task="t_tok"),
        "phase2": _stage(root, "p2", vocab_dir, dynamic_masking=True, task="t_p2",
                         max_seq_length=64, max_predictions_per_seq=10),
    }


def _batches(ds, n):
    return [{k: v.numpy() for k, v in b.items()} for b in ds.take(n)]


def _assert_resumes_exactly(make, total, starts):
    """make(skip) -> dataset; the batches from each start equal the uninterrupted ones."""
    whole = _batches(make(0), total)
    assert len(whole) == total
    for start in starts:
        resumed = _batches(make(start), total - start)
        for i, (want, got) in enumerate(zip(whole[start:], resumed)):
            assert want.keys() == got.keys()
            for name in want:
                assert want[name].dtype == got[name].dtype, name
                assert want[name].tobytes() == got[name].tobytes(), (start, i, name)
    return whole


def test_static_stream_resumes_exactly_across_epochs(tmp_path):
    d = _static(tmp_path, "static")  # 50 examples: an epoch every 6.25 batches
    make = lambda skip: pretraining_data.pretraining_dataset(  # noqa: E731
        d, "train", BATCH, 32, 5, seed=3, skip_batches=skip)
    whole = _assert_resumes_exactly(make, 20, [1, 6, 7, 13, 19])
    assert whole[0]["input_ids"].dtype == np.int32
    # Every epoch is one pass over all 50 records, each in its own order.
    rows = np.concatenate([b["input_ids"] for b in whole])
    epochs = [[r.tobytes() for r in rows[e * 50:(e + 1) * 50]] for e in range(3)]
    cached = [r.tobytes() for b in pretraining_data.pretraining_dataset(
        d, "train", 50, 32, 5, training=False) for r in b["input_ids"].numpy()]
    for epoch in epochs:
        assert sorted(epoch) == sorted(cached)
    assert epochs[0] != epochs[1] != epochs[2]
    # Another seed, another order.
    other = _batches(pretraining_data.pretraining_dataset(d, "train", BATCH, 32, 5, seed=4), 1)
    assert other[0]["input_ids"].tobytes() != whole[0]["input_ids"].tobytes()


@pytest.mark.parametrize("kind", ["whole_words", "tokens", "phase2"])
def test_dynamic_masks_resume_exactly_and_differ_each_epoch(dynamic_dirs, kind):
    d = dynamic_dirs[kind]
    seq, preds = (64, 10) if kind == "phase2" else (32, 5)
    with open(os.path.join(task_cache_of(d)[1], "stats.train.json")) as f:
        n = json.load(f)["examples"]
    make = lambda skip: pretraining_data.pretraining_dataset(  # noqa: E731
        d, "train", BATCH, seq, preds, seed=3, skip_batches=skip)
    per_epoch = -(-n // BATCH)
    total = 2 * per_epoch + 2
    whole = _assert_resumes_exactly(make, total, [1, per_epoch - 1, per_epoch + 1, total - 1])
    assert "word_starts" not in whole[0]
    assert (whole[0]["masked_lm_weights"].sum(axis=1) > 0).all()
    # The same instance gets a new mask in the next epoch.
    stream = pretraining_data.pretraining_dataset(d, "train", n, seq, preds, seed=3)
    epochs = _batches(stream, 2)

    def by_instance(batch):
        ids = batch["input_ids"].copy()
        rows, cols = np.nonzero(batch["masked_lm_weights"] > 0)
        ids[rows, batch["masked_lm_positions"][rows, cols]] = \
            batch["masked_lm_ids"][rows, cols]
        return {ids[i].tobytes() + batch["segment_ids"][i].tobytes():
                batch["masked_lm_positions"][i].tobytes() for i in range(len(ids))}

    first, second = by_instance(epochs[0]), by_instance(epochs[1])
    assert first.keys() == second.keys()
    assert np.mean([first[k] != second[k] for k in first]) > 0.8


def test_a_mixture_resumes_exactly_with_its_rates(tmp_path, dynamic_dirs):
    # A static and a dynamic member, 50 and ~100 examples: many epochs of each; 4096
    # positions a block, so a resume past 4096 x 1.x examples crosses a block boundary.
    static = _static(tmp_path, "m_static")
    dirs, rates = [static, dynamic_dirs["tokens"]], [0.7, 0.3]
    make = lambda skip: pretraining_data.pretraining_dataset(  # noqa: E731
        dirs, "train", 64, 32, 5, seed=5, skip_batches=skip, rates=rates)
    whole = _assert_resumes_exactly(make, 70, [1, 33, 63, 64, 65, 69])
    static_rows = {r.tobytes() for b in pretraining_data.pretraining_dataset(
        static, "train", 50, 32, 5, training=False) for r in b["input_ids"].numpy()}
    ids = np.concatenate([b["input_ids"] for b in whole])[:4096]
    share = np.mean([r.tobytes() in static_rows for r in ids])
    assert abs(share - 0.7) <= 1 / 4096  # every block holds the rates exactly


def test_mixture_schedule_counts_are_a_formula():
    schedule = MixtureSchedule([0.5, 0.3, 0.2], seed=9)
    block = schedule.block
    members = np.concatenate([schedule.block_members(b).numpy() for b in range(3)])
    for position in (0, 1, 777, block - 1, block, block + 5, 2 * block + 100):
        counted = np.bincount(members[:position], minlength=3)
        np.testing.assert_array_equal(schedule.member_positions(position), counted)
        chosen = list(schedule.choices(position).take(50).as_numpy_iterator())
        np.testing.assert_array_equal(chosen, members[position:position + 50])
    for b in range(3):
        counts = np.bincount(members[b * block:(b + 1) * block], minlength=3)
        assert np.all(np.abs(counts - block * np.array([0.5, 0.3, 0.2])) <= 1)
    # A rare member still gets its share of a (larger) block.
    rare = MixtureSchedule([1.0, 1e-4], seed=1)
    assert rare.block * 1e-4 / 1.0001 >= 2
    assert (np.bincount(rare.block_members(0).numpy(), minlength=2) > 0).all()


def test_two_hosts_partition_the_records_and_resume_alone(tmp_path):
    d = _static(tmp_path, "hosts", examples=41)
    cached = sorted(r.tobytes() for b in pretraining_data.pretraining_dataset(
        d, "train", 41, 32, 5, training=False) for r in b["input_ids"].numpy())
    epochs = []
    for host in range(2):
        info = seqio.ShardInfo(host, 2)
        make = lambda skip, info=info: pretraining_data.pretraining_dataset(  # noqa: E731
            d, "train", BATCH, 32, 5, seed=3, skip_batches=skip, shard_info=info)
        whole = _assert_resumes_exactly(make, 8, [2, 3, 7])
        size = (host + 1) * 41 // 2 - host * 41 // 2
        rows = np.concatenate([b["input_ids"] for b in whole])
        epochs.append([r.tobytes() for r in rows[:size]])
        assert sorted(epochs[-1]) == sorted(r.tobytes() for r in rows[size:2 * size])
    assert sorted(epochs[0] + epochs[1]) == cached


def test_the_order_is_a_permutation_per_epoch():
    order = ExampleOrder(num_records=1000, seed=7, host=1, hosts=3)
    assert (order.first, order.size) == (333, 333)
    got = order.records(tf.range(0, 3 * 333, dtype=tf.int64)).numpy()
    for e in range(3):
        assert sorted(got[e * 333:(e + 1) * 333]) == list(range(333, 666))
    assert list(got[:333]) != list(got[333:666])
    with pytest.raises(ValueError, match="cannot be shared"):
        ExampleOrder(num_records=1, seed=7, host=0, hosts=2)


def test_record_index_reads_what_tensorflow_reads_and_follows_its_files(tmp_path):
    d = _static(tmp_path, "index", examples=30)
    cache_dir = task_cache_of(d)[1]
    files = sorted(os.path.join(cache_dir, f) for f in os.listdir(cache_dir)
                   if f.startswith("train.tfrecord-"))
    want = [r.numpy() for r in tf.data.TFRecordDataset(files)]
    index = RecordIndex.open(cache_dir, "train", files)
    assert index.size == 30 and all(os.path.exists(p) for p in index_paths(cache_dir, "train"))
    picks = np.array([29, 0, 14, 15, 3])
    assert list(index.read(picks)) == [want[i] for i in picks]
    assert list(RecordIndex.open(cache_dir, "train", files).read(picks)) == [
        want[i] for i in picks]  # the saved index, memory-mapped
    with pytest.raises(IndexError):
        index.read(np.array([30]))
    # Files rewritten with other records: the saved index no longer matches, it is rebuilt.
    write_pretraining_records(d, "train", 31, TINY_MODEL["vocab_size"], 32, 5, seed=2)
    want = [r.numpy() for r in tf.data.TFRecordDataset(files)]
    index = RecordIndex.open(cache_dir, "train", files)
    assert index.size == 31 and list(index.read(np.arange(31))) == want


def test_a_run_records_its_stream_and_an_older_run_resumes_with_its_own(pretrain_data,
                                                                       tmp_path):
    data_dir, vocab_dir = pretrain_data
    inputs = {"data_dir": data_dir, "vocab_dir": vocab_dir}
    params = pretrain_params(train_steps=2, checkpoint_every=2, log_every=2, steps_per_loop=2,
                             batch_size=8)
    work_dir = str(tmp_path / "new")
    pretrain.run(make_ctx("pretrain", params, inputs, work_dir)).to_dict()
    with open(os.path.join(work_dir, pretraining_data.STREAM_FILE)) as f:
        assert json.load(f) == {"stream": pretraining_data.STREAM_VERSION}
    messages = []
    pretrain.run(make_ctx("pretrain", dict(params, train_steps=4), inputs, work_dir, messages)).to_dict()
    assert not any("data stream version" in m for m in messages)
    # A run written before streams had versions: no data_stream.json.
    os.remove(os.path.join(work_dir, pretraining_data.STREAM_FILE))
    messages = []
    summary = pretrain.run(make_ctx("pretrain", dict(params, train_steps=6), inputs, work_dir,
                                    messages)).to_dict()
    assert summary["step"] == 6
    assert any("data stream version 1" in m and "replaying" in m for m in messages)
    assert pretraining_data.stream_of_run(work_dir, resumed=True) == 1


def test_version_one_is_seqios_stream_replayed(pretrain_data):
    data_dir, _ = pretrain_data
    make = lambda skip: pretraining_data.pretraining_dataset(  # noqa: E731
        data_dir, "train", BATCH, 32, 5, seed=3, skip_batches=skip, stream=1)
    _assert_resumes_exactly(make, 6, [4])
    new = _batches(pretraining_data.pretraining_dataset(data_dir, "train", BATCH, 32, 5,
                                                        seed=3), 1)
    assert new[0]["input_ids"].tobytes() != _batches(make(0), 1)[0]["input_ids"].tobytes()
    with pytest.raises(ValueError, match="stream version 3"):
        pretraining_data.pretraining_dataset(data_dir, "train", BATCH, 32, 5, stream=3)


def test_two_hosts_with_dynamic_masks_resume_exactly_across_epochs(dynamic_dirs):
    d = dynamic_dirs["whole_words"]
    with open(os.path.join(task_cache_of(d)[1], "stats.train.json")) as f:
        n = json.load(f)["examples"]
    per_epoch = -(-(n // 2) // BATCH)  # a host's share, in batches
    firsts = []
    for host in range(2):
        info = seqio.ShardInfo(host, 2)
        make = lambda skip, info=info: pretraining_data.pretraining_dataset(  # noqa: E731
            d, "train", BATCH, 32, 5, seed=3, skip_batches=skip, shard_info=info)
        whole = _assert_resumes_exactly(make, 2 * per_epoch + 1,
                                        [1, per_epoch, per_epoch + 1, 2 * per_epoch])
        firsts.append(whole[0]["input_ids"].tobytes())
    assert firsts[0] != firsts[1]  # each host reads its own share


def test_a_static_second_phase_resumes_exactly_across_epochs(tmp_path):
    d = _static(tmp_path, "phase2_static", examples=30, seq=64, preds=10)
    make = lambda skip: pretraining_data.pretraining_dataset(  # noqa: E731
        d, "train", BATCH, 64, 10, seed=3, skip_batches=skip)
    whole = _assert_resumes_exactly(make, 10, [1, 3, 4, 8])  # an epoch every 3.75 batches
    assert whole[0]["input_ids"].shape == (BATCH, 64)
