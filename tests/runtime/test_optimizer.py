"""AdamW (BERT flavour) and its learning-rate schedule."""

import numpy as np
import pytest
import tensorflow as tf

from runexp.compiler.specs import OptimizerSpec
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


# --- schedules, LAMB, Amos, conditional updates, loss scaling --------------------------------

from runexp.runtime.optimizer import (Amos, DynamicLossScale, Lamb, WarmupDecay,  # noqa: E402
                                      amos_eta, amos_slot_shape, make_optimizer,
                                      optimizer_from_spec)


def test_polynomial_decay_to_an_end_learning_rate():
    s = WarmupDecay(peak=1.0, warmup_steps=10, train_steps=100, decay="polynomial",
                    decay_power=2.0, end_learning_rate=0.1)
    assert float(s(5)) == pytest.approx(0.5)
    assert float(s(55)) == pytest.approx(0.9 * 0.45 ** 2 + 0.1)
    assert float(s(100)) == pytest.approx(0.1) and float(s(500)) == pytest.approx(0.1)
    linear = WarmupDecay(1.0, 0, 100, decay="linear", decay_power=3.0)  # power is ignored
    assert float(linear(50)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="decay must be one of"):
        WarmupDecay(1.0, 0, 10, decay="cosine")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        make_optimizer("sgd", s, weight_decay=0.01, clip_norm=1.0)


def _lamb_reference(w, g, t, lr, wd, adapt, m=0.0, v=0.0, b1=0.9, b2=0.999, eps=1e-6):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    r = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    if adapt:
        r = r + wd * w
        wn, rn = np.linalg.norm(w), np.linalg.norm(r)
        r = r * (wn / rn if wn > 0 and rn > 0 else 1.0)
    return w - lr * r, m, v


def test_lamb_two_steps_match_the_paper_with_trust_ratio_only_on_weights():
    rng = np.random.default_rng(0)
    kernel0 = rng.normal(size=[3, 4]).astype(np.float32)
    bias0 = rng.normal(size=[4]).astype(np.float32)
    named = {"l/dense/kernel": tf.Variable(kernel0), "l/dense/bias": tf.Variable(bias0)}
    opt = Lamb(WarmupDecay(0.01, 0, 1000), weight_decay=0.1, clip_norm=0)
    opt.build(named)
    ref = {"l/dense/kernel": (kernel0, 0.0, 0.0, True), "l/dense/bias": (bias0, 0.0, 0.0, False)}
    for t in (1, 2):
        grads = [rng.normal(size=v.shape).astype(np.float32) for v in named.values()]
        lr = float(opt.apply([tf.constant(g) for g in grads], list(named.values())))
        for (name, (w, m, v, adapt)), g in zip(list(ref.items()), grads):
            w, m, v = _lamb_reference(w, g, t, lr, 0.1, adapt, m, v)
            ref[name] = (w, m, v, adapt)
    for name, var in named.items():
        np.testing.assert_allclose(var.numpy(), ref[name][0], rtol=1e-5, atol=1e-6)


def _amos_reference(w, g, t, xi, eta, axes, v, b, m, beta=0.999, zeta=0.25, mu=0.9):
    g2 = (g * g).mean() if axes is None else (g * g).mean(axis=tuple(axes), keepdims=True)
    v = beta * v + (1 - beta) * g2
    r = (1 - beta ** t) / np.maximum(v, 2.0 ** -125)
    gamma = xi ** 2 * r * g2 / np.sqrt(1 + zeta * np.sqrt(xi) * b)
    alpha = xi * eta
    u = -(alpha * np.sqrt(r) * g + 0.5 * gamma * w) / (1 + zeta * np.sqrt(alpha) * b)
    b = b + gamma * (1 + b)
    m = mu * m + (1 - mu) * u
    return w + m, v, b, m


def test_amos_three_steps_match_the_update_rule():
    rng = np.random.default_rng(1)
    h = 4
    shapes = {"bert/encoder/layer_0/intermediate/dense/kernel": [h, 6],
              "bert/encoder/layer_0/output/dense/kernel": [6, h],
              "bert/embeddings/word_embeddings": [5, h],
              "bert/encoder/layer_0/output/LayerNorm/gamma": [h],
              "cls/predictions/output_bias": [5]}
    init = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    named = {n: tf.Variable(x) for n, x in init.items()}
    opt = Amos(WarmupDecay(0.05, 0, 1000), hidden_size=h, clip_norm=0)
    opt.build(named)
    assert [list(v.shape) for v in opt.v] == [[1, 6], [1, h], [5, 1], [], []]
    assert amos_eta("bert/encoder/layer_0/output/dense/kernel", [6, h], h) == \
        pytest.approx(np.sqrt(2 / 6))
    assert amos_eta("bert/embeddings/word_embeddings", [5, h], h) == pytest.approx(np.sqrt(2 / h))
    assert amos_eta("bert/encoder/layer_0/output/LayerNorm/gamma", [h], h) == 1.0
    assert amos_eta("cls/predictions/output_bias", [5], h) == 0.5
    state = {n: (init[n], np.zeros(amos_slot_shape(n, s)), np.zeros(amos_slot_shape(n, s)),
                 np.zeros(s)) for n, s in shapes.items()}
    for t in (1, 2, 3):
        grads = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
        xi = float(opt.apply([tf.constant(grads[n]) for n in named], list(named.values())))
        for n, s in shapes.items():
            slot = amos_slot_shape(n, s)
            axes = None if not slot else [a for a, k in enumerate(slot) if k == 1]
            w, v, b, m = state[n]
            state[n] = _amos_reference(w, grads[n], t, xi, amos_eta(n, s, h), axes, v, b, m)
    for n, var in named.items():
        np.testing.assert_allclose(var.numpy(), state[n][0], rtol=1e-4, atol=1e-6, err_msg=n)
        np.testing.assert_allclose(opt.b[list(named).index(n)].numpy(), state[n][2],
                                   rtol=1e-4, atol=1e-9, err_msg=n)


@pytest.mark.parametrize("name", ["adamw", "lamb", "amos"])
def test_every_optimizer_checkpoints_its_slots_and_resumes_exactly(name, tmp_path):
    rng = np.random.default_rng(2)
    shapes = {"a/dense/kernel": [3, 4], "a/dense/bias": [4], "a/LayerNorm/gamma": [4]}
    init = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    grads = [[tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes.values()]
             for _ in range(3)]
    params = {"optimizer": name, "learning_rate": 0.01, "warmup_steps": 1}

    def fresh():
        named = {n: tf.Variable(x) for n, x in init.items()}
        opt = optimizer_from_spec(OptimizerSpec.of(**params), 100, hidden_size=4)
        opt.build(named)
        return named, opt

    named, opt = fresh()
    opt.apply(grads[0], list(named.values()))
    opt.apply(grads[1], list(named.values()))
    path = tf.train.Checkpoint(opt=opt, vars=list(named.values())).save(str(tmp_path / "c"))
    opt.apply(grads[2], list(named.values()))

    named2, opt2 = fresh()
    tf.train.Checkpoint(opt=opt2, vars=list(named2.values())).restore(path).assert_consumed()
    assert int(opt2.iterations.numpy()) == 2
    opt2.apply(grads[2], list(named2.values()))
    for a, b in zip(named.values(), named2.values()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_update_if_false_keeps_everything_but_counts_the_step():
    var = tf.Variable([1.0, 2.0])
    opt = make_optimizer("lamb", WarmupDecay(0.1, 0, 10), weight_decay=0.01, clip_norm=1.0)
    opt.build({"x/kernel": var})
    opt.apply([tf.constant([np.inf, 1.0])], [var], update_if=tf.constant(False))
    np.testing.assert_array_equal(var.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(opt.m[0].numpy(), [0.0, 0.0])
    assert int(opt.iterations.numpy()) == 1


def test_dynamic_loss_scale_halves_on_overflow_and_grows_after_good_steps():
    scale = DynamicLossScale(initial_scale=8.0, growth_steps=2)
    scale.update(tf.constant(False))
    assert float(scale.scale.numpy()) == 4.0
    scale.update(tf.constant(True))
    assert float(scale.scale.numpy()) == 4.0 and int(scale.good_steps.numpy()) == 1
    scale.update(tf.constant(True))
    assert float(scale.scale.numpy()) == 8.0 and int(scale.good_steps.numpy()) == 0
