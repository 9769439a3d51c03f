"""What each stage kind is: its spec, its summary, format version, and how the runtime
treats it.

One record per kind replaces the kind lists that were scattered over the compiler and the
runtime. Standard library only (the runtime and `runexp status` read it).

Usage:
    KINDS["pretrain"].trains          # True: checkpoints, resume, a wall-time budget
    KINDS["preprocess"].spec          # PreprocessSpec
    read_summary("evaluate", manifest["summary"]).mlm_accuracy
"""

from __future__ import annotations

import dataclasses

from typing import Any, Mapping

from runexp.compiler.specs import (CorpusSpec, EvaluateSpec, ExportSpec, FinetuneSpec,
                                   PreprocessSpec, SuiteSpec, SweepSpec, TrainSpec,
                                   VocabSpec)
from runexp.compiler.specs.corpus import CorpusSummary
from runexp.compiler.specs.evaluate import EvaluateSummary
from runexp.compiler.specs.export import ExportSummary
from runexp.compiler.specs.finetune import FinetuneSummary
from runexp.compiler.specs.outputs import Summary
from runexp.compiler.specs.preprocess import PreprocessSummary
from runexp.compiler.specs.suite import SuiteSummary
from runexp.compiler.specs.sweep import SweepSummary
from runexp.compiler.specs.train import PretrainSummary
from runexp.compiler.specs.vocab import VocabSummary
from runexp.compiler.specs.runner import OPERATIONAL
from runexp.compiler.specs.train import RESUMABLE


@dataclasses.dataclass(frozen=True)
class StageKind:
    """Attributes:
      name: the kind (also the handler's module: runtime/stages/<name>.py).
      spec: the spec class of its params.
      summary: the record of the summary its handler returns (compiler/specs/outputs.py).
      configurable: the gin configurable that sets them.
      format_version: bump when the handler's output changes for the same inputs and
        params: every cached output of that kind is then rebuilt.
      trains: writes checkpoints, can resume, honours the wall-time budget.
      needs_tensorflow: its handler imports TensorFlow.
      resumable: params that may change while a run continues from its checkpoints.
      operational: params that change how the outputs are made, never what they are (the
        preprocess stage's runner): in the plan, left out of the fingerprint, so changing
        them reuses a cached stage.
    """

    name: str
    spec: type
    summary: type
    configurable: str
    format_version: int = 1
    trains: bool = False
    needs_tensorflow: bool = False
    resumable: tuple = ()
    operational: tuple = ()


KINDS: dict[str, StageKind] = {k.name: k for k in (
    StageKind("corpus", CorpusSpec, CorpusSummary, "builtin_corpus"),
    StageKind("vocab", VocabSpec, VocabSummary, "vocab"),
    # 2: the records are a seqio task cache in <stage dir>/<task>/, with COMPLETED.
    StageKind("preprocess", PreprocessSpec, PreprocessSummary, "bert_pretraining_task",
              format_version=2, operational=OPERATIONAL),
    StageKind("pretrain", TrainSpec, PretrainSummary, "train", trains=True,
              needs_tensorflow=True, resumable=RESUMABLE),
    StageKind("evaluate", EvaluateSpec, EvaluateSummary, "evaluate", needs_tensorflow=True),
    StageKind("finetune", FinetuneSpec, FinetuneSummary, "finetune", trains=True,
              needs_tensorflow=True),
    # The fine-tunes of finetune.suite scored together: reads their metrics.json only.
    StageKind("suite", SuiteSpec, SuiteSummary, "finetune"),
    # The points of a fine-tuning sweep scored together (runtime/stages/sweep.py): reads
    # their metrics.json only, and says which point is selected and which exported.
    StageKind("sweep", SweepSpec, SweepSummary, "finetune"),
    StageKind("export", ExportSpec, ExportSummary, "export", needs_tensorflow=True),
)}

TRAINING_KINDS = tuple(k.name for k in KINDS.values() if k.trains)
TF_KINDS = tuple(k.name for k in KINDS.values() if k.needs_tensorflow)


def read_summary(kind: str, data: Any) -> Summary:
    """A stage's summary (a MANIFEST.json's "summary", or a metrics.json) as its kind
    declares it, read tolerantly: old manifests still read (compiler/specs/outputs.py)."""
    return KINDS[kind].summary.read(data)


def manifest_summary(kind: str, manifest: Mapping) -> Summary:
    """The summary of a MANIFEST.json's contents (``{}`` or not a mapping: every key None)."""
    return read_summary(kind, manifest.get("summary") if isinstance(manifest, Mapping)
                        else None)
