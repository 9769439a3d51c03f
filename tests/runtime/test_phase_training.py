"""Pretraining in phases at run time: a later phase's examples come from the first phase's
kept tokens (no corpus byte read), and its training starts from the previous phase's final
checkpoint: its weights, and with optimizer_state "carry" its optimizer's moments."""

import json
import os

import numpy as np
import pytest

from tests.support.runtime import (make_ctx, pretrain_params, write_pretraining_records,
                             write_vocab_dir)

tf = pytest.importorskip("tensorflow")

from runexp.runtime import checkpoints  # noqa: E402
from runexp.runtime.stages import preprocess, pretrain  # noqa: E402

WORDS = [f"w{i}" for i in range(5, 60)]


def _corpus(tmp_path) -> tuple[str, str, str]:
    """Text of vocab words (one sentence a line, blank line between documents) and a
    WordPiece vocab of them."""
    rng = np.random.default_rng(0)

    def docs(n):
        return "\n\n".join("\n".join(" ".join(rng.choice(WORDS, rng.integers(3, 12))) + " ."
                                     for _ in range(rng.integers(4, 15)))
                           for _ in range(n)) + "\n"

    (tmp_path / "train.txt").write_text(docs(40))
    (tmp_path / "valid.txt").write_text(docs(6))
    vocab_dir = write_vocab_dir(str(tmp_path / "vocab"), 64, WORDS + [".", "w60", "w61", "w62"])
    return str(tmp_path / "train.txt"), str(tmp_path / "valid.txt"), vocab_dir


def _preprocess(tmp_path, name, inputs, **params):
    base = dict(task="t", max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2,
                random_seed=3, num_shards=3, num_workers=2)
    base.update(params)
    ctx = make_ctx("preprocess", base, inputs, str(tmp_path / name))
    return ctx.work_dir, preprocess.run(ctx)


def _records(stage_dir) -> dict:
    cache = os.path.join(stage_dir, "t")
    return {name: open(os.path.join(cache, name), "rb").read()
            for name in sorted(os.listdir(cache)) if ".tfrecord-" in name}


def test_a_later_phase_makes_from_the_kept_tokens_what_the_text_would_give(tmp_path):
    train, valid, vocab_dir = _corpus(tmp_path)
    text = {"train_files": [train], "validation_files": [valid], "vocab_dir": vocab_dir}
    first, s1 = _preprocess(tmp_path, "phase1", text, keep_split_index=True)
    kept = os.path.join(first, "split_index")
    assert sorted(os.listdir(kept)) == ["train", "validation"]
    assert s1["input_bytes_read"] >= s1["input_bytes"] > 0
    assert s1["split_index_bytes"] > 0
    assert not os.path.exists(os.path.join(first, ".preprocess-spill"))

    later, s2 = _preprocess(tmp_path, "phase2", {"split_index_dir": kept, "vocab_dir": vocab_dir},
                            max_seq_length=64, max_predictions_per_seq=10)
    assert s2["input_bytes_read"] == 0 and s2["read_per_input_byte"] == 0
    assert s2["input_bytes"] == s1["input_bytes"]  # the text they are made from
    assert not os.path.exists(os.path.join(later, "split_index"))
    # The same examples, byte for byte, as one phase at 64 tokens made from the text.
    direct, s3 = _preprocess(tmp_path, "direct", text, max_seq_length=64,
                             max_predictions_per_seq=10)
    assert not os.path.exists(os.path.join(direct, "split_index"))
    assert _records(later) == _records(direct) and len(_records(later)) == 6
    for split in ("train", "validation"):
        assert s2[split] == s3[split] and s2[split]["instances"] > 0
    # Longer examples: fewer of them than at 32 tokens.
    assert s2["train"]["instances"] < s1["train"]["instances"]
    info = json.load(open(os.path.join(later, "t", "info.train.json")))
    assert info["features"]["input_ids"]["shape"] == [64]


def test_a_later_phase_without_kept_tokens_is_a_clear_error(tmp_path):
    from runexp.compiler.errors import UserError

    _, _, vocab_dir = _corpus(tmp_path)
    with pytest.raises(UserError, match="no tokenised split in"):
        _preprocess(tmp_path, "phase2", {"split_index_dir": str(tmp_path / "nothing"),
                                         "vocab_dir": vocab_dir})


def _reader(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def _model(values):
    """The model's weights (its dropout generator's state advances with every step)."""
    return {n: v for n, v in values.items()
            if n.startswith("model/") and "/generator/" not in n}


def _slots(values, which):
    """Optimizer slot ``which`` ("m" or "v") of every variable, by its index."""
    return {n.split("/")[2]: v for n, v in values.items()
            if n.startswith(f"optimizer/{which}/") and n.endswith("VARIABLE_VALUE")}


@pytest.fixture(scope="module")
def phase2_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("phase2_data")
    data_dir = str(root / "preprocess")
    write_pretraining_records(data_dir, "train", 200, 64, 64, 10, seed=5)
    return data_dir


def _phase2(tmp_path, name, previous, data_dir, vocab_dir, **params):
    p = pretrain_params(max_seq_length=64, max_predictions_per_seq=10, train_steps=1,
                        checkpoint_every=1, steps_per_loop=1, warmup_steps=5,
                        keep_checkpoints=10)
    p.update(params)
    ctx = make_ctx("pretrain", p, {"data_dir": data_dir, "vocab_dir": vocab_dir,
                                   "previous_phase_dir": previous}, str(tmp_path / name))
    return ctx.work_dir, pretrain.run(ctx).to_dict()


def test_a_later_phase_starts_from_the_previous_final_weights(pretrained, pretrain_data,
                                                              phase2_data, tmp_path):
    previous, _ = pretrained
    _, vocab_dir = pretrain_data
    last = checkpoints.require_latest_checkpoint(previous)
    before = _reader(last)

    reset_dir, summary = _phase2(tmp_path, "reset", previous, phase2_data, vocab_dir)
    assert summary["previous_phase"] == {"checkpoint": last, "step": 120,
                                         "optimizer_state": "reset"}
    assert summary["step"] == 1 and summary["resumed_from"] is None
    reset = _reader(os.path.join(reset_dir, "checkpoints", "ckpt-1"))
    # The phase's first step has a learning rate of 0 (its warmup starts again), so after it
    # the weights are still exactly the previous phase's final ones.
    model = _model(before)
    assert len(model) > 20 and set(_model(reset)) == set(model)
    for name, value in model.items():
        np.testing.assert_array_equal(reset[name], value, err_msg=name)
    # Fresh moments: after one gradient g, m = 0.1 g and v = 0.001 g^2, so m^2 / v = 10.
    m, v = _slots(reset, "m"), _slots(reset, "v")
    assert len(m) == len(v) > 20
    for i in m:
        kept = v[i] > 1e-20
        np.testing.assert_allclose(m[i][kept] ** 2 / v[i][kept], 10.0, rtol=1e-3)
    assert reset["optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE"] == 1
    assert reset["batches_consumed/.ATTRIBUTES/VARIABLE_VALUE"] == 1

    # "carry": the previous moments go on (the same first gradient: same weights, batch and
    # dropout), the step and its schedule start again.
    carry_dir, summary = _phase2(tmp_path, "carry", previous, phase2_data, vocab_dir,
                                 optimizer_state="carry")
    assert summary["previous_phase"]["optimizer_state"] == "carry"
    carry = _reader(os.path.join(carry_dir, "checkpoints", "ckpt-1"))
    for name, value in model.items():
        np.testing.assert_array_equal(carry[name], value, err_msg=name)
    m0, v0 = _slots(before, "m"), _slots(before, "v")
    for i in m:
        np.testing.assert_allclose(_slots(carry, "m")[i], 0.9 * m0[i] + m[i], rtol=1e-4,
                                   atol=1e-9)
        np.testing.assert_allclose(_slots(carry, "v")[i], 0.999 * v0[i] + v[i], rtol=1e-4,
                                   atol=1e-12)
    assert carry["optimizer/iterations/.ATTRIBUTES/VARIABLE_VALUE"] == 1

    # Continued, the phase resumes from its own checkpoint, not from the previous phase.
    _, summary = _phase2(tmp_path, "reset", previous, phase2_data, vocab_dir, train_steps=3)
    assert summary["resumed_from"].endswith(os.path.join("reset", "checkpoints", "ckpt-1"))
    assert "previous_phase" not in summary and summary["step"] == 3
