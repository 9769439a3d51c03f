"""compiler/formats/huggingface_dir.py on directories transformers itself wrote (in a child process:
the compiler never imports transformers, the test's consumer does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.huggingface_dirs import VOCAB, save_bert_dir
from runexp.compiler.formats.huggingface_dir import HuggingFaceDirError, read_huggingface_dir


def _save(tmp_path, kind="bert", vocab_size=len(VOCAB), lower=True, vocab=VOCAB,
          vocab_txt=True) -> str:
    return save_bert_dir(tmp_path, kind=kind, vocab=vocab, lower=lower, vocab_txt=vocab_txt,
                         vocab_size=vocab_size)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("bert"))


def test_reads_a_bert_directory_transformers_wrote(bert_dir):
    record = read_huggingface_dir(bert_dir)
    assert record.model_type == "bert" and record.architectures == ("BertForPreTraining",)
    assert (record.hidden_size, record.num_hidden_layers, record.num_attention_heads,
            record.intermediate_size, record.max_position_embeddings,
            record.type_vocab_size, record.vocab_size) == (32, 2, 2, 64, 128, 2, len(VOCAB))
    assert record.hidden_act == "gelu_new" and record.layer_norm_eps == 1e-7
    assert record.do_lower_case is True and record.tokenize_chinese_chars is True
    assert record.strip_accents is None
    assert record.vocab_file == os.path.join(bert_dir, "vocab.txt")
    assert record.vocab_lines == len(VOCAB)
    assert record.has_safetensors and not record.has_pytorch_bin


def test_a_cased_tokenizer_is_read_cased(tmp_path):
    record = read_huggingface_dir(_save(tmp_path, lower=False))
    assert record.do_lower_case is False


def test_tokenizer_json_alone_is_a_vocabulary(tmp_path):
    """What transformers 5's save_pretrained writes: tokenizer.json, no vocab.txt."""
    path = _save(tmp_path, lower=False, vocab_txt=False)
    assert "vocab.txt" not in os.listdir(path)
    record = read_huggingface_dir(path)
    assert record.vocab_file is None
    assert record.tokenizer_file == os.path.join(path, "tokenizer.json")
    assert record.vocab_lines == len(VOCAB) and record.do_lower_case is False
    os.remove(os.path.join(path, "tokenizer_config.json"))  # the normaliser's flags then
    assert read_huggingface_dir(path).do_lower_case is False


def test_a_tokenizer_json_larger_than_the_embedding_table_is_refused(tmp_path):
    path = _save(tmp_path, vocab_size=len(VOCAB) - 1, vocab_txt=False)
    with pytest.raises(HuggingFaceDirError) as e:
        read_huggingface_dir(path)
    assert e.value.file == os.path.join(path, "tokenizer.json")


def test_a_smaller_vocab_than_the_embedding_table_is_fine(tmp_path):
    record = read_huggingface_dir(_save(tmp_path, vocab_size=len(VOCAB) + 6))
    assert record.vocab_size == len(VOCAB) + 6 and record.vocab_lines == len(VOCAB)


def test_a_vocab_larger_than_the_embedding_table_is_refused(tmp_path):
    path = _save(tmp_path, vocab_size=len(VOCAB) - 2)
    with pytest.raises(HuggingFaceDirError) as e:
        read_huggingface_dir(path)
    assert e.value.file == os.path.join(path, "vocab.txt")
    assert f"the vocabulary has {len(VOCAB)} tokens but config.json's vocab_size is " \
           f"{len(VOCAB) - 2}" in str(e.value)
    assert "give the vocabulary the checkpoint was trained with" in e.value.hint


def test_roberta_is_refused_naming_its_model_type(tmp_path):
    path = _save(tmp_path, kind="roberta")
    with pytest.raises(HuggingFaceDirError) as e:
        read_huggingface_dir(path)
    assert e.value.file == os.path.join(path, "config.json")
    assert "model_type is 'roberta': runexp reads BERT directories" in str(e.value)


def test_pytorch_bin_only_is_refused_with_how_to_convert(tmp_path):
    path = _save(tmp_path, kind="pytorch_bin")
    assert os.path.exists(os.path.join(path, "pytorch_model.bin"))
    with pytest.raises(HuggingFaceDirError) as e:
        read_huggingface_dir(path)
    assert e.value.file == os.path.join(path, "pytorch_model.bin")
    assert "save_pretrained(dir, safe_serialization=True)" in e.value.hint


def test_no_config_json(tmp_path):
    with pytest.raises(HuggingFaceDirError) as e:
        read_huggingface_dir(str(tmp_path))
    assert e.value.file == str(tmp_path / "config.json") and "no such file" in str(e.value)


def test_no_vocabulary(bert_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes(open(os.path.join(bert_dir, name), "rb").read())
    with pytest.raises(HuggingFaceDirError) as e:
        read_huggingface_dir(str(bare))
    assert "no vocabulary: neither vocab.txt nor tokenizer.json" in str(e.value)
    assert "save_pretrained(dir)" in e.value.hint


def test_gs_uris_are_read_through_the_given_functions(bert_dir):
    """A gs:// directory: every read goes through the injected pair (here: a dict)."""
    files = {f"gs://bucket/bert/{name}": open(os.path.join(bert_dir, name), "rb").read()
             for name in os.listdir(bert_dir)}
    asked = []

    def read_text(uri):
        asked.append(uri)
        return files[uri].decode("utf-8")

    record = read_huggingface_dir("gs://bucket/bert", read_text=read_text,
                                  exists=files.__contains__)
    assert record.vocab_file == "gs://bucket/bert/vocab.txt" and record.has_safetensors
    assert "gs://bucket/bert/config.json" in asked
    assert json.loads(files["gs://bucket/bert/config.json"])["hidden_size"] == 32


def test_the_module_is_standard_library_only():
    code = ("import sys, runexp.compiler.formats.huggingface_dir\n"
            "heavy = [m for m in ('tensorflow', 'seqio', 'torch', 'transformers', 'tokenizers',"
            " 'safetensors', 'numpy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)
