"""The seed workflow from Hugging Face, through the `runexp` command: continue pretraining a
BERT that transformers saved (its vocabulary, casing and activation taken from the directory,
VOCAB unset), fine-tune it, and export it back: transformers reads the export with the numbers
runexp computes, and the continued weights are the ones it trained."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from runexp.tasks.vocabulary import vocab_dir
from tests.support.cli import QUICKSTART_SHORT, output, run_cli
from tests.support.huggingface_dirs import save_bert_dir
from tests.support.spm_models import corpus_lines

pytestmark = pytest.mark.e2e

# models/bert_tiny.gin's encoder, with transformers' (exact) GELU as every Hub BERT has.
TINY = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=512, max_position_embeddings=512, hidden_act="gelu",
            layer_norm_eps=1e-12)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf_seed")
    vocab = base / "vocab"
    vocab.mkdir()
    vocab_dir.train_vocab("wordpiece", corpus_lines(step=4), str(vocab), vocab_size=3000,
                          do_lower_case=True)
    tokens = (vocab / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    hf = save_bert_dir(base, vocab=tokens, lower=True, vocab_txt=False, name="bert-tiny",
                       **TINY)
    root = str(base / "out")
    proc = run_cli(gin_file="quickstart.gin", root=root,
                   params=[f"INIT_CHECKPOINT='{hf}'", *QUICKSTART_SHORT], timeout=1800)
    assert proc.returncode == 0, output(proc)
    return root, hf, proc


@pytest.mark.slow
def test_the_plan_takes_vocabulary_casing_and_activation_from_the_directory(finished):
    root, hf, _ = finished
    with open(os.path.join(root, "plan.json")) as f:
        stages = {s["id"]: s for s in json.load(f)["stages"]}
    assert stages["vocab"]["params"]["vocab_path"] == os.path.join(hf, "tokenizer.json")
    assert stages["pretrain"]["params"]["model"]["hidden_act"] == "gelu_exact"
    assert stages["pretrain"]["inputs"]["init_checkpoint"] == hf
    with open(os.path.join(root, "pretrain", "MANIFEST.json")) as f:
        summary = json.load(f)["summary"]
    assert summary["init_checkpoint"]["source"] == "huggingface"
    assert summary["init_checkpoint"]["missing"] == []


@pytest.mark.slow
def test_the_export_goes_back_to_transformers_with_runexps_numbers(finished, tmp_path):
    from tests.support.hf import check_export_against_runexp

    root, hf, _ = finished
    lines = [line for line in corpus_lines(step=8, start=3) if line.strip()][:200]
    check_export_against_runexp(root, lines, str(tmp_path / "check"))
    with open(os.path.join(root, "export", "huggingface", "config.json")) as f:
        config = json.load(f)
    assert config["hidden_act"] == "gelu" and config["architectures"] == [
        "BertForSequenceClassification"]
    # Trained, not copied: the continued encoder differs from the directory it started from.
    from safetensors.numpy import load_file

    before = load_file(os.path.join(hf, "model.safetensors"))
    after = load_file(os.path.join(root, "export", "huggingface", "model.safetensors"))
    name = "bert.encoder.layer.0.attention.self.query.weight"
    assert before[name].shape == after[name].shape
    assert not np.array_equal(before[name], after[name])
