"""A local output root may read its corpus from gs://: the dry run checks the objects exist,
and the run downloads the listed versions into the input cache, like a gs:// root's run."""

import os

import pytest

from runexp.runtime import storage
from tests.support.cli import run_cli

pytestmark = pytest.mark.e2e

TEXT = ("The parser reads the file.\nIt returns a list of names.\n\n"
        "A second document starts here.\nIt has two sentences.\n") * 60


def _runexp(tmp_path, gin, *args):
    """The command with its own cache under ``tmp_path``."""
    return run_cli(*args, gin_file=gin, env=dict(os.environ,
                                                 RUNEXP_CACHE_DIR=str(tmp_path / "cache")))


def test_a_local_root_reads_a_gcs_corpus(gcs_prefix, tmp_path):
    storage.write_text(f"{gcs_prefix}/corpus/part-0.txt", TEXT)
    gin = tmp_path / "e.gin"
    gin.write_text(f"""include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{tmp_path}/out'
CORPUS_FILES = ['{gcs_prefix}/corpus/*.txt']
VOCAB_SIZE = 100
""")
    dry = _runexp(tmp_path, gin, "--dry_run")
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert f"ok: {gcs_prefix}/corpus/*.txt exists" in dry.stdout
    run = _runexp(tmp_path, gin, "--until=vocab")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert os.path.isfile(tmp_path / "out" / "vocab" / "COMPLETED")
    assert "the" in (tmp_path / "out" / "vocab" / "vocab.txt").read_text().split()
    cached = [f for _, _, fs in os.walk(tmp_path / "cache") for f in fs if f == "part-0.txt"]
    assert cached, "the corpus was read from the input cache"

    storage.delete(f"{gcs_prefix}/corpus/part-0.txt")
    gone = _runexp(tmp_path, gin, "--dry_run")
    assert gone.returncode == 1
    assert f"{gcs_prefix}/corpus/*.txt" in gone.stdout + gone.stderr


def test_a_beam_runner_reads_a_gcs_corpus_in_place(gcs_prefix, tmp_path):
    """runner 'beam': the pipeline's workers read the corpus ranges from the listed object
    versions themselves (what Dataflow's workers must do), nothing is downloaded into the
    input cache, and the records are those runner 'local' makes from its downloaded copy."""
    pytest.importorskip("apache_beam")
    storage.write_text(f"{gcs_prefix}/corpus/part-0.txt", TEXT)
    storage.write_text(f"{gcs_prefix}/corpus/part-1.txt", TEXT.upper())
    common = f"""include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
CORPUS_FILES = ['{gcs_prefix}/corpus/*.txt']
MAX_SEQ_LENGTH = 32
bert_pretraining_task.num_shards = 3
"""
    local = tmp_path / "local.gin"
    local.write_text(common + f"OUTPUT_ROOT = '{tmp_path}/local'\nVOCAB_SIZE = 100\n")
    run = _runexp(tmp_path / "a", local, "--until=preprocess")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    beam = tmp_path / "beam.gin"
    beam.write_text(common + f"""OUTPUT_ROOT = '{tmp_path}/beam'
VOCAB = '{tmp_path}/local/vocab/vocab.txt'
bert_pretraining_task.runner = 'beam'
bert_pretraining_task.beam_options = {{'runner': 'DirectRunner', 'direct_num_workers': 2}}
""")
    run = _runexp(tmp_path / "b", beam, "--until=preprocess")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert not [f for _, _, fs in os.walk(tmp_path / "b") for f in fs if f.endswith(".txt")]
    shards = {}
    for who in ("local", "beam"):
        shards[who] = {p.name: p.read_bytes()
                       for p in sorted((tmp_path / who).glob("preprocess*/*/train.tfrecord-*"))}
    assert len(shards["local"]) == 3, sorted(shards["local"])
    assert shards["local"] == shards["beam"]
