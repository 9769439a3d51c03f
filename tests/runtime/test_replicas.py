"""The CPU test profile: 8 logical CPUs under MirroredStrategy, as the 8 cores of a v3-8.

Per-replica batches (16 / 8 = 2 examples), the loss divided by the *global* batch's masked
positions and examples, gradients summed across replicas, metrics summed across replicas:
the 8-replica run must take the same steps as the 1-replica run at the same global batch.
Logical CPUs must be split before TensorFlow starts, hence a child process (train_child.py),
which runs both one after the other. (A second MirroredStrategy in the same process would
reuse collective keys; gradient accumulation under 8 replicas is left to the accumulation
test's argument: micro-batches and replicas divide by the same global totals.) One layer
keeps the 8 replica traces short (~15 s).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.support import child_env
from tests.support.runtime import TINY_MODEL, pretrain_params
from runexp.runtime import checkpoints

# train_child.py, in its own process: a module of this package, found through child_env().
CHILD = [sys.executable, "-m", "tests.runtime.train_child"]
NO_DROPOUT = dict(TINY_MODEL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  num_hidden_layers=1)


def _log(work_dir):
    with open(os.path.join(work_dir, "train_log.jsonl")) as f:
        return [json.loads(line) for line in f]


def _weights(work_dir):
    reader = tf.train.load_checkpoint(
        checkpoints.latest_checkpoint(os.path.join(work_dir, "checkpoints")))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if n.startswith("model/")}


def test_eight_replicas_match_one_replica_at_the_same_global_batch(pretrain_data, tmp_path):
    data_dir, vocab_dir = pretrain_data
    inputs = {"data_dir": data_dir, "vocab_dir": vocab_dir}
    layouts = {"r1": {"type": "cpu"}, "r8": {"type": "cpu", "replicas": 8}}
    runs = []
    for name, accelerator in layouts.items():
        params = pretrain_params(model=NO_DROPOUT, train_steps=4, log_every=1,
                                 steps_per_loop=2, checkpoint_every=4, accelerator=accelerator)
        runs.append({"kind": "pretrain", "params": params, "inputs": inputs,
                     "work_dir": str(tmp_path / name)})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"runs": runs, "split_cpu": 8,
                                "out": str(tmp_path / "out.json")}))
    proc = subprocess.run([*CHILD, str(spec)], capture_output=True, text=True, timeout=300,
                          env=child_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "8 replica(s)" in proc.stdout

    one = _log(str(tmp_path / "r1"))
    one_weights = _weights(str(tmp_path / "r1"))
    assert len(one_weights) > 15
    for name in ("r8",):
        log = _log(str(tmp_path / name))
        assert [r["step"] for r in log] == [1, 2, 3, 4]
        for a, b in zip(log, one):
            # Summed across replicas in another order: float32 rounding only.
            for key in ("loss", "mlm_accuracy", "nsp_accuracy"):
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (name, key)
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5), name
        weights = _weights(str(tmp_path / name))
        for var, value in one_weights.items():
            # Adam turns a gradient rounding difference dg into <= 100 dg per step (lr 3e-3
            # here: 300 dg); 4 steps. A per-replica (instead of global) normalisation moves
            # weights by ~lr.
            np.testing.assert_allclose(weights[var], value, atol=5e-5, err_msg=f"{name} {var}")
