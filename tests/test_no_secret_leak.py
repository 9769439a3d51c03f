"""Credentials in the environment never end up in anything runexp writes.

A tiny quickstart runs end to end through the `runexp` command on a gs:// output root (the
loopback GCS server) with fake credentials and tokens in its environment, each a unique
marker; then every file it wrote is read as bytes: the objects in the bucket, the local
mirror cache, the --plan_out file, its stdout and stderr, and its HOME and TMPDIR (fresh
directories, so a stray write there is seen too). None may contain a marker.
"""

import json
import os
import subprocess
import uuid

import pytest

from runexp.runtime import storage
from tests.support.cli import cli_args

pytestmark = pytest.mark.e2e

# The quickstart at its smallest: every stage runs, each for a step or two.
TINY = [
    "VOCAB_SIZE=500", "MAX_SEQ_LENGTH=32", "MAX_PREDICTIONS_PER_SEQ=5", "DUPE_FACTOR=1",
    "BATCH_SIZE=8", "TRAIN_STEPS=2", "WARMUP_STEPS=1", "CHECKPOINT_EVERY=2",
    "train.log_every=1", "model.hidden_size=32", "model.num_hidden_layers=1",
    "model.num_attention_heads=1", "evaluate.max_examples=16", "FINETUNE_STEPS=2",
    "FINETUNE_BATCH_SIZE=8", "finetune.warmup_steps=1", "finetune.max_seq_length=32",
    "vocab.max_sentences=2000",
]
TOKEN_VARIABLES = ["GOOGLE_OAUTH_ACCESS_TOKEN", "CLOUDSDK_AUTH_ACCESS_TOKEN",
                   "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN",
                   "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY"]


def _marker(what: str) -> str:
    return f"leakmarker-{what}-{uuid.uuid4().hex}"


def _fake_credentials(path) -> dict:
    """A service-account key file with recognisable fake secrets; returns {name: marker}."""
    markers = {"private_key": _marker("private-key"), "private_key_id": _marker("key-id"),
               "client_email": _marker("client-email")}
    path.write_text(json.dumps({
        "type": "service_account", "project_id": "runexp-leak-test",
        "private_key_id": markers["private_key_id"],
        "private_key": "-----BEGIN PRIVATE KEY-----\n" + markers["private_key"]
                       + "\n-----END PRIVATE KEY-----\n",
        "client_email": markers["client_email"] + "@runexp-leak-test.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": "http://127.0.0.1:9/token"}))
    return markers


def _found(data: bytes, markers: dict) -> list[str]:
    return [name for name, marker in markers.items() if marker.encode() in data]


def _local_files(*roots) -> list[str]:
    out = []
    for root in roots:
        if os.path.isfile(root):
            out.append(str(root))
        for dirpath, _, names in os.walk(root):
            out.extend(os.path.join(dirpath, n) for n in names
                       if not os.path.islink(os.path.join(dirpath, n)))
    return out


def test_no_credential_or_token_in_anything_runexp_writes(gcs_prefix, tmp_path):
    secrets_dir, home, tmp, cache = (tmp_path / d for d in ("secrets", "home", "tmp", "cache"))
    for d in (secrets_dir, home, tmp):
        d.mkdir()
    key_file = secrets_dir / "service-account.json"
    markers = _fake_credentials(key_file)
    env = dict(os.environ, GOOGLE_APPLICATION_CREDENTIALS=str(key_file), HOME=str(home),
               TMPDIR=str(tmp), RUNEXP_CACHE_DIR=str(cache))
    for name in TOKEN_VARIABLES:
        markers[name] = env[name] = _marker(name.lower())
    # The scan finds a marker where there is one (the key file holds three).
    assert len(_found(key_file.read_bytes(), markers)) == 3

    root, plan_file = f"{gcs_prefix}/exp", tmp_path / "plan.json"
    # Bytes, not text: the logs are scanned as written.
    proc = subprocess.run(cli_args(f"--plan_out={plan_file}", gin_file="quickstart.gin",
                                   root=root, params=TINY),
                          env=env, capture_output=True, timeout=600)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "stdout").write_bytes(proc.stdout)
    (logs / "stderr").write_bytes(proc.stderr)
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-3000:]).decode(
        errors="replace")

    leaks = {}
    remote = storage.list(root)
    assert any(u.endswith("/export/COMPLETED") for u in remote), remote  # it all ran
    for uri in remote:
        leaks[uri] = _found(storage.read_bytes(uri), markers)
    local = _local_files(cache, plan_file, logs, home, tmp)
    assert any("checkpoints" in p for p in local) and str(plan_file) in local
    for path in local:
        with open(path, "rb") as f:
            leaks[path] = _found(f.read(), markers)
    leaks = {where: names for where, names in leaks.items() if names}
    assert not leaks, f"secrets found in files runexp wrote: {leaks}"
