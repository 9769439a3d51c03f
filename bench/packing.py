"""Packed pretraining rows (issue 27): real (non-padding) tokens per second of training,
packed against unpacked against keras-hub's BERT, at sequence length 128 and 512, XLA on.

    .venv/bin/python bench/packing.py [--rounds 5] [--steps 8] [--seqs 128,512] [--size 4x256]
        [--work_dir /tmp/runexp-bench-packing]

Data: real pretraining instances, made by runexp's own instance code (tasks/
pretraining_instances.py, google-research/bert's distribution: short_seq_prob 0.1,
random next 0.5, masked_lm_prob 0.15, dupe_factor 1; 20 predictions at 128, 80 at 512) from
a corpus of the machine's man pages (bench/doc_corpus.py, its first 4 MB) with a 30k
WordPiece vocab trained on it; both cached in ``--work_dir``. A man page is a short document
and most instances at 512 end with their document: of its pages of at least 150 tokens
(``MIN_DOCUMENT_TOKENS``; all of them: 76% padding), the instances are about half padding at
512, as Wikipedia's are in phase 2 (printed as ``padding``); fewer at 128. Packed: the same instances packed by tasks/instances/packing.py
(up to 3 a row; ``packed_max_predictions`` slots a row).

Runners, each fed the same instances in the same order, with the same encoder (``--size``,
LAYERSxHIDDEN, heads = hidden / 64, intermediate 4 x hidden, vocab 30,522, dropout 0.1) and
optimizer (AdamW lr 1e-4, weight decay 0.01, clipping 1.0), batch 32 rows at 128 and 8 at
512, XLA on:
  - packed:    runexp's Trainer host loop (what the pretrain stage runs), ``jit_compile``, on
    packed rows;
  - unpacked:  the same on the instances one a row;
  - keras-hub: keras-hub's ``BertMaskedLM`` with Keras ``fit(jit_compile=True)`` on the
    instances one a row (it has no packing; masked LM only, no next-sentence head).
They alternate, ``--rounds`` windows of ``--steps`` steps each, after a warm-up window that
traces and compiles. A window's rate is the real tokens of the batches it trained on (the
``input_mask`` ones) over its time (the first step of each window is left out: it holds the
iterator's start); the figures are medians over the windows, the ratio the median of the
rounds' ratios (packed over unpacked, measured a minute apart: BENCHMARKS.md's median
ratio). This machine is shared and its speed drifts: only figures of the same run compare.

Prints per sequence length:
    packing: seq <L> real tokens/s packed <a>, unpacked <b>, keras-hub <c>, ratio <a/b> (padding <p>%)
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

CORPUS_BYTES = 4_000_000
VOCAB_SIZE = 30000
PREDICTIONS = {128: 20, 512: 80}
BATCH = {128: 32, 512: 8}
HELDOUT_DOCUMENTS = 0.1  # the corpus's last tenth of documents: the held-out split
# Documents shorter than this many tokens are left out of the throughput data: the rest make
# instances about half padding at 512 (47.7% here; all of them: 76%).
MIN_DOCUMENT_TOKENS = 150


def corpus_and_vocab(work_dir: str, vocab_size: int = VOCAB_SIZE) -> tuple[dict, str]:
    """The man-page corpus and a vocab dir of it (bench/doc_corpus.py), built once."""
    import doc_corpus

    meta = doc_corpus.build_corpus(work_dir, min_bytes=CORPUS_BYTES)
    return meta, doc_corpus.build_vocab(work_dir, meta["path"], vocab_size=vocab_size)


def _documents(corpus_path: str) -> list[list[str]]:
    with open(corpus_path, encoding="utf-8") as f:
        return [d.split("\n") for d in f.read().strip("\n").split("\n\n")]


def instances(work_dir: str, seq: int, split: str = "train", seed: int = 0,
              max_instances: int | None = None, vocab_size: int = VOCAB_SIZE,
              min_document_tokens: int = MIN_DOCUMENT_TOKENS) -> dict:
    """Unpacked, masked instances of the corpus's documents of at least
    ``min_document_tokens`` tokens at ``seq`` (module docstring), shuffled with ``seed``;
    cached in ``work_dir`` as npz."""
    path = os.path.join(work_dir, f"instances_{split}_{seq}_{seed}_v{vocab_size}_"
                                  f"d{min_document_tokens}.npz")
    if not os.path.exists(path):
        from runexp.compiler.specs.preprocess import MaskingSpec
        from runexp.tasks.instances.document_store import DocumentStore
        from runexp.tasks.instances.masking import MaskingConfig
        from runexp.tasks.instances.pretraining_instances import (InstanceConfig, build_batch,
                                                        plan_instances)
        from runexp.tasks.vocabulary.tokenizer import load_tokenizer

        meta, vocab_dir = corpus_and_vocab(work_dir, vocab_size)
        tok = load_tokenizer(vocab_dir)
        docs = _documents(meta["path"])
        cut = int(len(docs) * (1 - HELDOUT_DOCUMENTS))
        docs = docs[:cut] if split == "train" else docs[cut:]
        encoded = [tok.encode_lines(d) for d in docs]
        encoded = [e for e in encoded if e[1].sum() >= min_document_tokens]
        store = DocumentStore()
        store.add_encoded(np.concatenate([e[0] for e in encoded]),
                          np.concatenate([e[1] for e in encoded]),
                          np.array([len(e[1]) for e in encoded]))
        masking = MaskingConfig(MaskingSpec(max_predictions_per_seq=PREDICTIONS[seq]),
                                tok.vocab_size, tok.mask_id, tok.cls_id, tok.sep_id)
        config = InstanceConfig(max_seq_length=seq, short_seq_prob=0.1, random_next_prob=0.5,
                                dupe_factor=1, masking=masking, pair_objective="nsp",
                                dynamic_masking=False)
        plan = plan_instances(store, config, random.Random(seed))
        plan.reorder(np.random.default_rng(seed).permutation(len(plan)))
        batch = build_batch(store, plan, np.arange(len(plan)), config,
                            np.random.default_rng(seed), random.Random(seed))
        np.savez(path + ".tmp.npz", **batch)
        os.replace(path + ".tmp.npz", path)
    with np.load(path) as data:
        out = {k: data[k] for k in data.files}
    if max_instances is not None:
        out = {k: v[:max_instances] for k, v in out.items()}
    return out


def packed(batch: dict, seq: int) -> dict:
    """``batch``'s instances packed into rows (tasks/instances/packing.py), in the order of their first
    instance."""
    from runexp.tasks.instances.packing import pack_batch, packed_max_predictions

    return pack_batch(batch, seq, packed_max_predictions(seq, PREDICTIONS[seq], 0.15))


def padding_share(batch: dict) -> float:
    mask = np.asarray(batch["input_mask"])
    return 1.0 - mask.sum() / mask.size


def model_dict(layers: int, hidden: int) -> dict:
    import train

    return train.model_dict(layers, hidden)


class Runner:
    """One of bench/train.py's runners on ``data`` at ``batch`` rows a step, and the real
    tokens of each of its steps (windows start at the first batch)."""

    def __init__(self, kind: str, model: dict, data: dict, batch: int, steps: int):
        import train

        cls = train.KerasHubRunner if kind == "keras-hub" else train.RunexpRunner
        self.runner = cls(model, data, True, batch)
        mask = np.asarray(data["input_mask"])
        self.tokens = [int(mask[i * batch:(i + 1) * batch].sum()) for i in range(steps)]

    def window(self, steps: int) -> float:
        """Real tokens per second of one window (its first step left out)."""
        times = self.runner.window(steps)
        times = times[-(steps - 1):]  # keras-hub's window already leaves out the first
        return sum(self.tokens[1:steps]) / sum(times)


def measure(seq: int, model: dict, rounds: int, steps: int, work_dir: str) -> dict:
    batch = BATCH[seq]
    unpacked = instances(work_dir, seq)
    rows = packed(unpacked, seq)
    share = padding_share(unpacked)
    factor = float(rows["next_sentence_weights"].sum()) / len(rows["input_ids"])
    print(f"seq {seq}: {len(unpacked['input_ids']):,} instances, padding {100 * share:.1f}% of "
          f"their slots; packed into {len(rows['input_ids']):,} rows ({factor:.2f} instances a "
          f"row, padding {100 * padding_share(rows):.1f}%)", flush=True)
    need = batch * steps
    if len(rows["input_ids"]) < need:
        sys.exit(f"seq {seq}: {len(rows['input_ids'])} packed rows, fewer than {need}")
    data = {"packed": {k: v[:need] for k, v in rows.items()},
            "unpacked": {k: v[:need] for k, v in unpacked.items()}}
    data["keras-hub"] = data["unpacked"]
    runners = {}
    for kind in ("packed", "unpacked", "keras-hub"):
        t0 = time.perf_counter()
        runners[kind] = Runner(kind, model, data[kind], batch, steps)
        runners[kind].runner.window(3)  # trace, compile, warm the caches
        print(f"  {kind}: built and warmed up in {time.perf_counter() - t0:.1f} s", flush=True)
    rates = {kind: [] for kind in runners}
    for r in range(rounds):
        for kind, runner in runners.items():
            rates[kind].append(runner.window(steps))
        print(f"  round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items())
              + " real tokens/s", flush=True)
    out = {kind: statistics.median(v) for kind, v in rates.items()}
    out["ratios"] = [p / u for p, u in zip(rates["packed"], rates["unpacked"])]
    out["padding"] = share
    out["factor"] = factor
    del runners
    gc.collect()
    import keras

    keras.backend.clear_session()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="alternating windows per runner")
    p.add_argument("--steps", type=int, default=8, help="steps per window")
    p.add_argument("--seqs", default="128,512", help="sequence lengths measured")
    p.add_argument("--size", default="4x256", help="the encoder, LAYERSxHIDDEN")
    p.add_argument("--work_dir", default="/tmp/runexp-bench-packing",
                   help="where the corpus, vocab and instances are cached")
    args = p.parse_args(argv)
    try:
        import keras_hub
    except ImportError:
        sys.exit("bench/packing.py needs keras-hub: pip install -e '.[bench]'")
    import tensorflow as tf

    from runexp.runtime.strategy import configure_threads

    configure_threads()
    layers, hidden = (int(v) for v in args.size.lower().split("x"))
    model = model_dict(layers, hidden)
    meta, _ = corpus_and_vocab(args.work_dir)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"TensorFlow {tf.__version__}, keras-hub {keras_hub.__version__}; encoder "
          f"{layers}x{hidden}; corpus {meta['bytes']:,} bytes, sha256 {meta['sha256'][:16]}",
          flush=True)
    lines = []
    for seq in (int(s) for s in args.seqs.split(",") if s):
        r = measure(seq, model, args.rounds, args.steps, args.work_dir)
        lines.append(
            f"packing: seq {seq} real tokens/s packed {r['packed']:,.0f}, unpacked "
            f"{r['unpacked']:,.0f}, keras-hub {r['keras-hub']:,.0f}, ratio "
            f"{statistics.median(r['ratios']):.2f} (padding {100 * r['padding']:.0f}% unpacked; "
            f"medians' ratio {r['packed'] / r['unpacked']:.2f}; "
            f"{r['factor']:.2f} instances a packed row; medians of {args.rounds} windows of "
            f"{args.steps - 1} timed steps, batch {BATCH[seq]} rows; ratio: the median of the "
            f"rounds' packed/unpacked, " + " ".join(f"{x:.2f}" for x in r["ratios"]) + ")")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
