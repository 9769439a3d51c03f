"""Settings that are not a stage's: the experiment (how to launch), the model, mixtures."""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import REQUIRED, Spec, setting


@dataclasses.dataclass(frozen=True)
class ExperimentSpec(Spec):
    """`experiment` in gin: where outputs go, on what, and how to launch."""

    name: Optional[str] = setting(None, "experiment name (default: the first gin file's name)")
    output_root: str = setting(REQUIRED, "local directory or gs:// URI for every output")
    accelerator: str = setting("cpu", "accelerator profile (see compiler/accelerators.py)")
    max_attempts: int = setting(1, "launches in all when a run is preempted (SIGTERM): "
                                   "relaunched until done or this many", minimum=1)
    relaunch_backoff_s: float = setting(30.0, "seconds before a relaunch; doubled for each "
                                              "further one after a launch shorter than 30 "
                                              "minutes (at most 10 minutes)", minimum=0.0)
    wall_time_hours: Optional[float] = setting(None, "stop cleanly with a checkpoint after this "
                                                     "long (a 12-hour notebook: 11.5)",
                                               minimum=0.0)
    wall_time_margin_minutes: Optional[float] = setting(
        None, "time kept free before the wall-time budget ends (None: scaled to the budget "
              "and the model)", minimum=0.0)
    memory_check: str = setting(
        "error", "a pretraining stage whose memory estimate exceeds the accelerator's: 'error' "
                 "(refused, with the changes that fit), or 'warn' (planned anyway, the override "
                 "recorded in the plan's warnings: for users who know the estimate is wrong)",
        choices=("error", "warn"))
    tpu: Optional[str] = setting(None, "TPU name or grpc:// address (None: $TPU_NAME, else this "
                                       "TPU VM's own)")
    tpu_zone: Optional[str] = setting(None, "the TPU's zone, e.g. 'us-central1-f' (also checked "
                                            "against the bucket's location)")
    gcp_project: Optional[str] = setting(None, "the TPU's Google Cloud project")
    tpu_service_account: Optional[str] = setting(None, "the TPU's service account: preflight "
                                                       "checks the bucket grants it access")


# Plan.launch: how to launch, not what to compute (never in a fingerprint).
LAUNCH_FIELDS = ("max_attempts", "relaunch_backoff_s", "wall_time_hours",
                 "wall_time_margin_minutes")


@dataclasses.dataclass(frozen=True)
class ModelSpec(Spec):
    """`model` in gin: Google's bert_config.json fields; `size` presets the rest."""

    size: str = setting("base", "preset sizes; the fields below override it",
                        choices=("tiny", "mini", "small", "medium", "base", "large"))
    hidden_size: Optional[int] = setting(None, "hidden size", minimum=1)
    num_hidden_layers: Optional[int] = setting(None, "layers", minimum=1)
    num_attention_heads: Optional[int] = setting(None, "attention heads", minimum=1)
    intermediate_size: Optional[int] = setting(None, "feed-forward size", minimum=1)
    vocab_size: Optional[int] = setting(None, "embedding rows (default: the vocab's size)",
                                        minimum=1)
    hidden_act: str = setting("gelu", "activation: 'gelu' is google-research/bert's tanh "
                              "approximation, 'gelu_exact' the erf one (transformers' 'gelu')",
                              choices=("gelu", "gelu_exact", "relu", "tanh"))
    hidden_dropout_prob: float = setting(0.1, "dropout", minimum=0.0, maximum=1.0)
    attention_probs_dropout_prob: float = setting(0.1, "attention dropout", minimum=0.0,
                                                  maximum=1.0)
    max_position_embeddings: int = setting(512, "position embeddings", minimum=1)
    type_vocab_size: int = setting(2, "segment types", minimum=1)
    initializer_range: float = setting(0.02, "truncated normal stddev", minimum=0.0)


@dataclasses.dataclass(frozen=True)
class MixtureSpec(Spec):
    """`bert_pretraining_mixture` in gin (scoped by the mixture's name)."""

    rates: dict = setting(REQUIRED, "task name -> sampling rate (positive; normalised), "
                                    "e.g. {'wiki': 0.7, 'books': 0.3}")
