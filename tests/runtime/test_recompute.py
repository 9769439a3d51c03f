"""Activation recomputation (train.recompute = "layers"): same gradients, same weights after
optimizer steps, interchangeable checkpoints, with dropout on, under XLA as TPUs run it."""

import numpy as np
import pytest
import tensorflow as tf

from runexp.runtime import checkpoints
from runexp.runtime.model import BertConfig, BertPretrainer
from runexp.runtime.optimizer import WarmupDecay, make_optimizer

CONFIG = BertConfig.from_dict({
    "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "max_position_embeddings": 24, "type_vocab_size": 2,
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1})


def _features(batch=3, seq=12, preds=4, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones([batch, seq], np.int32)
    mask[0, 8:] = 0
    return {
        "input_ids": rng.integers(0, CONFIG.vocab_size, [batch, seq]).astype(np.int32),
        "input_mask": mask,
        "segment_ids": (np.arange(seq)[None] >= seq // 2).astype(np.int32).repeat(batch, 0),
        "masked_lm_positions": rng.integers(1, 8, [batch, preds]).astype(np.int32),
        "masked_lm_ids": rng.integers(5, CONFIG.vocab_size, [batch, preds]).astype(np.int32),
        "masked_lm_weights": np.array([[1, 1, 1, 0]] * batch, np.float32),
        "next_sentence_labels": np.array([[0], [1], [0]], np.int32),
    }


def _pair(xla=True):
    """(model without, model with recomputation), same weights, same dropout seed."""
    plain = BertPretrainer(CONFIG, seed=7, xla=xla)
    recomputed = BertPretrainer(CONFIG, seed=7, xla=xla, recompute="layers")
    for name, var in recomputed.google_variables().items():
        var.assign(plain.google_variables()[name])
    return plain, recomputed


def _gradient_fn(model, jit_compile):
    names = list(model.google_variables())
    variables = [model.google_variables()[n] for n in names]

    @tf.function(jit_compile=jit_compile)
    def gradients(features):
        with tf.GradientTape() as tape:
            loss, _ = model.loss(features, training=True)
        return loss, tape.gradient(loss, variables)

    return names, gradients


def _assert_close(names, expected, actual, rtol=1e-5):
    """Each tensor within rtol of its largest entry (floored at 1e-4 of the largest entry of
    all: the key biases' gradients are zero in exact arithmetic, rounding noise in float)."""
    expected = [np.asarray(tf.convert_to_tensor(e)) for e in expected]
    actual = [np.asarray(tf.convert_to_tensor(a)) for a in actual]
    floor = 1e-4 * max(np.abs(e).max() for e in expected)
    for name, e, a in zip(names, expected, actual):
        scale = max(np.abs(e).max(), floor)
        assert np.abs(a - e).max() <= rtol * scale, (name, np.abs(a - e).max() / scale)


def test_gradients_equal_with_dropout():
    # Under XLA (jit_compile, as TPUs run it): the masks and gradients of recompute="none".
    plain, recomputed = _pair()
    names, plain_grads = _gradient_fn(plain, True)
    _, recomputed_grads = _gradient_fn(recomputed, True)
    features = _features()
    no_dropout = plain.loss(features, training=False)[0]
    for _ in range(2):  # the second step draws new masks from the advanced generators
        loss_a, grads_a = plain_grads(features)
        loss_b, grads_b = recomputed_grads(features)
        assert abs(float(loss_a) - float(no_dropout)) > 1e-4  # dropout is on
        np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-6)
        _assert_close(names, grads_a, grads_b)
    # Both models' dropout generators advanced alike.
    np.testing.assert_array_equal(plain.encoder.dropout.generator.state.numpy(),
                                  recomputed.encoder.dropout.generator.state.numpy())


def test_recomputation_redraws_the_masks_without_xla(monkeypatch):
    # Outside XLA mode the recomputed layers draw stateless Philox masks (not the 16-bit
    # masks of recompute="none"); the recomputation must draw them again: the gradients
    # equal those of the same layers kept on the tape.
    plain, recomputed = _pair(xla=False)
    for name, var in plain.google_variables().items():
        var.assign(recomputed.google_variables()[name])
    features = _features(seed=1)
    names, recomputed_grads = _gradient_fn(recomputed, False)
    loss_b, grads_b = recomputed_grads(features)
    monkeypatch.setattr(tf, "recompute_grad", lambda f: f)
    taped = BertPretrainer(CONFIG, seed=7, xla=False, recompute="layers")
    for name, var in taped.google_variables().items():
        var.assign(plain.google_variables()[name])
    _, taped_grads = _gradient_fn(taped, False)
    loss_a, grads_a = taped_grads(features)
    assert abs(float(loss_a) - float(taped.loss(features, training=False)[0])) > 1e-4
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-6)
    _assert_close(names, grads_a, grads_b)


def _train(model, steps, jit_compile=True):
    optimizer = make_optimizer("adamw", WarmupDecay(1e-2, 1, steps), weight_decay=0.01,
                               clip_norm=1.0)
    named = model.google_variables()
    optimizer.build(named)
    variables = list(named.values())

    @tf.function(jit_compile=jit_compile)
    def step(features):
        with tf.GradientTape() as tape:
            loss, _ = model.loss(features, training=True)
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    for i in range(steps):
        step(_features(seed=i))
    return optimizer


def test_weights_equal_after_optimizer_steps():
    plain, recomputed = _pair()
    _train(plain, 4)
    _train(recomputed, 4)
    a, b = plain.google_variables(), recomputed.google_variables()
    names = list(a)
    assert any(np.abs(a[n].numpy() - BertPretrainer(CONFIG).google_variables()[n].numpy()).max()
               > 0 for n in names)
    _assert_close(names, [a[n] for n in names], [b[n] for n in names], rtol=1e-5)


def test_checkpoints_are_interchangeable(tmp_path):
    plain, recomputed = _pair()
    assert list(plain.google_variables()) == list(recomputed.google_variables())
    assert ([v.name for v in plain.trainable_variables]
            == [v.name for v in recomputed.trainable_variables])
    # Trainer-style object checkpoint, written without recomputation, read with it (and back).
    optimizer = _train(plain, 2)
    prefix = tf.train.Checkpoint(model=plain, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    fresh = BertPretrainer(CONFIG, seed=99, xla=True, recompute="layers")
    fresh_optimizer = make_optimizer("adamw", WarmupDecay(1e-2, 1, 2), weight_decay=0.01,
                                     clip_norm=1.0)
    fresh_optimizer.build(fresh.google_variables())
    tf.train.Checkpoint(model=fresh, optimizer=fresh_optimizer).restore(
        prefix).assert_consumed()
    for name, var in plain.google_variables().items():
        np.testing.assert_array_equal(fresh.google_variables()[name].numpy(), var.numpy())
    np.testing.assert_array_equal(fresh.encoder.dropout.generator.state.numpy(),
                                  plain.encoder.dropout.generator.state.numpy())
    # Google layout: the same names both ways.
    google = checkpoints.save_google_checkpoint(fresh.google_variables(), str(tmp_path / "g"))
    back = BertPretrainer(CONFIG)
    report = checkpoints.load_google_checkpoint(back.google_variables(), google)
    assert not report.missing and not report.unused


def test_bad_recompute_value_is_refused():
    with pytest.raises(ValueError, match="recompute"):
        BertPretrainer(CONFIG, recompute="all")


def test_pretrain_stage_recomputes_and_resumes_either_way(pretrain_data, tmp_path):
    # train.recompute reaches the model; under XLA the run logs the losses of a run without
    # recomputation, and its checkpoints resume without it.
    import json
    import os

    from tests.support.runtime import make_ctx, pretrain_params
    from runexp.runtime.stages import pretrain

    data_dir, vocab_dir = pretrain_data
    inputs = {"data_dir": data_dir, "vocab_dir": vocab_dir}
    params = pretrain_params(train_steps=20, checkpoint_every=10, log_every=10,
                             jit_compile=True)

    def losses(work_dir):
        with open(os.path.join(work_dir, "train_log.jsonl")) as f:
            return [json.loads(line)["loss"] for line in f]

    messages = []
    on = str(tmp_path / "on")
    pretrain.run(make_ctx("pretrain", dict(params, recompute="layers"), inputs, on, messages)).to_dict()
    assert any("recompute layers" in m for m in messages)
    off = str(tmp_path / "off")
    pretrain.run(make_ctx("pretrain", params, inputs, off)).to_dict()
    np.testing.assert_allclose(losses(on), losses(off), rtol=1e-5)
    resumed = pretrain.run(make_ctx("pretrain", dict(params, train_steps=30), inputs, on)).to_dict()
    assert resumed["resumed_from"].endswith("ckpt-20") and resumed["step"] == 30


def test_the_fine_tuning_classifier_recomputes_with_equal_gradients():
    """finetune follows train.recompute (compiler/specs/finetune.py): the classifier's
    gradients, dropout on, under XLA, are those without recomputation."""
    from runexp.runtime.model import BertClassifier

    plain = BertClassifier(CONFIG, num_labels=3, seed=5, xla=True)
    recomputed = BertClassifier(CONFIG, num_labels=3, seed=5, xla=True, recompute="layers")
    for name, var in recomputed.google_variables().items():
        var.assign(plain.google_variables()[name])
    features = {k: v for k, v in _features().items() if not k.startswith(("masked", "next"))}
    features["label_ids"] = np.array([0, 2, 1], np.int32)
    names, expected = _gradient_fn(plain, jit_compile=True)
    _, actual = _gradient_fn(recomputed, jit_compile=True)
    loss_a, grads_a = expected(features)
    loss_b, grads_b = actual(features)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-6)
    _assert_close(names, grads_a, grads_b)


def _threefry_dropout(x, rate, key):
    """The XLA-mode dropout formula as it was before the mask was kept bit-packed: the
    same ThreeFry words, threshold compare and scale, nothing kept in between."""
    threshold = min(int(round(rate * 2 ** 32)), 2 ** 32 - 1)
    words = tf.random.stateless_uniform(tf.shape(x), seed=key, minval=None, maxval=None,
                                        dtype=tf.uint32, alg="threefry")
    keep = tf.cast(words >= tf.constant(threshold, tf.uint32), x.dtype)
    return x * (keep * (2 ** 32 / (2 ** 32 - threshold)))


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("shape", [[3, 2, 12, 12], [1, 1, 5, 7], [36, 16], [5, 7]])
def test_xla_dropout_is_bit_identical_to_the_unpacked_formula(shape, dtype):
    """Under XLA the dropout keeps the attention probabilities' (rank 4) masks packed 8
    elements a byte and makes an explicit key opaque to XLA's common-subexpression
    elimination (runtime/layers.py): its outputs and gradients, drawing its own key or given
    one, and through tf.recompute_grad, are bit for bit those of the plain formula from the
    same key (rank 2, and sizes not a multiple of 8, take the unpacked path)."""
    from runexp.runtime.layers import Dropout

    rng = np.random.default_rng(sum(shape))
    x = tf.cast(rng.normal(size=shape), dtype)
    g = tf.cast(rng.normal(size=shape), dtype)
    int_type = {2: tf.int16, 4: tf.int32}[dtype.size]
    for rate in (0.1, 0.5, 0.9):
        dropout, twin = Dropout(seed=11, xla=True), Dropout(seed=11, xla=True)

        @tf.function(jit_compile=True)
        def outputs(x, g):
            key = twin.key(rate, True)  # the key dropout's own next call draws
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(x)
                ys = [dropout(x, rate, True), dropout(x, rate, True, key=key),
                      tf.recompute_grad(lambda h: dropout(h, rate, True, key=key) * h)(x),
                      _threefry_dropout(x, rate, key),
                      tf.recompute_grad(lambda h: _threefry_dropout(h, rate, key) * h)(x)]
                losses = [tf.reduce_sum(tf.cast(y * g, tf.float32)) for y in ys]
            grads = [tape.gradient(loss, x) for loss in losses]
            return [tf.bitcast(t, int_type) for t in ys + grads]

        y_own, y_key, y_rec, y_ref, y_ref_rec, g_own, g_key, g_rec, g_ref, g_ref_rec = [
            t.numpy() for t in outputs(x, g)]
        for actual in (y_own, y_key):
            np.testing.assert_array_equal(actual, y_ref)
        np.testing.assert_array_equal(y_rec, y_ref_rec)
        for actual in (g_own, g_key):
            np.testing.assert_array_equal(actual, g_ref)
        np.testing.assert_array_equal(g_rec, g_ref_rec)
        assert 0 < (y_ref == 0).sum() < y_ref.size  # some dropped, some kept
