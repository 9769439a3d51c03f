"""pretrain stage: trains BERT's MLM + NSP objectives on the preprocess stage's records.

Contract (docs/STAGES.md): params ``model``, ``batch_size``, ``train_steps``,
``warmup_steps``, ``learning_rate``, ``weight_decay``, ``checkpoint_every``,
``keep_checkpoints``, ``init_checkpoint``, ``max_seq_length``, ``max_predictions_per_seq``,
``seed``, ``steps_per_loop``, ``log_every``, ``accelerator``; inputs ``data_dir``,
``vocab_dir`` (a mixture: ``data_dirs``, task -> dir, and the param ``mixture_rates``,
task -> rate). Writes ``checkpoints/``, ``tensorboard/``, ``bert_config.json``,
``train_log.jsonl``. Re-running with checkpoints present continues from the latest.

Optional params beyond the contract (``ctx.params.get`` with these defaults, so older
plans run unchanged; see ``training_options``):

- ``optimizer`` ("adamw" | "lamb" | "amos", "adamw"), ``decay`` ("linear" | "polynomial",
  "linear"), ``decay_power`` (float, 1.0), ``end_learning_rate`` (float, 0.0),
  ``clip_norm`` (float, 1.0; 0 = off), ``grad_accum_steps`` (int >= 1, 1);
- ``compute_dtype`` ("float32"; "bfloat16": bfloat16 matmuls, float32 variables, the TPU
  way and ~1.1-2x faster on CPUs with AMX; "mixed_float16": float16 matmuls with dynamic
  loss scaling, for GPUs), ``jit_compile`` (bool, False: the whole step compiled by XLA;
  about 5-20% faster steps on CPU, bench/train.py; without it only the vocabulary
  cross-entropy and, on one replica, the optimizer update are XLA-compiled);
- ``eval_every`` (int, 0 = off: held-out MLM/NSP metrics every n steps when the data has a
  validation split), ``eval_examples`` (int, 2048: examples per such evaluation);
- ``deadline_unix`` (float or None): stop with a checkpoint before this time.time() and
  raise ``preemption.DeadlineReached``. SIGTERM always stops with a checkpoint at the next
  step and raises ``preemption.Preempted``.
"""

from __future__ import annotations

import glob
import json
import os

import tensorflow as tf

from runexp.runtime import checkpoints, pretraining_data, strategy as strategy_lib
from runexp.runtime.model import BertConfig, BertPretrainer, count_parameters
from runexp.runtime.optimizer import optimizer_from_params
from runexp.runtime.trainer import TrainLoopConfig, Trainer, pretraining_metrics

CONFIG_FILE = "bert_config.json"


def write_bert_config(config: BertConfig, directory: str) -> str:
    path = os.path.join(directory, CONFIG_FILE)
    with open(path, "w") as f:
        json.dump(config.to_dict(), f, indent=2, sort_keys=True)
        f.write("\n")
    return path


def check_vocab(config: BertConfig, vocab_dir: str | None) -> None:
    """Refuses a model whose vocab_size is smaller than the vocab's token count."""
    if not vocab_dir:
        return
    path = os.path.join(vocab_dir, "vocab.txt")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            tokens = sum(1 for line in f if line.rstrip("\n"))
        if tokens > config.vocab_size:
            raise ValueError(f"model.vocab_size is {config.vocab_size} but {path} has "
                             f"{tokens} tokens: token ids would fall outside the embeddings")


def training_options(p, train_steps: int, batch_size: int, **defaults) -> TrainLoopConfig:
    """The loop options a training stage's params hold (see the module docstring)."""
    grad_accum = p.get("grad_accum_steps")
    grad_accum = 1 if grad_accum is None else int(grad_accum)
    if grad_accum < 1:
        raise ValueError(f"grad_accum_steps must be >= 1; got {grad_accum}")
    deadline = p.get("deadline_unix")
    return TrainLoopConfig(
        train_steps=train_steps, batch_size=batch_size,
        steps_per_loop=int(p.get("steps_per_loop") or defaults.get("steps_per_loop", 100)),
        log_every=int(p.get("log_every") or defaults.get("log_every", 100)),
        checkpoint_every=int(p.get("checkpoint_every")
                             or defaults.get("checkpoint_every", 1000)),
        keep_checkpoints=int(p.get("keep_checkpoints") or defaults.get("keep_checkpoints", 3)),
        jit_compile=bool(p.get("jit_compile", False)),
        grad_accum_steps=grad_accum,
        compute_dtype=p.get("compute_dtype") or "float32",
        eval_every=int(p.get("eval_every") or 0),
        deadline=None if deadline is None else float(deadline))


def has_split(data_dir: str, split: str) -> bool:
    return bool(glob.glob(os.path.join(data_dir, f"{split}.tfrecord-*")))


def data_sources(p, inputs) -> tuple[list[str], list[float] | None]:
    """The data dirs to train on and their rates: one task's ``data_dir``, or a mixture's
    ``data_dirs`` (task -> dir) with ``mixture_rates`` (task -> rate), sorted by task name so
    the sampling order never depends on how the gin file listed them."""
    if "data_dirs" not in inputs:
        return [inputs["data_dir"]], None
    rates = p["mixture_rates"]
    tasks = sorted(inputs["data_dirs"])
    if set(tasks) != set(rates):
        raise ValueError(f"mixture_rates names {sorted(rates)} but data_dirs {tasks}")
    return [inputs["data_dirs"][t] for t in tasks], [float(rates[t]) for t in tasks]


def run(ctx) -> dict:
    p, inputs = ctx.params, ctx.inputs
    strategy_lib.configure_threads()
    config = BertConfig.from_dict(p["model"])
    check_vocab(config, inputs.get("vocab_dir"))
    seed = int(p.get("seed", 0))
    tf.random.set_seed(seed)
    train_steps, batch_size = int(p["train_steps"]), int(p["batch_size"])
    loop_config = training_options(p, train_steps, batch_size)
    strategy = strategy_lib.make_strategy(strategy_lib.accelerator_of(ctx))
    xla = loop_config.jit_compile or strategy_lib.is_tpu(strategy_lib.accelerator_of(ctx))
    with strategy.scope():
        model = BertPretrainer(config, compute_dtype=loop_config.compute_dtype, seed=seed,
                               xla=xla)
        optimizer = optimizer_from_params(p, train_steps, config.hidden_size)
    write_bert_config(config, ctx.work_dir)

    seq, preds = int(p["max_seq_length"]), int(p["max_predictions_per_seq"])
    data_dirs, rates = data_sources(p, inputs)
    eval_dataset = None
    if loop_config.eval_every:
        held = [d for d in data_dirs if has_split(d, "validation")]
        if held:
            # The examples are split between the members with a validation split.
            eval_examples = max(1, int(p.get("eval_examples") or 2048) // len(held))
            eval_dataset = lambda: pretraining_data.pretraining_dataset(  # noqa: E731
                held, "validation", batch_size=batch_size, max_seq_length=seq,
                max_predictions_per_seq=preds, training=False, max_examples=eval_examples)
        else:
            ctx.progress(f"eval_every {loop_config.eval_every}: no validation split in "
                         f"{', '.join(data_dirs)}; training without held-out evaluation")
    trainer = Trainer(strategy, model, optimizer, ctx.work_dir, loop_config,
                      metrics_fn=pretraining_metrics, progress=ctx.progress,
                      on_checkpoint=ctx.sync, eval_dataset=eval_dataset)

    init_report = None
    has_checkpoint = trainer.manager.latest_checkpoint is not None
    if p.get("init_checkpoint") and not has_checkpoint:
        # Only a fresh run starts from init_checkpoint; a resumed one has its own weights.
        report = checkpoints.load_google_checkpoint(model.google_variables(),
                                                    p["init_checkpoint"])
        init_report = {"loaded": len(report.loaded), "missing": list(report.missing),
                       "unused": list(report.unused)}
        ctx.progress(f"init_checkpoint {p['init_checkpoint']}: {len(report.loaded)} variables "
                     f"loaded, {len(report.missing)} missing, {len(report.unused)} unused")
        for name in report.missing:
            ctx.progress(f"  missing (left at its initial value): {name}")
        for name in report.unused:
            ctx.progress(f"  unused: {name}")

    ctx.progress(f"model: {count_parameters(model.google_variables()):,} parameters, "
                 f"{strategy.num_replicas_in_sync} replica(s), optimizer "
                 f"{p.get('optimizer') or 'adamw'}, compute {loop_config.compute_dtype}"
                 + (f", {loop_config.grad_accum_steps} micro-batches per step"
                    if loop_config.grad_accum_steps > 1 else ""))

    def make_dataset(skip_batches: int):
        return pretraining_data.pretraining_dataset(
            data_dirs if rates else data_dirs[0], "train", batch_size=batch_size,
            max_seq_length=seq, max_predictions_per_seq=preds, seed=seed, training=True,
            skip_batches=skip_batches, rates=rates)

    result = trainer.train(make_dataset)
    summary = {
        "step": result["step"],
        "loss": result.get("loss"),
        "mlm_accuracy": result.get("mlm_accuracy"),
        "nsp_accuracy": result.get("nsp_accuracy"),
        "examples_per_second": result.get("examples_per_second"),
        "steps_trained": result["steps_trained"],
        "resumed_from": result["resumed_from"],
        "batches_consumed": int(trainer.batches_consumed.numpy()),
        "parameters": count_parameters(model.google_variables()),
    }
    if result.get("eval"):
        summary["eval"] = {k: result["eval"][k] for k in ("mlm_accuracy", "nsp_accuracy",
                                                            "loss")}
    if init_report is not None:
        summary["init_checkpoint"] = init_report
    return summary
