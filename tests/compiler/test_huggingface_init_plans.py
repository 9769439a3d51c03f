"""Planning from a Hugging Face BERT directory as init_checkpoint (made by transformers
itself): the dry run reads its config.json and tokenizer files without TensorFlow or torch,
checks them against the experiment, and takes the vocabulary, casing and activation from it;
bad directories are one clear error each, before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.huggingface_dirs import save_bert_dir
from runexp.compiler.planner import compile_experiment
from tests.support.cli import run_cli

# models/bert_tiny.gin's encoder.
TINY = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=512, max_position_embeddings=512, layer_norm_eps=1e-12)
TOKENS = (["[PAD]"] + [f"[unused{i}]" for i in range(4)]
          + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
          + "the a of to and is in it for value return list string name file".split()
          + ["##s", "##ed", "##ing", "Python", "The"])

PRETRAIN = """
include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{root}/out'
CORPUS_FILES = '{root}/corpus.txt'
INIT_CHECKPOINT = '{init}'
"""


def _experiment(tmp_path, init, extra=""):
    (tmp_path / "corpus.txt").write_text("The value is returned.\nIt is a list.\n\n"
                                         "A file name.\nThe string.\n")
    gin = tmp_path / "e.gin"
    gin.write_text(PRETRAIN.format(root=tmp_path, init=init) + extra)
    return str(gin)


@pytest.fixture(scope="module")
def cased_dir(tmp_path_factory):
    """A cased BERT-tiny with the exact GELU, its tokenizer saved as transformers 5 does
    (tokenizer.json and tokenizer_config.json, no vocab.txt)."""
    return save_bert_dir(tmp_path_factory.mktemp("hf"), vocab=TOKENS, lower=False,
                         vocab_txt=False, hidden_act="gelu", **TINY)


def test_vocab_casing_and_activation_come_from_the_directory(cased_dir, tmp_path):
    plan = compile_experiment([_experiment(tmp_path, cased_dir)]).plan
    vocab = plan.stage("vocab")
    assert vocab.params["vocab_path"] == os.path.join(cased_dir, "tokenizer.json")
    assert vocab.params["do_lower_case"] is False
    assert vocab.params["vocab_size"] == len(TOKENS)
    assert vocab.provenance["vocab_path"] == f"the vocabulary of init_checkpoint {cased_dir}"
    assert vocab.provenance["do_lower_case"] == f"the tokenizer of init_checkpoint {cased_dir}"
    pretrain = plan.stage("pretrain")
    # transformers' "gelu" is the exact one; runexp's "gelu" is the tanh approximation.
    assert pretrain.params["model"]["hidden_act"] == "gelu_exact"
    assert "hidden_act 'gelu_exact' from" in pretrain.provenance["model"]
    assert pretrain.inputs["init_checkpoint"] == cased_dir


def test_the_fingerprint_follows_the_directory_content(cased_dir, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(cased_dir, copy)
    before = compile_experiment([_experiment(tmp_path, str(copy))]).plan.stage("pretrain")
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "initializer_range": 0.03}))
    after = compile_experiment([_experiment(tmp_path, str(copy))]).plan.stage("pretrain")
    assert before.fingerprint != after.fingerprint


def test_the_dry_run_imports_neither_tensorflow_nor_torch(cased_dir, tmp_path):
    code = ("import sys\nfrom runexp.compiler.cli import main\n"
            f"code = main(['--gin_file={_experiment(tmp_path, cased_dir)}', '--dry_run'])\n"
            "heavy = [m for m in ('tensorflow', 'seqio', 'torch', 'transformers', 'safetensors')"
            " if m in sys.modules]\nassert code == 2 and not heavy, (code, heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_an_explicit_casing_that_disagrees_is_an_error(cased_dir, tmp_path):
    run = run_cli("--dry_run",
                  gin_file=_experiment(tmp_path, cased_dir, "DO_LOWER_CASE = True"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert (f"DO_LOWER_CASE is True but the tokenizer of init_checkpoint {cased_dir} keeps "
            "case") in run.stderr
    assert "Traceback" not in run.stderr


def test_a_model_of_another_size_is_an_error(tmp_path):
    small = save_bert_dir(tmp_path, vocab=TOKENS, name="small")  # hidden 32, not tiny's 128
    run = run_cli("--dry_run", gin_file=_experiment(tmp_path, small))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the init checkpoint does not fit the model (hidden_size: checkpoint 32, model 128" \
        in run.stderr
    assert f"set model.* to {small}/config.json" in run.stderr


@pytest.mark.parametrize("kind, message, hint", [
    ("roberta", "model_type is 'roberta': runexp reads BERT directories", "RoBERTa"),
    ("pytorch_bin", "there is no model.safetensors", "save_pretrained(dir, "
     "safe_serialization=True)"),
])
def test_a_directory_runexp_cannot_read_is_one_error(tmp_path, kind, message, hint):
    bad = save_bert_dir(tmp_path, kind=kind, vocab=TOKENS, **TINY)
    run = run_cli("--dry_run", gin_file=_experiment(tmp_path, bad))
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"init_checkpoint: {bad}/" in run.stderr and message in run.stderr
    assert hint in run.stderr and "Traceback" not in run.stderr
    assert run.stderr.count("error:") == 1, run.stderr


def test_a_vocabulary_larger_than_the_embedding_table_is_an_error(tmp_path):
    bad = save_bert_dir(tmp_path, vocab=TOKENS, vocab_size=len(TOKENS) - 3, **TINY)
    run = run_cli("--dry_run", gin_file=_experiment(tmp_path, bad))
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"the vocabulary has {len(TOKENS)} tokens but config.json's vocab_size is " \
           f"{len(TOKENS) - 3}" in run.stderr


def test_a_directory_without_config_json_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    run = run_cli("--dry_run", gin_file=_experiment(tmp_path, str(tmp_path / 'empty')))
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"init_checkpoint {tmp_path / 'empty'} is a directory without config.json" \
        in run.stderr


def test_a_directory_on_gcs_is_listed_and_read(cased_dir, tmp_path, gcs_prefix):
    """The same directory on gs:// (the loopback GCS server): listed for the fingerprint,
    config.json and the tokenizer files read through runexp's storage layer."""
    from runexp.runtime import storage

    remote = f"{gcs_prefix}/bert-tiny-cased"
    for name in os.listdir(cased_dir):
        storage.write_bytes(f"{remote}/{name}", open(os.path.join(cased_dir, name), "rb").read())
    plan = compile_experiment([_experiment(tmp_path, remote)]).plan
    vocab, pretrain = plan.stage("vocab"), plan.stage("pretrain")
    assert vocab.params["vocab_path"] == f"{remote}/tokenizer.json"
    assert vocab.params["do_lower_case"] is False
    assert pretrain.params["model"]["hidden_act"] == "gelu_exact"
    listed = pretrain.input_objects[remote]
    assert sorted(u.rsplit("/", 1)[1] for u in listed) == sorted(os.listdir(cased_dir))


def test_a_directory_that_computes_otherwise_is_an_error_before_anything_runs(tmp_path):
    """Another layer-norm epsilon loads without error in any converter and gives other
    numbers: the dry run refuses it, naming the setting."""
    other = save_bert_dir(tmp_path, vocab=TOKENS, name="eps", **{**TINY, "layer_norm_eps": 1e-7})
    run = run_cli("--dry_run", gin_file=_experiment(tmp_path, other))
    assert run.returncode == 1, run.stdout + run.stderr
    assert (f"init_checkpoint {other} computes something runexp's BERT does not: "
            "layer_norm_eps is 1e-07; runexp's LayerNorm uses 1e-12") in run.stderr
