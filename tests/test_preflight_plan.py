"""Preflight in the plan, against the loopback GCS server: the dry run shows what was checked
and refuses what would fail hours later on the TPU; a real run stops before writing."""

import socket

import pytest

from runexp.compiler.cli import main
from runexp.runtime import storage
from tests.support.cli import run_cli

EXPERIMENT = """
include 'runs/finetune.gin'
include 'models/bert_tiny.gin'
include 'accelerators/tpu_v3_8.gin'
OUTPUT_ROOT = '{root}/out'
VOCAB = '{root}/uncased_L-2_H-128_A-2/vocab.txt'
INIT_CHECKPOINT = '{root}/uncased_L-2_H-128_A-2/bert_model.ckpt'
model.vocab_size = 30
FINETUNE_TASK = 'toy'
toy/classification_task.train_file = '{root}/data/train.tsv'
toy/classification_task.dev_files = {{'matched': '{root}/data/dev.tsv'}}
experiment.tpu_zone = 'europe-west4-a'
experiment.tpu_service_account = 'service-42@cloud-tpu.iam.gserviceaccount.com'
"""


@pytest.fixture
def remote(gcs_prefix):
    """The experiment's inputs on gs:// (contents do not matter to the preflight)."""
    for name in ("uncased_L-2_H-128_A-2/vocab.txt", "uncased_L-2_H-128_A-2/bert_model.ckpt.index",
                 "uncased_L-2_H-128_A-2/bert_model.ckpt.data-00000-of-00001",
                 "data/train.tsv", "data/dev.tsv"):
        storage.write_text(f"{gcs_prefix}/{name}", "x\n")
    return gcs_prefix


def _dry_run(tmp_path, capsys, root, *extra):
    gin = tmp_path / "e.gin"
    gin.write_text(EXPERIMENT.format(root=root))
    code = main([f"--gin_file={gin}", "--dry_run", *[f"--gin_param={p}" for p in extra]])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_dry_run_reports_the_storage_checks(remote, tmp_path, capsys):
    code, out, _ = _dry_run(tmp_path, capsys, remote)
    assert code == 2, out
    bucket = remote.split("/")[2]
    assert "Preflight (storage; see compiler/preflight.py):" in out
    assert f"    ok: bucket gs://{bucket} exists" in out
    assert f"    ok: can create and delete objects under {remote}/out" in out
    # The emulator's buckets are in US: a TPU in europe-west4 reads across regions.
    assert f"    WARNING: bucket gs://{bucket} is in US but compute runs in europe-west4" in out
    assert "    WARNING: the bucket policy of" in out and "service-42@" in out
    assert f"    ok: {remote}/uncased_L-2_H-128_A-2/bert_model.ckpt exists" in out
    assert f"    ok: {remote}/data/dev.tsv exists" in out
    assert "(but the preflight's probe object, deleted at once)" in out
    assert storage.list(f"{remote}/out") == []  # the probe is gone, nothing else written


def test_service_account_granted_on_the_bucket(remote, tmp_path, capsys):
    bucket = storage._client().bucket(remote.split("/")[2])
    policy = bucket.get_iam_policy()
    policy.bindings.append({"role": "roles/storage.objectAdmin",
                            "members": {"serviceAccount:service-42@cloud-tpu.iam.gserviceaccount.com"}})
    bucket.set_iam_policy(policy)
    try:
        _, out, _ = _dry_run(tmp_path, capsys, remote)
        assert "ok: the TPU service account service-42@cloud-tpu.iam.gserviceaccount.com can " \
               "read and write" in out
    finally:
        policy.bindings.pop()
        bucket.set_iam_policy(policy)


def test_missing_input_fails_the_dry_run_and_the_run_writes_nothing(remote, tmp_path, capsys):
    storage.delete(f"{remote}/data/dev.tsv")
    code, out, err = _dry_run(tmp_path, capsys, remote)
    assert code == 1
    assert f"    error: {remote}/data/dev.tsv matches no object: check the path" in out
    assert "error: preflight found 1 problem(s)" in err

    code = main([f"--gin_file={tmp_path / 'e.gin'}"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"error: {remote}/data/dev.tsv matches no object" in err
    assert storage.list(f"{remote}/out") == []


def test_missing_bucket_is_an_error(gcs_emulator, tmp_path, capsys):
    code, out, _ = _dry_run(tmp_path, capsys, "gs://no-such-bucket-runexp/exp")
    assert code == 1
    assert "error: bucket gs://no-such-bucket-runexp does not exist" in out


def test_offline_the_checks_are_skipped_with_a_note(tmp_path, capsys, monkeypatch,
                                                    fast_retries):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{s.getsockname()[1]}")
    code, out, _ = _dry_run(tmp_path, capsys, "gs://any-bucket/exp")
    assert code == 2, out
    assert "    skipped: cannot reach storage for gs://any-bucket" in out


def test_local_root_is_checked_without_writing(tmp_path, capsys):
    gin = tmp_path / "e.gin"
    gin.write_text(f"include 'runs/pretrain.gin'\ninclude 'models/bert_tiny.gin'\n"
                   f"OUTPUT_ROOT = '{tmp_path}/new/out'\nCORPUS_FILES = '{gin}'\n")
    main([f"--gin_file={gin}", "--dry_run"])
    out = capsys.readouterr().out
    assert f"    ok: can write under {tmp_path} (creates {tmp_path}/new/out)" in out
    assert not (tmp_path / "new").exists()


def _no_credentials_env(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")}
    env.update(HOME=str(tmp_path / "home"), NO_GCE_CHECK="True",
               CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    return env


def test_gcs_root_without_credentials_says_how_to_authenticate(tmp_path):
    env = _no_credentials_env(tmp_path)

    def runexp(*flags):
        return run_cli(*flags, gin_file="quickstart.gin", root="gs://some-bucket/exp", env=env,
                       timeout=300)

    run = runexp()
    assert run.returncode == 1, run.stdout + run.stderr
    assert "no Google credentials to reach gs://some-bucket/exp" in run.stderr
    assert "gcloud auth application-default login" in run.stderr
    assert "Traceback" not in run.stderr
    dry = runexp("--dry_run")
    assert dry.returncode == 1 and "add --offline to the dry run" in dry.stdout
    offline = runexp("--dry_run", "--offline")
    assert offline.returncode == 2, offline.stderr
    assert "skipped: offline planning (--offline)" in offline.stdout
    # The state on gs:// is not read either: each stage says so, not a credentials error.
    assert "why: not known: planned --offline (its state on gs:// was not read)" in offline.stdout
    assert "DefaultCredentialsError" not in offline.stdout
    refused = runexp("--offline")
    assert refused.returncode == 1 and "--offline only plans" in refused.stderr


def test_local_root_is_probed_by_writing(tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    code = main(["--gin_file=quickstart.gin", f"--gin_param=OUTPUT_ROOT='{tmp_path}/a-file/out'",
                 "--dry_run"])
    out = capsys.readouterr().out
    assert code == 1
    assert f"error: OUTPUT_ROOT {tmp_path}/a-file/out: {tmp_path}/a-file is a file" in out
    assert main(["--gin_file=quickstart.gin", f"--gin_param=OUTPUT_ROOT='{tmp_path}/new/out'",
                 "--dry_run"]) == 2
    assert f"ok: can write under {tmp_path} (creates {tmp_path}/new/out)" in \
        capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # the probe is gone


def test_gcs_corpus_without_credentials_is_one_error_before_anything_runs(tmp_path):
    """A local root reading a gs:// corpus, no credentials yet (a laptop before `gcloud auth
    application-default login`): one error saying how to authenticate, exit 1, nothing
    written; the plan marks the unlisted input and the fingerprints resting on it."""
    root, env = tmp_path / "out", _no_credentials_env(tmp_path)

    def runexp(*flags):
        return run_cli(*flags, gin_file="quickstart.gin", root=root,
                       params=["CORPUS_FILES='gs://some-bucket/corpus/*.txt'"], env=env,
                       timeout=300)

    dry = runexp("--dry_run")
    assert dry.returncode == 1, dry.stdout + dry.stderr
    assert ("error: cannot list gs://some-bucket/corpus/*.txt (no Google credentials found): "
            "run `gcloud auth application-default login`") in dry.stdout
    assert "gs://some-bucket/corpus/*.txt NOT LISTED (no Google credentials found)" in dry.stdout
    assert "(fingerprint " in dry.stdout and ", provisional: gs:// inputs not listed)" in dry.stdout
    assert "Inputs not listed: 1 gs:// input (no Google credentials found)" in dry.stdout
    assert "Traceback" not in dry.stderr

    run = runexp()
    assert run.returncode == 1, run.stdout + run.stderr
    assert "cannot list gs://some-bucket/corpus/*.txt (no Google credentials found)" in run.stderr
    assert "Traceback" not in run.stderr and "DefaultCredentialsError" not in run.stderr
    assert not root.exists()

    offline = runexp("--dry_run", "--offline")
    assert offline.returncode == 2, offline.stdout + offline.stderr
    assert "gs://some-bucket/corpus/*.txt NOT LISTED (planned --offline)" in offline.stdout


def test_unwritable_root_names_the_root_the_user_wrote(capsys):
    code = main(["--gin_file=quickstart.gin",
                 "--gin_param=OUTPUT_ROOT='/proc/runexp-hidden/exp1'", "--dry_run"])
    out = capsys.readouterr().out
    assert code == 1
    assert ("error: OUTPUT_ROOT /proc/runexp-hidden/exp1 is not writable: the file system "
            "there does not accept new files (creating a file in /proc, its nearest existing "
            "parent, failed)") in out
