"""Outputs stay under the declared output root: ``storage.confined`` and the executor's
check of a plan before it writes anything."""

import os

import pytest

from runexp.compiler.plan import Plan, Stage
from runexp.runtime import executor, storage


@pytest.fixture
def root(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    return str(out)


def outside(root, path):
    with pytest.raises(storage.OutsideRootError) as info:
        storage.confined(root, path)
    assert path in str(info.value) and info.value.uri
    return str(info.value)


def test_paths_under_the_root_are_accepted(root):
    os.makedirs(os.path.join(root, "pretrain"))
    os.symlink(os.path.join(root, "pretrain"), os.path.join(root, "latest"))  # stays inside
    for path in (root, os.path.join(root, "pretrain"), os.path.join(root, "not", "yet"),
                 os.path.join(root, "a", "..", "vocab"), os.path.join(root, "latest")):
        assert storage.confined(root, path) == path


def test_dot_dot_escapes_are_refused_naming_the_path(root):
    outside(root, os.path.join(root, "..", "elsewhere"))
    outside(root, os.path.join(root, "pretrain", "..", "..", "elsewhere"))
    # A sibling whose name starts with the root's is outside too.
    outside(root, root + "2")


def test_a_stage_directory_symlinked_out_of_the_root_is_refused(root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, os.path.join(root, "pretrain"))
    message = outside(root, os.path.join(root, "pretrain"))
    assert f"resolves to {elsewhere}" in message
    outside(root, os.path.join(root, "pretrain", "checkpoints"))


@pytest.mark.parametrize("link", ["checkpoints", "train_log.jsonl"])
def test_a_symlink_inside_a_stage_directory_leading_out_is_refused(root, tmp_path, link):
    target = tmp_path / "elsewhere"
    if link == "checkpoints":
        target.mkdir()
    else:
        target.write_text("not runexp's\n")
    stage = os.path.join(root, "pretrain", "sub")
    os.makedirs(stage)
    os.symlink(target, os.path.join(stage, link))
    with pytest.raises(storage.OutsideRootError, match="symlink leading outside") as info:
        storage.confined(root, os.path.join(root, "pretrain"))
    assert info.value.uri == os.path.join(stage, link)
    assert str(target) in str(info.value)


def test_gcs_keys_stay_under_the_root():
    root = "gs://bucket/exps/run1"
    for path in (root, root + "/", root + "/pretrain/checkpoints/ckpt-2.index"):
        assert storage.confined(root, path) == path
    assert storage.confined("gs://bucket", "gs://bucket/anything")
    for path in ("gs://bucket/exps/run1/../run2/x", "gs://bucket/exps/run1/a/../../x",
                 "gs://bucket/exps/run1/./x", "gs://bucket/exps/run10/x",
                 "gs://bucket/exps/x", "gs://other/exps/run1/x", "/tmp/exps/run1/x"):
        outside(root, path)
    # A root with such a segment is refused, naming the root.
    with pytest.raises(storage.OutsideRootError, match=r"gs://bucket/exps/\.\./run1 has"):
        storage.confined("gs://bucket/exps/../run1", "gs://bucket/exps/../run1/x")


def _plan(root: str, stage_id: str = "vocab", output_dir: str | None = None) -> Plan:
    join = storage.join if storage.is_gcs(root) else os.path.join
    stage = Stage(id=stage_id, kind="vocab", params={}, inputs={},
                  output_dir=output_dir or join(root, stage_id), fingerprint="f")
    return Plan(experiment="confinement", output_root=root, stages=(stage,),
                accelerator={"type": "cpu"})


def test_the_executor_refuses_a_plan_escaping_the_root_before_writing(tmp_path, capsys):
    root = str(tmp_path / "out")
    escaped = os.path.join(root, "..", "escaped")
    assert executor.run_plan(_plan(root, output_dir=escaped)) == executor.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert escaped in err and "outside the output root" in err
    assert not os.path.exists(root) and not os.path.exists(tmp_path / "escaped")

    # A stage id that is a path out of the root (a hand-edited plan file) is refused too.
    assert executor.run_plan(_plan(root, stage_id="../escaped")) == executor.EXIT_USER_ERROR
    assert not os.path.exists(root) and not os.path.exists(tmp_path / "escaped")


def test_the_executor_refuses_a_stage_directory_symlinked_out(root, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, os.path.join(root, "vocab"))
    assert executor.run_plan(_plan(root)) == executor.EXIT_USER_ERROR
    assert os.path.join(root, "vocab") in capsys.readouterr().err
    assert os.listdir(elsewhere) == [] and os.listdir(root) == ["vocab"]


def test_the_executor_refuses_a_gcs_plan_escaping_the_root(gcs_prefix, capsys):
    root = storage.join(gcs_prefix, "exp")
    plan = _plan(root, stage_id="../escaped")
    assert executor.run_plan(plan) == executor.EXIT_USER_ERROR
    assert f"{root}/../escaped" in capsys.readouterr().err
    assert storage.list(gcs_prefix) == []


def test_a_gcs_input_with_dot_segments_is_not_copied_out_of_the_cache(tmp_path, monkeypatch):
    from runexp.runtime.gcs_mirror import Mirror

    monkeypatch.setenv("RUNEXP_CACHE_DIR", str(tmp_path / "cache"))
    mirror = Mirror(_plan("gs://bucket/exp"))
    assert mirror._input_path("gs://data/corpus/a.txt").startswith(str(tmp_path / "cache"))
    with pytest.raises(storage.OutsideRootError, match=r"'\.' or '\.\.' segment"):
        mirror._input_path("gs://data/corpus/../../../../x.txt")
