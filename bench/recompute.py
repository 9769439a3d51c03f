"""Activation recomputation (train.recompute = "layers"): peak memory and step time under XLA.

Each mode trains in its own subprocess (bench/memory.py ``measure_step``; jit_compile=True,
xla=True: the code path TPUs run): one step compiles, then a thread samples the process RSS (psutil, every 2 ms) over
--steps steps; "peak" is the highest RSS seen minus the RSS at rest after the compile step
(printed as a cross-check: it stays flat, the compiled step's buffers remain allocated
between steps). The headline peak is the train step's preallocated temp buffer from XLA's
buffer assignment (an --xla_dump_to dump): the step's peak working memory (activations kept
for the backward pass, gradients, temporaries), after XLA's own scheduling/rematerialization.

    .venv/bin/python bench/recompute.py                  # L4/H256 encoder, seq 512, batch 8
    .venv/bin/python bench/recompute.py --layers 4 --hidden 256 --batch 8 --steps 5

Prints
    recompute: <encoder> seq 512 batch <b>: peak <x> GB -> <y> GB (<y/x>), step time <r>x
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/memory.py's child
from memory import measure_step  # noqa: E402


def run(recompute: str, args) -> dict:
    h = args.hidden
    model = {"vocab_size": args.vocab, "hidden_size": h, "num_hidden_layers": args.layers,
             "num_attention_heads": max(1, h // 64), "intermediate_size": 4 * h,
             "max_position_embeddings": args.seq, "type_vocab_size": 2}
    return measure_step(model, args.batch, args.seq, 20, recompute, args.steps, args.threads)


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
    x, y = none["xla"]["temp"] / gb, layers["xla"]["temp"] / gb
    encoder = f"L{args.layers}/H{args.hidden}"
    print(f"recompute: {encoder} seq {args.seq} batch {args.batch}: peak {x:.2f} GB -> "
          f"{y:.2f} GB ({y / x:.2f}), step time {layers['step_s'] / none['step_s']:.2f}x")
    print(f"  peak = the XLA train step's preallocated temp buffer; step "
          f"{none['step_s']:.2f} s -> {layers['step_s']:.2f} s (median of {args.steps})")
    rss = [max(0, r["peak"] - r["after_compile"]) / gb for r in (none, layers)]
    print(f"  process RSS: at rest after compiling {none['after_compile'] / gb:.2f} / "
          f"{layers['after_compile'] / gb:.2f} GB, growth during steps {rss[0]:.2f} / "
          f"{rss[1]:.2f} GB "
          "(the compiled step's buffers stay allocated between steps: RSS does not show the "
          "peak)")

if __name__ == "__main__":
    main()
