"""What a long pretraining run leaves in its output root, written without training: a plan
with a pretrain stage of ``steps`` steps, its ``train_log.jsonl`` (a record every
``log_every`` steps, with the fields the training loop writes, and a wall-time stop now and
then), ``eval_log.jsonl`` (every ``eval_every`` steps), ``checkpoints/`` (the last
``keep`` checkpoints and TensorFlow's ``checkpoint`` state file), a TensorBoard events file
per process launch, STARTED.json. Used by tests/runtime/test_long_run.py (bounded work at
10^6 steps) and bench/long_run.py (time and memory at 10^6 steps).

    root = simulate(tmp_dir, steps=10**6, log_every=100)
    runexp status ROOT; runexp report ROOT
"""

from __future__ import annotations

import json
import math
import os
import random

STAGE = "pretrain"


def plan(root: str, steps: int, log_every: int, eval_every: int, checkpoint_every: int):
    """A Plan (one pretrain stage, BERT-base-like parameters) at ``root``."""
    from runexp.compiler.plan import Plan, Stage

    model = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
             "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu",
             "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
             "max_position_embeddings": 512, "type_vocab_size": 2,
             "initializer_range": 0.02}
    params = {"model": model, "batch_size": 256, "train_steps": steps, "warmup_steps": 10000,
              "learning_rate": 1e-4, "checkpoint_every": checkpoint_every,
              "keep_checkpoints": 5, "init_checkpoint": None, "max_seq_length": 128,
              "max_predictions_per_seq": 20, "seed": 7, "steps_per_loop": 100,
              "log_every": log_every, "eval_every": eval_every,
              "accelerator": {"type": "tpu"}}
    stage = Stage(id=STAGE, kind="pretrain", params=params,
                  inputs={"data_dir": os.path.join(root, "preprocess"),
                          "vocab_dir": os.path.join(root, "vocab")},
                  output_dir=os.path.join(root, STAGE), fingerprint="f" * 64,
                  resume_key="r" * 64)
    return Plan(experiment="long_run", output_root=root, stages=(stage,),
                accelerator={"type": "tpu", "name": "tpu_v3_8", "replicas": 8,
                             "peak_tflops_per_replica": 61.5, "usd_per_hour": 8.0,
                             "usd_per_hour_preemptible": 2.4,
                             "memory_gb_per_replica": 16.0})


def train_record(step: int, steps: int, rng: random.Random, t: float) -> dict:
    """A metrics record as RunLog.train writes it."""
    progress = step / steps
    loss = 1.6 + 8.8 * math.exp(-8 * progress) + rng.gauss(0, 0.05)
    return {"step": step, "loss": round(loss, 6), "mlm_loss": round(loss * 0.9, 6),
            "mlm_accuracy": round(0.7 - 0.6 * math.exp(-6 * progress), 6),
            "nsp_loss": round(loss * 0.1, 6), "nsp_accuracy": round(0.98 - 0.4 *
                                                                   math.exp(-9 * progress), 6),
            "learning_rate": 1e-4 * min(1.0, step / 10000) * (1 - progress),
            "examples_per_second": round(2400 + rng.gauss(0, 30), 2),
            "grad_norm": round(1.0 + rng.random(), 6), "step_time": round(0.1066, 6),
            "batches_consumed": step, "time": round(t, 3)}


def simulate(directory: str, steps: int = 10 ** 6, log_every: int = 100,
             eval_every: int = 10000, checkpoint_every: int = 1000, keep: int = 5,
             stops_every: int = 50000, launches: int = 25, seed: int = 0) -> str:
    """Writes the output root of a ``steps``-step run (still going: not done) (stopped at 90%
    of it, at a checkpoint) under ``directory``; returns it."""
    rng = random.Random(seed)
    root = os.path.join(directory, "long_run")
    stage_dir = os.path.join(root, STAGE)
    os.makedirs(os.path.join(stage_dir, "checkpoints"), exist_ok=True)
    os.makedirs(os.path.join(stage_dir, "tensorboard"), exist_ok=True)
    p = plan(root, steps, log_every, eval_every, checkpoint_every)
    with open(os.path.join(root, "plan.json"), "w") as f:
        f.write(p.to_json())
    with open(os.path.join(stage_dir, "STARTED.json"), "w") as f:
        json.dump({"fingerprint": "f" * 64, "resume_key": "r" * 64}, f)
    t = 1.7e9
    last = steps * 9 // 10 // checkpoint_every * checkpoint_every  # 90% done, stopped there
    with open(os.path.join(stage_dir, "train_log.jsonl"), "w") as f:
        for step in range(log_every, last + 1, log_every):
            t += log_every * 0.1066
            f.write(json.dumps(train_record(step, steps, rng, t)) + "\n")
            if stops_every and step % stops_every == 0:
                f.write(json.dumps({"step": step, "event": "deadline_stop",
                                    "deadline_seconds_left": 12.5, "margin_s": 495.0,
                                    "checkpoint": f"ckpt-{step}", "time": t}) + "\n")
    with open(os.path.join(stage_dir, "eval_log.jsonl"), "w") as f:
        for step in range(eval_every, last + 1, eval_every):
            f.write(json.dumps({"step": step, "loss": 2.0, "mlm_loss": 1.8,
                                "mlm_accuracy": 0.65, "nsp_loss": 0.2, "nsp_accuracy": 0.95,
                                "time": t}) + "\n")
    ckpts = [last - i * checkpoint_every for i in range(keep) if last - i * checkpoint_every > 0]
    for step in ckpts:
        for suffix in (".index", ".data-00000-of-00001"):
            with open(os.path.join(stage_dir, "checkpoints", f"ckpt-{step}{suffix}"), "wb") as f:
                f.write(b"\0" * 64)
    with open(os.path.join(stage_dir, "checkpoints", "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "ckpt-{ckpts[0]}"\n' + "".join(
            f'all_model_checkpoint_paths: "ckpt-{s}"\n' for s in reversed(ckpts)))
    for n in range(launches):
        with open(os.path.join(stage_dir, "tensorboard",
                               f"events.out.tfevents.{1700000000 + n}.host.{n}.v2"), "wb") as f:
            f.write(b"\0" * 128)
    return root
