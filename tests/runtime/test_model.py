"""BERT model: Google's variable layout, checkpoint round trip, shapes."""

import numpy as np
import pytest
import tensorflow as tf

from runexp.compiler.errors import UserError
from runexp.runtime import checkpoints
from runexp.runtime.model import BertConfig, BertPretrainer, count_parameters

CONFIG = BertConfig.from_dict({
    "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "max_position_embeddings": 24, "type_vocab_size": 2})


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


def _google_shapes(c: BertConfig) -> dict:
    h, i = c.hidden_size, c.intermediate_size
    shapes = {
        "bert/embeddings/word_embeddings": [c.vocab_size, h],
        "bert/embeddings/token_type_embeddings": [c.type_vocab_size, h],
        "bert/embeddings/position_embeddings": [c.max_position_embeddings, h],
        "bert/embeddings/LayerNorm/gamma": [h], "bert/embeddings/LayerNorm/beta": [h],
        "bert/pooler/dense/kernel": [h, h], "bert/pooler/dense/bias": [h],
        "cls/predictions/transform/dense/kernel": [h, h],
        "cls/predictions/transform/dense/bias": [h],
        "cls/predictions/transform/LayerNorm/gamma": [h],
        "cls/predictions/transform/LayerNorm/beta": [h],
        "cls/predictions/output_bias": [c.vocab_size],
        "cls/seq_relationship/output_weights": [2, h],
        "cls/seq_relationship/output_bias": [2],
    }
    for n in range(c.num_hidden_layers):
        p = f"bert/encoder/layer_{n}"
        for name in ("attention/self/query", "attention/self/key", "attention/self/value",
                     "attention/output/dense"):
            shapes[f"{p}/{name}/kernel"], shapes[f"{p}/{name}/bias"] = [h, h], [h]
        shapes[f"{p}/intermediate/dense/kernel"] = [h, i]
        shapes[f"{p}/intermediate/dense/bias"] = [i]
        shapes[f"{p}/output/dense/kernel"] = [i, h]
        shapes[f"{p}/output/dense/bias"] = [h]
        for norm in ("attention/output/LayerNorm", "output/LayerNorm"):
            shapes[f"{p}/{norm}/gamma"] = shapes[f"{p}/{norm}/beta"] = [h]
    return shapes


def test_variables_match_google_layout():
    model = BertPretrainer(CONFIG)
    got = {name: v.shape.as_list() for name, v in model.google_variables().items()}
    assert got == _google_shapes(CONFIG)
    # Every trainable variable of the module is in the map (nothing unnamed).
    assert {id(v) for v in model.trainable_variables} == \
        {id(v) for v in model.google_variables().values()}


def test_forward_shapes_and_padding_invariance():
    model = BertPretrainer(CONFIG)
    f = _features()
    mlm, nsp = model(f)
    assert mlm.shape == [3 * 4, CONFIG.vocab_size] and nsp.shape == [3, 2]
    # Changing tokens under the padding mask changes nothing for the unpadded ones.
    g = {k: v.copy() for k, v in f.items()}
    g["input_ids"][0, 8:] = 7
    seq_a, _ = model.encoder(f["input_ids"], f["input_mask"], f["segment_ids"])
    seq_b, _ = model.encoder(g["input_ids"], g["input_mask"], g["segment_ids"])
    np.testing.assert_allclose(seq_a.numpy()[:8], seq_b.numpy()[:8], atol=1e-5)


def test_loss_matches_definition():
    model = BertPretrainer(CONFIG)
    f = _features()
    loss, stats = model.loss(f)
    mlm, nsp = model(f)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=f["masked_lm_ids"].reshape(-1), logits=mlm).numpy()
    w = f["masked_lm_weights"].reshape(-1)
    nsp_ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=f["next_sentence_labels"].reshape(-1), logits=nsp).numpy()
    assert float(loss) == pytest.approx((w * ce).sum() / w.sum() + nsp_ce.mean(), rel=1e-5)
    assert float(stats["mlm_weight"]) == 9.0


def test_google_checkpoint_round_trip(tmp_path):
    tf.random.set_seed(1)
    source = BertPretrainer(CONFIG)
    prefix = checkpoints.save_google_checkpoint(source.google_variables(),
                                                str(tmp_path / "bert_model.ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    assert set(reader.get_variable_to_shape_map()) == set(source.google_variables())

    tf.random.set_seed(2)
    fresh = BertPretrainer(CONFIG)
    f = _features()
    assert not np.allclose(source(f)[0].numpy(), fresh(f)[0].numpy())
    report = checkpoints.load_google_checkpoint(fresh.google_variables(), prefix)
    assert report.missing == () and report.unused == ()
    assert len(report.loaded) == len(source.google_variables())
    for a, b in zip(source(f), fresh(f)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_google_checkpoint_vocab_mismatch_is_refused(tmp_path):
    prefix = checkpoints.save_google_checkpoint(BertPretrainer(CONFIG).google_variables(),
                                                str(tmp_path / "ckpt"))
    other = BertPretrainer(BertConfig.from_dict({**CONFIG.to_dict(), "vocab_size": 60}))
    with pytest.raises(UserError, match="vocabulary of 50 tokens but the model's "
                                        "vocab_size is 60"):
        checkpoints.load_google_checkpoint(other.google_variables(), prefix)


def test_missing_or_corrupt_google_checkpoint_is_a_user_error(tmp_path):
    model = BertPretrainer(CONFIG)
    with pytest.raises(UserError, match="no checkpoint there") as e:
        checkpoints.load_google_checkpoint(model.google_variables(), str(tmp_path / "nope"))
    assert "INIT_CHECKPOINT is a prefix" in e.value.render()
    prefix = checkpoints.save_google_checkpoint(model.google_variables(), str(tmp_path / "c"))
    with open(prefix + ".index", "r+b") as f:
        f.truncate(40)
    with pytest.raises(UserError, match="init_checkpoint .*c: "):
        checkpoints.load_google_checkpoint(model.google_variables(), prefix)


def test_bfloat16_compute_is_close_to_float32():
    tf.random.set_seed(3)
    model = BertPretrainer(CONFIG)
    fast = BertPretrainer(CONFIG, compute_dtype="bfloat16")
    for a, b in zip(fast.google_variables().values(), model.google_variables().values()):
        a.assign(b)
    f = _features()
    np.testing.assert_allclose(fast(f)[0].numpy(), model(f)[0].numpy(), atol=0.05)


def test_parameter_count():
    assert count_parameters(BertPretrainer(CONFIG).google_variables()) == sum(
        int(np.prod(s)) for s in _google_shapes(CONFIG).values())
