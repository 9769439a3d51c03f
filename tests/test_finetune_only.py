"""A fine-tune-only experiment through the `runexp` command: no pretraining, the encoder
from a checkpoint laid out like Google's released BERTs (directory name, bert_config.json,
vocab.txt, bert_model.ckpt.*), several named dev sets, export of the fine-tuned model; on
the CPU split into 8 replicas (the cpu_x8 profile), on local disk and on gs://."""

import csv
import json
import os

import numpy as np
import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.e2e

POSITIVE, NEGATIVE = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "sad"]
FILLER = ["the", "movie", "was", "very", "plot", "acting", "and", "it"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
RELEASE = "uncased_L-2_H-128_A-2"  # Google's name for BERT-tiny (2 layers, hidden 128, 2 heads)


def _write_tsv(path, n, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["id", "sentence1", "sentence2", "gold_label"])
        for i in range(n):
            label = rng.choice(["yes", "no"])
            mood = POSITIVE if label == "yes" else NEGATIVE
            w.writerow([i, " ".join(rng.choice(FILLER, 4)),
                        " ".join(list(rng.choice(FILLER, 3)) + list(rng.choice(mood, 2))),
                        label])


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A released-checkpoint directory and task data: (release_dir, data_dir)."""
    from runexp.runtime import checkpoints
    from runexp.runtime.model import BertConfig, BertPretrainer

    base = tmp_path_factory.mktemp("finetune_only")
    release_dir = base / "google" / RELEASE
    release_dir.mkdir(parents=True)
    tokens = SPECIAL + POSITIVE + NEGATIVE + FILLER
    (release_dir / "vocab.txt").write_text("\n".join(tokens) + "\n")
    config = {"vocab_size": len(tokens), "hidden_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 512, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
              "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02}
    (release_dir / "bert_config.json").write_text(json.dumps(config))
    model = BertPretrainer(BertConfig.from_dict(config), seed=7)
    checkpoints.save_google_checkpoint(model.google_variables(),
                                       str(release_dir / "bert_model.ckpt"))
    data = base / "data"
    data.mkdir()
    _write_tsv(data / "train.tsv", 256, seed=1)
    _write_tsv(data / "dev_matched.tsv", 64, seed=2)
    _write_tsv(data / "dev_mismatched.tsv", 48, seed=3)
    return release_dir, data


EXPERIMENT = """
include 'runs/finetune.gin'
include 'models/bert_tiny.gin'
include 'accelerators/cpu_x8.gin'

OUTPUT_ROOT = '{root}'
VOCAB = '{release}/vocab.txt'
INIT_CHECKPOINT = '{release}/bert_model.ckpt'
FINETUNE_TASK = 'toy_nli'
toy_nli/classification_task.train_file = '{data}/train.tsv'
toy_nli/classification_task.dev_files = {{
    'matched': '{data}/dev_matched.tsv',
    'mismatched': '{data}/dev_mismatched.tsv',
}}
toy_nli/classification_task.text_fields = ['sentence1', 'sentence2']
toy_nli/classification_task.label_field = 'gold_label'
MAX_SEQ_LENGTH = 16
FINETUNE_STEPS = 60
FINETUNE_BATCH_SIZE = 16
FINETUNE_LEARNING_RATE = 1e-3
FINETUNE_WARMUP_STEPS = 6
"""


def _experiment(path, root, release, data):
    path.write_text(EXPERIMENT.format(root=root, release=release, data=data))
    return str(path)


def _check_metrics(metrics):
    assert list(metrics["dev_sets"]) == ["matched", "mismatched"]
    assert metrics["dev_sets"]["matched"]["examples"] == 64
    assert metrics["dev_sets"]["mismatched"]["examples"] == 48
    for scores in metrics["dev_sets"].values():
        assert scores["accuracy"] > scores["majority_baseline"] + 0.15, metrics


@pytest.mark.slow
def test_finetune_only_on_local_disk(release, tmp_path):
    release_dir, data = release
    root = tmp_path / "out"
    gin_file = _experiment(tmp_path / "exp.gin", root, release_dir, data)

    dry = run_cli("--dry_run", gin_file=gin_file)
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert "+ finetune.toy_nli" in dry.stdout and "pretrain" not in dry.stdout.replace(
        "runs/finetune", "")
    assert "Plan: 3 to create." in dry.stdout
    assert "Estimates for finetune.toy_nli" in dry.stdout

    proc = run_cli(gin_file=gin_file)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "finetune.toy_nli: dev set mismatched: accuracy" in proc.stdout, proc.stdout
    assert sorted(os.listdir(root)) == ["export", "finetune.toy_nli", "operative_config.gin",
                                        "plan.json", "vocab"]
    metrics = json.loads((root / "finetune.toy_nli" / "metrics.json").read_text())
    _check_metrics(metrics)
    assert metrics["initialised_from"] == f"{release_dir}/bert_model.ckpt"
    for name in ("matched", "mismatched"):
        assert (root / "finetune.toy_nli" / f"predictions.{name}.tsv").is_file()
    export = root / "export"
    assert (export / "encoder" / "saved_model.pb").is_file()
    assert (export / "classifier" / "saved_model.pb").is_file()
    assert (export / "bert_model.ckpt.index").is_file()
    exported = json.loads((export / "bert_config.json").read_text())
    assert exported["hidden_size"] == 128 and exported["num_hidden_layers"] == 2

    again = run_cli("--dry_run", gin_file=gin_file)
    assert again.returncode == 0 and "Plan: 3 to reuse." in again.stdout, again.stdout


@pytest.mark.slow
def test_finetune_only_on_gcs(release, gcs_prefix, tmp_path):
    """Everything on gs://: the released checkpoint (a prefix, not an object), its vocab, the
    task's files and the output root."""
    from runexp.runtime import storage

    release_dir, data = release
    remote_release = f"{gcs_prefix}/google/{RELEASE}"
    storage.upload_dir(str(release_dir), remote_release)
    storage.upload_dir(str(data), f"{gcs_prefix}/data")
    root = f"{gcs_prefix}/out"
    gin_file = _experiment(tmp_path / "exp.gin", root, remote_release, f"{gcs_prefix}/data")
    env = dict(os.environ, RUNEXP_CACHE_DIR=str(tmp_path / "cache"))
    vocab_rows = len((release_dir / "vocab.txt").read_text().split())

    unset = run_cli("--dry_run", gin_file=gin_file, env=env)
    assert unset.returncode == 1 and "set model.vocab_size" in unset.stderr, unset.stderr

    proc = run_cli(gin_file=gin_file, params=[f"model.vocab_size={vocab_rows}"], env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    metrics = json.loads(storage.read_text(f"{root}/finetune.toy_nli/metrics.json"))
    _check_metrics(metrics)
    assert storage.exists(f"{root}/export/encoder/saved_model.pb")
    assert storage.exists(f"{root}/export/COMPLETED")
