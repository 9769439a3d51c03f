"""One glob semantics (compiler/globs.py) for the compiler, the text reader and gs://
listings: the same patterns over the same tree give the same files everywhere, and what the
plan fingerprints is what the stages read."""

import json
import os

import pytest

from runexp.compiler import globs, uris
from runexp.compiler.gcs_inputs import InputLister
from runexp.compiler.planner import compile_experiment
from runexp.runtime import storage
from runexp.tasks.sources.text_files import expand_globs

TREE = ["a.txt", "b1.txt", "b2.txt", "ab.txt", "notes.md", ".hidden.txt",
        "sub/c.txt", "sub/b3.txt", "sub/deep/d.txt", "sub/deep/er/e.txt", "sub/deep/x.md",
        ".cache/f.txt", "sub/.g.txt", "other/b4.txt", "other/deep/h.txt", "[x].txt"]

# pattern -> the files it matches (relative to the tree's root)
CASES = {
    "*.txt": ["[x].txt", "a.txt", "ab.txt", "b1.txt", "b2.txt"],
    "b?.txt": ["b1.txt", "b2.txt"],
    "[ab]*.txt": ["a.txt", "ab.txt", "b1.txt", "b2.txt"],
    "[!ab]*.txt": ["[x].txt"],
    "[x].txt": ["[x].txt"],  # an existing file named exactly by the pattern matches it too
    "**/*.txt": ["[x].txt", "a.txt", "ab.txt", "b1.txt", "b2.txt", "other/b4.txt",
                 "other/deep/h.txt", "sub/b3.txt", "sub/c.txt", "sub/deep/d.txt",
                 "sub/deep/er/e.txt"],
    "**/b?.txt": ["b1.txt", "b2.txt", "other/b4.txt", "sub/b3.txt"],
    "sub/**": ["sub/b3.txt", "sub/c.txt", "sub/deep/d.txt", "sub/deep/er/e.txt",
               "sub/deep/x.md"],
    "sub/*": ["sub/b3.txt", "sub/c.txt"],
    "*/deep/*.txt": ["other/deep/h.txt", "sub/deep/d.txt"],
    "sub/**/deep/**/*.txt": ["sub/deep/d.txt", "sub/deep/er/e.txt"],
    "sub/**/e.txt": ["sub/deep/er/e.txt"],
    "sub/?.txt": ["sub/c.txt"],
    ".*": [".hidden.txt"],
    ".cache/*.txt": [".cache/f.txt"],
    "sub/deep/er/e.txt": ["sub/deep/er/e.txt"],
    "sub/deep": [],  # a directory is not a file
    "nothing/**/*.txt": [],
}


@pytest.fixture
def trees(tmp_path, gcs_prefix):
    """The same files on local disk and on gs://: (local root, gs:// root)."""
    local = str(tmp_path / "tree")
    for rel in TREE:
        storage.write_text(os.path.join(local, rel), rel + "\n")
        storage.write_text(f"{gcs_prefix}/tree/{rel}", rel + "\n")
    return local, f"{gcs_prefix}/tree"


def _rel(paths, root):
    return [p[len(root) + 1:] for p in paths]


def test_the_same_files_for_the_compiler_the_reader_and_gcs(trees):
    local, remote = trees
    lister = InputLister()
    for pattern, expected in CASES.items():
        seen = {
            "compiler": _rel(uris.expand_local(f"{local}/{pattern}"), local),
            "reader": _rel(expand_globs(f"{local}/{pattern}"), local) if expected else [],
            "storage (local)": _rel(storage.glob(f"{local}/{pattern}"), local),
            "storage (gs://)": _rel(storage.glob(f"{remote}/{pattern}"), remote),
            "compiler (gs://)": _rel(sorted(lister.objects(f"{remote}/{pattern}")), remote),
        }
        for who, got in seen.items():
            assert got == expected, (pattern, who, got)
    with pytest.raises(FileNotFoundError):
        expand_globs(f"{local}/nothing/**/*.txt")


def test_relative_patterns_stay_relative(trees, monkeypatch):
    local, _ = trees
    monkeypatch.chdir(local)
    assert expand_globs(["sub/**/*.txt", "*.txt", "a.txt"]) == [
        "[x].txt", "a.txt", "ab.txt", "b1.txt", "b2.txt", "sub/b3.txt", "sub/c.txt",
        "sub/deep/d.txt", "sub/deep/er/e.txt"]
    assert globs.expand_local("**/h.txt") == ["other/deep/h.txt"]


def test_match_and_helpers():
    assert globs.match("c/**/*.txt", "c/a.txt") and globs.match("c/**/*.txt", "c/x/y/a.txt")
    assert not globs.match("c/*.txt", "c/x/a.txt")  # * never crosses /
    assert not globs.match("c/*", "c/.h") and globs.match("c/.*", "c/.h")
    assert not globs.match("c/**/a.txt", "c/.x/a.txt")
    assert globs.match("c/[a-c].txt", "c/b.txt") and not globs.match("c/[!a-c].txt", "c/b.txt")
    assert not globs.match("c/?", "c//") and not globs.match("c[/]d", "c/d")
    assert globs.literal_prefix("corpus/part-*.txt") == "corpus/part-"
    name = "ckpt/model[1]*?.index"
    assert globs.match(globs.escape(name), name)
    assert not globs.match(globs.escape(name), "ckpt/model1x?.index")
    assert globs.filter_names("d/*.txt", ["d/b.txt", "d/a.txt", "d/a.txt", "d/x/c.txt"]) == [
        "d/a.txt", "d/b.txt"]


def test_a_symlink_loop_is_walked_once(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("a\n")
    (tmp_path / "d" / "sub" / "b.txt").write_text("b\n")
    os.symlink(str(tmp_path / "d"), str(tmp_path / "d" / "sub" / "loop"))
    assert _rel(globs.expand_local(f"{tmp_path}/d/**/*.txt"), str(tmp_path)) == [
        "d/a.txt", "d/sub/b.txt"]


EXPERIMENT = """
include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{root}/out'
CORPUS_FILES = '{root}/corpus/**/*.txt'
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


def test_the_stages_read_what_the_plan_fingerprinted(tmp_path, capsys):
    """A recursive glob on local disk: the plan's fingerprint covers the nested files and
    the vocab and preprocess stages read every one of them (not only the top level)."""
    from runexp.compiler.state import plan_states
    from runexp.runtime.executor import run_stage

    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    docs = {"corpus/top.txt": 4, "corpus/x/one.txt": 5, "corpus/x/y/two.txt": 6}
    for k, (rel, n) in enumerate(docs.items()):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join(" ".join(words[(i + j + k) % 12] for j in range(8)) + "."
                                    for i in range(n)) + "\n")
    gin = tmp_path / "exp.gin"
    gin.write_text(EXPERIMENT.format(root=tmp_path))
    plan = compile_experiment([str(gin)]).plan
    pattern = plan.stage("vocab").inputs["train_files"][0]
    planned = uris.expand_local(pattern)
    assert _rel(planned, str(tmp_path)) == sorted(docs)
    assert expand_globs(pattern) == planned

    states = plan_states(plan)
    run_stage(plan, plan.stage("vocab"), states["vocab"])
    assert "of 3 files" in capsys.readouterr().out
    summary = run_stage(plan, plan.stage("preprocess.pretrain"), states["preprocess.pretrain"])
    assert summary["train"]["documents"] == sum(docs.values())

    # A nested file changes: the plan sees it (recursive in the fingerprint too).
    (tmp_path / "corpus/x/y/two.txt").write_text("omega psi chi.\n")
    again = plan_states(compile_experiment([str(gin)]).plan)
    assert again["vocab"].action == "rebuild" and again["preprocess.pretrain"].action == \
        "rebuild"
    manifest = json.loads((tmp_path / "out/vocab/MANIFEST.json").read_text())
    assert "input_objects" not in manifest  # local inputs: the manifest is as before
