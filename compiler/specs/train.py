"""The pretrain stage's settings (optimizer, schedule and the training loop) and its
summary.

`train` in gin (plus `train.task`, which names the task or mixture to train on).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, nested, setting
from runexp.compiler.specs.outputs import Summary, output


@dataclasses.dataclass(frozen=True)
class OptimizerSpec(Spec):
    """The optimizer and its learning-rate schedule (warmup, then decay)."""

    optimizer: str = setting("adamw", "AdamW as BERT; LAMB for large batches; Amos",
                             choices=("adamw", "lamb", "amos"), shown=True)
    learning_rate: float = setting(1e-4, "peak learning rate", minimum=0.0, phase=True, shown=True)
    warmup_steps: int = setting(10_000, "linear warmup steps", minimum=0, phase=True, shown=True)
    weight_decay: float = setting(0.01, "AdamW weight decay", minimum=0.0)
    decay: str = setting("linear", "learning-rate decay after warmup",
                         choices=("linear", "polynomial"))
    decay_power: float = setting(1.0, "power of polynomial decay", minimum=0.0)
    end_learning_rate: float = setting(0.0, "rate at the last step", minimum=0.0)
    clip_norm: float = setting(1.0, "global-norm clipping (0: off)", minimum=0.0)


# Params that may change while a run continues from its checkpoints (the resume key leaves
# them out): how long and how often, never what is computed per step.
RESUMABLE = ("train_steps", "checkpoint_every", "keep_checkpoints", "log_every",
             "steps_per_loop", "eval_every", "jit_compile", "recompute")


@dataclasses.dataclass(frozen=True)
class TrainSpec(Spec):
    """The pretrain stage: the encoder, its data and the loop."""

    model: dict = setting(None, "the encoder's bert_config (model.*)", gin=None)
    batch_size: int = setting(256, "global batch size", minimum=1, phase=True, shown=True)
    train_steps: int = setting(100_000, "training steps", gin="steps", minimum=1, phase=True,
                               shown=True)
    optimization: OptimizerSpec = nested(OptimizerSpec, "optimizer and schedule")
    optimizer_state: str = setting(
        "reset", "how a phase after the first starts: 'reset' its optimizer (new moments, step 0, "
                 "its own warmup), or 'carry' the previous phase's moments (step and schedule "
                 "restart)", choices=("reset", "carry"), phase=True)
    checkpoint_every: int = setting(1000, "steps between checkpoints", minimum=1, phase=True)
    keep_checkpoints: int = setting(5, "checkpoints kept", minimum=1)
    init_checkpoint: Optional[str] = setting(None, "checkpoint in Google's BERT layout to "
                                                   "start from", shown=True)
    steps_per_loop: int = setting(1, "steps per host loop (one call to the accelerator)",
                                  minimum=1)
    log_every: int = setting(100, "steps between logs and summaries", minimum=1)
    seed: int = setting(12345, "initialisation and data order seed")
    grad_accum_steps: int = setting(1, "micro-batches accumulated per step (batch / k each)",
                                    minimum=1, phase=True)
    compute_dtype: str = setting("float32", "bfloat16 on TPU; mixed_float16 (loss scaling) on "
                                            "GPU", choices=("float32", "bfloat16",
                                                            "mixed_float16"), shown=True)
    jit_compile: Optional[bool] = setting(None, "XLA-compile the training step (None: where it "
                                                "is faster, one replica on CPU or GPU; TPU steps "
                                                "are always compiled)")
    recompute: str = setting("none", "activation recomputation: 'layers' reruns each "
                                     "transformer layer in the backward pass (less memory, "
                                     "more compute; same gradients under XLA)",
                             choices=("none", "layers"), phase=True)
    eval_every: int = setting(0, "steps between held-out evaluations during training (0: off)",
                              minimum=0, shown=True)
    max_seq_length: int = setting(128, "tokens per example (the preprocess stage's)", gin=None,
                                  shown=True)
    max_predictions_per_seq: int = setting(20, "masked positions per example (the preprocess "
                                               "stage's)", gin=None)
    packing: bool = setting(False, "train rows hold up to 3 instances (the preprocess "
                                   "stage's packing)", gin=None)
    max_predictions_per_row: int = setting(0, "prediction slots of a packed train row (the "
                                              "preprocess stage's; 0: unpacked)", gin=None)
    batch_counts: str = setting(
        "instances", "with packed rows, what batch_size counts: 'instances' (rows a step = "
                     "batch_size / the measured packing factor, so the learning rate and steps "
                     "mean what they mean unpacked) or 'rows' (about factor x batch_size "
                     "instances a step: a larger batch, scale the learning rate with it)",
        choices=("instances", "rows"), phase=True)
    mixture: Optional[str] = setting(None, "the mixture trained on (train.task)", gin=None)
    mixture_rates: Optional[dict] = setting(None, "task -> sampling rate of the mixture",
                                            gin=None, shown=True)
    accelerator: Optional[dict] = setting(None, "the accelerator profile", gin=None)
    deadline_unix: Optional[float] = setting(None, "stop with a checkpoint before this "
                                                   "time.time() (from experiment.wall_time_hours)",
                                             planned=False)
    deadline_margin_s: Optional[float] = setting(None, "seconds kept free before the deadline "
                                                       "(experiment.wall_time_margin_minutes)",
                                                 planned=False)


@dataclasses.dataclass(frozen=True)
class TrainingEval(Summary):
    """The last held-out evaluation during training (train.eval_every)."""

    mlm_accuracy: Optional[float] = output("masked-LM accuracy")
    nsp_accuracy: Optional[float] = output("next-sentence accuracy")
    loss: Optional[float] = output("loss (MLM + NSP)")


@dataclasses.dataclass(frozen=True)
class PackedBatches(Summary):
    """What a step trained on, with packed rows (compiler/packing.py)."""

    rows_per_step: Optional[int] = output("rows a step")
    batch_counts: Optional[str] = output("what batch_size counted: instances or rows")
    factor: Optional[float] = output("the measured instances a row")


@dataclasses.dataclass(frozen=True)
class InitCheckpointReport(Summary):
    """How init_checkpoint was loaded."""

    loaded: Optional[int] = output("variables loaded")
    missing: Optional[list] = output("the model's variables it lacks (left at their initial "
                                     "values)")
    unused: Optional[list] = output("its variables the model has no use for")
    source: Optional[str] = output("google or huggingface")


@dataclasses.dataclass(frozen=True)
class PhaseStart(Summary):
    """How a later pretraining phase started from the previous one."""

    checkpoint: Optional[str] = output("the previous phase's final checkpoint")
    step: Optional[int] = output("its step")
    optimizer_state: Optional[str] = output("reset or carry (train.optimizer_state)")


@dataclasses.dataclass(frozen=True)
class PretrainSummary(Summary):
    """The pretrain stage's summary: the last training window's metrics and how the run
    went."""

    step: Optional[int] = output("the last step trained")
    loss: Optional[float] = output("training loss (MLM + NSP), last log window")
    mlm_accuracy: Optional[float] = output("masked-LM accuracy, last log window")
    nsp_accuracy: Optional[float] = output("next-sentence accuracy, last log window")
    examples_per_second: Optional[float] = output("training throughput, last log window")
    steps_trained: Optional[int] = output("steps this attempt trained")
    resumed_from: Optional[int] = output("the checkpoint step this attempt resumed from")
    batches_consumed: Optional[int] = output("global batches of the data stream read")
    parameters: Optional[int] = output("the model's parameters")
    deadline_seconds_left: Optional[float] = output(
        "with a wall-time budget: seconds left before the deadline at the end", optional=True)
    eval: Optional[TrainingEval] = output("the last held-out evaluation during training",
                                          record=TrainingEval, optional=True)
    packing: Optional[PackedBatches] = output("with packed rows: what a step trained on",
                                              record=PackedBatches, optional=True)
    init_checkpoint: Optional[InitCheckpointReport] = output(
        "with init_checkpoint: how it was loaded", record=InitCheckpointReport, optional=True)
    previous_phase: Optional[PhaseStart] = output(
        "a later phase, started fresh: the checkpoint it started from", record=PhaseStart,
        optional=True)
