"""What can be configured: every configurable, its parameters, their types and defaults.

This is the whole gin surface of runexp besides macros, derived from the specs
(compiler/specs/): a stage's settings are declared once there, with their defaults. Only the
parameters that are not settings of a stage are declared here: input files and the switches
that decide whether a stage exists. A binding of a configurable or parameter not listed is
an error with a "did you mean" hint. Configurables marked `scoped` are registries keyed by
scope: `legal/bert_pretraining_task.train_files = [...]` declares the task `legal`; unscoped
bindings of the same configurable are defaults for every task.
"""

from __future__ import annotations

import dataclasses

from runexp.compiler.specs import (ClassificationSpec, CorpusSpec, EvaluateSpec, ExperimentSpec,
                                   ExportSpec, FinetuneSpec, MixtureSpec, ModelSpec,
                                   PreprocessSpec, SweepSpec, TrainSpec, VocabSpec)
from runexp.compiler.specs.base import REQUIRED, Param

__all__ = ["CONFIGURABLES", "Configurable", "Param", "REQUIRED"]


@dataclasses.dataclass(frozen=True)
class Configurable:
    params: dict
    scoped: bool = False
    doc: str = ""


def _configurable(spec: type, doc: str, scoped: bool = False, **extra: Param) -> Configurable:
    """A configurable whose parameters are `spec`'s settable fields, plus `extra` (inputs and
    switches, which are not stage params)."""
    params = spec.gin_params()
    clash = set(params) & set(extra)
    if clash:
        raise AssertionError(f"{spec.__name__}: {sorted(clash)} declared twice")
    return Configurable({**params, **extra}, scoped=scoped, doc=doc)


CONFIGURABLES: dict[str, Configurable] = {
    "experiment": _configurable(
        ExperimentSpec, "The experiment as a whole.",
        ablation=Param("dict", None, optional=True,
                       doc="a grid over gin macros or bindings and the values each takes, "
                           "e.g. {'MASKED_LM_PROB': [0.15, 0.2]}: the experiment planned once "
                           "per combination, the stages a value changes once per point "
                           "(compiler/ablation.py); None: no ablation")),
    "builtin_corpus": _configurable(CorpusSpec,
                                    "The corpus built from the Python standard library."),
    "vocab": _configurable(VocabSpec, "The vocabulary: adopted from a file, or trained as a "
                                      "stage."),
    "bert_pretraining_task": _configurable(
        PreprocessSpec, "A seqio task of BERT pretraining examples.", scoped=True,
        train_files=Param("str_list", [], doc="globs of the text (sentence_lines, paragraphs, "
                                              "jsonl) or TFRecord (bert_tfrecord) files"),
        validation_files=Param("str_list", [], doc="held-out globs for evaluation")),
    "bert_pretraining_mixture": _configurable(
        MixtureSpec, "A seqio mixture of bert_pretraining_tasks, sampled by rate.", scoped=True),
    "model": _configurable(ModelSpec, "The BERT encoder (Google's bert_config.json fields)."),
    "train": _configurable(
        TrainSpec, "Pretraining.",
        task=Param("str", None, optional=True,
                   doc="name of the bert_pretraining_task or bert_pretraining_mixture to train "
                       "on (None: fine-tune only)"),
        phases=Param("dict_list", None, optional=True,
                     doc="pretraining phases in order, each a dict of the settings it changes "
                         "(compiler/specs/phases.py), e.g. [{'max_seq_length': 128, 'steps': "
                         "90000}, {'max_seq_length': 512, 'max_predictions_per_seq': 80, "
                         "'steps': 10000}]; None: one phase")),
    "evaluate": _configurable(EvaluateSpec, "Held-out MLM/NSP evaluation after pretraining.",
                              enabled=Param("bool", True, doc="run the evaluate stage")),
    "classification_task": _configurable(
        ClassificationSpec, "A sentence (pair) classification task.", scoped=True,
        train_file=Param("str", doc="TSV with a header, or JSONL"),
        dev_file=Param("str", None, optional=True, doc="TSV with a header, or JSONL"),
        dev_files=Param("dict", None, optional=True,
                        doc="several named dev sets, scored each: {'matched': ..., "
                            "'mismatched': ...}")),
    "finetune": _configurable(
        FinetuneSpec, "Fine-tuning, after pretraining or from a released checkpoint.",
        task=Param("str", None, optional=True,
                   doc="classification_task name; None: no fine-tune"),
        suite=Param("str_list", [], doc="a downstream suite instead of one task: GLUE task "
                                        "names (read from glue.data_dir) and "
                                        "classification_task names, one finetune stage each, "
                                        "scored together by the suite stage"),
        **SweepSpec.gin_params()),
    "glue": Configurable({"data_dir": Param("str", None, optional=True,
                                            doc="GLUE's data in its published layout: MNLI/, "
                                                "QQP/, ... (compiler/glue_tasks.py)")},
                         doc="GLUE's tasks for finetune.suite."),
    "export": _configurable(ExportSpec, "SavedModel, Google-layout checkpoint, "
                                        "bert_config.json, vocab.",
                            enabled=Param("bool", True, doc="run the export stage")),
}
