"""Keeps CPU cores busy while a command runs: to check that tests and the wall-time budget
hold on a busy machine (a shared CI runner, a notebook VM with neighbours).

    # the whole suite with two CPU-bound processes occupying both cores of a 2-core machine
    python bench/cpu_load.py -- .venv/bin/python -m pytest
    # the time-based tests, 5 times in a row, under the same load
    python bench/cpu_load.py -- bash -c 'for i in 1 2 3 4 5; do .venv/bin/python -m pytest -q \
        tests/runtime/test_trainer.py tests/runtime/test_stop_planner.py \
        tests/compiler/test_wall_time.py tests/runtime/test_preemption.py \
        tests/runtime/test_relaunch.py tests/storage/test_storage_faults.py \
        tests/storage/test_checkpoint_faults.py || exit 1; done'
    # just the load, for 10 minutes (or until Ctrl-C / SIGTERM)
    python bench/cpu_load.py --procs 2 --seconds 600

Starts ``--procs`` (default 2) processes that each spin on one core, runs COMMAND, stops them
when it ends, and exits with its exit code. Without a COMMAND it holds the load for
``--seconds`` or until interrupted. Interrupted (Ctrl-C, SIGTERM), it stops COMMAND too (its
whole process group: SIGTERM, then SIGKILL 30 s later) and the load. The load never outlives its limit: each spinning process
stops by itself after ``--seconds`` (default 3 hours) or as soon as this process is gone,
even if it was killed with SIGKILL. Only local CPU is used: no files, no network.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

# Spins until its time is up or its parent (this script) is gone; checks both every 0.1 s.
_SPIN = """
import os, sys, time
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while time.monotonic() < end and os.getppid() == parent:
    stop = time.monotonic() + 0.1
    while time.monotonic() < stop:
        pass
"""


def start_load(procs: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", _SPIN, str(os.getpid()), str(seconds)],
                             stdin=subprocess.DEVNULL)
            for _ in range(procs)]


def stop_load(spinners: list[subprocess.Popen]) -> None:
    for p in spinners:
        if p.poll() is None:
            p.terminate()
    for p in spinners:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _stop_group(child: subprocess.Popen) -> None:
    """SIGTERM to COMMAND's process group, SIGKILL if it is still there 30 s later."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(
        description="Run COMMAND with CPU-bound processes keeping cores busy.",
        usage="%(prog)s [--procs N] [--seconds S] [-- COMMAND ...]")
    parser.add_argument("--procs", type=int, default=2,
                        help="CPU-bound processes to start (default 2)")
    parser.add_argument("--seconds", type=float, default=3 * 3600.0,
                        help="the longest the load lasts, COMMAND or not (default 3 hours)")
    args = parser.parse_args(argv)
    if args.procs < 0 or args.seconds <= 0:
        parser.error("--procs must be >= 0 and --seconds > 0")

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    spinners = start_load(args.procs, args.seconds)
    print(f"cpu_load: {args.procs} CPU-bound process(es) running (pids "
          f"{', '.join(str(p.pid) for p in spinners)}), at most {args.seconds:g} s",
          file=sys.stderr, flush=True)
    child = None
    try:
        if command:
            # Its own process group, so that a stop reaches what it started too.
            child = subprocess.Popen(command, start_new_session=True)
            return child.wait()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end and any(p.poll() is None for p in spinners):
            time.sleep(0.5)
        return 0
    except KeyboardInterrupt:
        if child is not None and child.poll() is None:
            _stop_group(child)
        return 130
    finally:
        stop_load(spinners)
        print("cpu_load: load stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
