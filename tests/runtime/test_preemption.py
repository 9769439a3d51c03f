"""Real training processes killed and signalled, then resumed: exact resume and SIGTERM.

One experiment (60 steps, a checkpoint every 20, host loops of 10 steps, op determinism on)
is run as a chain of processes, each launched on the same work dir:

  1. killed -9 right at startup, at its 3rd step, before any checkpoint;
  2. killed -9 mid-interval (at step 25, the latest checkpoint at 20);
  3. killed -9 just after a checkpoint (at step 41, ckpt-40 the latest);
  4. sent SIGTERM at step 42: checkpoints at the step reached, inside a host loop, and
     exits 75 (preemption.EXIT_PREEMPTED);
  5. runs to the end.

Each process of the chain holds the step named above until it is killed or signalled
(train_child.py's ``hold_at_step``): the test acts at that step exactly, however fast or
slow the machine, instead of racing the training process.

Every step logs a hash of its batch's input_ids from inside the step (train_child.py). The
chain's steps, each taken from the process that finally kept it, must be the uninterrupted
run's batches in the same order; a step redone after a kill must have seen the same batch;
each process must start exactly at its checkpoint; and the final weights and optimizer
slots must be bitwise equal to the uninterrupted run's.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

from tests.support import child_env
from tests.support.runtime import pretrain_params
from runexp.runtime import checkpoints

# train_child.py, in its own process: a module of this package, found through child_env().
CHILD = [sys.executable, "-m", "tests.runtime.train_child"]


def _spec(tmp_path, name: str, work_dir: str, batch_log: str, inputs: dict,
          hold_at_step: int = 0) -> str:
    """``hold_at_step``: the process's n-th step waits for SIGTERM or a kill (0: none)."""
    params = pretrain_params(batch_size=32, train_steps=60, checkpoint_every=20, log_every=10,
                             steps_per_loop=10, keep_checkpoints=10)
    path = str(tmp_path / f"{name}.json")
    with open(path, "w") as f:
        json.dump({"runs": [{"kind": "pretrain", "params": params, "inputs": inputs,
                             "work_dir": work_dir}],
                   "batch_log": batch_log, "hold_at_step": hold_at_step,
                   "deterministic": True}, f)
    return path


class _Process:
    def __init__(self, spec: str, out: str):
        self.out = out
        self.stdout = open(out, "w")
        self.proc = subprocess.Popen([*CHILD, spec], stdout=self.stdout,
                                     stderr=subprocess.STDOUT, env=child_env())

    def wait(self, timeout=600) -> int:  # only ends a hang, as _until's
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.stdout.close()

    def text(self) -> str:
        with open(self.out) as f:
            return f.read()


def _segments(batch_log: str) -> list[list[str]]:
    """Per process, the hashes its steps logged (one "START" line opens each)."""
    if not os.path.exists(batch_log):
        return []
    out = []
    with open(batch_log) as f:
        for line in f.read().splitlines():
            if line == "START":
                out.append([])
            elif line.strip():
                out[-1].append(line.strip())
    return out


def _latest_step(work_dir: str) -> int:
    prefix = checkpoints.latest_checkpoint(os.path.join(work_dir, "checkpoints"))
    return checkpoints.checkpoint_step(prefix) if prefix else 0


def _until(condition, process: _Process, what: str, timeout: float = 600) -> None:
    """Waits for ``condition``; ``timeout`` only ends a hang (the process holds its step)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.proc.poll() is not None:
            raise AssertionError(f"the process ended (rc {process.proc.returncode}) before "
                                 f"{what}:\n{process.text()[-3000:]}")
        if time.monotonic() > deadline:
            process.proc.kill()
            raise AssertionError(f"timed out waiting for {what}:\n{process.text()[-3000:]}")
        time.sleep(0.005)


def _state(work_dir: str) -> dict:
    reader = tf.train.load_checkpoint(
        checkpoints.latest_checkpoint(os.path.join(work_dir, "checkpoints")))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if not n.startswith("save_counter") and not n.startswith("_CHECKPOINTABLE")}


def test_kill_9_at_three_moments_and_sigterm_resume_exactly(pretrain_data, tmp_path):
    data_dir, vocab_dir = pretrain_data
    inputs = {"data_dir": data_dir, "vocab_dir": vocab_dir}
    ref_dir, ref_log = str(tmp_path / "reference"), str(tmp_path / "reference.batches")
    work_dir, log = str(tmp_path / "chain"), str(tmp_path / "chain.batches")
    # The uninterrupted run goes alongside the chain.
    reference = _Process(_spec(tmp_path, "reference", ref_dir, ref_log, inputs),
                         str(tmp_path / "reference.out"))
    starts = []  # the checkpoint step each process of the chain started from
    chain = []

    def launch(n: int, hold_at_step: int = 0) -> _Process:
        starts.append(_latest_step(work_dir))
        spec = _spec(tmp_path, f"chain{n}", work_dir, log, inputs, hold_at_step)
        chain.append(_Process(spec, str(tmp_path / f"chain{n}.out")))
        return chain[-1]

    def steps_now() -> int:  # the step the running (last) process has reached
        segments = _segments(log)
        return starts[-1] + len(segments[-1]) if len(segments) == len(starts) else -1

    # 1. Right at startup: a few steps in, no checkpoint yet.
    p = launch(1, hold_at_step=3)
    _until(lambda: steps_now() >= 3, p, "step 3")
    p.proc.kill()
    assert p.wait() == -signal.SIGKILL and _latest_step(work_dir) == 0

    # 2. Mid-interval: the latest checkpoint is 20, the process at step 25.
    p = launch(2, hold_at_step=25)
    _until(lambda: _latest_step(work_dir) == 20 and steps_now() >= 25, p, "step 25")
    p.proc.kill()
    assert p.wait() == -signal.SIGKILL and _latest_step(work_dir) == 20

    # 3. Just after a checkpoint: ckpt-40 is the latest, the process at step 41.
    p = launch(3, hold_at_step=21)
    _until(lambda: _latest_step(work_dir) == 40 and steps_now() >= 41, p, "ckpt-40")
    p.proc.kill()
    assert p.wait() == -signal.SIGKILL

    # 4. SIGTERM inside the host loop covering steps 40-50: a checkpoint at the step
    #    reached, the preemption exit code.
    p = launch(4, hold_at_step=2)
    assert starts[-1] == 40
    _until(lambda: steps_now() >= 42, p, "step 42")
    p.proc.send_signal(signal.SIGTERM)
    assert p.wait() == 75, p.text()[-3000:]
    stopped = _latest_step(work_dir)
    assert stopped == 40 + len(_segments(log)[-1]), "checkpoint at the step reached"
    # The host loop runs steps 41-50 in one call: stopping before 50 is stopping between
    # steps, not at the end of the call.
    assert stopped == 42, f"stopped at {stopped}: not at the next step boundary"
    assert f"stopped by SIGTERM at step {stopped}" in p.text()

    # 5. To the end.
    p = launch(5)
    assert p.wait() == 0, p.text()[-3000:]
    assert reference.wait() == 0, reference.text()[-3000:]

    assert starts == [0, 0, 20, 40, stopped]
    for start, process in zip(starts, chain):
        if start:  # each process resumed exactly from the latest checkpoint
            assert f"at step {start}/60 ({start} batches consumed)" in process.text()
    expected = _segments(ref_log)[0]
    assert len(expected) == 60
    segments = _segments(log)
    assert len(segments) == 5
    kept = {}
    for start, hashes in zip(starts, segments):
        for offset, digest in enumerate(hashes):
            step = start + offset + 1
            # A step redone after a kill saw the same batch as the first time.
            assert kept.get(step, digest) == digest, f"step {step} saw another batch"
            kept[step] = digest
    # Every step's batch is the uninterrupted run's: none skipped, none repeated.
    assert [kept[s] for s in range(1, 61)] == expected
    assert len(set(expected)) == 60

    final, reference_final = _state(work_dir), _state(ref_dir)
    assert set(final) == set(reference_final)
    assert sum(n.startswith("model/") for n in final) > 20
    assert any("optimizer/m/" in n for n in final)
    for name, value in reference_final.items():
        np.testing.assert_array_equal(final[name], value, err_msg=name)
