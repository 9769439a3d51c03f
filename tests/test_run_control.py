"""Operating a run: part of a plan (--until/--only), one writer per root (the lock), live
status, and the CLI's conventions (t5x flag spellings, --version, the quoting hint, a
replayable operative_config.gin)."""

import json
import os
import signal
import subprocess
import time

import pytest

from runexp.compiler.cli import main
from runexp.runtime import run_lock
from tests.support.cli import cli_args, run_cli

pytestmark = pytest.mark.e2e

SMALL = ["VOCAB_SIZE=2000", "MAX_SEQ_LENGTH=64", "MAX_PREDICTIONS_PER_SEQ=10", "DUPE_FACTOR=1",
         "WARMUP_STEPS=4", "train.log_every=5", "vocab.max_sentences=20000",
         "evaluate.max_examples=64", "FINETUNE_STEPS=10", "finetune.warmup_steps=2"]


def _args(root, *extra):
    return cli_args(*extra, gin_file="quickstart.gin", root=root, params=SMALL)


def _run(root, *extra, timeout=900):
    return run_cli(*extra, gin_file="quickstart.gin", root=root, params=SMALL, timeout=timeout)


def _status(root):
    proc = run_cli("status", root, "--json", timeout=120)
    assert proc.returncode in (0, 2), proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_until_only_lock_and_live_status(tmp_path):
    root = str(tmp_path / "exp")
    # --until: the CPU-preprocess half of the preprocess-then-train workflow.
    proc = _run(root, "--until=preprocess", "--gin_param=TRAIN_STEPS=3000")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "skipped (after --until=preprocess)" in proc.stdout
    for stage in ("corpus", "vocab", "preprocess.pretrain"):
        assert os.path.isfile(os.path.join(root, stage, "COMPLETED")), stage
    assert not os.path.exists(os.path.join(root, "pretrain"))
    assert not os.path.exists(run_lock.lock_path(root)), "the lock is released at the end"

    # --only=pretrain, live: status shows the running stage with step, loss and ETA.
    live = subprocess.Popen(_args(root, "--only=pretrain", "--gin_param=TRAIN_STEPS=3000"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 600
        report = None
        while time.time() < deadline:
            report = _status(root)
            running = [s for s in report["stages"] if s["state"] == "running"]
            if running and running[0].get("step"):
                break
            assert live.poll() is None, live.stdout.read()[-3000:]
            time.sleep(2)
        stage = next(s for s in report["stages"] if s["state"] == "running")
        assert stage["id"] == "pretrain" and report["running"]["pid"] == live.pid
        assert stage["step"] > 0 and stage["loss"] > 0 and stage["eta_seconds"] > 0
        text = run_cli("status", root, timeout=120).stdout
        assert "running now: pid" in text and "ETA" in text

        # A second run on the same root is refused, with who holds it and what to do.
        second = _run(root, "--only=pretrain", "--gin_param=TRAIN_STEPS=3000")
        assert second.returncode == 1, second.stdout + second.stderr
        assert "another runexp run is writing" in second.stderr
        assert f"pid {live.pid}" in second.stderr and "runexp unlock" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        live.send_signal(signal.SIGKILL)  # no clean-up: the lock stays behind
        live.wait(60)
    assert os.path.exists(run_lock.lock_path(root))
    report = _status(root)
    assert report["running"] is None and "is gone" in report["stale_lock"]["reason"]
    # The next run takes the stale lock over by itself (the dead pid was on this host).
    proc = _run(root, "--until=preprocess", "--gin_param=TRAIN_STEPS=3000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not os.path.exists(run_lock.lock_path(root))


def test_only_refuses_a_stage_whose_input_is_not_finished(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["--gin_file=quickstart.gin", f"--gin_param=OUTPUT_ROOT='{tmp_path}/o'",
                 "--only=pretrain", "--dry_run"])
    err = capsys.readouterr().err
    assert code == 1
    assert "stage pretrain reads preprocess.pretrain, which is not finished" in err
    assert "--until=preprocess.pretrain" in err


def test_dry_run_shows_skipped_stages_and_unknown_names_get_a_suggestion(tmp_path, capsys):
    root = f"--gin_param=OUTPUT_ROOT='{tmp_path}/o'"
    assert main(["--gin_file=quickstart.gin", root, "--until=vocab", "--dry_run"]) == 2
    out = capsys.readouterr().out
    assert "- pretrain  (pretrain)  will be skipped" in out
    assert "+ vocab  (vocab)  will be created" in out
    assert "Plan: 2 to create, 5 to skip." in out
    assert main(["--gin_file=quickstart.gin", root, "--only=pretrian", "--dry_run"]) == 1
    assert "did you mean 'pretrain'" in capsys.readouterr().err


def test_lock_is_exclusive_and_stale_rules(tmp_path):
    root = str(tmp_path)
    lock = run_lock.RunLock.acquire(root, command="first")
    try:
        with pytest.raises(run_lock.LockHeld) as held:
            run_lock.RunLock.acquire(root)
        assert f"pid {os.getpid()}" in str(held.value)
        record = run_lock.read(root)
        assert run_lock.stale_reason(record) is None
        assert "heartbeat" in run_lock.stale_reason(record, now=time.time() + 3600)
        with pytest.raises(run_lock.LockHeld):
            run_lock.break_lock(root)  # live: refused without --force
    finally:
        lock.release()
    assert run_lock.read(root) is None
    # A lock whose heartbeat is old is taken over.
    old = {"host": "elsewhere", "pid": 1, "started": 0, "heartbeat": 0, "token": "x"}
    with open(run_lock.lock_path(root), "w") as f:
        json.dump(old, f)
    with run_lock.RunLock.acquire(root) as lock:
        assert run_lock.read(root)["token"] == lock.record["token"]


def test_lock_on_gcs_is_exclusive(gcs_prefix):
    root = gcs_prefix
    with run_lock.RunLock.acquire(root):
        with pytest.raises(run_lock.LockHeld):
            run_lock.RunLock.acquire(root)
    assert run_lock.read(root) is None


def test_t5x_flag_spellings_are_aliases(capsys):
    code = main(["--gin_file=quickstart.gin", "--gin.TRAIN_STEPS=7", "--gin_bindings",
                 "BATCH_SIZE=4", "--explain=TRAIN_STEPS", "--explain=BATCH_SIZE"])
    out = capsys.readouterr().out
    assert code == 0
    assert "TRAIN_STEPS = 7" in out and "BATCH_SIZE = 4" in out


def test_gin_search_paths_alias_splits_on_commas(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "mine.gin").write_text("include 'quickstart.gin'\nTRAIN_STEPS = 9\n")
    code = main([f"--gin_search_paths={tmp_path}/b,{tmp_path}/a", "--gin_file=mine.gin",
                 "--explain=TRAIN_STEPS"])
    assert code == 0 and "TRAIN_STEPS = 9" in capsys.readouterr().out


def test_version_and_help_list_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("runexp ")
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for sub in ("runexp status", "runexp inspect", "runexp report", "runexp unlock",
                "--gin.NAME=VALUE", "--until", "--only"):
        assert sub in out, sub


def test_unquoted_string_says_what_to_write(capsys):
    assert main(["--gin_file=quickstart.gin", "--gin_param=OUTPUT_ROOT=out", "--dry_run"]) == 1
    err = capsys.readouterr().err
    assert "'out' is not a gin value: strings need quotes" in err
    assert """--gin_param="OUTPUT_ROOT='out'\"""" in err
    assert "ast.Name" not in err


def test_operative_config_replays_the_same_plan_from_elsewhere(tmp_path, monkeypatch):
    from runexp.compiler.planner import compile_experiment

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.chdir(repo)
    first = compile_experiment(["gin/quickstart.gin"]).plan
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "operative_config.gin").write_text(first.operative_config)
    monkeypatch.chdir(elsewhere)
    replay = compile_experiment(["operative_config.gin"]).plan
    assert replay.experiment == first.experiment
    assert replay.output_root == first.output_root
    assert [(s.id, s.fingerprint) for s in replay.stages] == \
        [(s.id, s.fingerprint) for s in first.stages]
