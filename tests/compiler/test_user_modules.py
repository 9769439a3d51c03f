"""Gin imports are found and fingerprinted, never imported, by the compiler; seqio sources
are planned from them (compiler/user_modules.py, compiler/stages/seqio_sources.py)."""

import json
import os
import subprocess
import sys

import pytest

from runexp.compiler.errors import Location, UserError
from runexp.compiler.planner import compile_experiment
from runexp.compiler.user_modules import module_name, resolve

TASKS_PY = """
import os
open(os.environ.get("RUNEXP_TEST_IMPORTED", os.devnull), "w").close()
"""


def _experiment(write, imports="import my_project.tasks", source=None, extra=""):
    source = source or ("pretrain/bert_pretraining_task.format = 'seqio_documents'\n"
                        "pretrain/bert_pretraining_task.seqio_task = 'my_docs'\n")
    return write("proj/exp.gin", f"include 'runs/pretrain.gin'\n"
                                 f"include 'models/bert_tiny.gin'\n{imports}\n"
                                 f"OUTPUT_ROOT = '{write.dir}/out'\nCORPUS_FILES = []\n"
                                 f"VOCAB_SIZE = 100\n{source}{extra}")


def _preprocess(plan):
    return next(s for s in plan.stages if s.kind == "preprocess")


@pytest.fixture
def project(write):
    """A user's package next to the gin file: my_project/{__init__,tasks,helpers}.py."""
    write("proj/my_project/__init__.py", "")
    write("proj/my_project/tasks.py", TASKS_PY)
    write("proj/my_project/helpers.py", "X = 1\n")
    return os.path.join(write.dir, "proj")


def test_import_statements_name_modules():
    assert module_name("import a.b.c") == "a.b.c"
    assert module_name("import a.b as c") == "a.b"
    assert module_name("from a.b import c") == "a.b.c"


def test_a_package_module_is_found_next_to_the_gin_file(write, project):
    plan = compile_experiment([_experiment(write)]).plan
    [entry] = _preprocess(plan).inputs["modules"]
    assert entry["module"] == "my_project.tasks"
    assert entry["path"] == os.path.join(project, "my_project", "tasks.py")
    assert entry["sys_path"] == project
    assert entry["gin_import"].endswith("exp.gin:3")
    pre = _preprocess(plan)
    assert pre.params["num_shards"] == 64  # the size of a seqio source is unknown
    assert "checked at run time" in pre.provenance["seqio_task"]
    assert [s.id for s in plan.stages if s.kind == "evaluate"] == []  # no validation split


def test_a_validation_split_gives_the_task_an_evaluation(write, project):
    plan = compile_experiment([_experiment(
        write, extra="pretrain/bert_pretraining_task.validation_split = 'validation'\n")]).plan
    assert any(s.kind == "evaluate" for s in plan.stages)


def test_a_module_found_nowhere_is_an_error_at_the_import(write):
    with pytest.raises(UserError) as e:
        compile_experiment([_experiment(write, imports="import my_projetc.tasks")])
    text = str(e.value)
    assert "exp.gin:3: error: gin import: no module named 'my_projetc.tasks'" in text
    assert "hint:" in text and "next to the gin file" in text


def test_a_missing_module_is_an_error_whatever_the_source(minimal, write):
    path = write("exp2.gin", f"include '{minimal}'\nimport not_a_module_anywhere\n")
    with pytest.raises(UserError, match=r"exp2.gin:2: error: gin import: no module named"):
        compile_experiment([path])


def test_an_installed_module_is_fine(write, project):
    plan = compile_experiment([_experiment(write, imports="import my_project.tasks\n"
                                                          "import seqio")]).plan
    installed = _preprocess(plan).inputs["modules"][1]
    assert installed["module"] == "seqio" and installed["sys_path"] == ""
    assert resolve("json", Location("x.gin", 1)) is not None  # the standard library
    assert resolve("sys", Location("x.gin", 1)).path == ""    # built in


def test_the_fingerprint_follows_the_package_source(write, project):
    exp = _experiment(write)
    first = _preprocess(compile_experiment([exp]).plan).fingerprint
    assert _preprocess(compile_experiment([exp]).plan).fingerprint == first
    with open(os.path.join(project, "my_project", "tasks.py"), "a") as f:
        f.write("Y = 2\n")
    second = _preprocess(compile_experiment([exp]).plan).fingerprint
    assert second != first
    with open(os.path.join(project, "my_project", "helpers.py"), "a") as f:
        f.write("Z = 3\n")  # a sibling the task module may import
    assert _preprocess(compile_experiment([exp]).plan).fingerprint != second


def test_a_seqio_task_source_needs_the_task_and_an_import(write, project):
    with pytest.raises(UserError) as e:
        compile_experiment([_experiment(
            write, imports="", source="pretrain/bert_pretraining_task.format = "
                                      "'seqio_documents'\n")])
    text = str(e.value)
    assert "seqio_task is not set" in text and "no gin file imports the module" in text
    assert "exp.gin:7" in text  # the format's line


def test_text_files_do_not_apply_to_a_seqio_source(write, project):
    with pytest.raises(UserError, match=r"train_files does not apply to format "
                                        r"'seqio_documents'"):
        compile_experiment([_experiment(write, extra=f"CORPUS_FILES = '{write.corpus}'\n")])


def _prepared_tfds(root, name="my_docs", version="1.0.0", splits=("train", "test")):
    """The files TFDS writes for a prepared dataset (a layout, read by the compiler)."""
    d = os.path.join(root, name, version)
    os.makedirs(d)
    with open(os.path.join(d, "dataset_info.json"), "w") as f:
        json.dump({"name": name, "version": version,
                   "splits": [{"name": s, "shardLengths": ["2"]} for s in splits]}, f)
    for s in splits:
        with open(os.path.join(d, f"{name}-{s}.tfrecord-00000-of-00001"), "wb") as f:
            f.write(b"records")
    return d


def _tfds_source(data_dir, extra=""):
    return ("pretrain/bert_pretraining_task.format = 'tfds'\n"
            "pretrain/bert_pretraining_task.tfds_name = 'my_docs:1.0.0'\n"
            f"pretrain/bert_pretraining_task.tfds_data_dir = '{data_dir}'\n" + extra)


def test_a_local_tfds_dataset_is_fingerprinted_by_its_files(write, tmp_path):
    data_dir = str(tmp_path / "tfds")
    d = _prepared_tfds(data_dir)
    exp = _experiment(write, imports="", source=_tfds_source(data_dir))
    pre = _preprocess(compile_experiment([exp]).plan)
    assert pre.params["tfds_data_dir"] == data_dir and "modules" not in pre.inputs
    with open(os.path.join(d, "my_docs-train.tfrecord-00000-of-00001"), "ab") as f:
        f.write(b"more")
    assert _preprocess(compile_experiment([exp]).plan).fingerprint != pre.fingerprint


def test_tfds_errors_name_what_is_missing(write, tmp_path):
    data_dir = str(tmp_path / "tfds")
    with pytest.raises(UserError, match=r"'my_docs:1.0.0' is not prepared in"):
        compile_experiment([_experiment(write, imports="", source=_tfds_source(data_dir))])
    _prepared_tfds(data_dir)
    with pytest.raises(UserError, match=r"has no split 'validation'.*\n.*\n.*\n.*its splits: "
                                        r"test, train"):
        compile_experiment([_experiment(write, imports="", source=_tfds_source(
            data_dir, "pretrain/bert_pretraining_task.validation_split = 'validation'\n"))])
    plan = compile_experiment([_experiment(write, imports="", source=_tfds_source(
        data_dir, "pretrain/bert_pretraining_task.validation_split = 'test[:50%]'\n"))]).plan
    assert any(s.kind == "evaluate" for s in plan.stages)
    with pytest.raises(UserError, match=r"tfds_name is not set"):
        compile_experiment([_experiment(write, imports="", source="pretrain/"
                                        "bert_pretraining_task.format = 'tfds'\n")])


def test_a_tfds_dataset_on_gcs_is_checked_at_run_time(write):
    exp = _experiment(write, imports="", source=_tfds_source("gs://bucket/tfds"))
    pre = _preprocess(compile_experiment([exp]).plan)
    assert "checked at run time" in pre.provenance["tfds_data_dir"]
    assert pre.params["tfds_data_dir"] == "gs://bucket/tfds"


def test_the_dry_run_imports_neither_tensorflow_seqio_nor_the_users_module(write, project):
    marker = os.path.join(write.dir, "imported")
    code = ("import sys\nfrom runexp.compiler.cli import main\n"
            f"rc = main(['--gin_file={_experiment(write)}', '--dry_run'])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'seqio', 'tensorflow_datasets', 'my_project'))\n"
            "print('HEAVY', heavy, 'RC', rc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=write.dir, capture_output=True,
                         text=True, env={**os.environ, "RUNEXP_TEST_IMPORTED": marker})
    assert "HEAVY [] RC 2" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert "<- modules:" in out.stdout
    assert not os.path.exists(marker)
