"""Preprocessing throughput, scaling, memory and output statistics: runexp's preprocess
stage against google-research/bert.

    .venv/bin/python bench/preprocess.py [--runs 3] [--mb 20] [--work_dir DIR] [--dupe_factor 5]
        [--scale 16] [--seeds 10] [--no_peer]
    .venv/bin/python bench/preprocess.py --runner=beam [--runs 3]   # bench/preprocess_beam.py

See ../shared/design/BENCHMARKS.md, section 1. The peer is ``python -m
bert.create_pretraining_data`` from the bert-tensorflow package (the ``bench`` extra), run as
users run it: one process. Ours is the preprocess stage's own code (runtime/stages/
preprocess.py) in a child process, with its worker processes on every core and the shard
count the compiler would choose (compiler/shard_count.py auto_num_shards: 4 for 20 MB,
64 for 320 MB). Both read the same corpus (bench/doc_corpus.py: >= 20 MB of the machine's man
pages, info pages and Python docstrings, one sentence a line, built once and cached in the
work dir; its size and sha256 are printed) with the same ~30k vocab.txt and flags:
max_seq_length 128, max_predictions_per_seq 20, masked_lm_prob 0.15, dupe_factor 5,
short_seq_prob 0.1, random_seed 12345.

Each round runs, in an order that rotates (so drift on this shared machine hits all alike):
ours on the corpus, the peer on it, and ours on the corpus repeated ``--scale`` times
(doc_corpus.repeat_corpus: 16 copies, each in its own document order, built once on disk).
Instances/s is instances written over the child's wall time, start-up included. Peak RSS is
the largest sum of the resident sets of the child and all its descendants, sampled every 50
ms with psutil (our workers count; shared library pages are counted once per process, so
this overstates a multi-process run); the largest single process is printed too. Each run
also says how many cores other work kept busy meanwhile (the machine's busy CPU time minus
the run's own): ours uses both cores, so it loses the most when others run; the peer uses
one. Then ours once more on the corpus with 64 shards: its MANIFEST's input_bytes_read over
input_bytes (every worker's reads), and its instances against the auto shard count's.

Statistics: the peer's first output and our stage's (seed 12345) are read back (TFRecords),
and compared on instances, tokens per instance, full-length share, random-next share and
short (< 64 tokens) share. Instances are not independent (the target length is drawn per
document and pass, and one long document given a short target makes hundreds of short
instances), so the band of each statistic is measured: ours is built for ``--seeds`` other
seeds in this process (the same shard code, one shard: the statistics do not depend on the
shard count), and the peer must fall within ``4.78 * sd * sqrt(1 + 1/n)`` of their mean (sd:
their spread, n: their number; 4.78 is Student's t for 9 degrees of freedom at p = 0.001
two-sided, the parity test's rule). Ends with:

    preprocess: runexp <x> inst/s, peer <y> inst/s, ratio <r>; peak RSS runexp <a> MB, peer <b> MB
    scaling: 1x <a> s/MB, 16x <b> s/MB, ratio <b/a>; read <x> bytes per input byte

x and y are medians over the runs, r the median of the per-run ratios, a and b the largest
peaks seen over the runs on the corpus. The scaling line: median seconds per MB of text on
the corpus and on its 16 copies, their ratio, and bytes read per input byte at 64 shards.
Before them, the CPU time per instance of each side and ours per MB at 1x and 16x
(children's rusage: workers included), which other work on the machine barely moves, and
the peak RSS at 1x and 16x. (The 16 copies repeat the corpus's words, so the tokenizer's
word cache hits as often as on one copy: real text 16 times larger has more distinct words.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import psutil

from runexp.compiler.shard_count import auto_num_shards
from runexp.tasks.cache.records import count_records, iter_records

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_corpus  # noqa: E402

FLAGS = dict(max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15,
             short_seq_prob=0.1, random_seed=12345)


def measured(cmd: list[str], log_path: str) -> dict:
    """Runs ``cmd``; wall seconds, peak RSS of its process tree, largest single process, and
    how many cores everything else on the machine kept busy meanwhile (a shared box)."""
    busy0 = _busy_seconds()
    children0 = _children_cpu()
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        peak = [0, 0, 0]  # tree sum, largest process, largest descendant (a worker)
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
                            sizes.append(0)
                    peak[0] = max(peak[0], sum(sizes))
                    peak[1] = max([peak[1]] + sizes)
                    peak[2] = max([peak[2]] + sizes[1:])
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
            "max_process_rss_mb": peak[1] / 2**20, "max_worker_rss_mb": peak[2] / 2**20,
            "other_cores": max(0.0, others / wall),
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


def _find(out_dir: str, name: str) -> list[str]:
    """Files under out_dir whose names start with ``name`` (the stage writes its task's
    cache in a subdirectory)."""
    return sorted(os.path.join(d, f) for d, _, files in os.walk(out_dir) for f in files
                  if f.startswith(name))


def run_ours(corpus: str, vocab_dir: str, out_dir: str, dupe_factor: int, log: str,
             shards: int = 0, keep_stats: bool = False, runner: str = "local") -> dict:
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    shards = shards or auto_num_shards(os.path.getsize(corpus))
    cmd = [sys.executable, os.path.abspath(__file__), "--_ours", corpus, vocab_dir, out_dir,
           str(dupe_factor), str(shards), runner]
    result = measured(cmd, log)
    with open(_find(out_dir, "stats.train.json")[0]) as f:
        stats = json.load(f)
    with open(log) as f:  # the child prints the stage's summary (its MANIFEST entry) last
        summary = json.loads(f.read().strip().splitlines()[-1])
    result.update(instances=stats["examples"], shards=shards, mb=os.path.getsize(corpus) / 1e6,
                  input_bytes=summary.get("input_bytes", 0),
                  input_bytes_read=summary.get("input_bytes_read", 0))
    if keep_stats:
        result["stats"] = record_statistics(_find(out_dir, "train.tfrecord-"))
    shutil.rmtree(out_dir, ignore_errors=True)
    return result


def run_peer(corpus: str, vocab_dir: str, out_dir: str, dupe_factor: int, log: str,
             keep_stats: bool = False) -> dict:
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    out = os.path.join(out_dir, "peer.tfrecord")
    cmd = [sys.executable, "-m", "bert.create_pretraining_data", f"--input_file={corpus}",
           f"--output_file={out}", f"--vocab_file={os.path.join(vocab_dir, 'vocab.txt')}",
           "--do_lower_case=True", f"--dupe_factor={dupe_factor}",
           *(f"--{k}={v}" for k, v in FLAGS.items())]
    result = measured(cmd, log)
    result["instances"] = count_records([out])
    if keep_stats:
        result["stats"] = record_statistics([out])
    shutil.rmtree(out_dir, ignore_errors=True)
    return result


# --- output statistics ------------------------------------------------------------------------

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


_WANTED = (b"input_mask", b"next_sentence_labels")


def _length_and_label(record: bytes) -> tuple[int, int]:
    """Real tokens and the pair label of a tf.train.Example of BERT's features, from the
    wire format (both writers pack int64 lists; a 0/1 value is one byte)."""
    _, i = _varint(record, 1)  # Example.features
    n = len(record)
    found = {}
    while i < n:
        entry_len, i = _varint(record, i + 1)  # Features.feature (a map entry)
        end = i + entry_len
        key_len, j = _varint(record, i + 1)
        key = record[j:j + key_len]
        if key in _WANTED:
            j += key_len
            _, j = _varint(record, j + 1)  # entry value: Feature
            _, j = _varint(record, j + 1)  # Feature.int64_list
            payload = b""
            if j < end:
                payload_len, j = _varint(record, j + 1)  # Int64List.value, packed
                payload = record[j:j + payload_len]
            found[key] = payload
        i = end
    label = found.get(b"next_sentence_labels", b"\x00")
    return found[b"input_mask"].count(1), (label[0] if label else 0)


def record_statistics(paths: list[str]) -> dict:
    pairs = np.array([_length_and_label(r) for r in iter_records(paths)], np.int64)
    return length_statistics(pairs[:, 0], pairs[:, 1])


STATISTICS = ("instances", "tokens per instance", "full-length share", "random-next share",
              "short (< 64 tokens) share")


def length_statistics(lengths: np.ndarray, labels: np.ndarray) -> dict:
    max_len = FLAGS["max_seq_length"]
    return dict(zip(STATISTICS, (float(len(lengths)), float(lengths.mean()),
                                 float((lengths == max_len).mean()), float(labels.mean()),
                                 float((lengths < max_len // 2).mean()))))


def seed_statistics(corpus: str, vocab_dir: str, dupe_factor: int, seeds: list[int]
                    ) -> list[dict]:
    """Our statistics for other seeds: the stage's shard code in this process, one shard."""
    from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, ShardStats,
                                                 iter_shard_batches)
    out = []
    for seed in seeds:
        config = PretrainingConfig.of(**{**FLAGS, "random_seed": seed,
                                         "dupe_factor": dupe_factor})
        lengths, labels = [], []
        for batch in iter_shard_batches([corpus], vocab_dir, config, "train", 0, 1,
                                        ShardStats()):
            lengths.append(batch["input_mask"].sum(axis=1))
            labels.append(batch["next_sentence_labels"][:, 0])
        out.append(length_statistics(np.concatenate(lengths), np.concatenate(labels)))
    return out


T_999_9DF = 4.78  # Student's t, 9 degrees of freedom, two-sided p = 0.001


def compare_statistics(peer: dict, ours: dict, seeds: list[dict]) -> tuple[list[str], bool]:
    lines, ok = [], True
    n = len(seeds)
    t = T_999_9DF if n == 10 else 4.0
    lines.append(f"  {'statistic':26s} {'peer':>11s} {'ours':>11s} {'ours, seeds':>22s} "
                 f"{'peer - mean':>12s} {'band':>10s}")
    for name in STATISTICS:
        values = np.array([s[name] for s in seeds])
        mean, sd = values.mean(), values.std(ddof=1) if n > 1 else float("nan")
        band = t * sd * np.sqrt(1 + 1 / n)
        diff = peer[name] - mean
        inside = abs(diff) <= band
        ok &= bool(inside)
        fmt_v = "{:11,.0f}" if name == "instances" else "{:11.4f}"
        lines.append(f"  {name:26s} {fmt_v.format(peer[name])} {fmt_v.format(ours[name])} "
                     f"{fmt_v.format(mean)} ± {sd:8.4g} {diff / mean:+11.2%} "
                     f"{band / mean:9.2%} {'ok' if inside else 'OUTSIDE'}")
    return lines, ok


def child_ours(corpus: str, vocab_dir: str, out_dir: str, dupe_factor: str, shards: str,
               runner: str = "local"):
    """The preprocess stage exactly as the executor runs it (no TensorFlow imported)."""
    from runexp.compiler.plan import Plan, Stage
    from runexp.runtime.context import StageContext
    from runexp.runtime.stages import preprocess
    params = dict(task="bench", dupe_factor=int(dupe_factor), random_next_prob=0.5,
                  mask_token_prob=0.8, random_token_prob=0.1, whole_word_masking=False,
                  pair_objective="nsp", do_lower_case=True, num_shards=int(shards),
                  num_workers=0, **FLAGS)
    if runner == "beam":  # DirectRunner, a worker process per core (bench/preprocess_beam.py)
        params.update(runner="beam", beam_options={"runner": "DirectRunner"})
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
        return child_ours(*sys.argv[2:8])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--mb", type=float, default=20.0, help="corpus size (MB of text)")
    p.add_argument("--dupe_factor", type=int, default=5)
    p.add_argument("--vocab_size", type=int, default=30000)
    p.add_argument("--scale", type=int, default=16, help="copies for the scaling run (0: none)")
    p.add_argument("--seeds", type=int, default=10, help="our seeds for the statistics' bands")
    p.add_argument("--work_dir", default="/tmp/runexp_bench_preprocess")
    p.add_argument("--no_peer", action="store_true", help="ours only (no ratio)")
    p.add_argument("--runner", choices=("local", "beam"), default="local",
                   help="beam: Apache Beam's DirectRunner next to the local runner "
                        "(bench/preprocess_beam.py), instead of the peer comparison")
    args = p.parse_args()
    print("command: " + " ".join([os.path.relpath(sys.executable), "bench/preprocess.py",
                                  *sys.argv[1:]]), flush=True)
    if args.runner == "local" and not args.no_peer and importlib.util.find_spec("bert") is None:
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
    big_corpus = None
    if args.runner == "beam":
        import preprocess_beam
        logs = os.path.join(args.work_dir, "logs")
        os.makedirs(logs, exist_ok=True)
        return preprocess_beam.compare(args, corpus, vocab_dir, run_ours, fmt, logs,
                                       os.path.join(args.work_dir, "out"))
    if args.scale > 1:
        big_corpus = doc_corpus.repeat_corpus(meta, args.work_dir, args.scale)
        print(f"scaled corpus: {big_corpus['path']}: {big_corpus['bytes']:,} bytes "
              f"({args.scale} copies)", flush=True)
    out = os.path.join(args.work_dir, "out")
    logs = os.path.join(args.work_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    ours, peer, big, ratios = [], [], [], []
    rotation = ["ours", "peer", "big"]
    for i in range(args.runs):
        order = rotation[i % 3:] + rotation[:i % 3]
        order = [w for w in order if not (w == "peer" and args.no_peer)
                 and not (w == "big" and big_corpus is None)]
        for who in order:
            log = os.path.join(logs, f"{who}.{i}.log")
            if who == "ours":
                ours.append(run_ours(corpus, vocab_dir, out, args.dupe_factor, log,
                                     keep_stats=not ours))
                print(f"run {i + 1} runexp ({ours[-1]['shards']} shards, "
                      f"{os.cpu_count()} workers): {fmt(ours[-1])}", flush=True)
            elif who == "big":
                big.append(run_ours(big_corpus["path"], vocab_dir, out, args.dupe_factor, log))
                print(f"run {i + 1} runexp on {args.scale}x ({big[-1]['shards']} shards): "
                      f"{fmt(big[-1])}", flush=True)
            else:
                peer.append(run_peer(corpus, vocab_dir, out, args.dupe_factor, log,
                                     keep_stats=not peer))
                print(f"run {i + 1} peer (1 process): {fmt(peer[-1])}", flush=True)
        if peer:
            ratios.append((ours[-1]["instances"] / ours[-1]["seconds"])
                          / (peer[-1]["instances"] / peer[-1]["seconds"]))
    wide = run_ours(corpus, vocab_dir, out, args.dupe_factor,
                    os.path.join(logs, "ours.64shards.log"), shards=64)
    read = wide["input_bytes_read"] / max(wide["input_bytes"], 1)
    print(f"runexp with 64 shards: {fmt(wide)}; read {wide['input_bytes_read']:,} of "
          f"{wide['input_bytes']:,} input bytes ({read:.4f} per byte)", flush=True)
    print(f"shard count: {ours[0]['instances']:,} instances with {ours[0]['shards']} shards, "
          f"{wide['instances']:,} with 64 "
          f"({wide['instances'] / ours[0]['instances'] - 1:+.3%})", flush=True)

    if args.seeds > 1:
        start = time.perf_counter()
        seeds = seed_statistics(corpus, vocab_dir, args.dupe_factor,
                                list(range(1, args.seeds + 1)))
        print(f"our statistics for seeds 1..{args.seeds} ({time.perf_counter() - start:.0f} s, "
              "in this process)", flush=True)
        if peer:
            lines, ok = compare_statistics(peer[0]["stats"], ours[0]["stats"], seeds)
            print("statistics, the peer's output against ours (seed 12345, from the stage's "
                  f"records) and our {args.seeds} other seeds (mean ± sd); band: 4.78 sd "
                  f"sqrt(1 + 1/{args.seeds}), relative to the mean:")
            print("\n".join(lines))
            print(f"statistics: the peer is {'inside' if ok else 'OUTSIDE'} our bands on all "
                  f"{len(STATISTICS)}", flush=True)

    def med(rs):
        return statistics.median(r["instances"] / r["seconds"] for r in rs)

    def s_per_mb(rs):
        return statistics.median(r["seconds"] / r["mb"] for r in rs)

    mb = meta["bytes"] / 1e6
    x = med(ours)
    a = max(r["peak_rss_mb"] for r in ours)
    print(f"runexp: median {x:,.0f} inst/s, {statistics.median(mb / r['seconds'] for r in ours):.2f}"
          f" MB/s of text over {len(ours)} runs")
    if big:
        cpu_one = statistics.median(r["cpu_seconds"] / r["mb"] for r in ours)
        cpu_many = statistics.median(r["cpu_seconds"] / r["mb"] for r in big)
        print(f"CPU per MB of text (all processes; little moved by other work): 1x "
              f"{cpu_one:.3f} s, {args.scale}x {cpu_many:.3f} s, ratio {cpu_many / cpu_one:.2f}")
        print(f"memory: peak RSS runexp {a:.0f} MB on {mb:.0f} MB (largest process "
              f"{max(r['max_process_rss_mb'] for r in ours):.0f} MB), "
              f"{max(r['peak_rss_mb'] for r in big):.0f} MB on {args.scale * mb:.0f} MB "
              f"(largest process {max(r['max_process_rss_mb'] for r in big):.0f} MB)")
    if peer:
        y = med(peer)
        print(f"peer: median {y:,.0f} inst/s, "
              f"{statistics.median(mb / r['seconds'] for r in peer):.2f} MB/s of text over "
              f"{len(peer)} runs; per-run ratios " + ", ".join(f"{r:.1f}" for r in ratios))

        def cpu_us(rs):
            return statistics.median(r["cpu_seconds"] / r["instances"] * 1e6 for r in rs)

        print(f"CPU per instance (all processes, start-up included; little moved by other "
              f"work): runexp {cpu_us(ours):.1f} us, peer {cpu_us(peer):.1f} us, "
              f"{cpu_us(peer) / cpu_us(ours):.1f}x less. Ours spreads over {os.cpu_count()} "
              f"cores, the peer uses one: with the cores free the wall-clock ratio is about "
              f"{os.cpu_count()}x that, less start-up; with another job on a core, about "
              f"{(os.cpu_count() - 1) or 1}x to {os.cpu_count()}x")
        b = max(r["peak_rss_mb"] for r in peer)
        print(f"preprocess: runexp {x:,.0f} inst/s, peer {y:,.0f} inst/s, ratio "
              f"{statistics.median(ratios):.1f}; peak RSS runexp {a:.0f} MB, peer {b:.0f} MB")
    else:
        print(f"preprocess: runexp {x:,.0f} inst/s (no peer run); peak RSS runexp {a:.0f} MB")
    if big:
        one, many = s_per_mb(ours), s_per_mb(big)
        print(f"scaling: 1x {one:.3f} s/MB, {args.scale}x {many:.3f} s/MB, ratio "
              f"{many / one:.2f}; read {read:.4f} bytes per input byte")


if __name__ == "__main__":
    main()
