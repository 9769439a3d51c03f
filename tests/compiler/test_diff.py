"""`runexp diff OLD NEW`: values by stage and parameter with their file:line, the stages a
change rebuilds, two runs' metrics side by side, and exit codes a script can branch on."""

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys

from runexp.compiler.cli import main
from runexp.compiler.diff_metrics import METRICS_FILE
from runexp.compiler.exit_codes import EXIT_DIFFERENT, EXIT_OK, EXIT_USER_ERROR
from runexp.compiler.gcs_inputs import SKIP_ENV
from runexp.compiler.loader import installed_gin_dir
from runexp.compiler.plan import COMPLETED_FILE, MANIFEST_FILE
from runexp.compiler.planner import compile_experiment
from runexp.runtime.executor import _manifest  # how the executor writes MANIFEST.json
from runexp.runtime.report.collect import PLAN_FILE
from tests.support.cli import run_cli

QUICKSTART = os.path.join(installed_gin_dir(), "quickstart.gin")


def _line_of(path, prefix) -> int:
    with open(path, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if line.startswith(prefix))


def _changed_copy(tmp_path, name="changed.gin", output_root=None):
    """quickstart.gin with a comment and a binding that changes nothing inserted near the
    top (every later line moves down by two), and two values changed: the pretraining
    learning rate and the fine-tuning one."""
    with open(QUICKSTART, encoding="utf-8") as f:
        text = f.read()
    assert "LEARNING_RATE = 1e-3" in text and "FINETUNE_LEARNING_RATE = 1e-4" in text
    text = text.replace("include 'runs/pretrain_finetune.gin'",
                        "# A copy with two values changed.\nDUPE_FACTOR = 3\n"
                        "include 'runs/pretrain_finetune.gin'")
    text = text.replace("\nLEARNING_RATE = 1e-3", "\nLEARNING_RATE = 2e-3")
    text = text.replace("FINETUNE_LEARNING_RATE = 1e-4", "FINETUNE_LEARNING_RATE = 5e-5")
    if output_root:
        text = text.replace("OUTPUT_ROOT = 'runexp_output/quickstart'",
                            f"OUTPUT_ROOT = '{output_root}'")
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _entries(out: str, section: str) -> list[str]:
    """The indented lines of one section of the output."""
    lines = out.split(section, 1)[1].splitlines()[1:]
    return [line.strip() for line in lines[:next((i for i, l in enumerate(lines) if not l),
                                                   len(lines))]]


def test_two_changed_values_and_an_inserted_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    copy = _changed_copy(tmp_path)
    rc = main(["diff", "quickstart.gin", "changed.gin"])
    out = capsys.readouterr().out
    assert rc == EXIT_DIFFERENT == 4

    old_lr, new_lr = _line_of(QUICKSTART, "LEARNING_RATE"), _line_of(copy, "LEARNING_RATE")
    old_ft = _line_of(QUICKSTART, "FINETUNE_LEARNING_RATE")
    new_ft = _line_of(copy, "FINETUNE_LEARNING_RATE")
    assert new_lr == old_lr + 2 and new_ft == old_ft + 2  # the lines moved
    values = _entries(out, "Values:")
    # Exactly the two values, each with its file:line on either side: a line-based diff
    # would list every binding below the inserted lines.
    assert values == [
        (f"~ pretrain.learning_rate: 0.001 (gin/quickstart.gin:{old_lr}) -> 0.002 "
         f"(changed.gin:{new_lr})"),
        (f"~ finetune.stdlib_package.learning_rate: 0.0001 (gin/quickstart.gin:{old_ft}) -> "
         f"5e-05 (changed.gin:{new_ft})"),
    ]
    equal = int(re.search(r"Values: 2 differ \((\d+) equal, not shown\)", out).group(1))
    assert equal > 100  # DUPE_FACTOR, moved to another line, is one of them

    stages = {line.split()[1]: line for line in _entries(out, "Stages, if NEW")[:-1]}
    for reused in ("corpus", "vocab", "preprocess.pretrain"):
        assert stages[reused].startswith(f"= {reused}") and "reused" in stages[reused]
    assert "rebuilt: its own values changed (learning_rate)" in stages["pretrain"]
    assert "upstream" not in stages["pretrain"]
    assert "rebuilt: only because upstream changed: pretrain" in stages["evaluate"]
    assert ("rebuilt: its own values changed (learning_rate); upstream changed too: "
            "pretrain") in stages["finetune.stdlib_package"]
    assert "only because upstream changed: pretrain, finetune.stdlib_package" in \
        stages["export"]
    assert "4 rebuilt, 3 reused." in out


def test_a_preprocessing_value_rebuilds_from_the_data_on_and_keeps_the_vocab(tmp_path):
    from runexp.compiler.diff import load_side
    from runexp.compiler.plan_diff import diff_plans

    changed = tmp_path / "masking.gin"
    changed.write_text(f"include '{QUICKSTART}'\n\nMASKED_LM_PROB = 0.2\n")
    old, new = load_side(QUICKSTART), load_side(str(changed))
    d = diff_plans(old.plan, new.plan)
    assert [(c.key, c.old, c.new, c.new_where) for c in d.values] == [
        ("preprocess.pretrain.masked_lm_prob", 0.15, 0.2, f"{changed}:3")]
    assert d.values[0].old_where.startswith("gin/runs/pretrain.gin:")
    actions = {s.id: (s.action, s.own, s.upstream) for s in d.stages}
    assert actions["vocab"][0] == "reuse" and actions["corpus"][0] == "reuse"
    assert actions["preprocess.pretrain"] == ("rebuild", ("masked_lm_prob",), ())
    assert actions["pretrain"] == ("rebuild", (), ("preprocess.pretrain",))


def test_only_more_steps_continues_training_and_launch_settings_are_compared(tmp_path):
    from runexp.compiler.diff import load_side
    from runexp.compiler.plan_diff import diff_plans

    changed = tmp_path / "longer.gin"
    changed.write_text(f"include '{QUICKSTART}'\nTRAIN_STEPS = 3000\n"
                       "experiment.max_attempts = 3\n")
    d = diff_plans(load_side(QUICKSTART).plan, load_side(str(changed)).plan)
    assert {c.key: (repr(c.old), repr(c.new)) for c in d.values} == {
        "experiment.max_attempts": ("1", "3"), "pretrain.train_steps": ("2400", "3000")}
    pretrain = next(s for s in d.stages if s.id == "pretrain")
    assert pretrain.action == "resume" and "OLD's checkpoints" in pretrain.reason


def test_a_file_against_itself_is_the_same(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["diff", "quickstart.gin", QUICKSTART]) == EXIT_OK == 0
    out = capsys.readouterr().out
    assert "Values: 0 differ" in out and "7 reused." in out
    assert out.rstrip().endswith("Same: nothing differs.")
    assert SKIP_ENV not in os.environ  # the offline compile left the environment as it was


def test_a_missing_file_is_one_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["diff", "quickstart.gin", "no_such.gin"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "cannot read NEW, no_such.gin" in err
    assert "gin file 'no_such.gin' not found" in err and "hint:" in err
    assert main(["diff", "no_such_dir", "quickstart.gin"]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "cannot read OLD, no_such_dir" in err and "does not exist" in err
    (tmp_path / "empty").mkdir()
    assert main(["diff", "empty", "quickstart.gin"]) == EXIT_USER_ERROR
    assert "no plan.json" in capsys.readouterr().err


def test_through_the_command_no_tensorflow_and_no_storage(tmp_path):
    """gs:// inputs are not listed (the --dry_run --offline compile): no storage client (and so
    no credentials or network), no TensorFlow, and no traceback for a bad gin file."""
    for name, dupe in (("a.gin", 3), ("b.gin", 5)):
        (tmp_path / name).write_text(f"include 'quickstart.gin'\nCORPUS_FILES = "
                                     f"'gs://no-such-bucket/corpus/*.txt'\nDUPE_FACTOR = {dupe}\n")
    code = ("import sys\nfrom runexp.compiler.cli import main\n"
            "rc = main(['diff', 'a.gin', 'b.gin'])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'seqio', 'jax', 'keras') or m.startswith('google.cloud'))\n"
            "print('HEAVY', heavy, 'RC', rc)\n")
    env = {k: v for k, v in os.environ.items() if k != SKIP_ENV}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env=env).stdout
    assert "HEAVY [] RC 4" in out
    assert "~ preprocess.pretrain.dupe_factor: 3 (a.gin:3) -> 5 (b.gin:3)" in out
    (tmp_path / "bad.gin").write_text("include 'quickstart.gin'\ntrain.stepz = 3\n")
    proc = run_cli("diff", "a.gin", "bad.gin", cwd=tmp_path, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "cannot read NEW, bad.gin" in proc.stderr
    assert "bad.gin:2: error: 'train' has no parameter 'stepz'" in proc.stderr


def _runtime_constant(module: str, name: str) -> str:
    """A constant of a runtime module, read from its source (importing it loads TensorFlow)."""
    with open(importlib.util.find_spec(module).origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == name for t in node.targets))


def test_the_metrics_file_name_is_the_runtime_s():
    for module in ("runexp.runtime.stages.evaluate", "runexp.runtime.stages.finetune"):
        assert _runtime_constant(module, "METRICS_FILE") == METRICS_FILE


def _finished_root(gin_path, evaluate: dict, finetune: dict | None) -> str:
    """An output root as a run leaves it: plan.json, and in each stage directory
    MANIFEST.json and COMPLETED as runtime/executor.py writes them, with the metrics.json
    of the evaluate and finetune stages (their keys as runtime/stages/*.py write them).
    ``finetune`` None: that stage (and the export after it) never finished."""
    plan = compile_experiment([str(gin_path)]).plan
    os.makedirs(plan.output_root)
    with open(os.path.join(plan.output_root, PLAN_FILE), "w") as f:
        f.write(plan.to_json())
    for stage in plan.stages:
        metrics = {"evaluate": evaluate, "finetune": finetune}.get(stage.kind)
        if stage.kind in ("finetune", "export") and finetune is None:
            continue
        os.makedirs(stage.output_dir)
        if metrics is not None:
            with open(os.path.join(stage.output_dir, METRICS_FILE), "w") as f:
                json.dump(metrics, f)
        with open(os.path.join(stage.output_dir, MANIFEST_FILE), "w") as f:
            json.dump(_manifest(stage, metrics or {}, 1.0), f)
        with open(os.path.join(stage.output_dir, COMPLETED_FILE), "w") as f:
            f.write(stage.fingerprint + "\n")
    return plan.output_root


def _evaluate(mlm_accuracy, mlm_loss, nsp_accuracy):
    return {"mlm_accuracy": mlm_accuracy, "mlm_loss": mlm_loss, "nsp_accuracy": nsp_accuracy,
            "examples": 2000, "majority_token_accuracy": 0.04, "majority_token_id": 14,
            "step": 2400}


def _finetune(accuracy):
    return {"accuracy": accuracy, "majority_baseline": 0.23, "num_labels": 6,
            "dev_sets": {"dev": {"accuracy": accuracy, "majority_baseline": 0.23,
                                 "examples": 648}},
            "dev_examples": 648, "train_examples": 3441, "step": 600,
            "majority_label": "tkinter", "labels": ["a", "b"], "train_loss": 1.5,
            "initialised_from": "pretrain/checkpoints/ckpt-2400"}


def test_two_finished_runs_show_their_metrics_side_by_side(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old_gin = tmp_path / "old.gin"
    old_gin.write_text(f"include '{QUICKSTART}'\nOUTPUT_ROOT = '{tmp_path}/run_old'\n")
    new_gin = _changed_copy(tmp_path, output_root=f"{tmp_path}/run_new")
    old_root = _finished_root(old_gin, _evaluate(0.30, 4.50, 0.80), _finetune(0.50))
    new_root = _finished_root(new_gin, _evaluate(0.35, 4.20, 0.78), _finetune(0.55))
    assert main(["diff", old_root, new_root]) == EXIT_DIFFERENT
    out = capsys.readouterr().out
    assert "7 of 7 stages done" in out
    metrics = [" ".join(line.split()) for line in _entries(out, "Metrics (OLD -> NEW")]
    assert metrics == [
        "evaluate held-out MLM accuracy 0.3000 -> 0.3500 +0.0500 better",
        "evaluate held-out MLM loss 4.5000 -> 4.2000 -0.3000 better",
        "evaluate held-out NSP accuracy 0.8000 -> 0.7800 -0.0200 worse",
        "finetune.stdlib_package dev accuracy 0.5000 -> 0.5500 +0.0500 better",
    ]
    # Values and stages as for the gin files: the roots' own paths are not a difference.
    assert len(_entries(out, "Values:")) == 2 and "4 rebuilt, 3 reused." in out

    # A run whose fine-tune never finished: its metric is missing, and a stage equal on
    # both sides that OLD never finished is created, not reused.
    unfinished = tmp_path / "unfinished.gin"
    unfinished.write_text(f"include '{QUICKSTART}'\nOUTPUT_ROOT = '{tmp_path}/run_part'\n")
    part_root = _finished_root(unfinished, _evaluate(0.30, 4.50, 0.80), None)
    assert main(["diff", part_root, old_root]) == EXIT_OK  # the same experiment
    out = capsys.readouterr().out
    assert "5 of 7 stages done" in out
    assert "+ finetune.stdlib_package created: the same as OLD's, but OLD never finished " \
           "it" in " ".join(out.split())
    assert "finetune.stdlib_package dev accuracy — -> 0.5000" in \
        [" ".join(line.split()) for line in _entries(out, "Metrics (OLD -> NEW")]


def test_a_run_on_gcs_is_read_like_a_local_one(tmp_path, capsys, monkeypatch, gcs_prefix):
    """A gs:// output root, read through runexp's storage layer (an emulated bucket)."""
    from runexp.runtime import storage

    monkeypatch.chdir(tmp_path)
    old_gin = tmp_path / "old.gin"
    old_gin.write_text(f"include '{QUICKSTART}'\nOUTPUT_ROOT = '{tmp_path}/run_old'\n")
    new_gin = _changed_copy(tmp_path, output_root=f"{tmp_path}/run_new")
    old_root = _finished_root(old_gin, _evaluate(0.30, 4.50, 0.80), _finetune(0.50))
    new_root = _finished_root(new_gin, _evaluate(0.35, 4.20, 0.78), _finetune(0.55))
    storage.upload_dir(new_root, gcs_prefix)
    assert main(["diff", old_root, gcs_prefix + "/"]) == EXIT_DIFFERENT
    out = capsys.readouterr().out
    assert f"NEW: {gcs_prefix} (run of experiment 'changed', 7 of 7 stages done)" in out
    assert "evaluate held-out MLM accuracy 0.3000 -> 0.3500 +0.0500 better" in \
        [" ".join(line.split()) for line in _entries(out, "Metrics (OLD -> NEW")]
    assert main(["diff", gcs_prefix + "/no_such_run", old_root]) == EXIT_USER_ERROR
    assert "no plan.json" in capsys.readouterr().err


def test_a_stage_one_side_does_not_have(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "no_finetune.gin").write_text("include 'quickstart.gin'\n"
                                              "finetune.task = None\nexport.enabled = False\n")
    assert main(["diff", "quickstart.gin", "no_finetune.gin"]) == EXIT_DIFFERENT
    out = capsys.readouterr().out
    values = _entries(out, "Values:")
    assert values[0] == ("- stage finetune.stdlib_package (finetune): only in OLD; the values "
                         "a file or flag set:")
    lr = _line_of(QUICKSTART, "FINETUNE_LEARNING_RATE")
    assert f"- finetune.stdlib_package.learning_rate: 0.0001 (gin/quickstart.gin:{lr})" in values
    assert "- stage export (export): only in OLD; the values a file or flag set:" in values
    assert not any("warmup_steps" in v and "finetune" not in v for v in values)
    stages = _entries(out, "Stages, if NEW")
    assert any(line.startswith("- finetune.stdlib_package") and "dropped" in line
               for line in stages)
    assert stages[-1] == "2 dropped, 5 reused."
