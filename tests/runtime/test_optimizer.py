"""AdamW (BERT flavour) and its learning-rate schedule."""

import numpy as np
import pytest
import tensorflow as tf

from runexp.runtime.optimizer import AdamW, WarmupLinearDecay, decays


def test_schedule_warmup_peak_and_end():
    s = WarmupLinearDecay(peak=1e-3, warmup_steps=10, train_steps=100)
    assert float(s(0)) == 0.0
    assert float(s(5)) == pytest.approx(5e-4)
    assert float(s(10)) == pytest.approx(1e-3 * 0.9)  # Google's: decay counts from step 0
    assert float(s(55)) == pytest.approx(1e-3 * 0.45)
    assert float(s(100)) == 0.0 and float(s(150)) == 0.0


def test_no_decay_on_layer_norm_and_bias():
    assert decays("bert/encoder/layer_0/attention/self/query/kernel")
    assert decays("bert/embeddings/word_embeddings")
    assert not decays("bert/encoder/layer_0/output/LayerNorm/gamma")
    assert not decays("bert/pooler/dense/bias")
    assert not decays("cls/predictions/output_bias")


def test_zero_gradient_update_is_pure_weight_decay():
    kernel = tf.Variable(np.full([2, 2], 2.0, np.float32))
    bias = tf.Variable(np.full([2], 2.0, np.float32))
    gamma = tf.Variable(np.full([2], 2.0, np.float32))
    named = {"a/kernel": kernel, "a/bias": bias, "a/LayerNorm/gamma": gamma}
    opt = AdamW(WarmupLinearDecay(0.1, 0, 10), weight_decay=0.5)
    opt.build(named)
    lr = opt.apply([tf.zeros([2, 2]), tf.zeros([2]), tf.zeros([2])], list(named.values()))
    assert float(lr) == pytest.approx(0.1)
    np.testing.assert_allclose(kernel.numpy(), 2.0 - 0.1 * 0.5 * 2.0)
    np.testing.assert_allclose(bias.numpy(), 2.0)
    np.testing.assert_allclose(gamma.numpy(), 2.0)
    assert int(opt.iterations.numpy()) == 1


def test_adam_step_without_bias_correction_and_clipping():
    var = tf.Variable([1.0, 1.0])
    opt = AdamW(WarmupLinearDecay(0.01, 0, 1000), weight_decay=0.0)
    opt.build({"x/bias": var})
    opt.apply([tf.constant([30.0, 40.0])], [var])  # norm 50 -> clipped to [0.6, 0.8]
    g = np.array([0.6, 0.8])
    m, v = 0.1 * g, 0.001 * g * g
    np.testing.assert_allclose(var.numpy(), 1.0 - 0.01 * m / (np.sqrt(v) + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(opt.m[0].numpy(), m, rtol=1e-5)


def test_slots_are_checkpointed(tmp_path):
    var = tf.Variable([1.0])
    opt = AdamW(WarmupLinearDecay(0.01, 0, 100))
    opt.build({"w/kernel": var})
    opt.apply([tf.constant([1.0])], [var])
    path = tf.train.Checkpoint(opt=opt).save(str(tmp_path / "ckpt"))
    other = AdamW(WarmupLinearDecay(0.01, 0, 100))
    other.build({"w/kernel": tf.Variable([0.0])})
    tf.train.Checkpoint(opt=other).restore(path).assert_consumed()
    assert int(other.iterations.numpy()) == 1
    np.testing.assert_allclose(other.m[0].numpy(), opt.m[0].numpy())
