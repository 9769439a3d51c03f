"""A local output root may read its corpus from gs://: the dry run checks the objects exist,
and the run downloads the listed versions into the input cache, like a gs:// root's run."""

import os
import subprocess
import sys

from runexp.runtime import storage

TEXT = ("The parser reads the file.\nIt returns a list of names.\n\n"
        "A second document starts here.\nIt has two sentences.\n") * 60


def _runexp(tmp_path, gin, *args):
    env = dict(os.environ, RUNEXP_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "runexp.compiler.cli", f"--gin_file={gin}",
                           *args], capture_output=True, text=True, env=env, timeout=600)


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
