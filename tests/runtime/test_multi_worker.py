"""Multi-worker training: two processes with TF_CONFIG on this machine, under
MultiWorkerMirroredStrategy, continue one process's checkpoint as one model.

The chief resumes from a checkpoint only it can see (its stage directory); the other worker
starts in an empty private directory and gets the chief's state (weights, optimizer slots,
step, data position, dropout RNG) broadcast before the first step. Each worker then reads its
own share of the data through seqio (``seqio.ShardInfo(worker, 2)``: one of the two cached
train files each; tests/runtime/test_stage_pretrain.py checks the shares), and the gradients
are all-reduced: both end with the same weights, which the steps moved.
"""

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.support import child_env
from tests.support.runtime import TINY_MODEL, pretrain_params
from runexp.runtime import checkpoints

# train_child.py, in its own process: a module of this package, found through child_env().
CHILD = [sys.executable, "-m", "tests.runtime.train_child"]
NO_DROPOUT = dict(TINY_MODEL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  num_hidden_layers=1)


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _spec(tmp_path, name, work_dir, inputs, steps):
    params = pretrain_params(model=NO_DROPOUT, train_steps=steps, log_every=1, steps_per_loop=2,
                             checkpoint_every=2, accelerator={"type": "cpu"})
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"runs": [{"kind": "pretrain", "params": params,
                                          "inputs": inputs, "work_dir": str(work_dir)}]}))
    return str(path)


def _run(spec, env=None):
    return subprocess.Popen([*CHILD, spec], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env or child_env())


def _finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    return out


def _weights(work_dir):
    reader = tf.train.load_checkpoint(
        checkpoints.latest_checkpoint(os.path.join(work_dir, "checkpoints")))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if n.startswith("model/")}


def test_two_workers_continue_a_checkpoint_as_one_model(pretrain_data, tmp_path):
    data_dir, vocab_dir = pretrain_data
    inputs = {"data_dir": data_dir, "vocab_dir": vocab_dir}
    single = tmp_path / "single"
    _finish(_run(_spec(tmp_path, "half", single, inputs, steps=2)))
    chief_dir = tmp_path / "chief"
    shutil.copytree(single, chief_dir)  # the checkpoint at step 2, seen by the chief only

    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    workers = []
    other_dir = tmp_path / "worker1_private"
    for index, work_dir in enumerate((chief_dir, other_dir)):
        env = child_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                              "task": {"type": "worker", "index": index}}))
        workers.append(_run(_spec(tmp_path, f"w{index}", work_dir, inputs, steps=4), env))
    chief_out = _finish(workers[0])
    _finish(workers[1])

    assert "2 replica(s)" in chief_out
    assert "resuming from" in chief_out and "at step 2/4" in chief_out
    with open(chief_dir / "train_log.jsonl") as f:
        got = [json.loads(line) for line in f][-2:]
    assert [r["step"] for r in got] == [3, 4]
    assert [r["batches_consumed"] for r in got] == [3, 4]
    assert all(np.isfinite(r["loss"]) for r in got)
    ours, theirs, before = (_weights(str(chief_dir)), _weights(str(other_dir)),
                            _weights(str(single)))
    assert len(ours) > 15
    moved = 0
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, atol=1e-6, err_msg=name)
        moved += not np.array_equal(ours[name], before[name])
    assert moved > len(ours) // 2
    # The non-chief's writes stay in its private directory.
    assert not any(p.name.startswith("worker1") for p in chief_dir.iterdir())


def test_a_worker_joins_the_chiefs_run_and_writes_nothing(tmp_path):
    """Both processes run the same plan through the executor: the chief builds the stage and
    writes every output; the worker waits, joins the training, and leaves the root alone."""
    from tests.support import checkpoint_run

    data_dir, root = str(tmp_path / "data"), str(tmp_path / "out")
    checkpoint_run.write_tiny_data(data_dir)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"root": root, "data_dir": data_dir,
                                "params": {"train_steps": 4, "model": NO_DROPOUT}}))
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
    procs = []
    for index in (0, 1):
        env = child_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                              "task": {"type": "worker", "index": index}}))
        procs.append(subprocess.Popen([sys.executable, "-m", checkpoint_run.__name__, str(spec)],
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env))
    chief_out, worker_out = _finish(procs[0]), _finish(procs[1])
    assert "2 replica(s)" in chief_out
    assert "worker 1 of a multi-worker run" in worker_out and "pretrain: joining" in worker_out
    assert sorted(os.listdir(root)) == ["operative_config.gin", "plan.json", "pretrain"]
    with open(os.path.join(root, "pretrain", "MANIFEST.json")) as f:
        assert json.load(f)["summary"]["steps_trained"] == 4
    assert os.path.isfile(os.path.join(root, "pretrain", "COMPLETED"))
