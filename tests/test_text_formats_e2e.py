"""A jsonl pretraining task through the `runexp` command: the dry run shows its format and
text field, the vocab and preprocess stages run on its text (bad lines counted, never
fatal), and changing the format rebuilds both."""

import json
import random

import pytest

from runexp.compiler.exit_codes import EXIT_PENDING
from runexp.compiler.planner import compile_experiment
from tests.support.cli import run_cli

pytestmark = pytest.mark.e2e

WORDS = ("model layer token batch value function return object string number list file "
         "graph tensor shape index train step loss weight input output array record "
         "reader writer vocab piece sentence document paragraph corpus split shard").split()


def sentence(rng):
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
    return " ".join([words[0].capitalize()] + words[1:]) + rng.choice(".....!?")


def write_corpus(d):
    """Documents as JSON lines (text in "body"), with bad lines; the same as paragraphs."""
    rng = random.Random(0)
    docs = [[sentence(rng) for _ in range(rng.randint(2, 9))] for _ in range(600)]
    lines = [json.dumps({"id": i, "body": " ".join(doc)}) for i, doc in enumerate(docs)]
    (d / "held.jsonl").write_text("\n".join(lines[:48]) + "\n")
    lines[2:2] = ["{not json", '{"id": 5, "title": "no body"}']
    (d / "news-0.jsonl").write_text("\n".join(lines[:400]) + "\n")
    (d / "news-1.jsonl").write_text("\n".join(lines[400:]) + "\n")
    for name, part in (("news-0.txt", docs[:398]), ("news-1.txt", docs[398:])):
        (d / name).write_text("\n\n".join(" ".join(doc) for doc in part) + "\n")
    (d / "held.txt").write_text("\n\n".join(" ".join(doc) for doc in docs[:48]) + "\n")


@pytest.fixture
def experiment(tmp_path):
    write_corpus(tmp_path)
    path = tmp_path / "exp.gin"
    path.write_text(f"""
include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{tmp_path}/out'
CORPUS_FILES = '{tmp_path}/news-*.jsonl'
HELDOUT_FILES = '{tmp_path}/held.jsonl'
VOCAB_SIZE = 200
BATCH_SIZE = 8
TRAIN_STEPS = 20
WARMUP_STEPS = 2
MAX_SEQ_LENGTH = 32
MAX_PREDICTIONS_PER_SEQ = 5
DUPE_FACTOR = 1
pretrain/bert_pretraining_task.format = 'jsonl'
pretrain/bert_pretraining_task.text_field = 'body'
""")
    return str(path), tmp_path


def stage_text(plan_text, stage_id):
    start = plan_text.index(f" {stage_id}  (")
    return plan_text[start:plan_text.index("\n\n", start)]


def test_dry_run_shows_the_format_and_fingerprints_follow_it(experiment):
    gin, d = experiment
    proc = run_cli("--dry_run", gin_file=gin)
    assert proc.returncode == EXIT_PENDING, proc.stderr
    pre = stage_text(proc.stdout, "preprocess.pretrain")
    assert "format = 'jsonl'" in pre and "text_field = 'body'" in pre
    vocab = stage_text(proc.stdout, "vocab")
    assert "<- sources: {pretrain: {format: 'jsonl', text_field: 'body', train_files:" in vocab
    assert "train_files: [" not in vocab.split("<- sources")[0]  # no union of raw lines

    def fingerprints(*params):
        plan = compile_experiment([gin], list(params)).plan
        return {s.id: s.fingerprint for s in plan.stages}

    base = fingerprints()
    for change in ("pretrain/bert_pretraining_task.text_field='text'",
                   "pretrain/bert_pretraining_task.format='paragraphs'"):
        other = fingerprints(change)
        assert other["vocab"] != base["vocab"], change
        assert other["preprocess.pretrain"] != base["preprocess.pretrain"], change
    # A sentence_lines task's vocab is planned as before: the union of the files.
    lines = compile_experiment([gin], ["pretrain/bert_pretraining_task.format='sentence_lines'",
                                       f"CORPUS_FILES='{d}/news-*.txt'",
                                       f"HELDOUT_FILES='{d}/held.txt'"]).plan
    assert set(lines.stage("vocab").inputs) == {"train_files", "heldout_files"}


def test_vocab_and_preprocess_run_on_jsonl_text(experiment):
    gin, d = experiment
    proc = run_cli("--until=preprocess", gin_file=gin)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = d / "out"
    pieces = (out / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert not [p for p in pieces if any(j in p for j in ('{', '"', "body"))]
    vocab = json.loads((out / "vocab" / "MANIFEST.json").read_text())["summary"]
    assert vocab["unk_rate"] < 0.01 and vocab["diagnostics_on"] == "heldout"
    summary = json.loads((out / "preprocess.pretrain" / "MANIFEST.json").read_text())["summary"]
    assert summary["train"]["documents"] == 600 and summary["validation"]["documents"] == 48
    bad = summary["bad_input"]
    assert bad["invalid_json_lines"] == {"count": 1, "samples": [f"{d}/news-0.jsonl:3"]}
    assert bad["missing_text_lines"] == {"count": 1, "samples": [f"{d}/news-0.jsonl:4"]}
    assert "WARNING: skipped or repaired bad input: 1 invalid json lines" in proc.stdout
    # Another format: the plan says both stages are rebuilt, and why.
    proc = run_cli("--dry_run", gin_file=gin,
                   params=["pretrain/bert_pretraining_task.format='paragraphs'"])
    assert proc.returncode == EXIT_PENDING, proc.stderr
    assert "~ vocab  (vocab)  will be rebuilt" in proc.stdout
    assert "why: task pretrain is read as 'paragraphs', was 'jsonl'" in proc.stdout
    pre = stage_text(proc.stdout, "preprocess.pretrain")
    assert "will be rebuilt" in pre and "~ format: 'jsonl' -> 'paragraphs'" in pre


def test_a_mixture_vocab_reads_each_task_in_its_format(experiment):
    gin, d = experiment
    mix = d / "mix.gin"
    mix.write_text(f"""
include '{gin}'
books/bert_pretraining_task.train_files = '{d}/news-*.txt'
books/bert_pretraining_task.validation_files = '{d}/held.txt'
mix/bert_pretraining_mixture.rates = {{'pretrain': 0.5, 'books': 0.5}}
PRETRAIN_TASK = 'mix'
""")
    plan = compile_experiment([str(mix)]).plan
    vocab = plan.stage("vocab")
    assert set(vocab.inputs) == {"sources"}
    assert vocab.inputs["sources"] == {
        "books": {"format": "sentence_lines", "train_files": [f"{d}/news-*.txt"],
                  "heldout_files": [f"{d}/held.txt"]},
        "pretrain": {"format": "jsonl", "text_field": "body",
                     "train_files": [f"{d}/news-*.jsonl"], "heldout_files": [f"{d}/held.jsonl"]}}
    assert plan.stage("preprocess.books").params["format"] == "sentence_lines"
    changed = compile_experiment([str(mix)], ["books/bert_pretraining_task.format='paragraphs'"])
    assert changed.plan.stage("vocab").fingerprint != vocab.fingerprint
