"""bert_pretraining_task.word_segmenter (Chinese whole words): checked in the dry run, and
left out of the plan when unset (the plans and fingerprints of before)."""

import importlib.util

import pytest

from runexp.compiler.planner import compile_experiment
from tests.support.cli import errors_of


def test_unset_it_is_not_in_the_plan(minimal):
    stage = compile_experiment([minimal]).plan.stage("preprocess.pretrain")
    assert "word_segmenter" not in stage.params


def test_jieba_with_whole_word_masking_is_planned_and_fingerprinted(minimal, write):
    pytest.importorskip("jieba")
    path = write("e.gin", f"include '{minimal}'\n"
                          "bert_pretraining_task.whole_word_masking = True\n"
                          "bert_pretraining_task.word_segmenter = 'jieba'\n")
    plan = compile_experiment([path]).plan
    stage = plan.stage("preprocess.pretrain")
    assert stage.params["word_segmenter"] == "jieba"
    assert stage.provenance["word_segmenter"].endswith("e.gin:3")
    without = compile_experiment([path], ["bert_pretraining_task.word_segmenter = ''"]).plan
    assert without.stage("preprocess.pretrain").fingerprint != stage.fingerprint
    assert without.stage("vocab").fingerprint == plan.stage("vocab").fingerprint


def test_without_whole_word_masking_it_is_an_error(minimal, write):
    text = errors_of(write("e.gin", f"include '{minimal}'\n"
                                    "bert_pretraining_task.word_segmenter = 'jieba'\n"))
    assert "e.gin:2: error: pretrain: word_segmenter = 'jieba' finds the words whole-word " \
           "masking masks, but whole_word_masking is False" in text
    assert "whole_word_masking = True" in text


def test_with_a_sentencepiece_vocab_it_is_an_error(minimal, write):
    text = errors_of(write("e.gin", f"include '{minimal}'\n"
                                    "vocab.type = 'sentencepiece'\n"
                                    "bert_pretraining_task.whole_word_masking = True\n"
                                    "bert_pretraining_task.word_segmenter = 'jieba'\n"))
    assert "e.gin:4: error: pretrain: word_segmenter = 'jieba' marks Chinese words in the " \
           "characters BERT's WordPiece tokenizer splits CJK text into" in text


def test_jieba_not_installed_is_an_error_with_the_pip_command(minimal, write, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "jieba" else find_spec(name, *a))
    text = errors_of(write("e.gin", f"include '{minimal}'\n"
                                    "bert_pretraining_task.whole_word_masking = True\n"
                                    "bert_pretraining_task.word_segmenter = 'jieba'\n"))
    assert "e.gin:3: error: pretrain: word_segmenter = 'jieba' needs the jieba package, " \
           "which is not installed" in text
    assert "pip install 'jieba>=0.42,<0.43'" in text


def test_unknown_segmenter_is_refused(minimal, write):
    text = errors_of(write("e.gin", f"include '{minimal}'\n"
                                    "bert_pretraining_task.word_segmenter = 'ltp'\n"))
    assert "e.gin:2: error:" in text and "word_segmenter" in text and "'jieba'" in text
