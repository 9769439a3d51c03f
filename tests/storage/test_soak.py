"""A soak test: a two-phase pretraining experiment on a gs:// root (the loopback GCS server,
behind the fault proxy) interrupted in both phases, by SIGTERM and SIGKILL at steps a seeded
RNG picks and by SIGKILL while a checkpoint's upload is held at the proxy, then run to its
end (tests/storage/soak_run.py). It must end with the weights, optimizer slots and data
position of an uninterrupted run, bit for bit, in both phases.

Each process's start-up (process start to its first step) is printed, not asserted: it
depends on the machine. bench/soak.py runs the long chain (20+ interruptions) and reports
how it changes from the first resume to the last.
"""

import dataclasses
import os
import statistics

import numpy as np
import pytest

from tests.storage import soak_run

INTERRUPTIONS = 6  # three per phase: one of each kind in each
SEED = 26


@pytest.fixture(scope="module")
def soak_data(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("soak-data"))
    soak_run.write_data(data_dir)
    return data_dir


@pytest.mark.slow
def test_interrupted_in_both_phases_ends_bit_identical(soak_data, gcs_prefix, gcs_emulator,
                                                      fault_proxy, fast_retries, tmp_path,
                                                      monkeypatch):
    monkeypatch.setenv("RUNEXP_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "chain"
    work.mkdir()
    soak = soak_run.Soak(gcs_prefix, soak_data, str(work), fault_proxy,
                         retry=dataclasses.asdict(fast_retries), say=print)
    # The uninterrupted run, alongside: straight to the server (its own cache), so none of
    # its requests meet the proxy's holds.
    reference_root = gcs_prefix + "-reference"
    reference, _ = soak.spawn("reference", root=reference_root, env={
        **os.environ, "STORAGE_EMULATOR_HOST": gcs_emulator[0],
        "RUNEXP_CACHE_DIR": str(tmp_path / "reference-cache")})

    launches = soak.run(INTERRUPTIONS, SEED)

    kinds = {(launch.phase, launch.kind) for launch in launches[:-1]}
    assert kinds == {(p, k) for p in soak_run.PHASES for k in soak_run.KINDS}, kinds
    # Each resume started from a checkpoint the bucket held; a SIGTERM's is at the step held.
    for before, after in zip(launches, launches[1:]):
        if before.kind == "SIGTERM":
            assert after.started_from[before.phase] == \
                before.started_from[before.phase] + before.hold_n, (before, after)
    assert reference.wait(timeout=1200) == 0, soak.log("reference")
    fault_proxy.clear()
    for phase in soak_run.PHASES:
        got = soak.final_state(gcs_prefix, phase, str(tmp_path / "got" / phase))
        want = soak.final_state(reference_root, phase, str(tmp_path / "want" / phase))
        assert set(got) == set(want)
        assert sum(n.startswith("model/") for n in want) > 20
        assert any("optimizer/m/" in n for n in want)
        assert any(n.startswith("batches_consumed") for n in want)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{phase}: {name}")

    overheads = [launch.first_step_s for launch in launches[1:]
                 if launch.first_step_s is not None]
    print(f"\nSOAK {len(launches) - 1} interruptions; resume start-up (process start to "
          f"first step) s: {' '.join(f'{s:.2f}' for s in overheads)}; median "
          f"{statistics.median(overheads):.2f}")
