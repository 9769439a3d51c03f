"""A GLUE suite through the `runexp` command: four GLUE tasks in GLUE's published layout
(MNLI's two dev sets, MRPC's F1 and BOM, CoLA's headerless MCC, STS-B's regression) fine-tuned
for real from one released-style checkpoint, each scored as scikit-learn and SciPy score its
predictions file, and the suite's GLUE average by the leaderboard's rule."""

import csv
import json

import pytest
from scipy import stats
from sklearn import metrics as sk

from tests.support.cli import run_cli
from tests.support.glue_files import WORDS, write_glue_dir

pytestmark = pytest.mark.e2e

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SUITE = ["mnli", "mrpc", "cola", "stsb"]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from runexp.runtime import checkpoints
    from runexp.runtime.model import BertConfig, BertPretrainer

    base = tmp_path_factory.mktemp("glue_suite")
    release_dir = base / "google" / "uncased_L-2_H-128_A-2"
    release_dir.mkdir(parents=True)
    tokens = SPECIAL + WORDS + ['"', "?"]
    (release_dir / "vocab.txt").write_text("\n".join(tokens) + "\n")
    config = {"vocab_size": len(tokens), "hidden_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 512, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
              "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02}
    (release_dir / "bert_config.json").write_text(json.dumps(config))
    model = BertPretrainer(BertConfig.from_dict(config), seed=7)
    checkpoints.save_google_checkpoint(model.google_variables(),
                                       str(release_dir / "bert_model.ckpt"))
    glue = write_glue_dir(base / "glue", SUITE, rows=160, dev_rows=48, seed=5)
    return release_dir, glue


def _scores_of_predictions(path, metrics):
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if "pearson" in metrics:
        gold = [float(r["label"]) for r in rows]
        predicted = [float(r["prediction"]) for r in rows]
        return {"pearson": stats.pearsonr(gold, predicted)[0],
                "spearman": stats.spearmanr(gold, predicted)[0]}
    gold, predicted = [r["label"] for r in rows], [r["prediction"] for r in rows]
    return {"accuracy": sk.accuracy_score(gold, predicted),
            "f1": sk.f1_score(gold, predicted, pos_label="1") if "f1" in metrics else None,
            "mcc": sk.matthews_corrcoef(gold, predicted)}


@pytest.mark.slow
def test_a_glue_suite_end_to_end(release, tmp_path):
    release_dir, glue = release
    root = tmp_path / "out"
    gin_file = tmp_path / "suite.gin"
    gin_file.write_text(f"""include 'runs/finetune.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{root}'
VOCAB = '{release_dir}/vocab.txt'
INIT_CHECKPOINT = '{release_dir}/bert_model.ckpt'
GLUE_DIR = '{glue}'
FINETUNE_SUITE = {SUITE}
MAX_SEQ_LENGTH = 16
FINETUNE_STEPS = 120
FINETUNE_BATCH_SIZE = 16
FINETUNE_LEARNING_RATE = 3e-4
FINETUNE_WARMUP_STEPS = 8
""")
    proc = run_cli(gin_file=gin_file, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "GLUE average" in proc.stdout and "(WNLI left out" in proc.stdout, proc.stdout
    summary = json.loads((root / "suite" / "suite.json").read_text())
    task_scores = {}
    for task in SUITE:
        stage = root / f"finetune.{task}"
        metrics = json.loads((stage / "metrics.json").read_text())
        names = metrics["metrics"]
        for dev_set, scores in metrics["dev_sets"].items():
            reference = _scores_of_predictions(stage / f"predictions.{dev_set}.tsv", names)
            for name in names:
                # Regression predictions are written to 4 decimals.
                tolerance = 1e-3 if name in ("pearson", "spearman") else 1e-12
                assert scores[name] == pytest.approx(reference[name], abs=tolerance), \
                    (task, dev_set, name)
            assert summary["tasks"][task]["dev_sets"][dev_set] == {n: scores[n] for n in names}
        values = [s[n] for s in metrics["dev_sets"].values() for n in names]
        task_scores[task] = sum(values) / len(values)
        assert summary["tasks"][task]["score"] == pytest.approx(task_scores[task])
    assert list(json.loads((root / "finetune.mnli" / "metrics.json").read_text())
                ["dev_sets"]) == ["matched", "mismatched"]
    assert summary["glue"]["average"] == pytest.approx(sum(task_scores.values()) / 4)
    assert summary["glue"]["tasks"] == SUITE and "wnli" in summary["glue"]["left_out"]
    # Trained, not guessed: each task beats what a constant prediction scores.
    assert summary["tasks"]["mnli"]["score"] > 0.5, summary
    assert summary["tasks"]["cola"]["score"] > 0.2 and summary["tasks"]["stsb"]["score"] > 0.5
