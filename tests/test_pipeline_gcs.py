"""The quickstart with its output root on gs://, against the loopback GCS server.

Every stage's outputs, MANIFEST.json and COMPLETED land in the bucket; fingerprints equal
those of the same experiment on local disk; a second run reuses everything from the bucket.
"""

import json
import os

import pytest

from runexp.compiler.planner import compile_experiment
from tests.support.cli import QUICKSTART_SHORT, QUICKSTART_STAGES as STAGES, run_cli

pytestmark = pytest.mark.e2e

# The quickstart at its shortest: what is tested is where the outputs go and that they are
# reused from the bucket, not how well it trains (tests/test_pipeline_e2e.py trains longer).
SMALL = [*QUICKSTART_SHORT, "VOCAB_SIZE=2000", "vocab.max_sentences=20000"]


def _run(root, cache, *extra):
    return run_cli(*extra, gin_file="quickstart.gin", root=root, params=SMALL,
                   env=dict(os.environ, RUNEXP_CACHE_DIR=str(cache)))


@pytest.mark.slow
def test_quickstart_on_gcs_matches_local_disk_and_is_reused(gcs_prefix, tmp_path):
    from runexp.runtime import storage

    proc = _run(gcs_prefix, tmp_path / "cache")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    local = compile_experiment(["quickstart.gin"], [f"OUTPUT_ROOT='{tmp_path}/local'"] + SMALL)
    for stage in local.plan.stages:
        remote = f"{gcs_prefix}/{stage.id}"
        assert storage.exists(f"{remote}/COMPLETED"), stage.id
        manifest = json.loads(storage.read_text(f"{remote}/MANIFEST.json"))
        assert manifest["fingerprint"] == stage.fingerprint, stage.id
    assert storage.glob(f"{gcs_prefix}/pretrain/checkpoints/ckpt-*.index")
    assert storage.exists(f"{gcs_prefix}/export/encoder/saved_model.pb")
    assert storage.exists(f"{gcs_prefix}/plan.json")

    # A fresh cache: everything is decided from the bucket alone.
    again = _run(gcs_prefix, tmp_path / "cache2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(": reused (") == len(STAGES)
