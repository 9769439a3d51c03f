"""What a training stage (pretrain, finetune) will cost, before it runs: parameters, FLOPs,
tokens, epochs, time, money and memory, from the plan and the accelerator profile.

How FLOPs are counted (per training step; a multiply-add is 2 FLOPs; backward = 2 x forward):
  per token and layer: 8 h^2 (Q, K, V, output projections) + 4 h i (feed-forward)
                       + 4 s h (attention scores and weighted sum)
  per masked position: 2 h^2 + 2 h V (MLM transform and decoder)
  train step = 3 x batch x (s x layers x per-token-layer + predictions x per-position)
  (a fine-tune has no masked positions; its classifier's FLOPs are negligible)
Wall time assumes the model-FLOPs utilisation in ASSUMED_MFU of the profile's peak; it is
an estimate to compare runs and catch mistakes of 10x, not a promise.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from typing import Optional

from runexp.compiler import uris, wall_time
from runexp.compiler.kinds import KINDS, manifest_summary
from runexp.compiler.model_sizes import parameter_count
from runexp.compiler.packing import Packing, packing_of
from runexp.compiler.plan import Plan
from runexp.compiler.specs import FinetuneSpec, TrainSpec

ASSUMED_MFU = {"tpu": 0.20, "gpu": 0.30, "cpu": 0.25}
# English text tokenised with a 30k WordPiece vocab: about this many bytes per token.
BYTES_PER_TOKEN = 4.5
# Instances are not all full: short_seq_prob and document ends leave padding.
FILL_RATE = 0.85


@dataclasses.dataclass(frozen=True)
class Estimate:
    parameters: int
    tokens_per_step: int
    train_flops_per_step: float
    total_tokens: int
    instances: Optional[int]
    instances_source: str  # "preprocess stats" or "estimated from N bytes of text"
    epochs: Optional[float]
    hours: Optional[float]
    usd: Optional[float]
    usd_preemptible: Optional[float]
    memory_gb_per_replica: float
    # A pretraining phase on packed rows (compiler/packing.py): the factor and the batch.
    packed: Optional[Packing] = None
    seq: int = 0
    # On the profile's preemptible offering: the restarts expected and what they cost.
    restarts: Optional[wall_time.Restarts] = None

    def lines(self, accel: dict) -> list[str]:
        out = [
            f"parameters: {self.parameters / 1e6:.1f} M",
            f"tokens per step: {self.tokens_per_step:,}; total: {self.total_tokens:,}",
            f"training FLOPs per step: {self.train_flops_per_step:.3g}",
        ]
        if self.packed is not None:
            pk = self.packed
            real = int(self.tokens_per_step * pk.fill)
            out[1] += f" (packed rows: about {real:,} real tokens a step)"
            out[1:1] = pk.lines(self.seq)
        if self.instances and self.epochs is not None:
            out.append(f"instances: {self.instances:,} ({self.instances_source}); "
                       f"epochs over them: {self.epochs:.2f}")
        if self.hours is not None:
            money = ""
            if self.usd:
                money = (f"; about ${self.usd:,.0f} on demand, ${self.usd_preemptible:,.0f} "
                         f"preemptible")
            out.append(f"wall time on {accel['name']}: about {_duration(self.hours)} at "
                       f"{ASSUMED_MFU[accel['type']]:.0%} of peak{money}")
            if self.restarts is not None and self.restarts.count >= 0.1:
                out += _restart_lines(self.restarts, self.usd_preemptible / self.hours
                                      if self.usd_preemptible and self.hours else None)
        out.append(f"memory per replica: about {self.memory_gb_per_replica:.1f} GB "
                   f"(of {accel.get('memory_gb_per_replica', 0):g} GB)")
        return out


def _restart_lines(r: "wall_time.Restarts", usd_per_hour: Optional[float]) -> list[str]:
    """The preemptible run's restarts: how many, what each costs, the time and money with
    them (compiler/wall_time.py)."""
    rate = f"{r.rate_per_day:g} preemption a day assumed"
    if not math.isfinite(r.hours):
        return [f"preemptible: {rate}, and a restart takes longer than the time between "
                f"preemptions ({r.cost.describe()}): the run would never end"]
    money = f", ${r.hours * usd_per_hour:,.0f}" if usd_per_hour else ""
    return [f"preemptible: about {r.count:.1f} restarts expected ({rate}), "
            f"{r.cost.describe()}",
            f"preemptible with its restarts: about {_duration(r.hours)}{money}"]


def _duration(hours: float) -> str:
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    if hours < 1:
        return f"{hours * 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} days"


def train_flops_per_example(model: dict, seq: int, predictions: int) -> float:
    h, i, v = model["hidden_size"], model["intermediate_size"], model["vocab_size"]
    per_token_layer = 8 * h * h + 4 * h * i + 4 * seq * h
    per_prediction = 2 * h * h + 2 * h * v
    forward = seq * model["num_hidden_layers"] * per_token_layer + predictions * per_prediction
    return 3.0 * forward


# Bytes per activation value: bfloat16 and mixed_float16 keep activations in 16 bits;
# weights, gradients and optimizer slots stay float32 in every compute dtype.
ACTIVATION_BYTES = {"float32": 4, "bfloat16": 2, "mixed_float16": 2}


def optimizer_slot_values(model: dict, optimizer: str) -> int:
    """Values the optimizer keeps (runtime/optimizer.py): AdamW and LAMB two moments per
    parameter; Amos a momentum per parameter plus ``v`` and ``b`` of a reduced shape
    (amos_slot_shape: a kernel's output axis, an embedding's rows, one value otherwise)."""
    params = parameter_count(model)
    if optimizer != "amos":
        return 2 * params
    h, i, layers = model["hidden_size"], model["intermediate_size"], model["num_hidden_layers"]
    kernels = layers * (5 * h + i) + h + h + 2  # layers; pooler, MLM transform, NSP
    embeddings = model["vocab_size"] + model["max_position_embeddings"] + model["type_vocab_size"]
    scalars = layers * 10 + 12  # biases and LayerNorm scales and offsets
    return params + 2 * (kernels + embeddings + scalars)


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes one replica holds at the peak of a training step: ``state + activations``."""

    state: int  # weights, gradients, optimizer slots (float32), the accumulation sum
    activations: int  # what the peak holds beyond the state (see memory())

    @property
    def gb(self) -> float:
        return (self.state + self.activations) / 1e9


# Calibrated against XLA's buffer assignment of the train step (bench/memory.py: tiny, small
# and base encoders x seq 128/512 x recompute none/layers, float32): what each transformer
# layer keeps for the backward pass, per token, in activation values (scaled by
# ACTIVATION_BYTES) and in bytes of dropout masks (runtime/layers.py Dropout, under XLA).
LAYER_VALUES_H = 8  # x h: QKV input, Q, K, V, context, attention-output and FFN inputs, LN
LAYER_VALUES_I = 3  # x i: the FFN's pre-activation, tanh-GELU's tanh, the GELU output
EMBEDDING_VALUES_H = 3  # x h: the word and position gathers, the pooler slice's gradient
HIDDEN_MASK_BYTES = 4  # a hidden-state dropout mask: the 32-bit random words it is drawn from
ATTENTION_MASK_BYTES = 1 / 8  # the attention probabilities' masks: packed, a bit an element


def memory(model: dict, micro_batch: int, seq: int, optimizer: str = "adamw",
           compute_dtype: str = "float32", recompute: str = "none", grad_accum_steps: int = 1,
           predictions: int = 0) -> Memory:
    """Per replica, at the peak of a training step under XLA (the model of what XLA holds,
    calibrated by bench/memory.py, within a few % on CPU).

    state: float32 weights and gradients (8 bytes a parameter), the optimizer's slots
    (4 bytes a value), with gradient accumulation a float32 sum of the gradients.

    activations, of one micro-batch (``micro_batch`` examples per replica), per token:
      each layer keeps (Korthikanti et al. 2022, as XLA actually holds them)
        bytes x (8 h + 3 i + 2 heads s)      activations (1 heads s without attention
                                             dropout: the softmax output alone)
        + 4 x 2 h + heads s / 8              dropout masks: the hidden states' as the 32-bit
                                             random words, the attention probabilities'
                                             packed 8 to a byte, in every compute dtype
      the embeddings keep bytes x 3 h + 4 h (their mask).
      recompute 'layers': each layer keeps its input (bytes x h): its masks are drawn again
      when it is recomputed in the backward pass, where one layer's full activations are
      live again.
      The MLM logits and their gradient are float32: 8 x predictions x vocab bytes an
      example (the peak is the MLM head's backward, or a layer's recomputation, whichever
      holds more).
    Gradients: XLA computes them during the backward pass into memory the activations it
    frees; at the start of the backward pass only the MLM head's exist, the tied word
    embeddings' (4 x vocab x h bytes); at its end all of them, with the first layer's
    activations still live. So ``activations`` is the larger of the two peaks' bytes beyond
    ``state``: the above + that gradient - all gradients, or one layer's full activations."""
    params = parameter_count(model)
    grads = 4 * params
    state = 4 * (params + optimizer_slot_values(model, optimizer)) + grads
    if grad_accum_steps > 1:
        state += 4 * params
    h, i, vocab = model["hidden_size"], model["intermediate_size"], model["vocab_size"]
    heads, layers = model["num_attention_heads"], model["num_hidden_layers"]
    nbytes = ACTIVATION_BYTES.get(compute_dtype, 4)
    masks = HIDDEN_MASK_BYTES * 2 * h if model.get("hidden_dropout_prob", 0.1) > 0 else 0
    scores = heads * seq  # attention probabilities per token
    if model.get("attention_probs_dropout_prob", 0.1) > 0:
        masks += ATTENTION_MASK_BYTES * scores
        scores *= 2  # and their dropout output
    tokens = micro_batch * seq
    full_layer = int(tokens * (nbytes * (LAYER_VALUES_H * h + LAYER_VALUES_I * i + scores)
                               + masks))
    embeddings = tokens * (nbytes * EMBEDDING_VALUES_H * h + HIDDEN_MASK_BYTES * h)
    logits = 8 * micro_batch * predictions * vocab
    if recompute == "layers":
        kept = layers * tokens * nbytes * h + embeddings
        working = max(logits, full_layer)
    else:
        kept = layers * full_layer + embeddings
        working = logits
    peak = kept + working + 4 * vocab * h
    return Memory(state=state, activations=max(peak - grads, full_layer))


def memory_gb(model: dict, per_replica_batch: int, seq: int, **kwargs) -> float:
    """memory(...).gb: ``per_replica_batch`` is one micro-batch's examples per replica."""
    return memory(model, per_replica_batch, seq, **kwargs).gb


def memory_params(plan: Plan, stage) -> dict:
    """A training stage's params as its memory is estimated: a packed pretraining phase
    holds its rows a step (not its instances) and its rows' prediction slots."""
    pk = packing_of(plan, stage) if stage.kind == "pretrain" else None
    if pk is None:
        return stage.params
    return {**stage.params, "batch_size": pk.rows,
            "max_predictions_per_seq": stage.params["max_predictions_per_row"]}


def _replicas(accel: Optional[dict]) -> int:
    return (accel or {}).get("replicas", 1) or 1


def stage_memory(p: dict, accel: Optional[dict], pretrain: bool = True, **changes) -> Memory:
    """The memory of a training stage's params ``p`` on ``accel``, with ``changes``
    (grad_accum_steps, recompute, compute_dtype) applied."""
    q = {**p, **changes}
    if not pretrain:  # a fine-tune: AdamW, one batch, no recomputation, no masked positions
        f = FinetuneSpec.pick(q)
        micro = max(1, math.ceil(f.batch_size / _replicas(accel)))
        return memory(q["model"], micro, f.max_seq_length, compute_dtype=f.compute_dtype)
    t = TrainSpec.pick(q)
    k = max(1, t.grad_accum_steps)
    micro = max(1, math.ceil(t.batch_size / _replicas(accel) / k))
    return memory(q["model"], micro, t.max_seq_length, optimizer=t.optimization.optimizer,
                  compute_dtype=t.compute_dtype, recompute=t.recompute, grad_accum_steps=k,
                  predictions=t.max_predictions_per_seq)


@dataclasses.dataclass(frozen=True)
class FitOption:
    """A change to a pretraining stage that would fit the accelerator, and its estimate."""

    changes: tuple  # ((setting, value), ...), in the order ACCUM, recompute, dtype
    gb: float


def fit_options(p: dict, accel: dict) -> list[FitOption]:
    """Changes to pretrain params ``p`` that fit ``accel``'s memory, each with its estimate:
    the smallest gradient accumulation that keeps the global batch (a divisor of the
    per-replica batch), recomputation of the layers ('layers'), 16-bit activations; and for
    each of them that does not fit alone, the smallest combination with it that does."""
    limit = accel.get("memory_gb_per_replica") or 0
    per_replica = p["batch_size"] // _replicas(accel)
    t = TrainSpec.pick(p)
    ks = [k for k in range(t.grad_accum_steps + 1, per_replica + 1) if per_replica % k == 0]
    levers = []  # (name, value) switches besides accumulation
    if t.recompute != "layers":
        levers.append(("recompute", "layers"))
    if t.compute_dtype == "float32":
        gpu = accel.get("type") == "gpu"
        levers.append(("compute_dtype", "mixed_float16" if gpu else "bfloat16"))

    # Every combination of the changes: fewest changes first; of as many, those with
    # accumulation (no extra compute, unlike recomputation), smallest k first.
    combos = []
    for n in range(len(levers) + 1):
        for switches in itertools.combinations(levers, n):
            combos.append(switches)
            combos.extend(((("grad_accum_steps", k),) + switches) for k in ks)
    combos = [c for c in combos if c]
    combos.sort(key=lambda c: (len(c), "grad_accum_steps" not in dict(c),
                               dict(c).get("grad_accum_steps", 0)))
    fitting = []
    for changes in combos:
        gb = stage_memory(p, accel, **dict(changes)).gb
        if gb <= limit:
            fitting.append(FitOption(changes, gb))
    out: list[FitOption] = []
    for name in ["grad_accum_steps", *(name for name, _ in levers)]:
        best = next((o for o in fitting if name in dict(o.changes)), None)
        if best is not None and best not in out:
            out.append(best)
    return out


def _corpus_bytes(patterns: list[str]) -> Optional[int]:
    total = 0
    for pattern in patterns:
        if uris.is_gcs(pattern):
            return None
        for path in uris.expand_local(pattern):
            total += os.path.getsize(path)
    return total


def _preprocess_of(plan: Plan, stage) -> Optional[object]:
    """The first preprocess stage ``stage`` reads (a pretraining phase's data)."""
    by_id = {s.id: s for s in plan.stages}
    return next((by_id[d] for d in stage.deps if d in by_id and by_id[d].kind == "preprocess"),
                None)


def _instances(plan: Plan, stage) -> tuple[Optional[int], str]:
    pre = _preprocess_of(plan, stage)
    if pre is None:
        return None, ""
    stats = os.path.join(pre.output_dir, "MANIFEST.json")
    if os.path.isfile(stats):
        import json

        try:
            with open(stats, encoding="utf-8") as f:
                train = manifest_summary("preprocess", json.load(f)).train
            if train is not None and train.instances:
                return int(train.instances), "preprocess stats"
        except (OSError, ValueError, TypeError):
            pass
    corpus = next((s for s in plan.stages if s.kind == "corpus"), None)
    source = pre
    while source is not None and "split_index_dir" in source.inputs:
        source = _preprocess_of(plan, source)  # a later phase: the first phase's corpus
    size = _corpus_bytes(source.inputs.get("train_files") or []) if source else None
    if not size and corpus is not None:
        size = corpus.params["min_bytes"]
    if not size:
        return None, ""
    per_pass = size / BYTES_PER_TOKEN / (pre.params["max_seq_length"] * FILL_RATE)
    return int(per_pass * pre.params["dupe_factor"]), f"estimated from {size / 1e6:.1f} MB of text"


def _finetune_examples(stage) -> tuple[Optional[int], str]:
    """Training examples of a fine-tune: lines of a local train file (minus a TSV header)."""
    path = stage.inputs.get("train_file")
    if not isinstance(path, str) or uris.is_gcs(path) or not os.path.isfile(path) \
            or os.path.getsize(path) > 64 << 20:
        return None, ""
    with open(path, "rb") as f:
        lines = sum(1 for line in f if line.strip())
    header = 0 if path.endswith((".jsonl", ".json")) else 1
    return max(0, lines - header), "lines of the train file"


def estimate(plan: Plan, stage_id: str = "pretrain") -> Optional[Estimate]:
    """Estimates one training stage of `plan` (pretrain or finetune.NAME); None when the plan
    has no such stage or its model is known only at run time."""
    stage = next((s for s in plan.stages if s.id == stage_id), None)
    if stage is None or not KINDS[stage.kind].trains:
        return None
    p, model, accel = stage.params, stage.params["model"], plan.accelerator
    if model.get("vocab_size") is None:
        return None  # an adopted vocab on gs:// is only counted at run time
    seq, batch = p["max_seq_length"], p["batch_size"]
    # A classifier predicts no masked tokens.
    predictions = p["max_predictions_per_seq"] if stage.kind == "pretrain" else 0
    packing = packing_of(plan, stage) if stage.kind == "pretrain" else None
    instances_per_step = batch
    if packing is not None:  # a step computes its rows: fewer than its instances
        batch, instances_per_step = packing.rows, packing.instances_per_step
        predictions = p["max_predictions_per_row"]
    flops = train_flops_per_example(model, seq, predictions) * batch
    if stage.kind == "pretrain":
        instances, source = _instances(plan, stage)
    else:
        instances, source = _finetune_examples(stage)
    hours = usd = usd_pre = None
    if accel:
        rate = accel["replicas"] * accel["peak_tflops_per_replica"] * 1e12 * ASSUMED_MFU[accel["type"]]
        hours = flops * p["train_steps"] / rate / 3600
        usd = hours * accel["usd_per_hour"] if accel["usd_per_hour"] else None
        usd_pre = hours * accel["usd_per_hour_preemptible"] if accel["usd_per_hour"] else None
    restarts = None
    if hours is not None and wall_time.preemptions_per_day(accel):
        restarts = wall_time.expected_restarts(
            hours, wall_time.preemptions_per_day(accel),
            wall_time.restart_cost(parameter_count(model), accel["type"]))
    return Estimate(
        parameters=parameter_count(model),
        tokens_per_step=batch * seq,
        train_flops_per_step=flops,
        total_tokens=batch * seq * p["train_steps"],
        instances=instances,
        instances_source=source,
        epochs=(p["train_steps"] * instances_per_step / instances) if instances else None,
        hours=hours, usd=usd, usd_preemptible=usd_pre,
        memory_gb_per_replica=stage_memory(memory_params(plan, stage), accel,
                                           pretrain=stage.kind == "pretrain").gb,
        packed=packing, seq=seq, restarts=restarts,
    )


def pretraining_total(plan: Plan, ests: dict[str, Estimate]) -> list[str]:
    """Lines summing the pretraining phases' estimates (with more than one phase)."""
    phases = [ests[s.id] for s in plan.stages if s.kind == "pretrain" and s.id in ests]
    if len(phases) < 2:
        return []
    lines = [f"tokens: {sum(e.total_tokens for e in phases):,} in {len(phases)} phases"]
    if all(e.hours is not None for e in phases):
        hours = sum(e.hours for e in phases)
        money = ""
        if all(e.usd for e in phases):
            money = (f"; about ${sum(e.usd for e in phases):,.0f} on demand, "
                     f"${sum(e.usd_preemptible for e in phases):,.0f} preemptible")
        lines.append(f"wall time on {plan.accelerator['name']}: about {_duration(hours)}{money}")
        if all(e.restarts is not None for e in phases):
            restarted = sum(e.restarts.hours for e in phases)
            money = (f", ${sum(e.restarts.hours * e.usd_preemptible / e.hours for e in phases):,.0f}"
                     if all(e.usd_preemptible and e.hours for e in phases) else "")
            lines.append(f"preemptible with its restarts: about "
                         f"{sum(e.restarts.count for e in phases):.1f} restarts, "
                         f"{_duration(restarted)}{money}")
    lines.append(f"memory per replica: about {max(e.memory_gb_per_replica for e in phases):.1f}"
                 " GB at most")
    return lines


def estimates(plan: Plan) -> dict[str, Estimate]:
    """{stage id: Estimate} for every training stage that can be estimated."""
    out = {}
    for stage in plan.stages:
        est = estimate(plan, stage.id)
        if est is not None:
            out[stage.id] = est
    return out
