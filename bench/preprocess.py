"""Preprocessing throughput and memory: runexp's preprocess stage against google-research/bert.

    .venv/bin/python bench/preprocess.py [--runs 3] [--mb 20] [--work_dir DIR] [--dupe_factor 5]

See ../shared/design/BENCHMARKS.md, section 1. The peer is ``python -m
bert.create_pretraining_data`` from the bert-tensorflow package (the ``bench`` extra), run as
users run it: one process. Ours is the preprocess stage's own code (runtime/stages/
preprocess.py) in a child process, with its worker processes on every core and the shard
count the compiler would choose (one per 16 MB of text, at least 4). Both read the same corpus
(bench/doc_corpus.py: >= 20 MB of the machine's man pages, info pages and Python docstrings,
one sentence a line, built once and cached in the work dir; its size and sha256 are printed)
with the same ~30k vocab.txt and flags: max_seq_length 128, max_predictions_per_seq 20,
masked_lm_prob 0.15, dupe_factor 5, short_seq_prob 0.1, random_seed 12345.

The runs alternate (ours, peer, peer, ours, ...) so drift on this shared machine hits both
alike. Instances/s is instances written over the child's wall time, start-up included. Peak
RSS is the largest sum of the resident sets of the child and all its descendants, sampled
every 50 ms with psutil (our workers count; shared library pages are counted once per
process, so this overstates a multi-process run); the largest single process is printed too.
Ours is then run once on the corpus doubled, to show that memory does not grow with the
input. Each run also says how many cores other work kept busy meanwhile (the machine's busy
CPU time minus the run's own): ours uses both cores, so it loses the most when others run;
the peer uses one. Ends with one line:

    preprocess: runexp <x> inst/s, peer <y> inst/s, ratio <r>; peak RSS runexp <a> MB, peer <b> MB

x and y are medians over the runs, r the median of the per-run ratios, a and b the largest
peaks seen over the runs (a includes the doubled corpus). Before it, the CPU time per instance
of each side (children's rusage: workers included), which other work on the machine barely
moves, and their ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_corpus  # noqa: E402

FLAGS = dict(max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15,
             short_seq_prob=0.1, random_seed=12345)


def count_records(paths) -> int:
    """TFRecord records in files (reads the length headers only)."""
    n = 0
    for path in paths:
        with open(path, "rb") as f:
            while True:
                header = f.read(12)
                if len(header) < 12:
                    break
                (length,) = struct.unpack("<Q", header[:8])
                f.seek(length + 4, os.SEEK_CUR)
                n += 1
    return n


def measured(cmd: list[str], log_path: str) -> dict:
    """Runs ``cmd``; wall seconds, peak RSS of its process tree, largest single process, and
    how many cores everything else on the machine kept busy meanwhile (a shared box)."""
    busy0 = _busy_seconds()
    children0 = _children_cpu()
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        peak = [0, 0]  # tree sum, largest process
        done = threading.Event()

        def sample():
            root = psutil.Process(proc.pid)
            while not done.is_set():
                try:
                    procs = [root] + root.children(recursive=True)
                    sizes = []
                    for p in procs:
                        try:
                            sizes.append(p.memory_info().rss)
                        except psutil.Error:
                            pass
                    peak[0] = max(peak[0], sum(sizes))
                    peak[1] = max([peak[1]] + sizes)
                except psutil.Error:
                    pass
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        done.set()
        sampler.join()
    wall = time.perf_counter() - start
    others = (_busy_seconds() - busy0) - (_children_cpu() - children0)
    if rc != 0:
        with open(log_path) as f:
            sys.exit(f"command failed ({rc}): {' '.join(cmd)}\n{f.read()[-3000:]}")
    return {"seconds": wall, "peak_rss_mb": peak[0] / 2**20,
            "max_process_rss_mb": peak[1] / 2**20, "other_cores": max(0.0, others / wall),
            "cpu_seconds": _children_cpu() - children0}


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores, since boot)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + \
        getattr(t, "steal", 0)


def _children_cpu() -> float:
    """CPU seconds of this process's finished children and their descendants."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def auto_shards(size: int) -> int:
    """The compiler's rule (compiler/planner.py auto_shards): one per 16 MB, at least 4."""
    return max(4, -(-size // (16 << 20)))


def run_ours(corpus: str, vocab_dir: str, out_dir: str, dupe_factor: int, log: str) -> dict:
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    shards = auto_shards(os.path.getsize(corpus))
    cmd = [sys.executable, os.path.abspath(__file__), "--_ours", corpus, vocab_dir, out_dir,
           str(dupe_factor), str(shards)]
    result = measured(cmd, log)
    with open(os.path.join(out_dir, "stats.train.json")) as f:
        result["instances"] = json.load(f)["examples"]
    result["shards"] = shards
    shutil.rmtree(out_dir, ignore_errors=True)
    return result


def run_peer(corpus: str, vocab_dir: str, out_dir: str, dupe_factor: int, log: str) -> dict:
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    out = os.path.join(out_dir, "peer.tfrecord")
    cmd = [sys.executable, "-m", "bert.create_pretraining_data", f"--input_file={corpus}",
           f"--output_file={out}", f"--vocab_file={os.path.join(vocab_dir, 'vocab.txt')}",
           "--do_lower_case=True", f"--dupe_factor={dupe_factor}",
           *(f"--{k}={v}" for k, v in FLAGS.items())]
    result = measured(cmd, log)
    result["instances"] = count_records([out])
    shutil.rmtree(out_dir, ignore_errors=True)
    return result


def child_ours(corpus: str, vocab_dir: str, out_dir: str, dupe_factor: str, shards: str):
    """The preprocess stage exactly as the executor runs it (no TensorFlow imported)."""
    from runexp.compiler.plan import Plan, Stage
    from runexp.runtime.context import StageContext
    from runexp.runtime.stages import preprocess
    params = dict(task="bench", dupe_factor=int(dupe_factor), random_next_prob=0.5,
                  mask_token_prob=0.8, random_token_prob=0.1, whole_word_masking=False,
                  pair_objective="nsp", do_lower_case=True, num_shards=int(shards),
                  num_workers=0, **FLAGS)
    stage = Stage(id="preprocess.bench", kind="preprocess", output_dir=out_dir, params=params,
                  inputs=dict(train_files=[corpus], validation_files=[], vocab_dir=vocab_dir))
    summary = preprocess.run(StageContext(stage, Plan("bench", out_dir, (stage,)), out_dir))
    print(json.dumps(summary))
    assert "tensorflow" not in sys.modules


def fmt(r: dict) -> str:
    return (f"{r['instances']:,} instances in {r['seconds']:.1f} s = "
            f"{r['instances'] / r['seconds']:,.0f} inst/s, {r['cpu_seconds']:.1f} CPU s; "
            f"peak RSS {r['peak_rss_mb']:.0f} MB "
            f"(largest process {r['max_process_rss_mb']:.0f} MB); other work kept "
            f"{r['other_cores']:.1f} of {os.cpu_count()} cores busy")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--_ours":
        return child_ours(*sys.argv[2:7])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--mb", type=float, default=20.0, help="corpus size (MB of text)")
    p.add_argument("--dupe_factor", type=int, default=5)
    p.add_argument("--vocab_size", type=int, default=30000)
    p.add_argument("--work_dir", default="/tmp/runexp_bench_preprocess")
    p.add_argument("--no_peer", action="store_true", help="ours only (no ratio)")
    args = p.parse_args()
    print("command: " + " ".join([os.path.relpath(sys.executable), "bench/preprocess.py",
                                  *sys.argv[1:]]), flush=True)
    if not args.no_peer and importlib.util.find_spec("bert") is None:
        # (found, not imported: importing it would load TensorFlow into this process)
        sys.exit("the peer is missing: pip install -e '.[bench]' (bert-tensorflow==1.0.4)")
    meta = doc_corpus.build_corpus(args.work_dir, int(args.mb * 1e6))
    corpus = meta["path"]
    print(f"corpus: {corpus}: {meta['bytes']:,} bytes, {meta['documents']:,} documents, "
          f"{meta['sentences']:,} sentences, sha256 {meta['sha256']}", flush=True)
    vocab_dir = doc_corpus.build_vocab(args.work_dir, corpus, args.vocab_size)
    with open(os.path.join(vocab_dir, "report.json")) as f:
        report = json.load(f)
    print(f"vocab: {vocab_dir}/vocab.txt: {report['vocab_size']:,} entries, UNK rate "
          f"{report['unk_rate']:.3%}, {report['pieces_per_word']:.2f} pieces per word",
          flush=True)
    out = os.path.join(args.work_dir, "out")
    logs = os.path.join(args.work_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    ours, peer, ratios = [], [], []
    for i in range(args.runs):
        order = ["ours", "peer"] if i % 2 == 0 else ["peer", "ours"]
        if args.no_peer:
            order = ["ours"]
        for who in order:
            log = os.path.join(logs, f"{who}.{i}.log")
            if who == "ours":
                ours.append(run_ours(corpus, vocab_dir, out, args.dupe_factor, log))
                print(f"run {i + 1} runexp ({ours[-1]['shards']} shards, "
                      f"{os.cpu_count()} workers): {fmt(ours[-1])}", flush=True)
            else:
                peer.append(run_peer(corpus, vocab_dir, out, args.dupe_factor, log))
                print(f"run {i + 1} peer (1 process): {fmt(peer[-1])}", flush=True)
        if peer:
            ratios.append((ours[-1]["instances"] / ours[-1]["seconds"])
                          / (peer[-1]["instances"] / peer[-1]["seconds"]))
    doubled = doc_corpus.double_corpus(meta, args.work_dir)
    big = run_ours(doubled["path"], vocab_dir, out, args.dupe_factor,
                   os.path.join(logs, "ours.doubled.log"))
    print(f"runexp on the corpus doubled ({doubled['bytes']:,} bytes, {big['shards']} shards): "
          f"{fmt(big)}", flush=True)

    def med(rs):
        return statistics.median(r["instances"] / r["seconds"] for r in rs)

    mb = meta["bytes"] / 1e6
    x = med(ours)
    print(f"runexp: median {x:,.0f} inst/s, {statistics.median(mb / r['seconds'] for r in ours):.2f}"
          f" MB/s of text over {len(ours)} runs; peak RSS {max(r['peak_rss_mb'] for r in ours):.0f}"
          f" MB on {mb:.1f} MB, {big['peak_rss_mb']:.0f} MB on {2 * mb:.1f} MB")
    a = max([r["peak_rss_mb"] for r in ours] + [big["peak_rss_mb"]])
    if not peer:
        print(f"preprocess: runexp {x:,.0f} inst/s (no peer run); peak RSS runexp {a:.0f} MB")
        return
    y = med(peer)
    print(f"peer: median {y:,.0f} inst/s, {statistics.median(mb / r['seconds'] for r in peer):.2f}"
          f" MB/s of text over {len(peer)} runs; per-run ratios "
          + ", ".join(f"{r:.1f}" for r in ratios))

    def cpu_us(rs):
        return statistics.median(r["cpu_seconds"] / r["instances"] * 1e6 for r in rs)

    print(f"CPU per instance (all processes, start-up included; little moved by other "
          f"work): runexp {cpu_us(ours):.1f} us, peer {cpu_us(peer):.1f} us, "
          f"{cpu_us(peer) / cpu_us(ours):.1f}x less. Ours spreads over {os.cpu_count()} cores, "
          f"the peer uses one: with the cores free the wall-clock ratio is about "
          f"{os.cpu_count()}x that, less start-up; with another job on a core, about "
          f"{(os.cpu_count() - 1) or 1}x to {os.cpu_count()}x")
    b = max(r["peak_rss_mb"] for r in peer)
    print(f"preprocess: runexp {x:,.0f} inst/s, peer {y:,.0f} inst/s, ratio "
          f"{statistics.median(ratios):.1f}; peak RSS runexp {a:.0f} MB, peer {b:.0f} MB")


if __name__ == "__main__":
    main()
