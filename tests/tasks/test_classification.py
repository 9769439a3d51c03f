"""Classification examples from TSV and JSONL, encoded like BERT's run_classifier."""

import pytest

from runexp.compiler.formats.classification_files import load_examples
from runexp.tasks.sources.classification import encode_examples, labels_of
from runexp.tasks.vocabulary.tokenizer import load_tokenizer


def test_tsv_and_jsonl(tmp_path):
    (tmp_path / "a.tsv").write_text("label\tsentence\npos\tGood value.\nneg\tBad one.\n")
    assert load_examples(str(tmp_path / "a.tsv")) == [
        (("Good value.",), "pos"), (("Bad one.",), "neg")]
    (tmp_path / "b.jsonl").write_text(
        '{"sentence1": "A", "sentence2": "B", "label": "entailment"}\n\n'
        '{"sentence1": "C", "sentence2": "D", "label": 1}\n')
    assert load_examples(str(tmp_path / "b.jsonl"), ["sentence1", "sentence2"]) == [
        (("A", "B"), "entailment"), (("C", "D"), "1")]
    assert labels_of(load_examples(str(tmp_path / "a.tsv"))) == ["neg", "pos"]


def test_malformed_rows_name_file_and_line(tmp_path):
    (tmp_path / "a.tsv").write_text("label\tsentence\npos\tok\nneg\ttoo\tmany\n")
    with pytest.raises(ValueError, match=r"a\.tsv:3: error: 3 tab-separated fields") as e:
        load_examples(str(tmp_path / "a.tsv"))
    assert "hint: one example per line" in str(e.value)
    (tmp_path / "b.jsonl").write_text('{"sentence": "x", "label": "a"}\n{"sentence": "y"}\n')
    with pytest.raises(ValueError, match=r"b\.jsonl:2: error: missing field 'label'"):
        load_examples(str(tmp_path / "b.jsonl"))
    with pytest.raises(ValueError, match=r"a\.tsv:1: error: the header has no column 'premise'"):
        load_examples(str(tmp_path / "a.tsv"), ["premise"])
    (tmp_path / "c.tsv").write_bytes(b"label\tsentence\npos\tfine\nneg\tcaf\xe9\n")
    with pytest.raises(ValueError, match=r"c\.tsv:3: error: not UTF-8 text \(byte 0xe9"):
        load_examples(str(tmp_path / "c.tsv"))


def test_encode_single_and_pair(spm_dir):
    tok = load_tokenizer(spm_dir)
    a = tok.encode("return the value of the attribute")
    b = tok.encode("raise an error")
    arrays = encode_examples([(("return the value of the attribute",), "x")], tok, ["y", "x"], 16)
    assert arrays["input_ids"][0].tolist() == [2, *a, 3] + [0] * (14 - len(a))
    assert arrays["label_ids"].tolist() == [1]
    pair = encode_examples([(("return the value of the attribute", "raise an error"), "y")],
                           tok, ["y"], 8)
    ids, segments = pair["input_ids"][0].tolist(), pair["segment_ids"][0].tolist()
    # 5 slots: the longer side loses tokens from its end first.
    assert len(a) > 3 and len(b) >= 2
    assert ids == [2, *a[:3], 3, *b[:2], 3]
    assert segments == [0] * 5 + [1] * 3
    assert pair["input_mask"].tolist() == [[1] * 8]
    assert {k: v.dtype.name for k, v in pair.items()} == {
        "input_ids": "int32", "input_mask": "int32", "segment_ids": "int32",
        "label_ids": "int32"}
    with pytest.raises(ValueError, match="label 'z'"):
        encode_examples([(("a",), "z")], tok, ["y"], 8)
