"""A one-stage experiment for checkpoint fault tests: the real pretrain stage, run by the
executor on a gs:// output root, with a tiny model (a few seconds a run on a CPU).

In the test process:
    write_tiny_data(data_dir)
    plan = tiny_plan(root, data_dir, train_steps=6, checkpoint_every=2, keep_checkpoints=2)
    code = executor.run_plan(plan)

As a child process a test can kill (storage settings come from the environment, e.g.
STORAGE_EMULATOR_HOST and RUNEXP_CACHE_DIR; tests.support.child_env() finds this module):
    python -m tests.support.checkpoint_run SPEC.json
SPEC: {"root", "data_dir", "params" (tiny_plan's overrides), "retry" (RetryPolicy fields),
"deterministic" (TensorFlow's op determinism: runs that must end bitwise equal)}; the exit code
is run_plan's.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from tests.support import runtime as tiny

STAGE_ID = "pretrain"
EXAMPLES = 64


def write_tiny_data(data_dir: str) -> None:
    """vocab/ and preprocess/ (one shard of train records) for the tiny model (TINY_MODEL)."""
    vocab_size = tiny.TINY_MODEL["vocab_size"]
    tiny.write_vocab_dir(os.path.join(data_dir, "vocab"), vocab_size)
    tiny.write_pretraining_records(
        os.path.join(data_dir, "preprocess"), "train", EXAMPLES, vocab_size,
        tiny.TINY_SEQ, tiny.TINY_PRED, seed=1, num_shards=1)


def tiny_plan(root: str, data_dir: str, **overrides):
    """A Plan with one pretrain stage at ``<root>/pretrain``. The fingerprint covers every
    param; the resume key leaves out train_steps, so a longer run continues a shorter one."""
    from runexp.compiler.plan import Plan, Stage

    params = tiny.pretrain_params(
        batch_size=8, train_steps=6, warmup_steps=2, checkpoint_every=2, keep_checkpoints=2,
        steps_per_loop=2, log_every=2)
    params.update(overrides)
    stage = Stage(
        id=STAGE_ID, kind="pretrain", params=params,
        inputs={"data_dir": os.path.join(data_dir, "preprocess"),
                "vocab_dir": os.path.join(data_dir, "vocab")},
        output_dir=f"{root.rstrip('/')}/{STAGE_ID}",
        fingerprint=_digest(params), resume_key=_digest(
            {k: v for k, v in params.items() if k != "train_steps"}))
    return Plan(experiment="checkpoint-faults", output_root=root, stages=(stage,),
                accelerator={"type": "cpu"})


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    from runexp.runtime import executor, storage

    if spec.get("deterministic"):
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    storage.set_retry_policy(storage.RetryPolicy(**spec.get("retry", {})))
    return executor.run_plan(tiny_plan(spec["root"], spec["data_dir"], **spec["params"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
