"""Training throughput on CPU: runexp's pretraining step against keras-hub's BertMaskedLM.

    .venv/bin/python bench/train.py [--rounds 3] [--steps 5] [--small 4x256] [--sizes tiny,small]
        [--phase2_sizes small]
    .venv/bin/python bench/train.py --sizes '' [--phase2_sizes small]  # phase 2 alone
    .venv/bin/python bench/train.py --phase2_sizes ''                  # phase 1 alone
    .venv/bin/python bench/train.py --input_only [--input_runs 5]   # the input line alone

Both models get the same encoder size (tiny 2x128, small 4x256 by default; heads = hidden /
64, at least 2; intermediate = 4 x hidden) and the same shape: phase 1 (``--sizes``),
sequence length 128, batch 32, 20 masked positions; phase 2 (``--phase2_sizes``), the
published recipe's sequence length 512 and 80 masked positions, at batch 8: the same 4,096
tokens and 640 predictions a step as phase 1, so a step costs about as much (small encoder:
133 against 114 training GFLOPs; only attention's 4sh per token and layer grows) and a
window stays seconds long on a 2-core CPU (batch 32 would make it 4x longer). Otherwise
alike: vocabulary 30,522, AdamW (lr 1e-4, weight decay 0.01 but not on LayerNorm and
biases, epsilon 1e-6, global-norm clipping 1.0), dropout 0.1, and the same synthetic
examples in the same order, in one process with the same TensorFlow thread pools. runexp runs
its Trainer's compiled host loop; keras-hub runs Keras ``fit`` (``pip install -e '.[bench]'``).
Each runs with XLA off and on: runexp ``jit_compile`` (the pretrain stage's param), Keras
``compile(jit_compile=...)`` (on is Keras' own default on TensorFlow; off is the peer as
BENCHMARKS.md section 3 measured it).

For each size the four runners alternate, ``--rounds`` windows of ``--steps`` steps each
(after a warm-up window that traces and compiles); a step's time is the gap between
consecutive step ends, and the figures are medians over every step of every window. This
machine's speed drifts by up to 2x over minutes (a shared host): only figures from the same
run compare.

MFU = (training FLOPs per step / step time) / the machine's float32 matmul FLOP/s, measured
here as numpy's sgemm on 2048, 3072 and 4096 squares (the best size), once per round between
the windows, median over the rounds. FLOPs are counted as
compiler/estimates.py does: per token and layer 8h^2 + 4hi + 4sh, per masked position
2h^2 + 2hV, multiply-add = 2, backward = 2 x forward.

Prints every pairing's ratio and ends with one line a phase: the small encoder (else the
first measured), runexp with jit_compile (its fastest float32 setting on CPU at sequence 128;
kept at 512 for a like-for-like line, though XLA off measures faster there: XLA:CPU writes
each softmax and dropout pass over [batch, heads, seq, seq] to memory; see the pairings above)
against the peer as BENCHMARKS.md defines it (Keras fit, no XLA); the MFU counts the phase's
sequence length and predictions:
    train: runexp <x> ex/s, keras-hub <y> ex/s, ratio <r>, MFU <m>%
    train (phase 2, seq 512): runexp <x> ex/s, keras-hub <y> ex/s, ratio <r>, MFU <m>%

First, the input pipeline alone (it must never be what an accelerator waits on): the seqio
path the pretrain stage reads, ``runtime/pretraining_data.py``: a preprocess stage directory
holding a task's seqio cache (``INPUT_EXAMPLES`` synthetic full-length examples at sequence
length 128 and 20 predictions, ``INPUT_SHARDS`` shards, written as the preprocess stage
writes them; more than seqio keeps in memory, so every epoch reads the files), read with
``get_dataset(use_cached=True, shuffle=True, num_epochs=None)``, batch 256, into numpy; the
rate over ``INPUT_BATCHES`` batches after ``INPUT_WARMUP``, median of ``--input_runs`` fresh
pipelines, also with dynamic masking (the train split stored unmasked and masked by the
task's seqio preprocessor, whole words):
    input: seqio from the cache, seq 128: <x> ex/s (dynamic masking: <y> ex/s)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

VOCAB = 30522


@dataclasses.dataclass(frozen=True)
class Phase:
    """A pretraining phase's shape; ``tag`` names it in the final line."""

    tag: str
    seq: int
    predictions: int
    batch: int


PHASE1 = Phase("", 128, 20, 32)
PHASE2 = Phase(" (phase 2, seq 512)", 512, 80, 8)  # 4,096 tokens a step, as phase 1


def sgemm_flops(sizes=(2048, 3072, 4096), reps: int = 3) -> float:
    """numpy float32 matmul FLOP/s: the best over ``sizes`` of the median of ``reps`` (after
    one untimed product per size)."""
    best = 0.0
    rng = np.random.default_rng(0)
    for n in sizes:
        a = rng.random((n, n), dtype=np.float32)
        b = rng.random((n, n), dtype=np.float32)
        a @ b
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        best = max(best, 2 * n ** 3 / statistics.median(times))
    return best


def model_dict(layers: int, hidden: int) -> dict:
    return {"vocab_size": VOCAB, "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": max(2, hidden // 64), "intermediate_size": 4 * hidden,
            "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512,
            "type_vocab_size": 2, "initializer_range": 0.02}


def examples(n: int, phase: Phase = PHASE1, seed: int = 0) -> dict:
    """n synthetic examples in google-research/bert's layout (full-length pairs)."""
    seq, predictions = phase.seq, phase.predictions
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, [n, seq]).astype(np.int32)
    ids[:, 0] = 2
    ids[:, seq // 2] = ids[:, -1] = 3
    positions = np.sort(np.stack([rng.choice(np.arange(1, seq - 1), predictions, replace=False)
                                  for _ in range(n)]), axis=1).astype(np.int32)
    targets = np.take_along_axis(ids, positions, axis=1)
    masked = ids.copy()
    np.put_along_axis(masked, positions, 4, axis=1)
    return {
        "input_ids": masked,
        "input_mask": np.ones([n, seq], np.int32),
        "segment_ids": (np.arange(seq)[None] > seq // 2).astype(np.int32).repeat(n, 0),
        "masked_lm_positions": positions,
        "masked_lm_ids": targets,
        "masked_lm_weights": np.ones([n, predictions], np.float32),
        "next_sentence_labels": rng.integers(0, 2, [n, 1]).astype(np.int32),
    }


class RunexpRunner:
    """runexp's model, optimizer and Trainer host loop (what the pretrain stage runs)."""

    def __init__(self, model: dict, data: dict, xla: bool, batch: int):
        import tensorflow as tf

        from runexp.runtime.model import BertConfig, BertPretrainer
        from runexp.compiler.specs import OptimizerSpec
        from runexp.runtime.optimizer import optimizer_from_spec
        from runexp.runtime.train_loop_config import TrainLoopConfig
        from runexp.runtime.train_log import pretraining_metrics
        from runexp.runtime.trainer import Trainer

        self.tf = tf
        self.model = BertPretrainer(BertConfig.from_dict(model), xla=xla)
        optimizer = optimizer_from_spec(OptimizerSpec(learning_rate=1e-4, warmup_steps=10),
                                        100_000, model["hidden_size"])
        self.work_dir = tempfile.mkdtemp(prefix="bench-train-")
        self.trainer = Trainer(tf.distribute.get_strategy(), self.model, optimizer,
                               self.work_dir, TrainLoopConfig(train_steps=100_000,
                                                              batch_size=batch,
                                                              jit_compile=xla),
                               pretraining_metrics, progress=lambda _: None)
        self.dataset = tf.data.Dataset.from_tensor_slices(data).repeat().batch(
            batch, drop_remainder=True).prefetch(2)

    def window(self, steps: int) -> list[float]:
        """Runs ``steps`` steps from the first batch; the time of each."""
        iterator = iter(self.dataset)
        times, last = [], time.perf_counter()
        for _ in range(steps):
            self.trainer.run_steps(iterator, 1)
            now = time.perf_counter()
            times.append(now - last)
            last = now
        return times


class KerasHubRunner:
    """keras-hub's BertMaskedLM trained with Keras fit."""

    def __init__(self, model: dict, data: dict, xla: bool, batch: int):
        import keras
        import keras_hub
        import tensorflow as tf

        backbone = keras_hub.models.BertBackbone(
            vocabulary_size=VOCAB, num_layers=model["num_hidden_layers"],
            num_heads=model["num_attention_heads"], hidden_dim=model["hidden_size"],
            intermediate_dim=model["intermediate_size"], dropout=0.1,
            max_sequence_length=model["max_position_embeddings"])
        self.model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
        optimizer = keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01,
                                           epsilon=1e-6, global_clipnorm=1.0)
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
        self.model.compile(optimizer=optimizer,
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()],
                           jit_compile=xla)
        x = {"token_ids": data["input_ids"], "segment_ids": data["segment_ids"],
             "padding_mask": data["input_mask"].astype(bool),
             "mask_positions": data["masked_lm_positions"]}
        self.dataset = tf.data.Dataset.from_tensor_slices(
            (x, data["masked_lm_ids"], data["masked_lm_weights"])).repeat().batch(
            batch, drop_remainder=True).prefetch(2)
        self.keras = keras

    def window(self, steps: int) -> list[float]:
        """Runs ``steps`` steps of fit from the first batch; the time of each but the first
        (fit's own start-up precedes it)."""
        ends = []

        class _Clock(self.keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                ends.append(time.perf_counter())

        self.model.fit(self.dataset, steps_per_epoch=steps, epochs=1, verbose=0,
                       callbacks=[_Clock()])
        return list(np.diff(ends))


def measure(name: str, model: dict, phase: Phase, rounds: int, steps: int) -> dict:
    """Both models with XLA off and on, alternating; {(label, xla): figures}."""
    from runexp.compiler.estimates import train_flops_per_example

    flops = train_flops_per_example(model, phase.seq, phase.predictions) * phase.batch
    data = examples(phase.batch * max(steps, 3), phase)
    runners = {}
    for xla in (False, True):
        for label, cls in (("runexp", RunexpRunner), ("keras-hub", KerasHubRunner)):
            t0 = time.perf_counter()
            runners[(label, xla)] = cls(model, data, xla, phase.batch)
            runners[(label, xla)].window(3)  # trace, compile, warm the caches
            print(f"  {label} (XLA {'on' if xla else 'off'}): built and warmed up in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
    samples = {key: [] for key in runners}
    peaks = []
    for _ in range(rounds):
        peaks.append(sgemm_flops(reps=1))  # the machine's speed drifts: measure it alongside
        for key, runner in runners.items():
            samples[key] += runner.window(steps)
    peak = statistics.median(peaks)
    print(f"{name}: numpy sgemm {peak / 1e9:.0f} GFLOP/s during these windows (median of "
          f"{len(peaks)})", flush=True)
    out = {}
    for key, times in samples.items():
        step = statistics.median(times)
        out[key] = {"step_s": step, "ex_s": phase.batch / step, "mfu": flops / step / peak,
                    "n": len(times)}
    for (label, xla), r in out.items():
        print(f"{name} {label:9s} XLA {'on ' if xla else 'off'}: {r['ex_s']:6.1f} ex/s, "
              f"{r['step_s'] * 1000:5.0f} ms/step, MFU {100 * r['mfu']:4.1f}% "
              f"(median of {r['n']} steps)", flush=True)
    for ours, theirs, what in ((True, False, "runexp XLA vs the BENCHMARKS.md peer (no XLA)"),
                               (True, True, "both XLA"), (False, False, "both without XLA")):
        ratio = out[("runexp", ours)]["ex_s"] / out[("keras-hub", theirs)]["ex_s"]
        print(f"{name} ratio, {what}: {ratio:.2f}", flush=True)
    del runners
    gc.collect()
    import keras

    keras.backend.clear_session()
    return out


INPUT_EXAMPLES, INPUT_SHARDS, INPUT_BATCH, INPUT_BATCHES, INPUT_WARMUP = 40_000, 8, 256, 200, 20


def write_input_cache(stage_dir: str, dynamic: bool) -> None:
    """A preprocess stage directory with task ``bench_input``'s seqio cache (train split)."""
    from runexp.tasks.cache import records

    cache = records.task_cache_dir(stage_dir, "bench_input")
    os.makedirs(cache, exist_ok=True)
    rng = np.random.default_rng(1)
    per_shard = INPUT_EXAMPLES // INPUT_SHARDS
    for shard in range(INPUT_SHARDS):
        batch = examples(per_shard, seed=shard)
        batch = {k: v.astype(np.float32 if k == "masked_lm_weights" else np.int64)
                 for k, v in batch.items()}
        if dynamic:
            half = PHASE1.seq // 2
            batch["input_ids"][:, 1:half] = rng.integers(5, VOCAB, [per_shard, half - 1])
            batch["word_starts"] = (rng.random([per_shard, PHASE1.seq]) < 0.7).astype(np.int64)
            for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
                batch[k] = np.zeros_like(batch[k])
        with records.TFRecordWriter(records.shard_path(cache, "train", shard,
                                                       INPUT_SHARDS)) as w:
            w.write_batch(*records.encode_instance_batch(batch))
    records.write_info(cache, "train", INPUT_SHARDS, PHASE1.seq, PHASE1.predictions, dynamic)
    records.write_stats(cache, "train", {"examples": per_shard * INPUT_SHARDS})
    if dynamic:
        records.write_masking(cache, {"max_predictions_per_seq": PHASE1.predictions,
                                      "masked_lm_prob": 0.15, "mask_token_prob": 0.8,
                                      "random_token_prob": 0.1, "whole_word_masking": True,
                                      "ngram_max": 1, "vocab_size": VOCAB, "mask_id": 4,
                                      "cls_id": 2, "sep_id": 3, "random_seed": 1,
                                      "splits": ["train"]})
    records.write_completed(cache)


def input_rate(stage_dir: str) -> float:
    """Examples per second of one fresh pipeline (module docstring)."""
    from runexp.runtime import pretraining_data

    ds = pretraining_data.pretraining_dataset(stage_dir, "train", INPUT_BATCH, PHASE1.seq,
                                              PHASE1.predictions, seed=1, training=True)
    batches = iter(ds.as_numpy_iterator())
    for _ in range(INPUT_WARMUP):
        next(batches)
    t0 = time.perf_counter()
    for _ in range(INPUT_BATCHES):
        next(batches)
    return INPUT_BATCHES * INPUT_BATCH / (time.perf_counter() - t0)


def measure_input(runs: int) -> tuple[float, float]:
    """Median examples/s of the seqio input pipeline, static and dynamically masked."""
    rates = {}
    with tempfile.TemporaryDirectory(prefix="bench-input-") as tmp:
        for dynamic in (False, True):
            stage_dir = os.path.join(tmp, "dynamic" if dynamic else "static")
            write_input_cache(stage_dir, dynamic)
            rates[dynamic] = [input_rate(stage_dir) for _ in range(runs)]
            print(f"  input{' (dynamic masking)' if dynamic else ''}: "
                  + ", ".join(f"{r:,.0f}" for r in rates[dynamic]) + " ex/s", flush=True)
    return statistics.median(rates[False]), statistics.median(rates[True])


def run_phase(phase: Phase, models: list, args) -> str:
    """Measures ``models`` [(size, model)] at ``phase``'s shape; the phase's final line (the
    small encoder if measured, else the first; module docstring), preceded by what it is."""
    results = {}
    for size, model in models:
        label = f"{size} {model['num_hidden_layers']}x{model['hidden_size']}{phase.tag}"
        results[size] = measure(label, model, phase, args.rounds, args.steps)
    if not results:
        return ""
    size = "small" if "small" in results else next(iter(results))
    ours, theirs = results[size][("runexp", True)], results[size][("keras-hub", False)]
    return (f"(the line below: the {size} encoder, sequence {phase.seq}, batch {phase.batch}, "
            f"{phase.predictions} predictions; runexp with jit_compile against the peer of "
            f"BENCHMARKS.md section 3, Keras fit without XLA; medians of {ours['n']} and "
            f"{theirs['n']} steps, {args.rounds} alternating windows each)\n"
            f"train{phase.tag}: runexp {ours['ex_s']:.1f} ex/s, keras-hub "
            f"{theirs['ex_s']:.1f} ex/s, ratio {ours['ex_s'] / theirs['ex_s']:.2f}, "
            f"MFU {100 * ours['mfu']:.0f}%")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input_only", action="store_true",
                   help="measure the seqio input pipeline only")
    p.add_argument("--input_runs", type=int, default=5, help="input pipelines measured")
    p.add_argument("--rounds", type=int, default=3, help="alternating windows per model")
    p.add_argument("--steps", type=int, default=5, help="steps per window")
    p.add_argument("--small", default="4x256", help="the small encoder, LAYERSxHIDDEN")
    p.add_argument("--sizes", default="tiny,small",
                   help="encoders measured at sequence 128 (phase 1); '' for none")
    p.add_argument("--phase2_sizes", default="small",
                   help="encoders measured at sequence 512 (phase 2); '' for none")
    args = p.parse_args(argv)
    from runexp.runtime.strategy import configure_threads

    configure_threads()  # the pipelines and both models share these thread pools
    static, dynamic = measure_input(args.input_runs)
    print(f"input: seqio from the cache, seq {PHASE1.seq}: {static:,.0f} ex/s (dynamic masking: "
          f"{dynamic:,.0f} ex/s; median of {args.input_runs} pipelines, batch {INPUT_BATCH})",
          flush=True)
    if args.input_only:
        return 0
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        sys.exit("bench/train.py needs keras-hub: pip install -e '.[bench]'")
    import tensorflow as tf
    import keras_hub as kh

    print(f"machine: {os.cpu_count()} cores; TensorFlow {tf.__version__}, keras-hub "
          f"{kh.__version__}", flush=True)
    layers, hidden = (int(v) for v in args.small.lower().split("x"))
    sizes = {"tiny": model_dict(2, 128), "small": model_dict(layers, hidden)}
    lines = [run_phase(phase, [(s, sizes[s]) for s in wanted.split(",") if s], args)
             for phase, wanted in ((PHASE1, args.sizes), (PHASE2, args.phase2_sizes))]
    print("\n".join(line for line in lines if line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
