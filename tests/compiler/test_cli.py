"""The runexp command: dry runs, exit codes, search paths, and the no-TensorFlow rule."""

import json
import os
import subprocess
import sys

from runexp.compiler.cli import main
from tests.support.cli import run_cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dry_run_imports_neither_tensorflow_nor_seqio(tmp_path):
    code = ("import sys\nfrom runexp.compiler.cli import main\n"
            "rc = main(['--gin_file=quickstart.gin', '--dry_run'])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'seqio', 'jax', 'keras'))\n"
            "print('HEAVY', heavy, 'RC', rc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert "HEAVY [] RC 2" in out
    assert "Plan: 7 to create." in out


def test_dry_run_works_from_any_directory_and_prints_the_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(["--gin_file=quickstart.gin", "--dry_run", "--gin_param=TRAIN_STEPS=300"])
    out = capsys.readouterr().out
    assert rc == 2  # work pending
    assert "+ corpus  (corpus)  will be created" in out
    assert "train_steps = 300   # --gin_param[1]:1" in out
    assert "This was a dry run: nothing was executed or written." in out
    assert not os.path.exists(tmp_path / "runexp_output")


def test_json_plan_format(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--gin_file=quickstart.gin", "--dry_run", "--plan_format=json",
                 f"--plan_out={tmp_path}/plan.json"]) == 2
    printed = json.loads(capsys.readouterr().out)
    assert printed["actions"]["corpus"]["action"] == "create"
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert [s["id"] for s in saved["stages"]] == [s["id"] for s in printed["stages"]]


def test_user_error_exits_1_without_traceback(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text("include 'quickstart.gin'\ntrain.stepz = 3\n")
    proc = run_cli("--dry_run", gin_file=bad, cwd=tmp_path)
    assert proc.returncode == 1
    assert "bad.gin:2: error: 'train' has no parameter 'stepz'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_flag_is_a_user_error(capsys):
    try:
        main(["--gin_fil=x.gin"])
    except SystemExit as e:
        assert e.code == 1
    else:
        raise AssertionError("expected SystemExit")


def test_gin_search_path_finds_files_and_includes(tmp_path, capsys, monkeypatch):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "mine.gin").write_text("include 'quickstart.gin'\nTRAIN_STEPS = 7\n")
    monkeypatch.chdir(tmp_path)
    assert main(["--gin_file=mine.gin", f"--gin_search_path={configs}",
                 "--explain=TRAIN_STEPS"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("TRAIN_STEPS = 7\n")
    assert "mine.gin:2" in out and "overrides 2400 @ gin/quickstart.gin:" in out


def test_explain_unknown_name_suggests(capsys):
    assert main(["--gin_file=quickstart.gin", "--explain=TRAIN_STEP"]) == 1
    assert "did you mean 'TRAIN_STEPS'" in capsys.readouterr().out


def test_saved_plan_runs_as_is_and_is_refused_after_an_input_changed(write, minimal, capsys):
    saved = f"{write.dir}/plan.json"
    assert main([f"--gin_file={minimal}", "--dry_run", f"--plan_out={saved}"]) == 2
    assert main([f"--plan_file={saved}", "--dry_run"]) == 2
    assert capsys.readouterr().out.count("Plan: 5 to create.") == 2
    with open(write.corpus, "a") as f:
        f.write("\nA changed corpus.\n")
    assert main([f"--plan_file={saved}", "--dry_run"]) == 1
    err = capsys.readouterr().err
    assert "plan.json: error: the world changed since this plan was saved: stage(s) " \
           "evaluate, export, preprocess.pretrain, pretrain, vocab would now be built" in err


def test_status_of_a_directory_without_an_experiment(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 1
    assert "holds no runexp experiment (no plan.json)" in capsys.readouterr().err


def test_status_of_a_run_stopped_by_its_wall_time_budget(tmp_path, capsys):
    """The stop record the trainer writes (runtime/train_log.py) is what status reads."""
    from runexp.compiler.planner import compile_experiment

    corpus = tmp_path / "c.txt"
    corpus.write_text("One sentence.\nAnother.\n\nA second document.\n")
    gin = tmp_path / "e.gin"
    gin.write_text(f"include 'runs/pretrain.gin'\ninclude 'models/bert_tiny.gin'\n"
                   f"OUTPUT_ROOT = '{tmp_path}/out'\nCORPUS_FILES = '{corpus}'\n")
    plan = compile_experiment([str(gin)]).plan
    os.makedirs(f"{tmp_path}/out/pretrain/checkpoints")
    with open(f"{tmp_path}/out/plan.json", "w") as f:
        f.write(plan.to_json())
    with open(f"{tmp_path}/out/pretrain/checkpoints/checkpoint", "w") as f:
        f.write('model_checkpoint_path: "ckpt-40"\n')
    with open(f"{tmp_path}/out/pretrain/train_log.jsonl", "w") as f:
        f.write(json.dumps({"step": 40, "loss": 7.1}) + "\n")
        f.write(json.dumps({"step": 40, "event": "deadline_stop",
                            "deadline_seconds_left": 12.4, "margin_s": 30.0}) + "\n")
        f.write('{"step": 41, "loss"')  # a line cut by a kill is skipped
    assert main(["status", f"{tmp_path}/out"]) == 2
    out = capsys.readouterr().out
    assert "not done (latest checkpoint: step 40 of 100000)" in out
    assert ("stopped at the wall-time budget: the checkpoint of step 40 was complete 12 s "
            "before the deadline; run the same command again to continue") in out
