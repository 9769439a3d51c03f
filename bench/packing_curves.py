"""Packed against unpacked pretraining: held-out masked-LM accuracy after the same number of
instances seen, three seeds each (issue 27), drawn as curves.

    .venv/bin/python bench/packing_curves.py [--seq 512] [--steps 300] [--eval_every 30]
        [--seeds 1,2,3] [--size 2x128] [--out packing_curves.png]
        [--work_dir /tmp/runexp-bench-packing]

Data: bench/packing.py's man-page instances (runexp's own instance code, google-research/
bert's distribution) at ``--seq`` with an 8k WordPiece vocab of the corpus (a tiny model on a
small corpus, as the quickstart), from every page (at 512 about three quarters padding: packed
rows hold about 2.5 instances); held out: instances of the corpus's last tenth of documents,
one a row (every model serves unpacked inputs), the first ``--heldout`` of them.

Each seed trains two tiny BERTs (``--size``, dropout 0.1, AdamW lr 1e-3, 10% warmup, XLA on)
with runexp's Trainer, from the same initial weights (the seed's), on the same training
instances in the same seeded order:
  - unpacked: ``--batch`` instances a step, one a row;
  - packed: the same instances packed (tasks/instances/packing.py), ``round(batch / f)`` rows a step,
    ``f`` the instances a row of the packing, so that a step sees about as many instances.
Both run ``--steps`` steps (packed: a few instances more or fewer, counted exactly) and are
evaluated on the held-out instances every ``--eval_every`` steps (the Trainer's eval_every);
the x axis is the instances seen by then. Writes the PNG (held-out masked-LM accuracy and
loss: both modes' three curves and their means) and ``<out>.json`` (every point), and prints per checkpoint the mean and spread of each
mode and their difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import packing  # noqa: E402  (bench/packing.py)

CURVES_VOCAB = 8000


def run(mode: str, seed: int, train: dict, heldout: dict, model_dict: dict, batch: int,
        steps: int, eval_every: int, work_dir: str) -> list[tuple[int, float]]:
    """[(instances seen, held-out MLM accuracy, held-out MLM loss)] every ``eval_every``
    steps of one run."""
    import tensorflow as tf

    from runexp.compiler.specs import OptimizerSpec
    from runexp.runtime.model import BertConfig, BertPretrainer
    from runexp.runtime.optimizer import optimizer_from_spec
    from runexp.runtime.train_log import EVAL_LOG, pretraining_metrics
    from runexp.runtime.train_loop_config import TrainLoopConfig
    from runexp.runtime.trainer import Trainer

    tf.random.set_seed(seed)
    model = BertPretrainer(BertConfig.from_dict(model_dict), seed=seed, xla=True)
    optimizer = optimizer_from_spec(
        OptimizerSpec(learning_rate=1e-3, warmup_steps=max(1, steps // 10)), steps,
        model_dict["hidden_size"])
    config = TrainLoopConfig(train_steps=steps, batch_size=batch, steps_per_loop=eval_every,
                             log_every=eval_every, checkpoint_every=steps, jit_compile=True,
                             eval_every=eval_every)
    heldout_ds = lambda: tf.data.Dataset.from_tensor_slices(heldout).batch(64)  # noqa: E731
    train_ds = tf.data.Dataset.from_tensor_slices(train).repeat().batch(batch,
                                                                       drop_remainder=True)
    trainer = Trainer(tf.distribute.get_strategy(), model, optimizer, work_dir, config,
                      pretraining_metrics, progress=lambda _: None, eval_dataset=heldout_ds)
    trainer.train(lambda skip: train_ds.skip(skip))
    # Instances in each row of the stream (1 unpacked), cumulated over the batches.
    per_row = (train["next_sentence_weights"].sum(axis=1) if "next_sentence_weights" in train
               else np.ones(len(train["input_ids"])))
    rows = len(per_row)
    seen = lambda step: int(sum(per_row[i % rows] for i in range(step * batch)))  # noqa: E731
    with open(os.path.join(work_dir, EVAL_LOG), encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [(seen(r["step"]), float(r["mlm_accuracy"]), float(r["mlm_loss"]))
            for r in records]


def draw(results: dict, out: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5), dpi=110)
    colours = {"unpacked": "tab:blue", "packed": "tab:orange"}
    for k, (ax, what) in enumerate(zip(axes, ("accuracy", "loss")), start=1):
        for mode, runs in results.items():
            for i, (seed, points) in enumerate(sorted(runs.items())):
                ax.plot([p[0] for p in points], [p[k] for p in points], color=colours[mode],
                        alpha=0.45, linewidth=1, marker=".",
                        label=f"{mode}, each seed" if i == 0 else None)
            xs = np.mean([[p[0] for p in pts] for pts in runs.values()], axis=0)
            ys = np.mean([[p[k] for p in pts] for pts in runs.values()], axis=0)
            ax.plot(xs, ys, color=colours[mode], linewidth=2.2,
                    label=f"{mode}, mean of {len(runs)} seeds")
        ax.set_xlabel("training instances seen")
        ax.set_ylabel(f"held-out masked-LM {what}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=16, help="instances a step, unpacked")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval_every", type=int, default=30)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--size", default="2x128", help="the encoder, LAYERSxHIDDEN")
    p.add_argument("--heldout", type=int, default=512, help="held-out instances evaluated")
    p.add_argument("--out", default="packing_curves.png")
    p.add_argument("--work_dir", default="/tmp/runexp-bench-packing")
    args = p.parse_args(argv)
    from runexp.runtime.strategy import configure_threads

    configure_threads()
    layers, hidden = (int(v) for v in args.size.lower().split("x"))
    model_dict = {**packing.model_dict(layers, hidden), "vocab_size": CURVES_VOCAB}
    unpacked = packing.instances(args.work_dir, args.seq, "train", vocab_size=CURVES_VOCAB,
                                 min_document_tokens=0)
    heldout = packing.instances(args.work_dir, args.seq, "validation",
                                max_instances=args.heldout, vocab_size=CURVES_VOCAB,
                                min_document_tokens=0)
    model_dict["vocab_size"] = max(CURVES_VOCAB, int(unpacked["input_ids"].max()) + 1)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {"unpacked": {}, "packed": {}}
    t0 = time.time()
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(len(unpacked["input_ids"]))
        train_u = {k: v[order] for k, v in unpacked.items()}
        train_p = packing.packed(train_u, args.seq)
        factor = float(train_p["next_sentence_weights"].sum()) / len(train_p["input_ids"])
        batch_p = max(1, round(args.batch / factor))
        for mode, data, batch in (("unpacked", train_u, args.batch),
                                  ("packed", train_p, batch_p)):
            with tempfile.TemporaryDirectory(prefix="bench-packing-curves-") as work:
                results[mode][seed] = run(mode, seed, data, heldout, model_dict, batch,
                                          args.steps, args.eval_every, work)
            last = results[mode][seed][-1]
            print(f"seed {seed} {mode}: batch {batch} rows ({factor:.2f} instances a packed "
                  f"row), {last[0]:,} instances seen, held-out MLM accuracy {last[1]:.4f} "
                  f"({time.time() - t0:.0f} s so far)", flush=True)
    padding = packing.padding_share(unpacked)
    title = (f"{layers}x{hidden} BERT, seq {args.seq} (padding {100 * padding:.0f}% unpacked), "
             f"{args.batch} instances a step, {args.steps} steps, seeds {args.seeds}")
    draw(results, args.out, title)
    with open(args.out + ".json", "w") as f:
        json.dump({"title": title, "results": {m: {str(s): pts for s, pts in r.items()}
                                               for m, r in results.items()}}, f, indent=1)
    print("held-out masked-LM accuracy, mean ± standard deviation over the seeds:")
    print(f"{'instances (mean)':>18} {'unpacked':>16} {'packed':>16} {'packed - unpacked':>18}")
    n = min(len(pts) for r in results.values() for pts in r.values())
    for i in range(n):
        cols = []
        for mode in ("unpacked", "packed"):
            ys = [results[mode][s][i][1] for s in seeds]
            cols.append((statistics.mean(ys), statistics.pstdev(ys)))
        x = statistics.mean(results[m][s][i][0] for m in results for s in seeds)
        print(f"{x:18,.0f} {cols[0][0]:9.4f} ±{cols[0][1]:.4f} {cols[1][0]:9.4f} "
              f"±{cols[1][1]:.4f} {cols[1][0] - cols[0][0]:+18.4f}")
    print(f"wrote {args.out} and {args.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
