"""A plan knows whether it fits: a pretraining stage whose per-replica memory estimate
exceeds the accelerator's is refused with the changes that would fit (each with its
estimate); experiment.memory_check = 'warn' plans it anyway and records the override."""

import os
import re

import pytest

from runexp.compiler.errors import UserError
from runexp.compiler.estimates import memory, stage_memory
from runexp.compiler.model_sizes import bert_config
from runexp.compiler.planner import compile_experiment
from runexp.compiler.render import render_plan
from runexp.compiler.state import CREATE, StageState

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

BERT_BASE_512 = """
include 'runs/pretrain.gin'
include 'models/bert_base.gin'
include 'accelerators/tpu_v2_8.gin'
OUTPUT_ROOT = 'gs://my-bucket/experiments/base512'
CORPUS_FILES = 'gs://my-bucket/corpora/train-*.txt'
MAX_SEQ_LENGTH = 512
BATCH_SIZE = 256
"""


@pytest.fixture
def base512(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RUNEXP_NO_INPUT_LISTING", "1")
    path = tmp_path / "base512.gin"
    path.write_text(BERT_BASE_512)

    def compile_(*params):
        return compile_experiment([str(path)], list(params))
    return compile_


def _gb(text: str, option: str) -> float:
    line = next(l for l in text.splitlines() if l.strip().startswith(option + ":"))
    return float(re.search(r"about ([\d.]+) GB", line).group(1))


def test_bert_base_512_on_v2_8_is_refused_with_the_changes_that_fit(base512):
    with pytest.raises(UserError) as e:
        base512()
    text = str(e.value)
    assert "error: pretrain needs about 24.9 GB per replica" in text
    assert "1.8 GB weights, gradients and adamw state" in text
    assert "activations of 32 examples x 512 tokens" in text
    assert "tpu_v2_8 has 8 GB" in text
    assert "changes that would fit" in text
    # The smallest accumulation that fits (2 does not), recomputation alone, and 16-bit
    # activations, which fit only with accumulation.
    assert _gb(text, "train.grad_accum_steps = 4") == 7.7
    assert "micro-batches of 8 per replica, the same global batch" in text
    assert "train.grad_accum_steps = 2:" not in text
    assert _gb(text, "train.recompute = 'layers'") == 4.1
    assert _gb(text, "train.grad_accum_steps = 4 with train.compute_dtype = 'bfloat16'") == 5.0
    assert "\n    train.compute_dtype = 'bfloat16':" not in text  # alone it does not fit
    assert "experiment.memory_check = 'warn'" in text


def test_each_proposed_change_plans(base512):
    with pytest.raises(UserError) as e:
        base512()
    proposed = [line.strip().split(": about")[0].split(" with ")
                for line in str(e.value).splitlines() if ": about" in line]
    assert len(proposed) == 3
    for changes in proposed:
        plan = base512(*changes).plan
        assert not any("memory" in w for w in plan.warnings), changes


def test_the_override_plans_and_records_a_warning(base512):
    plan = base512("experiment.memory_check = 'warn'").plan
    warning = next(w for w in plan.warnings if "memory check overridden" in w)
    assert "pretrain needs about 24.9 GB per replica" in warning
    assert "planned anyway" in warning
    states = {s.id: StageState(CREATE, "not built yet") for s in plan.stages}
    assert "memory check overridden" in render_plan(plan, states, dry_run=True)


def test_each_phase_is_checked_with_phase_settings_proposed(base512):
    with pytest.raises(UserError) as e:
        base512("train.phases = [{'max_seq_length': 128, 'max_predictions_per_seq': 20, "
                "'steps': 900}, {'max_seq_length': 512, 'max_predictions_per_seq': 80, "
                "'steps': 100}]")
    text = str(e.value)
    assert "pretrain.phase2 needs about" in text
    assert "error: pretrain needs" not in text  # phase 1 (128 tokens) fits
    assert "phase 2's 'grad_accum_steps': 4: about 7.8 GB" in text
    assert "phase 2's 'recompute': 'layers': about 4.1 GB" in text
    # As proposed: phase 2 alone recomputes (phase 1 at 128 tokens need not pay for it).
    plan = base512("train.phases = [{'max_seq_length': 128, 'max_predictions_per_seq': 20, "
                   "'steps': 900}, {'max_seq_length': 512, 'max_predictions_per_seq': 80, "
                   "'steps': 100, 'recompute': 'layers'}]").plan
    assert plan.stage("pretrain").params["recompute"] == "none"
    assert plan.stage("pretrain.phase2").params["recompute"] == "layers"


def test_memory_terms():
    model = {**bert_config("base", {}), "vocab_size": 30522, "max_position_embeddings": 512,
             "type_vocab_size": 2}
    adam = memory(model, 8, 128)
    amos = memory(model, 8, 128, optimizer="amos")
    assert amos.state < adam.state  # Amos: one full-size slot (momentum), not two
    assert memory(model, 8, 128, grad_accum_steps=2).state > adam.state  # the gradient sum
    # A micro-batch where the activations dominate: 16-bit activation values (the dropout
    # masks stay what they are drawn as: bench/memory.py); recomputation keeps each layer's
    # input; no dropout, no masks.
    big = memory(model, 32, 512)
    half = memory(model, 32, 512, compute_dtype="bfloat16")
    assert big.activations / 2 < half.activations < 0.7 * big.activations
    assert memory(model, 32, 512, recompute="layers").activations < big.activations / 3
    no_dropout = {**model, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    assert memory(no_dropout, 32, 512).activations < 0.8 * big.activations
    # A small one: the peak is the end of the backward pass, every gradient (in the state)
    # and the first layer's activations.
    small = memory(model, 8, 128, recompute="layers")
    assert 0 < small.activations < memory(model, 8, 128).activations / 4
    p = {"model": model, "batch_size": 256, "max_seq_length": 128, "grad_accum_steps": 4,
         "max_predictions_per_seq": 0}
    assert stage_memory(p, {"replicas": 8}).activations == memory(model, 8, 128).activations
