"""A training process for tests that kill, signal or split the CPU: runs stage handlers.

    python -m tests.runtime.train_child SPEC.json   (the repository root on PYTHONPATH)

SPEC (JSON):
  runs: [{"kind": "pretrain", "params": {...}, "inputs": {...}, "work_dir": "..."}, ...],
    run in order in this one process; their summaries go to ``out``.
  out: path of a JSON file written with the list of summaries when all runs finish.
  split_cpu: n logical CPUs to make before TensorFlow starts (the 8-replica profile).
  deterministic: call tf.config.experimental.enable_op_determinism().
  batch_log: append one line per training step: a hash of the step's input_ids (written
    inside the step, so it records what was consumed, not what was prefetched). A line
    "START" is appended first.
  step_sleep: seconds each training step also sleeps.
  hold_at_step: n: this process's n-th training step (its hash logged) does not end until
    the process gets SIGTERM (it then ends, and the loop stops before the next step) or is
    killed: a test acts at that exact step, however fast or slow the machine. Needs
    batch_log.

Exit codes: 0 done; runexp.runtime.preemption's codes when a run raised Preempted (75) or
DeadlineReached (124).
"""

import json
import os
import sys
import threading
import time

# A held step goes on by itself after this long: a child a test forgot does not hang forever.
HOLD_LIMIT_S = 600.0


def _log_batches(path: str, step_sleep: float, hold_at_step: int = 0) -> None:
    import tensorflow as tf

    from runexp.runtime import preemption
    from runexp.runtime.model import BertPretrainer

    original = BertPretrainer.loss_stats
    steps, sigterm = [0], threading.Event()
    request = preemption.PreemptionWatcher._request

    def on_request(self, signum):  # the watcher's thread: the stop flag is set, then this
        request(self, signum)
        sigterm.set()

    preemption.PreemptionWatcher._request = on_request

    def after_step():
        steps[0] += 1
        if step_sleep:
            time.sleep(step_sleep)
        if steps[0] == hold_at_step:
            sigterm.wait(HOLD_LIMIT_S)
        return 0

    def loss_stats(self, features, training=False):
        if training:
            ids = tf.strings.as_string(tf.reshape(features["input_ids"], [-1]))
            digest = tf.strings.to_hash_bucket_fast(tf.strings.reduce_join(ids, separator=","),
                                                    2 ** 62)
            tf.print(digest, output_stream=f"file://{path}")
            if step_sleep or hold_at_step:
                tf.py_function(after_step, [], [tf.int32])
        return original(self, features, training)

    BertPretrainer.loss_stats = loss_stats


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from runexp.runtime import strategy as strategy_lib

    if spec.get("split_cpu"):
        strategy_lib.split_cpu(int(spec["split_cpu"]))
    import tensorflow as tf

    if spec.get("deterministic"):
        tf.config.experimental.enable_op_determinism()
    if spec.get("batch_log"):
        with open(spec["batch_log"], "a") as f:
            f.write("START\n")
        _log_batches(spec["batch_log"], float(spec.get("step_sleep") or 0.0),
                     int(spec.get("hold_at_step") or 0))

    import importlib

    from tests.support.runtime import make_ctx
    from runexp.runtime.preemption import Preempted
    from runexp.runtime.executor import declared_summary

    summaries = []
    for run in spec["runs"]:
        handler = importlib.import_module(f"runexp.runtime.stages.{run['kind']}")
        ctx = make_ctx(run["kind"], run["params"], run["inputs"], run["work_dir"])
        ctx.progress = lambda message: print(message, flush=True)
        try:
            # As MANIFEST.json holds it (the executor's own conversion).
            summaries.append(declared_summary(run["kind"], handler.run(ctx)))
        except Preempted as e:
            print(f"PREEMPTED {e}", flush=True)
            return e.exit_code
    if spec.get("out"):
        with open(spec["out"], "w") as f:
            json.dump(summaries, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
