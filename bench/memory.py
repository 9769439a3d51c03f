"""The per-replica training memory estimate (compiler/estimates.py memory()) against measurement.

Each configuration (encoder x sequence x recomputation) trains in its own subprocess with
jit_compile=True and xla=True (the code path a TPU runs), float32, AdamW with global-norm
clipping, vocab 30522, max_position_embeddings 512: one step compiles, --steps more run.
The estimate is the compiler's own: runexp.compiler.estimates.memory(model dict, batch, seq,
recompute=..., predictions=...).

Measured, "the peak of a training step": the bytes XLA's compiled train step needs, from its
buffer assignment (an --xla_dump_to dump):

  state     the variables, summed from their shapes: weights, AdamW's two slots, the step
            counter, the dropout generator's state. They are the step's parameters and XLA
            aliases each updated variable to its input buffer (input_output_alias), so they
            are held once; outputs that alias no parameter (a few bytes: the loss) are added.
  temp      the step's preallocated temp buffer: the activations kept for the backward pass,
            the gradients (never variables: XLA computes them into temp and consumes them
            in the same program, for clipping and the update), the MLM logits, temporaries;
            after XLA's liveness analysis, buffer reuse and scheduling.

  measured = state + temp: what the estimate predicts (bytes the program needs at its
  peak), and the quantity a TPU's HBM must hold; XLA:TPU fuses and lays out differently and
  rematerializes under memory pressure, so on a TPU it is, if anything, an upper bound.

Printed beside it, as cross-checks:
  allocator peak  TensorFlow's allocator statistics over the steps (CPU:0 reports them:
            tf.config.experimental.get_memory_info, reset after the compile step). It is
            state + temp plus the BFC allocator's rounding: a request smaller than a free
            chunk but over half of it takes the whole chunk (tiny/512/layers: a 256 MiB
            chunk for a 231 MB temp), which depends on the process's allocation history,
            not on the model; hence not the headline.
  RSS growth  the peak RSS during the steps (psutil, sampled every 2 ms) over the RSS at
            rest before the model is built (TensorFlow imported, the batch created). It
            adds the compiled executable, the XLA compiler's heap glibc keeps and the
            runtime's own buffers (~0.4-0.8 GB here).

Encoders: tiny (2 layers x 128 hidden, 2 heads), small (4 x 256, 4 heads: the preset "mini"),
base (12 x 768, 12 heads); intermediate 4 x hidden; dropout 0.1. Sequence 128 with 20
predictions, 512 with 80. Batches (BATCH) are what a 2-core CPU runs in about 20 minutes
for all 12; a train step's buffer assignment does not depend on how many steps run.

    .venv/bin/python bench/memory.py                         # all 12 configurations
    .venv/bin/python bench/memory.py --only base/512         # a subset (name filter)
    .venv/bin/python bench/memory.py --json raw.json         # also keep the raw results
    .venv/bin/python bench/memory.py --from-json raw.json    # the table of earlier results

Prints a table (encoder, seq, batch, recompute, estimated GB (state / activations),
measured GB, error %, the cross-checks), then
    memory estimate: <n> configurations, worst error <e>%
(the signed error of largest magnitude, (estimated - measured) / measured) and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENCODERS = {"tiny": (2, 128, 2), "small": (4, 256, 4), "base": (12, 768, 12)}
PREDICTIONS = {128: 20, 512: 80}
# Examples per step: big enough that activations outweigh the state, small enough for a
# 2-core CPU (base at 512: 4).
BATCH = {("tiny", 128): 64, ("tiny", 512): 16, ("small", 128): 64, ("small", 512): 16,
         ("base", 128): 16, ("base", 512): 4}
VOCAB = 30522

_CHILD = r"""
import json, os, sys, threading, time
import numpy as np, psutil
proc = psutil.Process()
import tensorflow as tf
from runexp.runtime.model import BertConfig, BertPretrainer
from runexp.runtime.optimizer import WarmupDecay, make_optimizer

a = json.loads(sys.argv[1])
tf.config.threading.set_intra_op_parallelism_threads(a["threads"])
b, s, p, v = a["batch"], a["seq"], a["predictions"], a["vocab"]
rng = np.random.default_rng(0)
features = {
    "input_ids": tf.constant(rng.integers(0, v, [b, s]), tf.int32),
    "input_mask": tf.ones([b, s], tf.int32),
    "segment_ids": tf.constant((np.arange(s)[None] >= s // 2).repeat(b, 0), tf.int32),
    "masked_lm_positions": tf.constant(rng.integers(0, s, [b, p]), tf.int32),
    "masked_lm_ids": tf.constant(rng.integers(0, v, [b, p]), tf.int32),
    "masked_lm_weights": tf.ones([b, p], tf.float32),
    "next_sentence_labels": tf.zeros([b, 1], tf.int32),
}
time.sleep(0.2)
rest = proc.memory_info().rss
peak, done = [rest], threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.002)

config = BertConfig.from_dict(a["model"])
model = BertPretrainer(config, seed=1, xla=True, recompute=a["recompute"])
optimizer = make_optimizer("adamw", WarmupDecay(1e-4, 10, 1000), weight_decay=0.01,
                           clip_norm=1.0)
named = model.google_variables()
optimizer.build(named)
variables = list(named.values())
state = sum(x.shape.num_elements() * x.dtype.size for x in
            {id(x): x for x in list(model.variables) + list(optimizer.variables)}.values())

@tf.function(jit_compile=True)
def step(features):
    with tf.GradientTape() as tape:
        loss, _ = model.loss(features, training=True)
    optimizer.apply(tape.gradient(loss, variables), variables)
    return loss

def allocator():
    try:
        return tf.config.experimental.get_memory_info("CPU:0")
    except (ValueError, RuntimeError):
        return None

t0 = time.perf_counter()
step(features).numpy()  # compiles
compile_s = time.perf_counter() - t0
time.sleep(0.2)
after_compile = proc.memory_info().rss
build = allocator()  # peak over model build and the compile step
try:
    tf.config.experimental.reset_memory_stats("CPU:0")
except (ValueError, RuntimeError):
    pass
thread = threading.Thread(target=sample, daemon=True)
thread.start()
times = []
for _ in range(a["steps"]):
    t0 = time.perf_counter()
    step(features).numpy()
    times.append(time.perf_counter() - t0)
done.set(); thread.join()
print(json.dumps({"rest": rest, "after_compile": after_compile, "peak": peak[0],
                  "state": state, "step_s": float(np.median(times)), "compile_s": compile_s,
                  "allocator": allocator(), "allocator_build": build}))
"""

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+),([^\n]*)$", re.M)
# The entries of XLA's "Stack trace breakdown for peak usage": (op, bytes live).
_PEAK_ENTRY = re.compile(r"^[ │]*[├└]── (\S+) \([\d.]+%, total: [\d ]+ bytes, "
                         r"current: ([\d ]+) bytes", re.M)


def buffer_assignment(dump_dir: str) -> dict:
    """From the largest train-step module's buffer assignment: its temp bytes, parameter
    bytes, and output bytes that do not alias a parameter (updated variables normally do)."""
    best = None
    for name in os.listdir(dump_dir):
        if not name.endswith("buffer-assignment.txt"):
            continue
        with open(os.path.join(dump_dir, name)) as f:
            text = f.read()
        out = {"temp": 0, "parameters": 0, "outputs": 0, "file": name,
               "peak_breakdown": [(m.group(1), int(m.group(2).replace(" ", ""))) for m in
                                  _PEAK_ENTRY.finditer(text) if m.group(2).strip("0 ")]}
        for _, size, attrs in _ALLOCATION.findall(text):
            size = int(size)
            if "preallocated-temp" in attrs:
                out["temp"] = max(out["temp"], size)
            elif "parameter" in attrs:
                out["parameters"] += size
            elif "output" in attrs or "maybe-live-out" in attrs:
                out["outputs"] += size
        if best is None or out["temp"] > best["temp"]:
            best = out
    return best or {"temp": 0, "parameters": 0, "outputs": 0, "file": None}


def measure_step(model: dict, batch: int, seq: int, predictions: int, recompute: str,
                 steps: int, threads: int, dump: str | None = None) -> dict:
    """One configuration's train step in its own subprocess (_CHILD): its variables' bytes,
    RSS at rest / after the compile / peak, step time, allocator statistics, and ``xla``:
    its buffer assignment (``dump``: keep the XLA dump there). Also bench/recompute.py's."""
    payload = dict(model=model, batch=batch, seq=seq, predictions=predictions,
                   vocab=model["vocab_size"], recompute=recompute, steps=steps,
                   threads=threads)
    with tempfile.TemporaryDirectory() as tmp:
        dump = dump or tmp
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", TF_CPP_MIN_LOG_LEVEL="2",
                   XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text "
                             "--xla_dump_hlo_module_re=.*step.*")
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(payload)], env=env,
                             check=True, capture_output=True, text=True, cwd=REPO)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["xla"] = buffer_assignment(dump)
    return result


def run(encoder: str, seq: int, recompute: str, args) -> dict:
    layers, hidden, heads = ENCODERS[encoder]
    model = {"vocab_size": VOCAB, "hidden_size": hidden, "num_hidden_layers": layers,
             "num_attention_heads": heads, "intermediate_size": 4 * hidden,
             "max_position_embeddings": 512, "type_vocab_size": 2}
    batch = args.batch or BATCH[(encoder, seq)]
    dump = os.path.join(args.dump, f"{encoder}_{seq}_{recompute}") if args.dump else None
    result = measure_step(model, batch, seq, PREDICTIONS[seq], recompute, args.steps,
                          args.threads, dump)
    result.update(encoder=encoder, seq=seq, batch=batch, recompute=recompute, model=model)
    return result


def measured(r: dict) -> int:
    """The step's peak bytes (see the module docstring): the variables + the XLA step's
    temp buffer + outputs that alias no variable."""
    return r["state"] + r["xla"]["temp"] + r["xla"]["outputs"]


def allocator_peak(r: dict) -> int | None:
    """TensorFlow's allocator peak over the steps (None where the device reports none)."""
    return (r.get("allocator") or {}).get("peak") or None


def estimated(r: dict):
    from runexp.compiler.estimates import memory

    return memory(r["model"], r["batch"], r["seq"], optimizer="adamw",
                  compute_dtype="float32", recompute=r["recompute"],
                  predictions=PREDICTIONS[r["seq"]])


def table(results: list[dict]) -> list[str]:
    gb = 1e9
    lines = [f"{'encoder':<7} {'seq':>4} {'batch':>5} {'recompute':<9} "
             f"{'estimated GB (state / act)':<27}{'measured GB':>11} {'error':>7}   "
             f"{'allocator peak':>14} {'RSS growth':>10}"]
    errors = []
    for r in results:
        est = estimated(r)
        meas = measured(r)
        err = 100.0 * (est.gb * gb - meas) / meas
        errors.append(err)
        alloc = allocator_peak(r)
        lines.append(
            f"{r['encoder']:<7} {r['seq']:>4} {r['batch']:>5} {r['recompute']:<9} "
            f"{f'{est.gb:.3f} ({est.state / gb:.3f} / {est.activations / gb:.3f})':<27}"
            f"{meas / gb:>11.3f} {err:>+6.1f}%   "
            f"{alloc / gb if alloc else float('nan'):>14.3f} "
            f"{(r['peak'] - r['rest']) / gb:>10.3f}")
    worst = max(errors, key=abs)
    lines.append(f"memory estimate: {len(results)} configurations, worst error {worst:+.1f}%")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run configurations whose name "
                        "('base/512/layers') contains this")
    parser.add_argument("--batch", type=int, default=0, help="override every batch size")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--from-json", help="print the table of earlier raw results")
    parser.add_argument("--dump", help="keep the XLA dumps under this directory")
    args = parser.parse_args(argv)
    t0 = time.time()
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
    else:
        results = []
        for encoder in ENCODERS:
            for seq in PREDICTIONS:
                for recompute in ("none", "layers"):
                    if args.only not in f"{encoder}/{seq}/{recompute}":
                        continue
                    results.append(run(encoder, seq, recompute, args))
                    print(f"  ran {encoder}/{seq}/{recompute} ({time.time() - t0:.0f} s)",
                          file=sys.stderr, flush=True)
                    if args.json:
                        with open(args.json, "w") as f:
                            json.dump(results, f, indent=1)
    for line in table(results):
        print(line)
    command = " ".join(["$ .venv/bin/python bench/memory.py", *(argv or sys.argv[1:])])
    print("  measured = the variables (weights, AdamW slots) + the XLA train step's temp buffer "
          "(activations, gradients, MLM logits, temporaries); allocator peak = TensorFlow's "
          f"allocator peak over {args.steps} steps (adds the BFC allocator's rounding); RSS "
          "growth = peak RSS over the rest before the model is built (adds the executable, "
          f"the compiler's heap); {time.time() - t0:.0f} s")
    print(f"  {command}")


if __name__ == "__main__":
    main()
