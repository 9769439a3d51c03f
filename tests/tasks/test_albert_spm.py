"""A SentencePiece model in ALBERT's layout is adopted: its ``<pad>`` and ``<unk>`` play BERT's
``[PAD]`` and ``[UNK]``.

The model is trained with ALBERT's settings on the stdlib corpus (tests/support/spm_models.py). A
T5-style model (no [CLS], [SEP], [MASK]) is still refused, with a hint.

The whole pipeline over such a model (preprocess, training, every export) is
tests/test_albert_spm_e2e.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.spm_models import (ALBERT_ROLES, corpus_lines, train_albert_style,
                                      train_t5_style)

from runexp.runtime.stages import vocab as vocab_stage
from runexp.tasks.vocabulary.tokenizer import load_tokenizer
from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def lines():
    return corpus_lines()


@pytest.fixture(scope="module")
def albert_model(lines, tmp_path_factory):
    path = tmp_path_factory.mktemp("albert") / "30k-clean.model"
    train_albert_style(lines, str(path))
    return str(path)


def test_the_model_is_in_albert_layout(albert_model):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=albert_model)
    assert [sp.id_to_piece(i) for i in range(5)] == ["<pad>", "<unk>", "[CLS]", "[SEP]",
                                                     "[MASK]"]
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, -1, -1)
    assert sp.piece_to_id("[UNK]") == sp.piece_to_id("[PAD]") == 1  # no such pieces


def test_the_vocab_stage_adopts_it_and_reports_the_roles(albert_model, lines, tmp_path):
    """The vocab stage as a plan runs it: the model adopted, the report names the piece of
    each role, and the tokenizer every later stage uses has BERT's special ids."""
    from runexp.compiler.plan import Plan, Stage
    from runexp.runtime.context import StageContext

    heldout = tmp_path / "heldout.txt"
    heldout.write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    out = tmp_path / "vocab"
    out.mkdir()
    stage = Stage(id="vocab", kind="vocab", output_dir=str(out),
                  params={"vocab_path": albert_model, "do_lower_case": True,
                          "vocab_size": 2000},
                  inputs={"vocab_file": albert_model, "heldout_files": [str(heldout)]})
    messages = []
    summary = vocab_stage.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)), str(out),
                                           progress=messages.append))
    assert summary.type == "sentencepiece" and summary.unk_rate < 0.01
    report = json.loads((out / "report.json").read_text())
    assert report["special_pieces"] == ALBERT_ROLES
    assert report["special_ids"] == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3,
                                     "[MASK]": 4}
    assert any("[PAD]=<pad> (0), [UNK]=<unk> (1)" in m for m in messages), messages

    tok = load_tokenizer(str(out))
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    assert tok.special_pieces() == ALBERT_ROLES
    assert tok.token_to_id("[UNK]") == 1 and tok.token_to_id("<unk>") == 1
    # Text it cannot spell is its unknown piece, which is [UNK]'s id.
    assert tok.unk_id in tok.encode("the \u2603 snowman")
    # The control pieces are never made from text.
    assert not {2, 3, 4} & set(tok.encode("a [CLS] b [SEP] c [MASK]"))


def _dry_run(tmp_path, model_path) -> subprocess.CompletedProcess:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here.\nAnother one.\n\nA second document.\n")
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("Held out text.\n")
    gin = tmp_path / "e.gin"
    gin.write_text(f"""include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{tmp_path}/out'
CORPUS_FILES = '{corpus}'
HELDOUT_FILES = '{heldout}'
VOCAB = '{model_path}'
BATCH_SIZE = 8
TRAIN_STEPS = 20
WARMUP_STEPS = 2
CHECKPOINT_EVERY = 10
""")
    return run_cli("--dry_run", gin_file=gin, timeout=300)


def test_the_plan_adopts_it_and_says_which_piece_plays_which_role(albert_model, tmp_path):
    proc = _dry_run(tmp_path, albert_model)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]  # work to do
    vocab_block = proc.stdout.split("+ vocab ")[1].split("\n\n")[0]
    assert ("vocab_size = 2000   # counted in 30k-clean.model; roles [PAD]=<pad> (0), "
            "[UNK]=<unk> (1), [CLS]=[CLS] (2), [SEP]=[SEP] (3), [MASK]=[MASK] (4)"
            in vocab_block), vocab_block


def test_a_model_without_cls_sep_mask_is_refused_with_a_hint(lines, tmp_path):
    t5 = tmp_path / "t5.model"
    train_t5_style(lines[:3000], str(t5))
    proc = _dry_run(tmp_path, t5)
    assert proc.returncode == 1  # a user error
    text = proc.stdout + proc.stderr
    assert f"error: vocab.path: {t5} has no piece [CLS], [SEP], [MASK]" in text, text[-2000:]
    assert "control_symbols=[CLS],[SEP],[MASK]" in text
    assert "[UNK]" not in text.split("has no piece")[1].split("\n")[0]  # <unk> plays it
