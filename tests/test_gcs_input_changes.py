"""Reuse you can trust, against the loopback GCS server: a gs:// corpus is fingerprinted by
its objects (name, size, generation, crc32c) when the plan is compiled, so a changed object
makes the dry run say "rebuild" and name it; the mirror reads exactly the listed versions and
keeps its cached copies by generation and crc32c, not by size.

The vocab and preprocess stages really run (through the executor, on the mirror); the later
stages are only planned.
"""

import json
import random

import pytest

from runexp.compiler.cli import main
from runexp.compiler.planner import compile_experiment
from runexp.compiler.state import REBUILD, REUSE, plan_states
from runexp.runtime import storage

WORDS = ("the function returns value of attribute an asynchronous task runs in event loop "
         "raise error when widget has no parent window parse header message and return its "
         "fields logger writes records to every handler").split()

EXPERIMENT = """
include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{root}/out'
CORPUS_FILES = '{root}/corpus/**/*.txt'
HELDOUT_FILES = '{root}/heldout.txt'
VOCAB_SIZE = 60
MAX_SEQ_LENGTH = 32
MAX_PREDICTIONS_PER_SEQ = 5
DUPE_FACTOR = 1
BATCH_SIZE = 8
TRAIN_STEPS = 20
WARMUP_STEPS = 2
CHECKPOINT_EVERY = 10
bert_pretraining_task.num_workers = 1
bert_pretraining_task.num_shards = 1
"""


def _text(seed: int, documents: int = 30) -> str:
    rng = random.Random(seed)
    docs = []
    for _ in range(documents):
        docs.append("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
                              + "." for _ in range(rng.randint(2, 5))))
    return "\n\n".join(docs) + "\n"


def _dry_run(gin, capsys):
    code = main([f"--gin_file={gin}", "--dry_run"])
    return code, capsys.readouterr().out


def _stage_block(out: str, stage_id: str) -> str:
    """The lines of the dry run about one stage."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line[2:].startswith(stage_id + "  ("))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")),
               len(lines))
    return "\n".join(lines[start:end])


def _run(plan, stage_ids, cache_dir, monkeypatch):
    """Runs the given stages of ``plan`` for real, as the executor does for a gs:// root."""
    from runexp.runtime.executor import run_stage
    from runexp.runtime.gcs_mirror import Mirror

    monkeypatch.setenv("RUNEXP_CACHE_DIR", str(cache_dir))
    mirror = Mirror(plan)
    states = plan_states(plan)
    for stage_id in stage_ids:
        run_stage(plan, plan.stage(stage_id), states[stage_id], mirror)
    return mirror


@pytest.fixture
def corpus(gcs_prefix):
    """A corpus in nested "directories", plus objects the glob must not take."""
    storage.write_text(f"{gcs_prefix}/corpus/part-0.txt", _text(0))
    storage.write_text(f"{gcs_prefix}/corpus/more/part-1.txt", _text(1))
    storage.write_text(f"{gcs_prefix}/corpus/more/notes.md", "not text of the corpus\n")
    storage.write_text(f"{gcs_prefix}/corpus/.hidden.txt", "a hidden object\n")
    storage.write_text(f"{gcs_prefix}/heldout.txt", _text(2, documents=5))
    return gcs_prefix


def test_a_changed_gcs_object_is_rebuilt_and_named(corpus, tmp_path, capsys, monkeypatch):
    root = corpus
    gin = tmp_path / "exp.gin"
    gin.write_text(EXPERIMENT.format(root=root))
    plan = compile_experiment([str(gin)]).plan
    vocab = plan.stage("vocab")
    listing = vocab.input_objects[f"{root}/corpus/**/*.txt"]
    assert sorted(listing) == [f"{root}/corpus/more/part-1.txt", f"{root}/corpus/part-0.txt"]
    first = listing[f"{root}/corpus/more/part-1.txt"]
    assert first["size"] == len(_text(1)) and first["generation"] and first["crc32c"]

    mirror = _run(plan, ["vocab", "preprocess.pretrain"], tmp_path / "cache", monkeypatch)
    manifest = json.loads(storage.read_text(f"{root}/out/vocab/MANIFEST.json"))
    assert manifest["input_objects"] == {k: dict(v) for k, v in vocab.input_objects.items()}

    # Unchanged: the built stages are reused, and say nothing about unlisted inputs.
    code, out = _dry_run(gin, capsys)
    assert code == 2, out  # the later stages are still to be created
    for stage_id in ("vocab", "preprocess.pretrain"):
        block = _stage_block(out, stage_id)
        assert "will be reused" in block, block
        assert "why: finished earlier with the same inputs and parameters" in block
    assert f"ok: {root}/corpus/**/*.txt exists" in out  # preflight, from the plan's listing

    # Offline (here: listing switched off), nothing can say the corpus is unchanged: the
    # plan never says "reuse" for it, and says why.
    monkeypatch.setenv("RUNEXP_NO_INPUT_LISTING", "1")
    offline = plan_states(compile_experiment([str(gin)]).plan)
    monkeypatch.delenv("RUNEXP_NO_INPUT_LISTING")
    assert offline["vocab"].action == REBUILD
    assert (f"{root}/corpus/**/*.txt could not be listed (RUNEXP_NO_INPUT_LISTING=1): "
            "whether it changed cannot be told") in offline["vocab"].reason

    # One object of the corpus is overwritten (same size: a size check would miss it).
    changed = f"{root}/corpus/more/part-1.txt"
    old_text = _text(1)
    storage.write_text(changed, old_text[::-1].lstrip("\n") + "\n")
    now = storage.glob_objects(changed)[0]
    assert now["size"] == first["size"] and now["generation"] != first["generation"]

    code, out = _dry_run(gin, capsys)
    for stage_id in ("vocab", "preprocess.pretrain"):
        block = _stage_block(out, stage_id)
        assert "will be rebuilt" in block, block
        assert (f"why: input changed: {changed} (generation {first['generation']} -> "
                f"{now['generation']}, crc32c {first['crc32c']} -> {now['crc32c']})") in block
        assert "part-0.txt" not in block.split("why:")[1].splitlines()[0]

    states = plan_states(compile_experiment([str(gin)]).plan)
    assert states["vocab"].action == REBUILD and states["preprocess.pretrain"].action == REBUILD

    # The old plan listed the old version: running it now would read other data than it
    # fingerprinted, so the mirror refuses (a fresh plan reads the new version).
    import shutil

    shutil.rmtree(tmp_path / "cache")
    with pytest.raises(storage.InputChangedError, match="part-1.txt changed after the plan"):
        mirror._localize(f"{root}/corpus/**/*.txt")

    # An object added to the glob, and one deleted, are named too.
    storage.write_text(f"{root}/corpus/deep/er/part-2.txt", _text(3))
    storage.delete(f"{root}/corpus/part-0.txt")
    vocab_state = plan_states(compile_experiment([str(gin)]).plan)["vocab"]
    assert vocab_state.action == REBUILD
    assert f"input added: {root}/corpus/deep/er/part-2.txt" in vocab_state.reason
    assert f"input removed: {root}/corpus/part-0.txt" in vocab_state.reason

    # Changed back? Content alone is not enough: a new generation is a new input.
    storage.write_text(changed, old_text)
    storage.write_text(f"{root}/corpus/part-0.txt", _text(0))
    storage.delete(f"{root}/corpus/deep/er/part-2.txt")
    assert plan_states(compile_experiment([str(gin)]).plan)["vocab"].action == REBUILD


def test_rebuilt_after_the_change_then_reused(corpus, tmp_path, capsys, monkeypatch):
    root = corpus
    gin = tmp_path / "exp.gin"
    gin.write_text(EXPERIMENT.format(root=root))
    _run(compile_experiment([str(gin)]).plan, ["vocab"], tmp_path / "cache", monkeypatch)
    storage.write_text(f"{root}/corpus/part-0.txt", _text(5))
    plan = compile_experiment([str(gin)]).plan
    assert plan_states(plan)["vocab"].action == REBUILD
    _run(plan, ["vocab"], tmp_path / "cache", monkeypatch)
    assert plan_states(compile_experiment([str(gin)]).plan)["vocab"].action == REUSE


def test_the_mirror_keeps_copies_by_generation_and_crc32c(corpus, tmp_path, monkeypatch):
    from runexp.runtime import gcs_mirror as mirror_module

    root = corpus
    gin = tmp_path / "exp.gin"
    gin.write_text(EXPERIMENT.format(root=root))
    monkeypatch.setenv("RUNEXP_CACHE_DIR", str(tmp_path / "cache"))
    downloads = []
    real = storage.download_version

    def counting(uri, dest, generation, crc32c):
        downloads.append(uri)
        return real(uri, dest, generation, crc32c)

    monkeypatch.setattr(mirror_module.storage, "download_version", counting)
    pattern = f"{root}/corpus/**/*.txt"

    def localize():
        plan = compile_experiment([str(gin)]).plan
        return mirror_module.Mirror(plan)._localize(pattern)

    paths = localize()
    assert [p.split("/corpus/", 1)[1] for p in paths] == ["more/part-1.txt", "part-0.txt"]
    assert len(downloads) == 2
    assert localize() == paths and len(downloads) == 2  # cached copies are that version

    # Same size, other bytes, new generation: downloaded again.
    text = _text(0)
    storage.write_text(f"{root}/corpus/part-0.txt", text.upper())
    assert localize() == paths and downloads[2:] == [f"{root}/corpus/part-0.txt"]
    with open(paths[1], encoding="utf-8") as f:
        assert f.read() == text.upper()

    # A cached copy edited locally is not that version any more either.
    with open(paths[0], "a", encoding="utf-8") as f:
        f.write("local edit\n")
    assert localize() == paths and downloads[3:] == [f"{root}/corpus/more/part-1.txt"]
    with open(paths[0], encoding="utf-8") as f:
        assert f.read() == _text(1)


def test_unlisted_inputs_are_never_reused_silently(corpus, tmp_path, monkeypatch):
    """Compiled without a listing (offline, no credentials; here RUNEXP_NO_INPUT_LISTING=1),
    a gs:// input keeps the constant fingerprint of earlier versions. Stages built that way
    are reused only with a reason saying they are not verified (downstream ones too); once
    the inputs can be listed again, they are rebuilt, saying why."""
    import os

    from runexp.compiler.plan import COMPLETED_FILE, MANIFEST_FILE
    from runexp.runtime.executor import _manifest

    root = corpus
    gin = tmp_path / "exp.gin"
    gin.write_text(EXPERIMENT.format(root=root).replace(f"'{root}/out'",
                                                        f"'{tmp_path}/out'"))

    def finish(plan, *stage_ids):  # what the executor leaves in a finished stage
        for stage_id in stage_ids:
            stage = plan.stage(stage_id)
            os.makedirs(stage.output_dir, exist_ok=True)
            with open(os.path.join(stage.output_dir, MANIFEST_FILE), "w") as f:
                json.dump(_manifest(stage, {}, 0.0), f)
            with open(os.path.join(stage.output_dir, COMPLETED_FILE), "w") as f:
                f.write(stage.fingerprint + "\n")

    monkeypatch.setenv("RUNEXP_NO_INPUT_LISTING", "1")
    plan = compile_experiment([str(gin)]).plan
    pattern = f"{root}/corpus/**/*.txt"
    assert plan.stage("vocab").input_objects[pattern] == \
        "not listed: RUNEXP_NO_INPUT_LISTING=1"
    finish(plan, "vocab", "preprocess.pretrain")
    states = plan_states(compile_experiment([str(gin)]).plan)
    for stage_id in ("vocab", "preprocess.pretrain"):
        assert states[stage_id].action == REUSE
        assert "NOT verified" in states[stage_id].reason
        assert f"{pattern} (RUNEXP_NO_INPUT_LISTING=1)" in states[stage_id].reason

    monkeypatch.delenv("RUNEXP_NO_INPUT_LISTING")
    states = plan_states(compile_experiment([str(gin)]).plan)
    assert states["vocab"].action == REBUILD
    assert (f"{pattern} could not be listed when the stage was built "
            "(RUNEXP_NO_INPUT_LISTING=1): its objects cannot be compared") in \
        states["vocab"].reason
    assert states["vocab"].unverified == ()
