"""pretrain and evaluate stages on real TFRecords: learning, resuming, metrics."""

import json
import os

import numpy as np
import pytest

from tests.support.runtime import make_ctx, pretrain_params
from runexp.compiler.errors import UserError
from runexp.runtime import checkpoints, pretraining_data
from runexp.runtime.stages import evaluate, pretrain


def _log(work_dir):
    with open(os.path.join(work_dir, "train_log.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_pretrain_learns_and_writes_its_outputs(pretrained):
    work_dir, summary = pretrained
    assert summary["step"] == 120 and summary["steps_trained"] == 120
    log = _log(work_dir)
    assert [r["step"] for r in log] == [30, 60, 90, 120]
    assert log[-1]["loss"] < log[0]["loss"] - 0.3
    assert log[-1]["batches_consumed"] == 120
    with open(os.path.join(work_dir, "bert_config.json")) as f:
        assert json.load(f)["hidden_size"] == 32
    assert sorted(os.listdir(os.path.join(work_dir, "checkpoints")))[0] == "checkpoint"
    assert checkpoints.latest_checkpoint(os.path.join(work_dir, "checkpoints")).endswith(
        "ckpt-120")
    assert os.listdir(os.path.join(work_dir, "tensorboard"))


def test_evaluate_beats_the_majority_token(pretrained, pretrain_data, tmp_path):
    data_dir, _ = pretrain_data
    work_dir, _ = pretrained
    p = pretrain_params()
    ctx = make_ctx("evaluate", {"model": p["model"], "batch_size": 32,
                                "max_seq_length": p["max_seq_length"],
                                "max_predictions_per_seq": p["max_predictions_per_seq"],
                                "max_examples": None},
                   {"data_dir": data_dir, "checkpoint_dir": work_dir}, str(tmp_path / "eval"))
    summary = evaluate.run(ctx)
    with open(tmp_path / "eval" / "metrics.json") as f:
        metrics = json.load(f)
    for key in ("mlm_accuracy", "mlm_loss", "nsp_accuracy", "examples",
                "majority_token_accuracy", "step"):
        assert key in metrics and metrics[key] == getattr(summary, key)
    assert metrics["examples"] == 200 and metrics["step"] == 120
    assert metrics["mlm_accuracy"] > metrics["majority_token_accuracy"] + 0.02


def test_dataset_is_deterministic_and_skips_exactly(pretrain_data):
    data_dir, _ = pretrain_data
    make = lambda skip: pretraining_data.pretraining_dataset(  # noqa: E731
        data_dir, "train", 8, 32, 5, seed=3, skip_batches=skip)
    first = [b["input_ids"].numpy() for b in make(0).take(6)]
    again = [b["input_ids"].numpy() for b in make(0).take(6)]
    skipped = [b["input_ids"].numpy() for b in make(4).take(2)]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(skipped[0], first[4])
    np.testing.assert_array_equal(skipped[1], first[5])
    assert first[0].dtype == np.int32


def test_input_hosts_read_their_own_shares(pretrain_data):
    import seqio

    data_dir, _ = pretrain_data

    def rows(shard_info, **kw):
        ds = pretraining_data.pretraining_dataset(data_dir, "train", 100, 32, 5, seed=3,
                                                  shard_info=shard_info, **kw)
        return [r.tobytes() for b in ds for r in b["input_ids"].numpy()]

    everything = rows(None, training=False)
    assert len(everything) == len(set(everything)) == 1200
    # 2 hosts: one of the 2 cached files each; 3 hosts: every third example.
    for hosts in (2, 3):
        shares = [rows(seqio.ShardInfo(i, hosts), training=False) for i in range(hosts)]
        assert sorted(sum(shares, [])) == sorted(everything), hosts
    # Training: each host's stream is its own, deterministic for the seed.
    def stream(index):
        return [b["input_ids"].numpy().tobytes() for b in pretraining_data.pretraining_dataset(
            data_dir, "train", 8, 32, 5, seed=3, shard_info=seqio.ShardInfo(index, 2)).take(3)]

    first = [stream(0), stream(1)]
    assert stream(1) == first[1] and first[0] != first[1]


def test_stop_and_resume_continues_step_and_data(pretrain_data, tmp_path):
    data_dir, vocab_dir = pretrain_data
    inputs = {"data_dir": data_dir, "vocab_dir": vocab_dir}
    work_dir = str(tmp_path / "pretrain")
    params = pretrain_params(train_steps=20, checkpoint_every=10, log_every=10)
    first = pretrain.run(make_ctx("pretrain", params, inputs, work_dir)).to_dict()
    assert first["step"] == 20 and first["batches_consumed"] == 20

    messages = []
    second = pretrain.run(make_ctx("pretrain", dict(params, train_steps=30), inputs, work_dir,
                                   messages)).to_dict()
    assert second["resumed_from"].endswith("ckpt-20")
    assert second["step"] == 30 and second["steps_trained"] == 10
    assert second["batches_consumed"] == 30
    assert any("resuming from" in m and "20 batches consumed" in m for m in messages)
    assert [r["step"] for r in _log(work_dir)] == [10, 20, 30]

    # Nothing left to do: a re-run returns at once with the step unchanged.
    third = pretrain.run(make_ctx("pretrain", dict(params, train_steps=30), inputs, work_dir)).to_dict()
    assert third["step"] == 30 and third["steps_trained"] == 0


def test_nan_loss_stops_naming_the_last_checkpoint(pretrain_data, tmp_path):
    data_dir, vocab_dir = pretrain_data
    params = pretrain_params(train_steps=20, checkpoint_every=10, learning_rate=1e30,
                             warmup_steps=0)
    with pytest.raises(FloatingPointError, match="last good checkpoint"):
        pretrain.run(make_ctx("pretrain", params, {"data_dir": data_dir,
                                                   "vocab_dir": vocab_dir},
                              str(tmp_path / "pretrain"))).to_dict()


def test_init_checkpoint_in_google_layout(pretrained, pretrain_data, tmp_path):
    from runexp.runtime.model import BertConfig, BertPretrainer

    data_dir, vocab_dir = pretrain_data
    p = pretrain_params()
    source = BertPretrainer(BertConfig.from_dict(p["model"]))
    prefix = checkpoints.save_google_checkpoint(
        {k: v for k, v in source.google_variables().items() if not k.startswith("cls/")},
        str(tmp_path / "google" / "bert_model.ckpt"))
    messages = []
    summary = pretrain.run(make_ctx(
        "pretrain", pretrain_params(train_steps=2, init_checkpoint=prefix),
        {"data_dir": data_dir, "vocab_dir": vocab_dir}, str(tmp_path / "pt"), messages)).to_dict()
    assert summary["init_checkpoint"]["missing"][0].startswith("cls/")
    assert summary["init_checkpoint"]["unused"] == []
    bad = pretrain_params(model=dict(p["model"], vocab_size=80), init_checkpoint=prefix)
    with pytest.raises(UserError, match="vocabulary of 64 tokens"):
        pretrain.run(make_ctx("pretrain", bad, {"data_dir": data_dir, "vocab_dir": vocab_dir},
                              str(tmp_path / "bad"))).to_dict()


# --- dynamic masking and mixtures ------------------------------------------------------------

@pytest.fixture(scope="module")
def dynamic_data(tmp_path_factory):
    """(data_dir, vocab_dir): real text preprocessed with dynamic_masking (train unmasked,
    validation statically masked), TINY_SEQ tokens, TINY_PRED predictions, whole words."""
    from tests.runtime.test_stage_preprocess import make_inputs, run_stage

    root = tmp_path_factory.mktemp("dynamic")
    vocab_dir = make_inputs(root)
    out, _ = run_stage(root, "preprocess", vocab_dir, num_workers=1, dynamic_masking=True)
    return str(out), vocab_dir


def _unmasked(batch):
    ids = batch["input_ids"].numpy().copy()
    rows, cols = np.nonzero(batch["masked_lm_weights"].numpy() > 0)
    ids[rows, batch["masked_lm_positions"].numpy()[rows, cols]] = \
        batch["masked_lm_ids"].numpy()[rows, cols]
    return ids


def test_dynamic_masks_resume_exactly_and_change_every_epoch(dynamic_data):
    data_dir, _ = dynamic_data
    make = lambda skip, **kw: pretraining_data.pretraining_dataset(  # noqa: E731
        data_dir, "train", 8, 32, 5, seed=3, skip_batches=skip, **kw)
    first = list(make(0).take(6))
    assert set(first[0]) == {"input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                             "masked_lm_ids", "masked_lm_weights", "next_sentence_labels"}
    assert (first[0]["masked_lm_weights"].numpy().sum(axis=1) > 0).all()
    again = list(make(0).take(6))
    skipped = list(make(4).take(2))
    for a, b in zip(first + first[4:], again + skipped):
        for name in a:
            np.testing.assert_array_equal(a[name].numpy(), b[name].numpy(), err_msg=name)
    # Without shuffling, epoch 2 repeats epoch 1's instances with new masks.
    from runexp.tasks.cache.records import task_cache_of
    with open(os.path.join(task_cache_of(data_dir)[1], "stats.train.json")) as f:
        n = json.load(f)["examples"]
    stream = list(make(0, shuffle_buffer=1).unbatch().batch(n).take(2))
    order = [np.lexsort(_unmasked(s).T[::-1]) for s in stream]  # the epochs' rows, sorted
    np.testing.assert_array_equal(_unmasked(stream[0])[order[0]], _unmasked(stream[1])[order[1]])
    positions = [s["masked_lm_positions"].numpy()[o] for s, o in zip(stream, order)]
    assert (positions[0] != positions[1]).any(axis=1).mean() > 0.8


def test_a_dynamically_masked_mixture_resumes_exactly(dynamic_data, tmp_path):
    import shutil

    from runexp.tasks.cache.records import task_cache_of
    data_dir, _ = dynamic_data
    # The same data as two members (two task names): each member has its own mask key.
    twin = str(tmp_path / "twin")
    shutil.copytree(task_cache_of(data_dir)[1], os.path.join(twin, "t_mlm_twin"))
    make = lambda skip: pretraining_data.pretraining_dataset(  # noqa: E731
        [data_dir, twin], "train", 8, 32, 5, seed=3, skip_batches=skip, rates=[0.5, 0.5])
    first = list(make(0).take(8))
    for a, b in zip(first[5:], make(5).take(3)):
        for name in a:
            np.testing.assert_array_equal(a[name].numpy(), b[name].numpy(), err_msg=name)


def test_pretrain_and_evaluate_on_dynamically_masked_data(dynamic_data, tmp_path):
    data_dir, vocab_dir = dynamic_data
    inputs = {"data_dir": data_dir, "vocab_dir": vocab_dir}
    work_dir = str(tmp_path / "pretrain")
    params = pretrain_params(train_steps=4, checkpoint_every=2, log_every=2, steps_per_loop=2,
                             batch_size=8)
    assert pretrain.run(make_ctx("pretrain", params, inputs, work_dir)).to_dict()["step"] == 4
    resumed = pretrain.run(make_ctx("pretrain", dict(params, train_steps=6), inputs, work_dir)).to_dict()
    assert resumed["step"] == 6 and resumed["batches_consumed"] == 6
    p = pretrain_params()
    summary = evaluate.run(make_ctx(
        "evaluate", {"model": p["model"], "batch_size": 8, "max_seq_length": 32,
                     "max_predictions_per_seq": 5, "max_examples": None},
        {"data_dir": data_dir, "checkpoint_dir": work_dir}, str(tmp_path / "eval")))
    # The baseline's majority token comes from masks drawn as training draws them.
    assert summary.examples > 0 and summary.majority_token_id > 4
    assert 0 < summary.majority_token_accuracy < 1


def _member_of(rows: np.ndarray, members: list[set]) -> list[int]:
    return [next(i for i, m in enumerate(members) if r.tobytes() in m) for r in rows]


def test_mixture_samples_members_by_rate_deterministically(tmp_path):
    from tests.support.runtime import TINY_MODEL, write_pretraining_records

    dirs, members = [], []
    for i, seed in enumerate((11, 12)):
        d = str(tmp_path / f"member{i}")
        write_pretraining_records(d, "train", 300, TINY_MODEL["vocab_size"], 32, 5, seed=seed)
        dirs.append(d)
        ds = pretraining_data.pretraining_dataset(d, "train", 300, 32, 5, training=False)
        members.append({r.tobytes() for b in ds for r in b["input_ids"].numpy()})
    assert not members[0] & members[1]
    rates = [0.7, 0.3]
    make = lambda skip: pretraining_data.pretraining_dataset(  # noqa: E731
        dirs, "train", 100, 32, 5, seed=5, skip_batches=skip, rates=rates)
    batches = [b["input_ids"].numpy() for b in make(0).take(40)]
    whom = np.array(_member_of(np.concatenate(batches), members))
    n = len(whom)
    for i, rate in enumerate(rates):
        share = np.mean(whom == i)
        band = 3.29 * np.sqrt(rate * (1 - rate) / n)  # binomial, 99.9%
        assert abs(share - rate) <= band, (i, share, rate, band)
    # Deterministic for the seed, and a resume skips to exactly the same batches.
    for a, b in zip(batches[30:32], make(30).take(2)):
        np.testing.assert_array_equal(a, b["input_ids"].numpy())
    other = next(iter(pretraining_data.pretraining_dataset(
        dirs, "train", 100, 32, 5, seed=6, rates=rates)))["input_ids"].numpy()
    assert not np.array_equal(other, batches[0])


def test_pretrain_and_evaluate_a_mixture(pretrain_data, tmp_path):
    from tests.support.runtime import TINY_MODEL, write_pretraining_records

    data_dir, vocab_dir = pretrain_data
    other = str(tmp_path / "other")
    write_pretraining_records(other, "train", 200, TINY_MODEL["vocab_size"], 32, 5, seed=21)
    write_pretraining_records(other, "validation", 50, TINY_MODEL["vocab_size"], 32, 5,
                              seed=22, num_shards=1)
    dirs = {"wiki": data_dir, "books": other}
    params = pretrain_params(train_steps=4, checkpoint_every=2, log_every=2, steps_per_loop=2,
                             mixture="mix", mixture_rates={"wiki": 0.7, "books": 0.3})
    work_dir = str(tmp_path / "pretrain")
    summary = pretrain.run(make_ctx("pretrain", params, {"data_dirs": dirs,
                                                         "vocab_dir": vocab_dir}, work_dir)).to_dict()
    assert summary["step"] == 4 and summary["batches_consumed"] == 4
    p = pretrain_params()
    metrics = evaluate.run(make_ctx(
        "evaluate", {"model": p["model"], "batch_size": 25, "max_seq_length": 32,
                     "max_predictions_per_seq": 5, "max_examples": None},
        {"data_dirs": dirs, "checkpoint_dir": work_dir}, str(tmp_path / "eval"))).to_dict()
    assert set(metrics["tasks"]) == {"books", "wiki"}
    assert metrics["tasks"]["wiki"]["examples"] == 200
    assert metrics["tasks"]["books"]["examples"] == 50
    assert metrics["examples"] == 250 and metrics["step"] == 4
    # Overall = the members pooled, weighted by their examples (NSP: 1 per example).
    pooled = sum(m["nsp_accuracy"] * m["examples"] for m in metrics["tasks"].values()) / 250
    assert metrics["nsp_accuracy"] == pytest.approx(pooled)
