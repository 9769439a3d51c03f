"""The vocab stage trains or adopts a vocab and reports on it."""

import json

from runexp.compiler.plan import Plan, Stage
from runexp.runtime.context import StageContext
from runexp.runtime.stages import vocab
from runexp.tasks.vocabulary.tokenizer import load_tokenizer

TEXT = ("The function returns the value of the attribute.\n"
        "An asynchronous task runs in the event loop.\n"
        "Raise an error when the widget has no parent window.\n\n"
        "Parse the header of the message and return its fields.\n"
        "The logger writes records to every handler.\n")


def run_stage(tmp_path, name, **params):
    (tmp_path / "train.txt").write_text(TEXT * 40)
    (tmp_path / "heldout.txt").write_text(TEXT)
    out = tmp_path / name
    out.mkdir()
    base = dict(vocab_path=None, vocab_size=120, do_lower_case=True, model_type="unigram",
                vocab_type="wordpiece", max_sentences=1000, seed=0)
    base.update(params)
    stage = Stage(id=name, kind="vocab", output_dir=str(out), params=base,
                  inputs=dict(train_files=[str(tmp_path / "train*.txt")],
                              heldout_files=[str(tmp_path / "heldout.txt")]))
    summary = vocab.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)), str(out),
                                     progress=lambda m: None))
    return out, summary


def test_trains_a_wordpiece_vocab_by_default(tmp_path):
    out, summary = run_stage(tmp_path, "vocab", vocab_type="wordpiece")
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "vocab.txt"]
    report = json.loads((out / "report.json").read_text())
    assert report["type"] == "wordpiece" and report["do_lower_case"] is True
    assert {"vocab_size", "unk_rate", "pieces_per_word", "sample_words"} <= set(report)
    assert summary.vocab_size == report["vocab_size"] == load_tokenizer(str(out)).vocab_size
    assert summary.unk_rate == 0.0
    lines = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert "the" in lines and "##e" in lines  # words and continuation pieces, BERT's way


def test_trains_sentencepiece_on_request_and_writes_no_vocab_txt(tmp_path):
    out, summary = run_stage(tmp_path, "spm", vocab_type="sentencepiece")
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "spm.model"]
    assert summary.type == "sentencepiece" and summary.unk_rate == 0.0
    import sentencepiece

    # Lower-casing is the model's own normalisation: the model alone reads "The" as "the".
    sp = sentencepiece.SentencePieceProcessor(model_file=str(out / "spm.model"))
    assert sp.encode("The Value") == sp.encode("the value")


def test_adopts_a_wordpiece_vocab_and_warns_on_unk(tmp_path):
    given = tmp_path / "given_vocab.txt"
    given.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "."]))
    out, summary = run_stage(tmp_path, "vocab_adopted", vocab_path=str(given))
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "vocab.txt"]
    assert summary.type == "wordpiece" and summary.vocab_size == 7
    assert summary.unk_rate > 0.5 and "UNK rate" in summary.warning
    assert "on held-out text is above 1%" in summary.warning
    report = json.loads((out / "report.json").read_text())
    assert report["warning"] == summary.warning


def test_no_warning_below_one_percent(tmp_path):
    out, summary = run_stage(tmp_path, "vocab_ok")
    assert summary.unk_rate < 0.01 and summary.warning is None
    assert "warning" not in json.loads((out / "report.json").read_text())
