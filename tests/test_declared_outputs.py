"""Each stage kind's summary is declared once (a record beside its spec, compiler/specs/
outputs.py): handlers return it, the executor writes it, status, the report, `runexp diff`
and the console's "Results" read its attributes. So no summary key is read by its string
outside its declaration and its writer: checked here on the syntax of compiler/ and runtime/,
like tests/compiler/test_specs.py's second defaults.

A read is ``x["key"]``, ``x.get("key")`` or ``"key" in x`` with a string constant. It is
refused when the key is declared (a summary's, an export artifact's, a bad-input kind's) and
- it is not one of GENERIC, ordinary words other files use as keys of their own data; or
- the receiver names a summary (``summary["step"]``, ``sr.summary.get("loss")``), whatever
  the key;
unless the file is the declaration (compiler/specs/) or the key's writer (the handler of a
kind that declares it, runtime/stages/<kind>.py), the key is also one of the file's own data
(OWN_DATA).
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from runexp.compiler.kinds import KINDS
from runexp.compiler.specs.bad_input import BAD_INPUT_KINDS
from runexp.runtime.export.artifacts import ARTIFACTS

REPO = pathlib.Path(__file__).resolve().parent.parent
SUMMARY_RECEIVER = re.compile(r"summar", re.I)

# Declared keys that are also ordinary words, keys of other files' data: read by string they
# are refused only on a receiver that names a summary.
GENERIC = {
    # plan and stage params, bert_config.json, vocab report.json (tasks/vocabulary/vocab_dir.py)
    "kind", "type", "tasks", "labels", "source", "seq_length", "vocab_size",
    "do_lower_case", "init_checkpoint", "optimizer_state", "batch_counts", "packing",
    "dynamic_masking", "vocab_type", "unk_rate",
    # train_log.jsonl / eval_log.jsonl records (runtime/train_log.py), read by `runexp status`
    # and the curves
    "step", "loss", "mlm_accuracy", "nsp_accuracy", "mlm_loss", "examples_per_second",
    "batches_consumed", "deadline_seconds_left", "eval",
    # the metric names (compiler/specs/task_kinds.py), keys of the task kinds' tables and of
    # the training metrics
    "accuracy", "f1", "mcc", "pearson", "spearman",
    # sweep.json (runtime/stages/sweep.py), read by the report's sweep section and `runexp diff`
    "selected", "mean", "std", "exported", "points", "point", "metric",
    # MANIFEST.json, the run lock, split names and counts in many files
    "seconds", "train", "validation", "heldout", "dev", "count", "samples", "files",
    "examples", "documents", "instances", "tokens", "rows", "factor", "fill", "bytes",
    "sentences", "checkpoint", "missing", "unused", "loaded", "metrics", "warning",
    "parameters", "input_bytes", "num_shards",
}

# A declared key that is also a key of a file's own data: (file, key) -> whose.
OWN_DATA = {
    ("runtime/stages/sweep.py", "majority_baseline"): "sweep.json's, written by select()",
    ("runtime/report/sweeps.py", "majority_baseline"): "sweep.json's (runtime/stages/sweep.py)",
}

# Files that read summary keys by string and are being written or restructured by other
# work; their reads are to go through the records (StageReport.outputs, read_summary).
def declared_keys() -> dict[str, set[str]]:
    """key -> the kinds that declare it (bad-input kinds and export artifacts under the
    kinds whose summaries hold them)."""
    out: dict[str, set[str]] = {}
    for kind in KINDS.values():
        for name in kind.summary.names():
            out.setdefault(name, set()).add(kind.name)
    for name in BAD_INPUT_KINDS:
        out.setdefault(name, set()).add("preprocess")
    for artifact in ARTIFACTS:
        if artifact.key:
            out.setdefault(artifact.key, set()).add("export")
    return out


def _key_reads(tree) -> list[tuple[int, str, str]]:
    """(line, key, receiver source) of every read of a string key."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            found.append((node.lineno, node.slice.value, ast.unparse(node.value)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and node.args \
                and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            found.append((node.lineno, node.args[0].value, ast.unparse(node.func.value)))
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str) \
                and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            found.append((node.lineno, node.left.value, ast.unparse(node.comparators[0])))
    return found


def _writer_kind(rel: str) -> str | None:
    match = re.fullmatch(r"runtime/stages/(\w+)\.py", rel)
    return match.group(1) if match and match.group(1) in KINDS else None


def undeclared_reads(rel: str, source: str, keys: dict[str, set[str]]) -> list[str]:
    """The reads of ``source`` (the file ``rel``) that this test refuses."""
    if rel.startswith("compiler/specs/"):
        return []
    own = _writer_kind(rel)
    wrong = []
    for line, key, receiver in _key_reads(ast.parse(source)):
        kinds = keys.get(key)
        if not kinds or own in kinds or (rel, key) in OWN_DATA:
            continue
        if key not in GENERIC or SUMMARY_RECEIVER.search(receiver):
            wrong.append(f"{rel}:{line}: {receiver}[{key!r}] (declared by "
                         f"{', '.join(sorted(kinds))}: read the record's attribute)")
    return wrong


def test_no_summary_key_is_read_by_its_string():
    keys = declared_keys()
    wrong = []
    for folder in ("compiler", "runtime"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            wrong += undeclared_reads(rel, path.read_text(encoding="utf-8"), keys)
    assert not wrong, "summary keys read by string:\n" + "\n".join(wrong)


@pytest.mark.parametrize("source", [
    'def f(summary):\n    return summary["dev_sets"]\n',
    'def f(sr):\n    return sr.summary.get("step")\n',
    'def f(s):\n    return s.get("majority_baseline")\n',
    'def f(m):\n    return "glue_average" in m\n',
    'def f(bad):\n    return bad["giant_lines"]\n',
])
def test_the_check_catches_a_new_read(source):
    assert undeclared_reads("runtime/report/new.py", source, declared_keys())


def test_a_handler_reads_its_own_keys_and_generic_words_pass():
    keys = declared_keys()
    own = 'def f(sweep):\n    return sweep["selected"], sweep.get("metric")\n'
    assert not undeclared_reads("runtime/stages/sweep.py", own, keys)
    other = 'def f(metrics):\n    return metrics["dev_sets"]\n'
    assert undeclared_reads("runtime/stages/sweep.py", other, keys)  # finetune's key
    assert not undeclared_reads("runtime/report/new.py",
                                'def f(record):\n    return record["step"]\n', keys)


def test_generic_words_are_declared_keys():
    """The allow-list names only keys some summary declares (a stale entry is removed)."""
    keys = declared_keys()
    assert not sorted(GENERIC - set(keys))


def test_docs_list_each_summary_and_the_bad_input_kinds():
    """docs/STAGES.md has each kind's summary table and the bad-input kinds' (made from the
    declarations; tests/compiler/test_specs.py checks that they are current)."""
    text = (REPO / "docs" / "STAGES.md").read_text(encoding="utf-8")
    for kind in KINDS:
        assert f"<!-- summary:{kind} " in text, f"docs/STAGES.md has no summary table for {kind}"
    assert "<!-- params:bad_input " in text


def test_every_bad_input_kind_has_a_reader_and_the_report_names_it():
    from runexp.compiler.specs.bad_input import EVERY_FORMAT, JSONL, WORD_SEGMENTER
    from runexp.tasks.vocabulary import chinese_words
    from runexp.tasks.sources import text_files

    assert {k.counted for k in BAD_INPUT_KINDS.values()} == {EVERY_FORMAT, JSONL,
                                                             WORD_SEGMENTER}
    assert set(text_files.ISSUE_MEANINGS) == set(BAD_INPUT_KINDS)
    assert chinese_words.UNSEGMENTED in BAD_INPUT_KINDS
    assert all(k.label and k.meaning for k in BAD_INPUT_KINDS.values())


# --- the records: the tolerant reader, the writer, the executor's check ---------------------

def test_an_old_manifest_still_reads():
    from runexp.compiler.kinds import read_summary

    old = read_summary("finetune", {"accuracy": 0.7, "majority_baseline": 0.5, "step": 20,
                                    "retired_key": 1})
    assert old.kind is None and old.dev_sets is None and old.scored_by == ["accuracy"]
    (dev,) = old.dev_scores().values()
    assert dev.values == {"accuracy": 0.7} and dev.majority_baseline == 0.5
    assert dev.examples is None
    assert read_summary("evaluate", None).mlm_accuracy is None
    issues = read_summary("preprocess", {"bad_input": {"giant_lines": 3}}).bad_input
    assert issues["giant_lines"].count == 3  # an early summary's bare count


def test_a_handlers_summary_is_written_as_it_was_returned():
    from runexp.compiler.kinds import read_summary
    from runexp.runtime.executor import declared_summary

    dev = {"accuracy": 0.7, "f1": 0.6, "majority_baseline": 0.5, "examples": 60}
    finetune = {"accuracy": 0.7, "f1": 0.6, "majority_baseline": 0.5, "kind": "sentence_pair",
                "metrics": ["accuracy", "f1"], "dev_sets": {"dev": dev}, "num_labels": 3,
                "dev_examples": 60, "train_examples": 300, "step": 20}
    pretrain = {"step": 2, "loss": None, "mlm_accuracy": 0.1, "nsp_accuracy": 0.5,
                "examples_per_second": 1.0, "steps_trained": 2, "resumed_from": None,
                "batches_consumed": 2, "parameters": 9,
                "eval": {"mlm_accuracy": 0.1, "nsp_accuracy": 0.5, "loss": 6.0}}
    for kind, summary in (("finetune", finetune), ("pretrain", pretrain)):
        assert declared_summary(kind, summary) == summary
        written = read_summary(kind, summary).to_dict()
        assert written == summary and list(written) == list(summary)  # same keys, same order
        assert declared_summary(kind, read_summary(kind, summary)) == summary


def test_an_undeclared_key_is_a_programming_error(monkeypatch, capsys):
    from runexp.compiler.specs.vocab import VocabSummary
    from runexp.runtime import executor

    with pytest.raises(ValueError, match="VocabSummary does not declare: vocab_sise"):
        executor.declared_summary("vocab", {"vocab_size": 8, "vocab_sise": 8})
    with pytest.raises(ValueError, match="eval.accuracy"):
        executor.declared_summary("pretrain", {"step": 1, "eval": {"accuracy": 0.1}})
    with pytest.raises(TypeError, match="not a PretrainSummary"):
        executor.declared_summary("pretrain", VocabSummary(vocab_size=8))
    monkeypatch.delenv(executor.STRICT_SUMMARIES_ENV)  # a user's run: written, and said
    assert executor.declared_summary("vocab", {"vocab_sise": 8}) == {"vocab_sise": 8}
    assert "WARNING" in capsys.readouterr().out
