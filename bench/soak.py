"""The long soak: a two-phase pretraining experiment on a gs:// root (a GCS JSON API server on
loopback, behind the fault proxy) interrupted ``--interruptions`` times (default 20): SIGTERM
and SIGKILL at steps a seeded RNG picks, SIGKILL while a checkpoint's upload is held at the
proxy, half in each phase; then run to its end, and compared bit for bit with an
uninterrupted run (tests/storage/soak_run.py; tests/storage/test_soak.py is the short chain
CI runs).

    .venv/bin/python bench/soak.py [--interruptions 20] [--seed 26] [--steps 60,40]
        [--keep DIR]

Prints one line per launch (how it ended, the committed steps it started from, its
start-up: process start to its first step, which holds the imports, the executor, the
checkpoint's download and restore, the data position and the first step's compilation):
    soak: launch <n>: <kind> ...; process start to first step <s> s; exit <code>
then
    soak: resume start-up: median <s> s, first <s> s, last <s> s, last/first <r>,
        by launch: ...
    soak: final weights, optimizer slots and data position bit-identical to an
        uninterrupted run: yes
A resume costs the same at its step whatever the run's length: the ratio last/first stays
near 1 (the steps resumed at grow along the chain).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)  # tests.storage.soak_run, tests.support, tests.conftest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--interruptions", type=int, default=20)
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--steps", default="60,40", help="train steps of phase 1 and phase 2")
    p.add_argument("--keep", help="keep the processes' logs and data here")
    args = p.parse_args(argv)
    say = lambda line: print(line, flush=True)  # noqa: E731

    import numpy as np

    from runexp.runtime import storage
    from tests.conftest import EMULATOR_BUCKET, _start_emulator, _stop
    from tests.storage import soak_run
    from tests.support.fault_proxy import FaultProxy

    work = args.keep or tempfile.mkdtemp(prefix="soak-")
    os.makedirs(work, exist_ok=True)
    emulator, endpoint = _start_emulator(os.path.join(work, "emulator.log"))
    proxy = FaultProxy(endpoint, socket_timeout=15)
    try:
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.endpoint
        os.environ["RUNEXP_CACHE_DIR"] = os.path.join(work, "cache")
        retry = storage.RetryPolicy(max_tries=6, initial_delay=0.01, max_delay=0.2,
                                    deadline=300.0, timeout=60.0)
        storage.set_retry_policy(retry)
        data_dir = os.path.join(work, "data")
        soak_run.write_data(data_dir)
        root = f"gs://{EMULATOR_BUCKET}/soak-{uuid.uuid4().hex[:8]}"
        steps = tuple(int(x) for x in args.steps.split(","))
        soak = soak_run.Soak(root, data_dir, work, proxy, dataclasses.asdict(retry),
                             steps=steps, say=say)
        reference_root = root + "-reference"
        t0 = time.monotonic()
        reference, _ = soak.spawn("reference", root=reference_root, env={
            **os.environ, "STORAGE_EMULATOR_HOST": endpoint,
            "RUNEXP_CACHE_DIR": os.path.join(work, "reference-cache")})
        launches = soak.run(args.interruptions, args.seed)
        chain_s = time.monotonic() - t0
        if reference.wait() != 0:
            say(soak.log("reference"))
            return 1
        proxy.clear()
        same = True
        for phase in soak_run.PHASES:
            got = soak.final_state(root, phase, os.path.join(work, "got", phase))
            want = soak.final_state(reference_root, phase, os.path.join(work, "want", phase))
            same &= set(got) == set(want) and all(
                np.array_equal(got[n], want[n]) for n in want)
        resumes = [(launch.n, launch.first_step_s) for launch in launches[1:]
                   if launch.first_step_s is not None]
        times = [s for _, s in resumes]
        say(f"soak: {len(launches) - 1} interruptions "
            f"({', '.join(f'{k} {sum(x.kind == k for x in launches)}' for k in soak_run.KINDS)}"
            f"), {len(launches)} launches, {chain_s:.0f} s")
        say(f"soak: resume start-up (process start to first step): median "
            f"{statistics.median(times):.2f} s, first {times[0]:.2f} s, last {times[-1]:.2f} s, "
            f"last/first {times[-1] / times[0]:.2f}, min {min(times):.2f} s, max "
            f"{max(times):.2f} s; by launch: "
            + " ".join(f"{n}:{s:.1f}" for n, s in resumes))
        say(f"soak: final weights, optimizer slots and data position bit-identical to an "
            f"uninterrupted run: {'yes' if same else 'NO'}")
        return 0 if same else 1
    finally:
        proxy.stop()
        _stop(emulator)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
