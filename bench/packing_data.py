"""How full packed rows are: the packing factor (instances a row) and fill (real tokens / row
tokens) that preprocessing with ``packing`` reaches, against one instance a row, on the
quickstart corpus and on bench/doc_corpus.py's corpus, at 128 and 512 tokens.

The instances are the preprocess stage's own (tasks/instances/pretraining_shards.py, google-research/
bert's distribution: short_seq_prob 0.1, dupe_factor 1, NSP pairs), packed as the stage packs
them (tasks/instances/packing.py: SPFHP, up to 3 a row, over each batch of 1024 instances). The
unpacked fill at each length is what compiler/packing.py's estimate before preprocessing
assumes (UNPACKED_FILL).

    python bench/packing_data.py [--mb 5 | --corpus FILE] [--work_dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import doc_corpus  # noqa: E402

from runexp.tasks.sources import stdlib_corpus  # noqa: E402
from runexp.tasks.vocabulary import vocab_dir as vocab_dirs  # noqa: E402
from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, ShardStats,  # noqa: E402
                                             iter_shard_batches)
from runexp.tasks.sources.text_documents import sample_lines  # noqa: E402


def measure(files: list[str], vocab: str, length: int, num_shards: int = 1) -> dict:
    config = PretrainingConfig.of(max_seq_length=length,
                                  max_predictions_per_seq=round(length * 0.15),
                                  dupe_factor=1, random_seed=12345, packing=True)
    stats = ShardStats()
    start = time.monotonic()
    for shard in range(num_shards):
        for _ in iter_shard_batches(files, vocab, config, "train", shard, num_shards, stats):
            pass
    return {"length": length, "instances": stats.instances, "rows": stats.rows,
            "factor": stats.instances / stats.rows,
            "fill": stats.tokens / (stats.rows * length),
            "unpacked_fill": stats.tokens / (stats.instances * length),
            "seconds": time.monotonic() - start}


def quickstart_corpus(work_dir: str) -> tuple[list[str], str]:
    """The quickstart's corpus (its corpus stage's, 2 MB of docstrings) and an 8000-token
    WordPiece vocab, as the quickstart trains them."""
    out = os.path.join(work_dir, "quickstart")
    train = os.path.join(out, "train.txt")
    vocab = os.path.join(out, "vocab")
    if not os.path.exists(train):
        corpus = stdlib_corpus.build_corpus(min_bytes=2_000_000, heldout_fraction=0.05,
                                            finetune_classes=6, seed=0)
        os.makedirs(out, exist_ok=True)
        stdlib_corpus.write_corpus(corpus, out)
    if not os.path.exists(os.path.join(vocab, "report.json")):
        lines = sample_lines([train], 200_000, seed=0)
        os.makedirs(vocab, exist_ok=True)
        vocab_dirs.train_vocab("wordpiece", lines, vocab, vocab_size=8000, do_lower_case=True)
        vocab_dirs.write_report(vocab, "wordpiece", True, lines[:1000])
    return [train], vocab


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=5.0, help="bench corpus size (MB of text)")
    p.add_argument("--work_dir", default="/tmp/runexp_bench_packing")
    p.add_argument("--corpus", help="a corpus doc_corpus.py already wrote, or a prefix of one "
                                    "cut at a document's end (instead of building --mb)")
    args = p.parse_args()
    corpora = {"quickstart (stdlib docstrings, 2 MB)": quickstart_corpus(args.work_dir)}
    if args.corpus:
        path = args.corpus
    else:
        path = doc_corpus.build_corpus(args.work_dir, int(args.mb * 1e6))["path"]
    size = os.path.getsize(path) / 1e6
    corpora[f"bench doc_corpus (man pages, {size:.1f} MB)"] = (
        [path], doc_corpus.build_vocab(os.path.dirname(path), path, 30000))
    print(f"{'corpus':40} {'L':>4} {'instances':>10} {'rows':>9} {'factor':>7} "
          f"{'fill':>6} {'unpacked':>9}")
    for name, (files, vocab) in corpora.items():
        for length in (128, 512):
            m = measure(files, vocab, length)
            print(f"{name:40} {length:>4} {m['instances']:>10,} {m['rows']:>9,} "
                  f"{m['factor']:>7.3f} {m['fill']:>6.1%} {m['unpacked_fill']:>9.1%}")
    print("\nreproduce: python bench/packing_data.py "
          + (f"--corpus {args.corpus}" if args.corpus else f"--mb {args.mb:g}"))


if __name__ == "__main__":
    main()
