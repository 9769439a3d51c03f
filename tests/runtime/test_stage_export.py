"""export stage: SavedModel serving signature, Google-layout checkpoint, config, vocab."""

import json
import os

import numpy as np
import tensorflow as tf

from runtime_testlib import TINY_MODEL, make_ctx
from runexp.runtime.model import BertConfig, BertPretrainer
from runexp.runtime.stages import export
from runexp.runtime.checkpoints import restore_model


def test_export_saved_model_and_google_checkpoint(pretrained, pretrain_data, tmp_path):
    work_dir, _ = pretrained
    _, vocab_dir = pretrain_data
    out = str(tmp_path / "export")
    summary = export.run(make_ctx("export", {"model": dict(TINY_MODEL)},
                                  {"checkpoint_dir": work_dir, "vocab_dir": vocab_dir}, out))
    assert summary["step"] == 120 and summary["parameters"] > 0
    assert {"vocab.txt", "bert_config.json", "bert_model.ckpt.index"} <= set(os.listdir(out))
    with open(os.path.join(out, "bert_config.json")) as f:
        assert json.load(f) == BertConfig.from_dict(TINY_MODEL).to_dict()

    model = BertPretrainer(BertConfig.from_dict(TINY_MODEL))
    restore_model(model, work_dir)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 64, [2, 9]).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    segments = np.zeros_like(ids)
    sequence, pooled = model.encoder(ids, mask, segments)

    loaded = tf.saved_model.load(summary["saved_model"])
    outputs = loaded.signatures["serving_default"](
        input_ids=tf.constant(ids), input_mask=tf.constant(mask),
        segment_ids=tf.constant(segments))
    assert outputs["sequence_output"].shape == [2, 9, TINY_MODEL["hidden_size"]]
    np.testing.assert_allclose(outputs["sequence_output"].numpy().reshape(18, -1),
                               sequence.numpy(), atol=1e-5)
    np.testing.assert_allclose(outputs["pooled_output"].numpy(), pooled.numpy(), atol=1e-5)

    reader = tf.train.load_checkpoint(os.path.join(out, "bert_model.ckpt"))
    names = reader.get_variable_to_shape_map()
    assert set(names) == set(model.google_variables())
    np.testing.assert_array_equal(
        reader.get_tensor("bert/encoder/layer_1/attention/self/query/kernel"),
        model.google_variables()["bert/encoder/layer_1/attention/self/query/kernel"].numpy())
