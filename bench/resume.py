"""Resume cost: time from process start to the first training batch, by resume step.

    .venv/bin/python bench/resume.py [--runs 3] [--old_runs 2] [--examples 20000]
        [--steps 0,1000,100000,1000000] [--old_steps 1000,10000] [--keep DIR]

The quickstart's data shape (gin/quickstart.gin: sequence length 128, 20 predictions,
vocabulary 8,000, batch 32): a preprocess stage directory holding a task's seqio cache of
``--examples`` synthetic full-length examples in 4 shards, written with the preprocess
stage's record writer (tasks/cache/records.py), once statically masked and once stored unmasked
for dynamic masking (whole words). Step 10^6 is 3.2*10^7 positions: 1,600 epochs of the
cache, so resumes land deep in later epochs.

Each measurement is a fresh Python process (``--child``) that imports runexp and
TensorFlow, registers the task through seqio, builds ``pretraining_dataset(...,
skip_batches=S)`` as the pretrain stage does and takes its first batch; the time is the wall
clock from starting the process to that batch (so it includes the imports, the same at every
step). Before the measurements one process per cache builds the record index (once per
cache, saved beside it; its time is printed). The old path (stream version 1: seqio's
sequential stream, skipping by reading) is measured at 10^3 and 10^4 for comparison (larger
takes minutes). Prints, medians of the runs:
    resume: <masking> step <S> first batch <t> s (data path <d> s; runs ...)
    resume (replay, stream 1): <masking> step <S> first batch <t> s (data path <d> s)
    resume: data path ratio <r>   # the same ratio, from the pretraining_dataset call on
    resume: ratio <r>             # median at 10^6 / median at 10^3, both maskings pooled
(the data path: from the child's call of ``pretraining_dataset`` to its first batch).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SEQ, PREDICTIONS, VOCAB, BATCH, SHARDS, SEED = 128, 20, 8000, 32, 4, 1
TASK = "bench_resume"


def write_cache(stage_dir: str, examples: int, dynamic: bool) -> None:
    """A preprocess stage directory with task ``bench_resume``'s seqio cache (train)."""
    import numpy as np

    from runexp.tasks.cache import records

    cache = records.task_cache_dir(stage_dir, TASK)
    os.makedirs(cache, exist_ok=True)
    per_shard = examples // SHARDS
    for shard in range(SHARDS):
        rng = np.random.default_rng(shard)
        ids = rng.integers(5, VOCAB, [per_shard, SEQ])
        ids[:, 0], ids[:, SEQ // 2], ids[:, -1] = 2, 3, 3
        positions = np.sort(rng.random([per_shard, SEQ - 2]).argsort(axis=1)[:, :PREDICTIONS]
                            + 1, axis=1)
        batch = {"input_ids": ids, "input_mask": np.ones_like(ids),
                 "segment_ids": (np.arange(SEQ)[None] > SEQ // 2).repeat(per_shard, 0),
                 "masked_lm_positions": positions,
                 "masked_lm_ids": np.take_along_axis(ids, positions, axis=1),
                 "masked_lm_weights": np.ones([per_shard, PREDICTIONS], np.float32),
                 "next_sentence_labels": rng.integers(0, 2, [per_shard, 1])}
        if dynamic:
            batch["word_starts"] = (rng.random([per_shard, SEQ]) < 0.7).astype(np.int64)
            for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
                batch[k] = np.zeros_like(batch[k])
        else:
            np.put_along_axis(batch["input_ids"], positions, 4, axis=1)
        batch = {k: v.astype(np.float32 if k == "masked_lm_weights" else np.int64)
                 for k, v in batch.items()}
        with records.TFRecordWriter(records.shard_path(cache, "train", shard, SHARDS)) as w:
            w.write_batch(*records.encode_instance_batch(batch))
    records.write_info(cache, "train", SHARDS, SEQ, PREDICTIONS, dynamic)
    records.write_stats(cache, "train", {"examples": per_shard * SHARDS})
    if dynamic:
        records.write_masking(cache, {"max_predictions_per_seq": PREDICTIONS,
                                      "masked_lm_prob": 0.15, "mask_token_prob": 0.8,
                                      "random_token_prob": 0.1, "whole_word_masking": True,
                                      "ngram_max": 1, "vocab_size": VOCAB, "mask_id": 4,
                                      "cls_id": 2, "sep_id": 3, "random_seed": 1,
                                      "splits": ["train"]})
    records.write_completed(cache)


def child(stage_dir: str, step: int, stream: int) -> None:
    """The first batch of a stream resumed at ``step``, as the pretrain stage makes it."""
    import tensorflow as tf

    from runexp.runtime import pretraining_data

    tf.random.set_seed(SEED)
    start = time.perf_counter()
    ds = pretraining_data.pretraining_dataset(
        stage_dir, "train", batch_size=BATCH, max_seq_length=SEQ,
        max_predictions_per_seq=PREDICTIONS, seed=SEED, skip_batches=step, stream=stream)
    batch = next(iter(ds))
    assert batch["input_ids"].shape == (BATCH, SEQ)
    print(f"first batch {time.perf_counter() - start:.4f}", flush=True)
    os._exit(0)  # no interpreter teardown: the batch is what is timed


def measure(stage_dir: str, step: int, stream: int = 2) -> tuple[float, float]:
    """Seconds from starting a child process to its first batch, and from its call of
    ``pretraining_dataset`` to that batch (the data path alone, without the imports)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", stage_dir,
                             str(step), str(stream)], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("first batch"):
            elapsed = time.perf_counter() - start
            data = float(line.split()[2])
            break
    else:
        raise RuntimeError(f"the child at step {step} produced no batch")
    proc.wait()
    if proc.returncode:
        raise RuntimeError(f"the child at step {step} failed ({proc.returncode})")
    return elapsed, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--old_runs", type=int, default=2)
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--steps", default="0,1000,100000,1000000")
    parser.add_argument("--old_steps", default="1000,10000")
    parser.add_argument("--keep", help="write the caches here and keep them")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    steps = [int(s) for s in args.steps.split(",") if s]
    old_steps = [int(s) for s in args.old_steps.split(",") if s]
    root = args.keep or tempfile.mkdtemp(prefix="bench_resume_")
    try:
        dirs = {}
        for masking in ("static", "dynamic"):
            dirs[masking] = os.path.join(root, masking)
            if not os.path.exists(dirs[masking]):
                write_cache(dirs[masking], args.examples, masking == "dynamic")
            built = measure(dirs[masking], 0)[1]  # builds (or finds) the record index
            print(f"resume: {masking} record index and first batch {built:.2f} s "
                  f"({args.examples} examples)", flush=True)
        times: dict = {}
        for _ in range(args.runs):  # rounds, so a drift of the machine hits every step alike
            for masking, stage_dir in dirs.items():
                for step in steps:
                    times.setdefault((masking, step), []).append(measure(stage_dir, step))
        for (masking, step), ts in times.items():
            print(f"resume: {masking} step {step} first batch "
                  f"{statistics.median(t for t, _ in ts):.2f} s (data path "
                  f"{statistics.median(d for _, d in ts):.3f} s; runs "
                  f"{', '.join(f'{t:.2f}' for t, _ in ts)})", flush=True)
        for masking, stage_dir in dirs.items():
            for step in old_steps:
                ts = [measure(stage_dir, step, stream=1) for _ in range(args.old_runs)]
                print(f"resume (replay, stream 1): {masking} step {step} first batch "
                      f"{statistics.median(t for t, _ in ts):.2f} s (data path "
                      f"{statistics.median(d for _, d in ts):.3f} s)", flush=True)
        if 1000 in steps and 1_000_000 in steps:
            def at(step, part):
                return statistics.median(m[part] for d in dirs for m in times[(d, step)])
            print(f"resume: data path ratio {at(1_000_000, 1) / at(1000, 1):.2f}", flush=True)
            print(f"resume: ratio {at(1_000_000, 0) / at(1000, 0):.2f}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
