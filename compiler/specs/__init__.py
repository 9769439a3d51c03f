"""Specs: each setting of each stage kind declared once (see base.py).

Standard library only, so the compiler, tasks/ and the runtime share them.
"""

from runexp.compiler.specs.base import REQUIRED, Param, Spec, nested, setting
from runexp.compiler.specs.corpus import CorpusSpec
from runexp.compiler.specs.evaluate import EvaluateSpec
from runexp.compiler.specs.export import ExportSpec
from runexp.compiler.specs.finetune import ClassificationSpec, FinetuneSpec
from runexp.compiler.specs.launch import ExperimentSpec, MixtureSpec, ModelSpec
from runexp.compiler.specs.preprocess import MaskingSpec, PreprocessSpec
from runexp.compiler.specs.source import SourceSpec
from runexp.compiler.specs.suite import SuiteSpec
from runexp.compiler.specs.sweep import SweepSpec
from runexp.compiler.specs.train import OptimizerSpec, TrainSpec
from runexp.compiler.specs.vocab import VocabSpec

__all__ = ["REQUIRED", "Param", "Spec", "nested", "setting", "CorpusSpec", "EvaluateSpec",
           "ExportSpec", "ClassificationSpec", "FinetuneSpec", "ExperimentSpec", "MixtureSpec",
           "ModelSpec", "MaskingSpec", "PreprocessSpec", "OptimizerSpec", "SourceSpec", "SuiteSpec",
           "SweepSpec", "TrainSpec", "VocabSpec"]
