"""Dry-run latency: `runexp --dry_run` against the peer's start-up (`python -c "import seqio"`).

    .venv/bin/python bench/dry_run.py [--runs 7] [--gin_file experiments/continue_multilingual_base_tpu_v3_8.gin]

Runs both commands alternately in fresh processes (Python start-up included) and prints the
medians and their ratio; ends with one line:
    dry_run: median <s> s over <n> runs (<experiment>)
"""

import argparse
import os
import statistics
import subprocess
import sys
import time


def timed(cmd, ok_codes=(0, 2)):
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode not in ok_codes:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    return elapsed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--gin_file", default="experiments/continue_multilingual_base_tpu_v3_8.gin",
                   help="default: the bert-base TPU reference experiment (gs:// paths)")
    p.add_argument("--no_peer", action="store_true", help="skip the seqio import timing")
    args = p.parse_args()
    runexp = [os.path.join(os.path.dirname(sys.executable), "runexp"),
              f"--gin_file={args.gin_file}", "--dry_run"]
    peer = [sys.executable, "-c", "import seqio"]
    ours, theirs = [], []
    for _ in range(args.runs):
        ours.append(timed(runexp))
        if not args.no_peer:
            theirs.append(timed(peer, ok_codes=(0,)))
    print(f"command: {' '.join(runexp)}")
    print(f"runexp --dry_run: median {statistics.median(ours):.3f} s "
          f"(min {min(ours):.3f}, max {max(ours):.3f})")
    if theirs:
        print(f"peer (python -c 'import seqio'): median {statistics.median(theirs):.3f} s; "
              f"ratio peer/runexp {statistics.median(theirs) / statistics.median(ours):.1f}x")
    print(f"dry_run: median {statistics.median(ours):.3f} s over {args.runs} runs "
          f"({args.gin_file})")


if __name__ == "__main__":
    main()
