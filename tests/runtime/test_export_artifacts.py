"""The export's artifacts are one table (runtime/export/artifacts.py): a new one is one class
and one row, and the export stage's writing, its README and the report's artifacts section
all follow. No TensorFlow: the rows written here are the new one and the README."""

from __future__ import annotations

import json
import os

import pytest

from runexp.compiler.specs.export import ExportSummary
from runexp.runtime.export import artifacts, readme
from runexp.runtime.export.artifact import Artifact, Snippet


class Onnx(Artifact):
    """A scratch export format, as a new one would be added."""

    path, key = "model.onnx", "onnx"
    note = "the encoder as ONNX: onnxruntime reads it"

    def describe(self, facts):
        return f"the encoder in ONNX, {facts.seq_length} tokens"

    def readme(self, facts):
        return "## ONNX\n\n```python\nimport onnxruntime\n```\n"

    def snippets(self, where):
        return [Snippet("With `onnxruntime`:",
                                  f'onnxruntime.InferenceSession("{where.at(self.path)}")')]

    def write(self, job):
        with open(job.path(self), "w") as f:
            f.write("onnx")


def _facts(**kw):
    base = dict(step=3, parameters=10, layers=2, hidden=8, vocab_type="wordpiece",
                do_lower_case=True, seq_length=64, seq_length_source="why",
                vocab_files=["vocab.txt"], special_ids={"[CLS]": 2})
    return readme.ExportFacts(**{**base, **kw})


@pytest.fixture
def with_onnx(monkeypatch):
    rows = list(artifacts.ARTIFACTS)
    rows.insert(len(rows) - 1, Onnx())  # the one row: before README.md, written last
    monkeypatch.setattr(artifacts, "ARTIFACTS", tuple(rows))
    return rows


def test_a_new_artifact_is_one_class_and_one_row(with_onnx, tmp_path, monkeypatch):
    # Writing: only the new row and the README (the others need TensorFlow).
    monkeypatch.setattr(artifacts, "ARTIFACTS", (Onnx(), artifacts.Readme()))
    job = artifacts.ExportJob(None, None, str(tmp_path), str(tmp_path), "", _facts())
    written = artifacts.write_all(job)
    assert [a.path for a in written] == ["model.onnx", "README.md"]
    assert (tmp_path / "model.onnx").read_text() == "onnx"
    text = (tmp_path / "README.md").read_text()
    assert "| `model.onnx` | the encoder in ONNX, 64 tokens |" in text
    assert "## ONNX" in text
    summary = ExportSummary(artifacts={a.key: job.path(a) for a in written if a.key})
    assert summary.to_dict()["onnx"] == str(tmp_path / "model.onnx")
    assert ExportSummary.read(summary.to_dict()).artifacts == {"onnx": job.path(Onnx())}


def test_the_readme_lists_every_row_the_export_has(with_onnx):
    text = readme.render(_facts(), artifacts.ARTIFACTS)
    table = [line.split("`")[1] for line in text.splitlines() if line.startswith("| `")]
    assert table == ["encoder/", "preprocessing/", "bert_model.ckpt.*", "bert_config.json",
                     "huggingface/", "vocab.txt", "model.onnx", "README.md"]
    tuned = readme.render(_facts(labels=["a", "b"], text_fields=["x"]), artifacts.ARTIFACTS)
    assert "| `classifier/` |" in tuned and "## The classifier" in tuned


def test_the_report_names_and_loads_a_new_row(with_onnx, tmp_path):
    from runexp.runtime.report import sections
    from runexp.runtime.report.collect import RootReader

    assert sections._artifact_note("model.onnx", 1) == Onnx.note
    assert artifacts.group_of("bert_model.ckpt.index") == "bert_model.ckpt.*"
    assert artifacts.artifact_at("bert_model.ckpt.*").note.startswith("checkpoint in google")

    class Stage:
        id, kind, params, inputs = "export", "export", {}, {}

    class Report:
        plan = None

        def by_kind(self, kind):
            return []

    class StageReport:
        stage, dir = Stage(), str(tmp_path)

    html = sections._snippets(Report(), StageReport(), {"model.onnx", "encoder/"},
                              RootReader(str(tmp_path)))
    assert f"<p>With <code>onnxruntime</code>:</p><pre>onnxruntime.InferenceSession(" \
           f"&quot;{tmp_path}/model.onnx&quot;)</pre>" in html
    assert "tf.saved_model.load" in html  # the encoder's, from its row
    assert "run_classifier.py" not in html  # no checkpoint files: no checkpoint snippet


def test_every_keyed_row_is_a_directory_the_summary_reads_back():
    keyed = [a for a in artifacts.ARTIFACTS if a.key]
    assert [a.key for a in keyed] == ["encoder", "preprocessing", "classifier", "huggingface"]
    paths = {a.key: f"/x/{a.path.rstrip('/')}" for a in keyed}
    written = ExportSummary(artifacts=paths, step=1).to_dict()
    assert json.loads(json.dumps(written))["huggingface"] == "/x/huggingface"
    assert ExportSummary.read(written).artifacts == paths
    assert all(os.path.basename(p) for p in paths.values())
