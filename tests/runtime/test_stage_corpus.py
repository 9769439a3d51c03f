"""The corpus stage writes the documented files through a real StageContext."""

import platform

from runexp.compiler.plan import Plan, Stage
from runexp.runtime.context import StageContext
from runexp.runtime.stages import corpus


def test_corpus_stage_writes_documented_files(tmp_path):
    stage = Stage(id="corpus", kind="corpus", output_dir=str(tmp_path), params=dict(
        source="python_stdlib_docstrings", min_bytes=2_000_000, heldout_fraction=0.05,
        finetune_classes=4, seed=1,
        python_version=".".join(platform.python_version_tuple()[:2])), inputs={})
    messages = []
    summary = corpus.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)), str(tmp_path),
                                      progress=messages.append))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "finetune_dev.tsv", "finetune_train.tsv", "heldout.txt", "train.txt"]
    assert summary["train"]["bytes"] >= 2_000_000
    assert summary["heldout"]["documents"] > 0 and len(summary["labels"]) == 4
    assert summary["finetune_examples"]["dev"] > 100
    assert (tmp_path / "finetune_dev.tsv").read_text().startswith("label\tsentence\n")
    assert messages
