"""What a checkpoint costs the training loop on a gs:// output root: uploaded in the foreground
(the old behaviour) or in the background while training goes on.

    .venv/bin/python -m bench.checkpoint_upload [--runs 3] [--latency 0.1] [--steps 50]
        [--checkpoint_every 5] [--modes local,old,sync,async]

The real pretrain stage, run by the executor in this process, trains a small BERT (2x128,
intermediate 512, vocabulary 64: a 5.4 MB checkpoint with Adam's slots; batch 128, sequence
128: a step is compute-bound like an accelerator's, and TensorFlow's local save, which no
upload scheme removes, is small beside it)
to a gs:// root on a GCS JSON API server on loopback (gcp-storage-emulator, the ``test``
extra) behind tests/support/fault_proxy.py, which delays every request by ``--latency``
seconds (a far bucket). A checkpoint every ``--checkpoint_every`` steps, the last two kept;
one step per call of the compiled loop; no log line but at the end.

A step's time is the gap between the starts of two consecutive calls of the loop: its
compute and the host work after it, the checkpoint included where there is one (what an
accelerator waits for). Checkpoint steps are those a checkpoint follows, but the last (a
stage's last checkpoint is always uploaded before the stage ends); ordinary steps are the
others, from the third on (the first call traces and compiles), the steps right after a
checkpoint included (a background upload shares the machine with them). A run's ratio is the
median of its checkpoint steps over the median of its ordinary steps (this machine's speed
drifts between runs, not within a few seconds); a mode's ratio is the median of its runs'
(and its times, the medians over every step of its runs). The modes alternate, ``--runs``
runs each:

- local: a local output root, nothing uploaded: TensorFlow's local save alone, the floor;
- old: uploaded in the foreground, one file at a time (``RUNEXP_CHECKPOINT_UPLOAD=sync``,
  ``transfer.TRANSFER_THREADS = 1``): what every checkpoint cost before;
- sync: in the foreground, ``TRANSFER_THREADS`` files at once;
- async: in the background (the default).

Ends with one line (sync: the old behaviour) and the command that reproduces it:
    checkpoint step / ordinary step: sync <a>x, async <b>x
This machine is shared and its speed drifts: only figures of the same run compare.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
import uuid

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The test helpers it runs (a module of the repository, run from its root with python -m).
from tests import conftest  # noqa: E402 - the GCS emulator the tests start
from tests.support import checkpoint_run, fault_proxy  # noqa: E402
from tests.support import runtime as tiny  # noqa: E402

MODEL = {"vocab_size": 64, "hidden_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 2, "intermediate_size": 512, "hidden_act": "gelu",
         "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
         "max_position_embeddings": 128, "type_vocab_size": 2, "initializer_range": 0.02}
BATCH, SEQ, PREDICTIONS, EXAMPLES = 128, 128, 20, 2048


def write_data(data_dir: str) -> None:
    """vocab/ and preprocess/ (one shard of train records) for MODEL."""
    tiny.write_vocab_dir(os.path.join(data_dir, "vocab"), MODEL["vocab_size"])
    tiny.write_pretraining_records(
        os.path.join(data_dir, "preprocess"), "train", EXAMPLES, MODEL["vocab_size"], SEQ,
        PREDICTIONS, seed=1, num_shards=1)


class CallStarts:
    """Notes when each call of the trainer's compiled loop starts (Trainer._build_loop
    wrapped while installed)."""

    def __init__(self):
        self.starts: list[float] = []

    def __enter__(self):
        from runexp.runtime.trainer import Trainer

        self._original = original = Trainer._build_loop
        starts = self.starts

        def build(trainer):
            loop = original(trainer)

            def timed(iterator, num_steps):
                starts.append(time.perf_counter())
                return loop(iterator, num_steps)

            return timed

        Trainer._build_loop = build
        return self

    def __exit__(self, *exc):
        from runexp.runtime.trainer import Trainer

        Trainer._build_loop = self._original


def run_once(mode: str, bucket: str, data_dir: str, cache: str,
             args) -> tuple[list, list, float]:
    """One training run in ``mode``: (checkpoint step times, ordinary step times, the
    seconds from the first call of the loop to the stage's end)."""
    from runexp.runtime import executor
    from runexp.runtime import gcs_mirror as mirror
    from runexp.runtime.storage import transfer

    os.environ[mirror.UPLOAD_MODE_ENV] = "background" if mode == "async" else "sync"
    transfer.TRANSFER_THREADS = 1 if mode == "old" else args.threads
    os.environ["RUNEXP_CACHE_DIR"] = os.path.join(cache, uuid.uuid4().hex[:8])
    root = f"gs://{bucket}/bench/{mode}-{uuid.uuid4().hex[:8]}"
    if mode == "local":
        root = os.path.join(cache, "local", uuid.uuid4().hex[:8])
    plan = checkpoint_run.tiny_plan(
        root, data_dir, model=dict(MODEL), batch_size=BATCH, max_seq_length=SEQ,
        max_predictions_per_seq=PREDICTIONS, train_steps=args.steps, warmup_steps=10,
        checkpoint_every=args.checkpoint_every, keep_checkpoints=2, steps_per_loop=1,
        log_every=args.steps)
    out = io.StringIO()
    with CallStarts() as calls, contextlib.redirect_stdout(out):
        code = executor.run_plan(plan)
    ended = time.perf_counter()
    if code != 0:
        sys.exit(f"the {mode} run failed (exit {code}):\n{out.getvalue()[-3000:]}")
    starts = calls.starts
    assert len(starts) == args.steps, (len(starts), args.steps)
    # starts[i]: step i + 1 begins; its time (with the host work after it) ends at starts[i+1].
    times = {i + 1: starts[i + 1] - starts[i] for i in range(len(starts) - 1)}
    checkpoint = [t for step, t in times.items() if step % args.checkpoint_every == 0]
    ordinary = [t for step, t in times.items()
                if step % args.checkpoint_every and step >= 3]
    return checkpoint, ordinary, ended - starts[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="runs per mode (alternating)")
    p.add_argument("--latency", type=float, default=0.1, help="seconds added to each request")
    p.add_argument("--steps", type=int, default=50, help="training steps per run")
    p.add_argument("--checkpoint_every", type=int, default=5)
    p.add_argument("--threads", type=int, default=8, help="files moved at once (sync, async)")
    p.add_argument("--modes", default="local,old,sync,async")
    args = p.parse_args(argv)
    modes = args.modes.split(",")

    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-upload-") as tmp:
        proc, endpoint = conftest._start_emulator(os.path.join(tmp, "emulator.log"))
        proxy = None
        try:
            proxy = fault_proxy.FaultProxy(endpoint)
            os.environ["STORAGE_EMULATOR_HOST"] = proxy.endpoint
            data_dir = os.path.join(tmp, "data")
            write_data(data_dir)
            proxy.latency(args.latency)
            import tensorflow as tf

            print(f"machine: {os.cpu_count()} cores; TensorFlow {tf.__version__}; "
                  f"{args.latency * 1000:.0f} ms per request; {args.steps} steps, a "
                  f"checkpoint every {args.checkpoint_every}", flush=True)
            samples = {mode: ([], [], []) for mode in modes}
            for r in range(args.runs):
                for mode in modes:
                    t0 = time.perf_counter()
                    checkpoint, ordinary, training = run_once(
                        mode, conftest.EMULATOR_BUCKET, data_dir, tmp, args)
                    c, o = statistics.median(checkpoint), statistics.median(ordinary)
                    samples[mode][0].extend(checkpoint)
                    samples[mode][1].extend(ordinary)
                    samples[mode][2].append(c / o)
                    print(f"  run {r + 1} {mode:5s}: checkpoint steps {c * 1000:6.0f} ms, "
                          f"ordinary {o * 1000:5.0f} ms (medians), ratio {c / o:.2f}x; "
                          f"training to the stage's end {training:.1f} s, the run "
                          f"{time.perf_counter() - t0:.1f} s", flush=True)
        finally:
            if proxy is not None:
                proxy.stop()
            conftest._stop(proc)
    ratios = {}
    for mode, (checkpoint, ordinary, run_ratios) in samples.items():
        c, o = statistics.median(checkpoint), statistics.median(ordinary)
        ratios[mode] = statistics.median(run_ratios)
        print(f"{mode:5s}: checkpoint step {c * 1000:6.0f} ms, ordinary step {o * 1000:5.0f} ms"
              f" (medians of {len(checkpoint)} and {len(ordinary)} steps); ratio "
              f"{ratios[mode]:.2f}x (median of {len(run_ratios)} runs: "
              + ", ".join(f"{r:.2f}" for r in run_ratios) + ")")
    command = "    .venv/bin/python -m bench.checkpoint_upload " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items())
    if "async" in ratios and ("old" in ratios or "sync" in ratios):
        sync = ratios.get("old", ratios.get("sync"))
        label = "one file at a time" if "old" in ratios else f"{args.threads} files at once"
        print(f"(sync: uploaded in the foreground, {label}, the old behaviour"
              f"{'' if 'old' in ratios else ' but parallel'}; async: in the background)")
        print(f"checkpoint step / ordinary step: sync {sync:.2f}x, async {ratios['async']:.2f}x")
    print(f"reproduce:\n{command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
