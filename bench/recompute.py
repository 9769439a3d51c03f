"""Activation recomputation (train.recompute = "layers"): peak memory and step time under XLA.

Each mode trains in its own subprocess (jit_compile=True, xla=True: the code path TPUs
run): one step compiles, then a thread samples the process RSS (psutil, every 2 ms) over
--steps steps; "peak" is the highest RSS seen minus the RSS at rest after the compile step
(printed as a cross-check: it stays flat, the compiled step's buffers remain allocated
between steps). The headline peak is the train step's preallocated temp buffer from XLA's
buffer assignment (an --xla_dump_to dump): the step's peak working memory (activations kept
for the backward pass, gradients, temporaries), after XLA's own scheduling/rematerialization.

    .venv/bin/python bench/recompute.py                  # small encoder, seq 512, batch 8
    .venv/bin/python bench/recompute.py --layers 4 --hidden 256 --batch 8 --steps 5

Prints
    recompute: <encoder> seq 512 batch <b>: peak <x> GB -> <y> GB (<y/x>), step time <r>x
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, sys, threading, time
import numpy as np, psutil, tensorflow as tf
from runexp.runtime.model import BertConfig, BertPretrainer
from runexp.runtime.optimizer import WarmupDecay, make_optimizer

a = json.loads(sys.argv[1])
tf.config.threading.set_intra_op_parallelism_threads(a["threads"])
h = a["hidden"]
config = BertConfig.from_dict({
    "vocab_size": a["vocab"], "hidden_size": h, "num_hidden_layers": a["layers"],
    "num_attention_heads": max(1, h // 64), "intermediate_size": 4 * h,
    "max_position_embeddings": a["seq"], "type_vocab_size": 2})
model = BertPretrainer(config, seed=1, xla=True, recompute=a["recompute"])
optimizer = make_optimizer("adamw", WarmupDecay(1e-4, 10, 1000), weight_decay=0.01,
                           clip_norm=1.0)
named = model.google_variables()
optimizer.build(named)
variables = list(named.values())

@tf.function(jit_compile=True)
def step(features):
    with tf.GradientTape() as tape:
        loss, _ = model.loss(features, training=True)
    optimizer.apply(tape.gradient(loss, variables), variables)
    return loss

b, s, p = a["batch"], a["seq"], 20
rng = np.random.default_rng(0)
features = {
    "input_ids": tf.constant(rng.integers(0, a["vocab"], [b, s]), tf.int32),
    "input_mask": tf.ones([b, s], tf.int32),
    "segment_ids": tf.constant((np.arange(s)[None] >= s // 2).repeat(b, 0), tf.int32),
    "masked_lm_positions": tf.constant(rng.integers(0, s, [b, p]), tf.int32),
    "masked_lm_ids": tf.constant(rng.integers(0, a["vocab"], [b, p]), tf.int32),
    "masked_lm_weights": tf.ones([b, p], tf.float32),
    "next_sentence_labels": tf.zeros([b, 1], tf.int32),
}
step(features).numpy()  # compiles
proc = psutil.Process()
time.sleep(0.2)
rest = proc.memory_info().rss
peak, done = [rest], threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.002)

thread = threading.Thread(target=sample, daemon=True)
thread.start()
times = []
for _ in range(a["steps"]):
    t0 = time.perf_counter()
    step(features).numpy()
    times.append(time.perf_counter() - t0)
done.set(); thread.join()
print(json.dumps({"rest": rest, "peak": peak[0], "step_s": float(np.median(times))}))
"""


def _temp_bytes(dump_dir: str) -> int | None:
    """The train step's preallocated temp buffer (its peak working memory: activations kept
    for the backward pass, gradients, temporaries; XLA's buffer assignment), the largest over
    the dumped modules."""
    best = None
    for path in glob.glob(os.path.join(dump_dir, "*buffer-assignment.txt")):
        with open(path) as f:
            for m in re.finditer(r"allocation \d+: size (\d+), preallocated-temp", f.read()):
                best = max(best or 0, int(m.group(1)))
    return best


def run(recompute: str, args) -> dict:
    with tempfile.TemporaryDirectory() as dump:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", TF_CPP_MIN_LOG_LEVEL="2",
                   XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text "
                             "--xla_dump_hlo_module_re=.*step.*")
        payload = json.dumps(dict(vars(args), recompute=recompute))
        out = subprocess.run([sys.executable, "-c", _CHILD, payload], env=env, check=True,
                             capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["xla_bytes"] = _temp_bytes(dump)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    none, layers = run("none", args), run("layers", args)
    gb = 1e9
    x, y = none["xla_bytes"] / gb, layers["xla_bytes"] / gb
    encoder = f"L{args.layers}/H{args.hidden}"
    print(f"recompute: {encoder} seq {args.seq} batch {args.batch}: peak {x:.2f} GB -> "
          f"{y:.2f} GB ({y / x:.2f}), step time {layers['step_s'] / none['step_s']:.2f}x")
    print(f"  peak = the XLA train step's preallocated temp buffer; step "
          f"{none['step_s']:.2f} s -> {layers['step_s']:.2f} s (median of {args.steps})")
    rss = [(r["peak"] - r["rest"]) / gb for r in (none, layers)]
    print(f"  process RSS: at rest after compiling {none['rest'] / gb:.2f} / "
          f"{layers['rest'] / gb:.2f} GB, growth during steps {rss[0]:.2f} / {rss[1]:.2f} GB "
          "(the compiled step's buffers stay allocated between steps: RSS does not show the "
          "peak)")

if __name__ == "__main__":
    main()
