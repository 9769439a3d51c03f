"""What grows with a run, at the length of a real one: time and peak memory of ``runexp
status``, ``runexp report``, the curves, a resume's log work, the stop planner and relaunch on
the output root of a simulated million-step run (tests/runtime/long_run_files.py: plan,
train and eval logs, checkpoint directory, TensorBoard files; no training).

    .venv/bin/python bench/long_run.py [--steps 1000000] [--log_every 100,1]
        [--relaunches 100] [--keep DIR]

For each ``--log_every`` (100: 9,000 train records, the usual; 1: 900,000 records, a run
that logs every step) it prints:
    long_run: log_every <k>: train log <n> records, <MB> MB
    long_run: <what>: <s> s, peak <MB> MB (<how measured>)
where ``runexp status`` and ``runexp report`` run as the command does, in a fresh process
(peak: the process's maximum resident set, imports included), and the rest in this process
(peak: what tracemalloc saw allocated during the call). Then, independent of the log:
    long_run: stop planner: <n> calls, <us> us a call, peak <KB> KB
    long_run: relaunch: <n> relaunches of a preempted child, <ms> ms each beyond the child,
        peak <KB> KB
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)  # tests.runtime.long_run_files

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def in_process(fn):
    """(seconds, peak bytes, result) of ``fn()``: timed in one call, its peak allocation
    (tracemalloc, which slows allocation down many times) measured in a second call."""
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    tracemalloc.start()
    try:
        fn()
        return seconds, tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


# Runs a module as ``python -m`` does, then prints the process's peak resident set (VmHWM:
# this process image's own, unlike getrusage's maximum, which on Linux also counts the
# parent's memory the child was forked with).
_PEAK = """
import runpy, sys
module, sys.argv = sys.argv[1], sys.argv[1:]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
finally:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            print("PEAK_KB", line.split()[1], file=sys.stderr, flush=True)
"""


def in_child(module: str, *args: str) -> tuple[float, float, int]:
    """(seconds, peak resident MB, exit code) of ``python -m module args`` in its own
    process."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _PEAK, module, *args],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t0
    peak = [int(line.split()[1]) for line in proc.stderr.splitlines()
            if line.startswith("PEAK_KB ")]
    return seconds, (peak[-1] / 1024 if peak else float("nan")), proc.returncode


def bench_logs(directory: str, steps: int, log_every: int, say) -> None:
    from runexp.runtime import log_reader
    from runexp.runtime.report import curves
    from tests.runtime.long_run_files import STAGE, simulate

    t0 = time.perf_counter()
    root = simulate(os.path.join(directory, f"every{log_every}"), steps=steps,
                    log_every=log_every)
    stage_dir = os.path.join(root, STAGE)
    log = os.path.join(stage_dir, log_reader.TRAIN_LOG)
    with open(log, "rb") as f:
        records = sum(1 for _ in f)
    say(f"long_run: log_every {log_every}: train log {records:,} records, "
        f"{os.path.getsize(log) / 1e6:.1f} MB (written in {time.perf_counter() - t0:.0f} s)")

    seconds, peak, code = in_child("runexp.compiler.cli", "status", root)
    say(f"long_run: runexp status: {seconds:.2f} s, peak {peak:.0f} MB (own process; exit "
        f"{code}: not done)")
    seconds, peak, code = in_child("runexp.compiler.cli", "report", root, "--out",
                                   os.path.join(directory, "report.html"))
    say(f"long_run: runexp report: {seconds:.2f} s, peak {peak:.0f} MB (own process, curves "
        f"drawn; exit {code})")

    from runexp.compiler.cli import _reader
    from runexp.compiler.plan import Plan
    from runexp.runtime import status
    from runexp.runtime.report import collect

    read = _reader(root)
    plan = Plan.from_json(read(os.path.join(root, "plan.json")))
    seconds, peak, _ = in_process(lambda: status.render(status.status(plan, read)))
    say(f"long_run: status, its work alone: {seconds * 1e3:.1f} ms, peak {peak / 1e3:.0f} KB")
    seconds, peak, _ = in_process(lambda: collect.collect(root, draw=False))
    say(f"long_run: report, gathering (no drawing): {seconds:.2f} s, peak "
        f"{peak / 1e6:.1f} MB")

    seconds, peak, logs = in_process(lambda: curves.read_logs(stage_dir))
    say(f"long_run: curves, reading the logs: {seconds:.2f} s, peak {peak / 1e6:.1f} MB "
        f"({len(logs.train)} train points kept)")

    def draw():
        return curves.figure_png(curves.curves_figure("pretrain", logs, total_steps=steps))

    seconds, peak, png = in_process(draw)
    say(f"long_run: curves, drawing: {seconds:.2f} s, peak {peak / 1e6:.1f} MB "
        f"({len(png) / 1e3:.0f} KB PNG)")

    from runexp.runtime import train_log

    last = steps * 9 // 10
    seconds, peak, _ = in_process(lambda: (train_log.trim_logs(stage_dir, last),
                                           train_log.last_metrics(stage_dir)))
    say(f"long_run: a resume's log work (trim past the checkpoint, last metrics): "
        f"{seconds * 1e3:.1f} ms, peak {peak / 1e3:.0f} KB")


def bench_stop_planner(calls: int, say) -> None:
    from runexp.runtime.stop_planner import StopPlanner

    def run():
        now = [0.0]
        planner = StopPlanner(deadline=10.0 ** 9, margin_s=300.0, assumed_save_s=30.0,
                              clock=lambda: now[0])
        for i in range(calls):
            n = planner.next_call_steps(100)
            now[0] += 0.1 * n
            planner.record_call(n, 0.1 * n, tracing=i == 0)
            if i % 10 == 0:
                planner.record_save(5.0)
        return planner

    seconds, peak, _ = in_process(run)
    say(f"long_run: stop planner: {calls:,} calls ({calls * 100:,} steps, 100 a call, a "
        f"checkpoint every 10 calls), {seconds / calls * 1e6:.1f} us a call, peak "
        f"{peak / 1e3:.0f} KB")


def bench_relaunch(relaunches: int, directory: str, say) -> None:
    from runexp.runtime.relaunch import run_with_relaunch

    counter = os.path.join(directory, "attempts")
    child = ("import os, sys\n"
             f"p = {counter!r}\n"
             "n = int(open(p).read()) if os.path.exists(p) else 0\n"
             "open(p, 'w').write(str(n + 1))\n"
             f"sys.exit(75 if n < {relaunches} else 0)\n")
    lines = []
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-S", "-c", "pass"])
    bare = time.perf_counter() - t0

    def run():
        if os.path.exists(counter):
            os.remove(counter)
        lines.clear()
        return run_with_relaunch([sys.executable, "-S", "-c", child],
                                 max_attempts=relaunches + 1, backoff_s=0.0, say=lines.append)

    seconds, peak, code = in_process(run)
    each = seconds / (relaunches + 1) - bare
    say(f"long_run: relaunch: {relaunches} relaunches of a preempted child (exit {code}), "
        f"{max(each, 0) * 1e3:.1f} ms each beyond the child's own start, peak "
        f"{peak / 1e3:.0f} KB, {len(lines)} lines said")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10 ** 6)
    p.add_argument("--log_every", default="100,1")
    p.add_argument("--relaunches", type=int, default=100)
    p.add_argument("--planner_calls", type=int, default=10 ** 4)
    p.add_argument("--keep", help="write the simulated roots here and keep them")
    args = p.parse_args(argv)
    directory = args.keep or tempfile.mkdtemp(prefix="long_run-")
    say = lambda line: print(line, flush=True)  # noqa: E731
    try:
        for every in (int(x) for x in args.log_every.split(",")):
            bench_logs(directory, args.steps, every, say)
        bench_stop_planner(args.planner_calls, say)
        bench_relaunch(args.relaunches, directory, say)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
