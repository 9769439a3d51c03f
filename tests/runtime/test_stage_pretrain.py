"""pretrain and evaluate stages on real TFRecords: learning, resuming, metrics."""

import json
import os

import numpy as np
import pytest

from runtime_testlib import make_ctx, pretrain_params
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
        assert key in metrics and metrics[key] == summary[key]
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


def test_stop_and_resume_continues_step_and_data(pretrain_data, tmp_path):
    data_dir, vocab_dir = pretrain_data
    inputs = {"data_dir": data_dir, "vocab_dir": vocab_dir}
    work_dir = str(tmp_path / "pretrain")
    params = pretrain_params(train_steps=20, checkpoint_every=10, log_every=10)
    first = pretrain.run(make_ctx("pretrain", params, inputs, work_dir))
    assert first["step"] == 20 and first["batches_consumed"] == 20

    messages = []
    second = pretrain.run(make_ctx("pretrain", dict(params, train_steps=30), inputs, work_dir,
                                   messages))
    assert second["resumed_from"].endswith("ckpt-20")
    assert second["step"] == 30 and second["steps_trained"] == 10
    assert second["batches_consumed"] == 30
    assert any("resuming from" in m and "20 batches consumed" in m for m in messages)
    assert [r["step"] for r in _log(work_dir)] == [10, 20, 30]

    # Nothing left to do: a re-run returns at once with the step unchanged.
    third = pretrain.run(make_ctx("pretrain", dict(params, train_steps=30), inputs, work_dir))
    assert third["step"] == 30 and third["steps_trained"] == 0


def test_nan_loss_stops_naming_the_last_checkpoint(pretrain_data, tmp_path):
    data_dir, vocab_dir = pretrain_data
    params = pretrain_params(train_steps=20, checkpoint_every=10, learning_rate=1e30,
                             warmup_steps=0)
    with pytest.raises(FloatingPointError, match="last good checkpoint"):
        pretrain.run(make_ctx("pretrain", params, {"data_dir": data_dir,
                                                   "vocab_dir": vocab_dir},
                              str(tmp_path / "pretrain")))


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
        {"data_dir": data_dir, "vocab_dir": vocab_dir}, str(tmp_path / "pt"), messages))
    assert summary["init_checkpoint"]["missing"][0].startswith("cls/")
    assert summary["init_checkpoint"]["unused"] == []
    bad = pretrain_params(model=dict(p["model"], vocab_size=80), init_checkpoint=prefix)
    with pytest.raises(ValueError, match="vocabulary of 64 tokens"):
        pretrain.run(make_ctx("pretrain", bad, {"data_dir": data_dir, "vocab_dir": vocab_dir},
                              str(tmp_path / "bad")))
