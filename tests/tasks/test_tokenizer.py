"""The shared Tokenizer interface over real SentencePiece and WordPiece vocab dirs."""

import json
import os

from runexp.tasks.vocabulary.tokenizer import SPECIAL_TOKENS, load_tokenizer


def test_sentencepiece_special_ids_are_bert_layout(spm_dir):
    tok = load_tokenizer(spm_dir)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert tok.vocab_size == 2000


def test_sentencepiece_lower_cases_and_never_emits_control_symbols(spm_dir):
    tok = load_tokenizer(spm_dir)
    assert tok.do_lower_case
    assert tok.encode("Return The VALUE.") == tok.encode("return the value.")
    assert not {2, 3, 4} & set(tok.encode("a [CLS] b [SEP] c [MASK]"))


def test_sentencepiece_word_start(spm_dir):
    tok = load_tokenizer(spm_dir)
    ids = tok.encode("return the value")
    assert tok.is_word_start(ids[0])
    starts = [tok.is_word_start(i) for i in ids]
    assert sum(starts) == 3


def test_a_sentencepiece_vocab_is_its_model_alone(spm_dir):
    """No vocab.txt beside spm.model: its pieces are not WordPiece tokens, and a consumer
    reading them as such would get other ids than training used."""
    assert sorted(os.listdir(spm_dir)) == ["report.json", "spm.model"]


def test_a_trained_wordpiece_vocab_is_bert_layout(wordpiece_dir):
    tok = load_tokenizer(wordpiece_dir)
    with open(os.path.join(wordpiece_dir, "vocab.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) == tok.vocab_size == len(set(lines)) == 2000
    assert lines[:5] == list(SPECIAL_TOKENS)
    assert any(t.startswith("##") for t in lines) and not any("\u2581" in t for t in lines)


def test_report_has_diagnostics(spm_dir):
    with open(os.path.join(spm_dir, "report.json"), encoding="utf-8") as f:
        report = json.load(f)
    assert report["type"] == "sentencepiece" and report["vocab_size"] == 2000
    assert 0 <= report["unk_rate"] < 0.01
    assert 1.0 < report["pieces_per_word"] < 3.0


def test_wordpiece_vocab_dir(wordpiece_dir):
    tok = load_tokenizer(wordpiece_dir)
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    pieces = tok.tokenize("Returns the asynchronous value")
    assert pieces and all(tok.token_to_id(p) is not None for p in pieces)
    ids = tok.encode("Returns the asynchronous value")
    assert [tok.is_word_start(i) for i in ids] == [not p.startswith("##") for p in pieces]
