"""Packed pretraining rows in the model (issue 27): the same loss and gradients as the same
instances one a row, the same variables, and checkpoints that serve unpacked inputs.

"The same loss" is BertPretrainer's definition on the batch's instances, whatever the rows:
masked-LM = sum(weight * cross-entropy) / sum(weight) over every prediction of the batch,
next-sentence = mean cross-entropy over the batch's instances (a packed row's empty slots
weigh 0). Compared in float32 at relative 1e-5: the loss, and each variable's gradient by
norm (|g_packed - g_unpacked| / |g_unpacked|).
"""

import numpy as np
import pytest
import tensorflow as tf

from runexp.runtime import checkpoints
from runexp.runtime.model import BertConfig, BertPretrainer, is_packed
from runexp.tasks.instances.packing import pack_batch, packing_stats

SEQ, PREDS = 24, 4
CONFIG = BertConfig.from_dict({
    "vocab_size": 60, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "intermediate_size": 32, "max_position_embeddings": SEQ, "type_vocab_size": 2,
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
# Real tokens of each instance: rows of 24 hold 2 or 3 of them.
LENGTHS = [9, 7, 6, 12, 5, 11, 8, 24, 10, 4]


def unpacked_instances(lengths=LENGTHS, seq=SEQ, preds=PREDS, seed=0) -> dict:
    """Instances in google-research/bert's layout: [CLS] A [SEP] B [SEP], padding, masked
    positions ascending (weight 1 first, then 0)."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    out = {"input_ids": np.zeros([n, seq], np.int32), "input_mask": np.zeros([n, seq], np.int32),
           "segment_ids": np.zeros([n, seq], np.int32),
           "masked_lm_positions": np.zeros([n, preds], np.int32),
           "masked_lm_ids": np.zeros([n, preds], np.int32),
           "masked_lm_weights": np.zeros([n, preds], np.float32),
           "next_sentence_labels": rng.integers(0, 2, [n, 1]).astype(np.int32)}
    for i, length in enumerate(lengths):
        ids = rng.integers(5, CONFIG.vocab_size, length)
        a = max(1, (length - 3) // 2)
        ids[0], ids[a + 1], ids[-1] = 2, 3, 3
        out["input_ids"][i, :length] = ids
        out["input_mask"][i, :length] = 1
        out["segment_ids"][i, a + 2:length] = 1
        k = min(preds, max(1, length // 4))
        inner = [p for p in range(1, length - 1) if p != a + 1]
        positions = np.sort(rng.choice(inner, k, replace=False))
        out["masked_lm_positions"][i, :k] = positions
        out["masked_lm_ids"][i, :k] = out["input_ids"][i, positions]
        out["masked_lm_weights"][i, :k] = 1.0
        out["input_ids"][i, positions] = 4  # [MASK]
    return out


def packed_rows(instances: dict, preds: int = 3 * PREDS) -> dict:
    return pack_batch(instances, SEQ, preds)


def loss_and_grads(model, features, jit: bool = False):
    variables = list(model.google_variables().values())

    def run(f):
        with tf.GradientTape() as tape:
            loss, stats = model.loss(f, training=True)
        return loss, stats, tape.gradient(loss, variables)

    if jit:
        run = tf.function(run, jit_compile=True)
    features = {k: tf.constant(v) for k, v in features.items()}
    loss, stats, grads = run(features)
    return float(loss), {k: float(v) for k, v in stats.items()}, \
        [tf.convert_to_tensor(g).numpy() for g in grads]


def relative(a, b) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_packing_fills_rows():
    rows = packed_rows(unpacked_instances())
    stats = packing_stats(rows)
    assert is_packed(rows)
    assert stats["instances"] == len(LENGTHS) and stats["tokens"] == sum(LENGTHS)
    assert stats["rows"] < len(LENGTHS) // 2 + 1  # 10 instances in at most 5 rows


@pytest.mark.parametrize("jit", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["eager", "xla"])  # XLA compiles both shapes: minutes when busy
def test_packed_batch_has_the_same_loss_and_gradients(jit):
    tf.random.set_seed(3)
    model = BertPretrainer(CONFIG, xla=jit)
    instances = unpacked_instances()
    rows = packed_rows(instances)
    loss_u, stats_u, grads_u = loss_and_grads(model, instances, jit)
    loss_p, stats_p, grads_p = loss_and_grads(model, rows, jit)
    assert loss_p == pytest.approx(loss_u, rel=1e-5)
    for key in ("mlm_loss_sum", "nsp_loss_sum"):
        assert stats_p[key] == pytest.approx(stats_u[key], rel=1e-5)
    for key in ("mlm_weight", "mlm_correct", "nsp_correct", "examples"):
        assert stats_p[key] == stats_u[key], key
    assert stats_p["examples"] == len(LENGTHS)
    names = list(model.google_variables())
    assert len(grads_p) == len(grads_u) == len(names)
    scale = np.sqrt(sum(np.sum(g ** 2) for g in grads_u))
    for name, gp, gu in zip(names, grads_p, grads_u):
        if name.endswith("attention/self/key/bias"):
            # Zero in exact arithmetic (a softmax ignores a constant added to all of a
            # query's scores): both are rounding noise.
            assert max(np.linalg.norm(gp), np.linalg.norm(gu)) <= 1e-7 * scale, name
            continue
        assert np.linalg.norm(gu) > 0, name  # every variable takes part
        assert relative(gp, gu) <= 1e-5, (name, relative(gp, gu))


def test_each_instance_encodes_as_alone():
    """Sequence outputs at every real token and the pooled output of each instance equal
    the unpacked ones: attention never crosses instances, positions restart at 0."""
    tf.random.set_seed(4)
    model = BertPretrainer(CONFIG)
    instances = unpacked_instances()
    rows = packed_rows(instances)
    seq_u, pooled_u = model.encoder(instances["input_ids"], instances["input_mask"],
                                    instances["segment_ids"])
    packing = {k: rows[k] for k in ("position_ids", "instance_ids", "next_sentence_positions")}
    seq_p, pooled_p = model.encoder(rows["input_ids"], rows["input_mask"], rows["segment_ids"],
                                    packing=packing)
    seq_u = seq_u.numpy().reshape(len(LENGTHS), SEQ, -1)
    seq_p = seq_p.numpy().reshape(len(rows["input_ids"]), SEQ, -1)
    pooled_p = pooled_p.numpy().reshape(len(rows["input_ids"]), 3, -1)
    # Find each instance's row and start from its [CLS]'s row position.
    seen = 0
    for r in range(len(rows["input_ids"])):
        for slot in range(3):
            if rows["next_sentence_weights"][r, slot] == 0:
                continue
            start = rows["next_sentence_positions"][r, slot]
            length = int((rows["instance_ids"][r] == slot + 1).sum())
            matches = [i for i, n in enumerate(LENGTHS) if n == length and np.array_equal(
                instances["input_ids"][i, :n], rows["input_ids"][r, start:start + n])]
            assert len(matches) == 1
            i = matches[0]
            np.testing.assert_allclose(seq_p[r, start:start + length], seq_u[i, :length],
                                       rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(pooled_p[r, slot], pooled_u.numpy()[i], rtol=1e-5,
                                       atol=1e-6)
            seen += 1
    assert seen == len(LENGTHS)


def test_micro_batches_of_packed_rows_add_up_to_the_batch():
    """The trainer's gradient accumulation: each micro-batch's loss over the whole batch's
    denominators (loss_denominators) sums to the batch's loss."""
    tf.random.set_seed(5)
    model = BertPretrainer(CONFIG)
    rows = packed_rows(unpacked_instances(LENGTHS + [20, 3]))
    n = len(rows["input_ids"]) // 2 * 2
    rows = {k: v[:n] for k, v in rows.items()}
    whole, _ = model.loss(rows)
    denominators = model.loss_denominators(rows)
    parts = [model.objective(model.loss_stats({k: v[s] for k, v in rows.items()}),
                             denominators)
             for s in (slice(0, n // 2), slice(n // 2, n))]
    assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-5)
    assert float(denominators["examples"]) == float(rows["next_sentence_weights"].sum())


def test_a_model_trained_packed_serves_unpacked_inputs(tmp_path):
    """Packing is an input format: the same variables (Google's names), and a checkpoint
    trained on packed rows loads into a fresh model whose unpacked outputs are its own."""
    tf.random.set_seed(6)
    model = BertPretrainer(CONFIG)
    reference = BertPretrainer(CONFIG)
    assert {n: v.shape for n, v in model.google_variables().items()} == \
        {n: v.shape for n, v in reference.google_variables().items()}
    instances = unpacked_instances()
    rows = {k: tf.constant(v) for k, v in packed_rows(instances).items()}
    optimizer = tf.keras.optimizers.SGD(0.5)
    variables = list(model.google_variables().values())
    before = model(instances)[0].numpy()
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss, _ = model.loss(rows, training=True)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    trained = model(instances)[0].numpy()
    assert np.abs(trained - before).max() > 1e-4  # it learned from the packed rows
    prefix = checkpoints.save_google_checkpoint(model.google_variables(),
                                                str(tmp_path / "ckpt"))
    fresh = BertPretrainer(CONFIG)
    report = checkpoints.load_init_checkpoint(fresh.google_variables(), prefix, CONFIG)
    assert not report.missing and not report.unused
    np.testing.assert_allclose(fresh(instances)[0].numpy(), trained, rtol=1e-6, atol=1e-6)


def test_recomputed_layers_give_the_same_packed_gradients():
    tf.random.set_seed(7)
    model = BertPretrainer(CONFIG, recompute="layers")
    instances = unpacked_instances()
    _, _, grads_u = loss_and_grads(model, instances)
    _, _, grads_p = loss_and_grads(model, packed_rows(instances))
    for name, gp, gu in zip(model.google_variables(), grads_p, grads_u):
        if not name.endswith("attention/self/key/bias"):
            assert relative(gp, gu) <= 1e-5, name


def _trained_step(rows: dict, batch: int, jit: bool, accum: int, tmp_path) -> dict:
    """The step's stats and each variable's update by one step of the Trainer's compiled
    loop on ``rows``."""
    from runexp.compiler.specs import OptimizerSpec
    from runexp.runtime.optimizer import optimizer_from_spec
    from runexp.runtime.train_log import pretraining_metrics
    from runexp.runtime.train_loop_config import TrainLoopConfig
    from runexp.runtime.trainer import Trainer

    tf.random.set_seed(8)
    model = BertPretrainer(CONFIG, xla=jit)
    optimizer = optimizer_from_spec(OptimizerSpec(learning_rate=1e-2, warmup_steps=0), 10,
                                    CONFIG.hidden_size)
    trainer = Trainer(tf.distribute.get_strategy(), model, optimizer, str(tmp_path),
                      TrainLoopConfig(train_steps=10, batch_size=batch, jit_compile=jit,
                                      grad_accum_steps=accum),
                      pretraining_metrics, progress=lambda _: None)
    before = {n: v.numpy() for n, v in model.google_variables().items()}
    data = tf.data.Dataset.from_tensor_slices(rows).batch(batch, drop_remainder=True)
    stats = trainer.run_steps(iter(data), 1)
    return stats, {n: v.numpy() - before[n] for n, v in model.google_variables().items()}


@pytest.mark.slow  # compiles two whole training steps: minutes on a busy 2-core machine
@pytest.mark.parametrize("jit,accum", [(True, 1), (False, 2)], ids=["xla", "accum2"])
def test_a_training_step_on_packed_rows_is_the_unpacked_step(jit, accum, tmp_path):
    """The Trainer's whole step (XLA on one replica; micro-batches): the same update from the
    same instances, packed or not: the stats and gradient norm at relative 1e-5, each
    variable's update at 1e-4 by norm (AdamW's first step, about g / (|g| + epsilon), turns
    the gradients' 1e-5 into a larger relative difference where an element's gradient is
    near epsilon)."""
    instances = unpacked_instances(LENGTHS + [13, 6])  # 12 instances
    rows = packed_rows(instances)
    n_rows = len(rows["input_ids"]) // accum * accum
    rows = {k: v[:n_rows] for k, v in rows.items()}
    # The unpacked batch: exactly the instances of the kept rows.
    kept = set()
    for r in range(n_rows):
        for slot in range(3):
            if rows["next_sentence_weights"][r, slot]:
                start = rows["next_sentence_positions"][r, slot]
                n = int((rows["instance_ids"][r] == slot + 1).sum())
                kept.update(i for i in range(len(instances["input_ids"]))
                            if instances["input_mask"][i].sum() == n and np.array_equal(
                                instances["input_ids"][i, :n], rows["input_ids"][r, start:start + n]))
    kept = sorted(kept)
    if len(kept) % accum:
        pytest.fail(f"{len(kept)} instances do not split into {accum} micro-batches")
    unpacked = {k: v[kept] for k, v in instances.items()}
    stats_u, update_u = _trained_step(unpacked, len(kept), jit, accum, tmp_path / "u")
    stats_p, update_p = _trained_step(rows, n_rows, jit, accum, tmp_path / "p")
    assert stats_p["examples"] == stats_u["examples"] == len(kept)
    assert stats_p["mlm_loss_sum"] == pytest.approx(stats_u["mlm_loss_sum"], rel=1e-5)
    assert stats_p["grad_norm"] == pytest.approx(stats_u["grad_norm"], rel=1e-5)
    for name in update_u:
        if not name.endswith("attention/self/key/bias"):  # zero gradient: see above
            assert np.linalg.norm(update_u[name]) > 0, name
            assert relative(update_p[name], update_u[name]) <= 1e-4, name
