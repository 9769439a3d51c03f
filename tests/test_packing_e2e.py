"""Packed pretraining end to end (issue 27): the quickstart, scaled down, with
``bert_pretraining_task.packing``: the train split is packed, pretraining trains on packed
rows, and evaluation, fine-tuning and the exports are those of any run: they read and serve
one instance a row, from the same variables. (tests/test_packed_phase_e2e.py: a packed
second phase and its plan.)
"""

import json
import os

import numpy as np
import pytest

from tests.support.cli import QUICKSTART_SHORT, QUICKSTART_STAGES, output, run_cli

pytestmark = pytest.mark.e2e


@pytest.mark.slow
def test_packed_quickstart_trains_and_exports_an_ordinary_model(tmp_path):
    tf = pytest.importorskip("tensorflow")
    from runexp.runtime import checkpoints
    from runexp.runtime.bert_config import BertConfig
    from runexp.runtime.model import BertPretrainer
    from runexp.runtime.pretraining_data import pretraining_dataset

    root = str(tmp_path / "packed")
    proc = run_cli(gin_file="quickstart.gin", root=root, timeout=1800,
                   params=[*QUICKSTART_SHORT, "bert_pretraining_task.packing=True"])
    assert proc.returncode == 0, output(proc)
    for stage in QUICKSTART_STAGES:
        assert os.path.isfile(os.path.join(root, stage, "COMPLETED")), stage

    # Pretraining trained on packed rows (some hold several instances) and learned: finite
    # losses; the held-out evaluation (one instance a row) is a real number.
    with open(os.path.join(root, "pretrain", "MANIFEST.json")) as f:
        manifest = json.load(f)
    assert manifest["params"]["packing"] is True
    assert manifest["summary"]["packing"]["factor"] > 1.0
    with open(os.path.join(root, "pretrain", "train_log.jsonl")) as f:
        losses = [r["loss"] for r in map(json.loads, f) if "loss" in r]
    assert losses and all(np.isfinite(losses))
    with open(os.path.join(root, "evaluate", "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["examples"] > 0 and 0.0 < metrics["mlm_accuracy"] <= 1.0

    # The export is an ordinary encoder: it serves unpacked inputs (the validation split)
    # with the numbers of the exported Google checkpoint loaded into runexp's model.
    batch = next(iter(pretraining_dataset(os.path.join(root, "preprocess.pretrain"),
                                          "validation", batch_size=8, max_seq_length=64,
                                          max_predictions_per_seq=10, training=False)))
    assert "instance_ids" not in batch
    export = os.path.join(root, "export")
    with open(os.path.join(export, "bert_config.json")) as f:
        config = BertConfig.from_dict(json.load(f))
    model = BertPretrainer(config)
    report = checkpoints.load_google_checkpoint(model.google_variables(),
                                                os.path.join(export, "bert_model.ckpt"))
    # The export's checkpoint is the fine-tuned classifier's: the encoder, no pretraining heads.
    assert report.loaded and not [n for n in report.missing if n.startswith("bert/")]
    ids, mask, types = (batch[k] for k in ("input_ids", "input_mask", "segment_ids"))
    want, pooled = model.encoder(ids, mask, types)
    encoder = tf.saved_model.load(os.path.join(export, "encoder"))
    got = encoder({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types})
    np.testing.assert_allclose(got["sequence_output"].numpy(),
                               want.numpy().reshape(got["sequence_output"].shape), atol=1e-5)
    np.testing.assert_allclose(got["pooled_output"].numpy(), pooled.numpy(), atol=1e-5)
