"""``bench/preprocess.py --runner=beam``: the preprocess stage on Apache Beam's DirectRunner
next to the local runner, on the same corpus, vocab and flags.

    .venv/bin/python bench/preprocess.py --runner=beam [--runs 3] [--mb 20] [--work_dir DIR]

Each round runs, in an order that rotates (so drift on this shared machine hits both alike):
the local runner on the corpus, the Beam runner (DirectRunner, one worker process per core,
``multi_processing``) on it, and both on the corpus doubled (doc_corpus.repeat_corpus, 2
copies). Each is the stage's own code in a child process (bench/preprocess.py ``--_ours``),
with the shard count the compiler would choose; the measures are bench/preprocess.py's:
instances/s over the child's wall time (start-up included), CPU seconds of the whole process
tree, the largest sum of resident sets of the tree, of its largest process and of its largest
worker (any process but the stage's own: the local runner's pool processes, Beam's SDK
worker processes and the shells that start them), sampled every 50 ms. Both runners must write the same stats (the records are compared byte for byte
by tests/tasks/test_beam_preprocess.py). Ends with:

    beam: DirectRunner <x> inst/s, local <y> inst/s, ratio <r>; largest worker 1x <a> MB, 2x <b> MB

medians over the runs. There is no target: DirectRunner is Beam's test harness, here to show
that the pipeline is the local runner's work plus Beam's overhead, and that a worker's memory
stays flat when the corpus doubles (it holds one range, then one shard, not the split).
"""

from __future__ import annotations

import os
import statistics


def compare(args, corpus: str, vocab_dir: str, run_ours, fmt, logs: str, out: str) -> None:
    import doc_corpus
    meta = {"path": corpus}
    doubled = doc_corpus.repeat_corpus(meta, args.work_dir, 2)["path"]
    print(f"doubled corpus: {doubled}: {os.path.getsize(doubled):,} bytes", flush=True)
    results: dict[tuple[str, str], list[dict]] = {}
    rotation = [("local", corpus), ("beam", corpus), ("local", doubled), ("beam", doubled)]
    for i in range(args.runs):
        order = rotation[i % len(rotation):] + rotation[:i % len(rotation)]
        for runner, path in order:
            size = "1x" if path == corpus else "2x"
            log = os.path.join(logs, f"{runner}.{size}.{i}.log")
            r = run_ours(path, vocab_dir, out, args.dupe_factor, log, runner=runner)
            results.setdefault((runner, size), []).append(r)
            print(f"run {i + 1} {runner} on {size} ({r['shards']} shards): {fmt(r)}",
                  flush=True)
    for size in ("1x", "2x"):
        local = {r["instances"] for r in results[("local", size)]}
        beam = {r["instances"] for r in results[("beam", size)]}
        assert local == beam and len(local) == 1, (size, local, beam)

    def med(key, f):
        return statistics.median(f(r) for r in results[key])

    for runner in ("local", "beam"):
        for size in ("1x", "2x"):
            key = (runner, size)
            print(f"{runner} {size}: median {med(key, lambda r: r['instances'] / r['seconds']):,.0f}"
                  f" inst/s, {med(key, lambda r: r['mb'] / r['seconds']):.2f} MB/s, "
                  f"{med(key, lambda r: r['cpu_seconds'] / r['mb']):.2f} CPU s per MB, peak RSS "
                  f"of the tree {med(key, lambda r: r['peak_rss_mb']):.0f} MB, largest process "
                  f"{med(key, lambda r: r['max_process_rss_mb']):.0f} MB, largest worker "
                  f"(any process but the stage's own) "
                  f"{med(key, lambda r: r['max_worker_rss_mb']):.0f} MB "
                  f"(max {max(r['max_worker_rss_mb'] for r in results[key]):.0f} MB)")
    ratios = [b["instances"] / b["seconds"] / (a["instances"] / a["seconds"])
              for a, b in zip(results[("local", "1x")], results[("beam", "1x")])]
    x = med(("beam", "1x"), lambda r: r["instances"] / r["seconds"])
    y = med(("local", "1x"), lambda r: r["instances"] / r["seconds"])
    a = med(("beam", "1x"), lambda r: r["max_worker_rss_mb"])
    b = med(("beam", "2x"), lambda r: r["max_worker_rss_mb"])
    print(f"beam: DirectRunner {x:,.0f} inst/s, local {y:,.0f} inst/s, ratio "
          f"{statistics.median(ratios):.2f}; largest worker 1x {a:.0f} MB, 2x {b:.0f} MB")
