"""pretrain stage: trains BERT's MLM + NSP objectives on the preprocess stage's records.

Contract (docs/STAGES.md): params ``model``, ``batch_size``, ``train_steps``,
``warmup_steps``, ``learning_rate``, ``weight_decay``, ``checkpoint_every``,
``keep_checkpoints``, ``init_checkpoint``, ``max_seq_length``, ``max_predictions_per_seq``,
``seed``, ``steps_per_loop``, ``log_every``, ``accelerator``; inputs ``data_dir``,
``vocab_dir``. Writes ``checkpoints/``, ``tensorboard/``, ``bert_config.json``,
``train_log.jsonl``. Re-running with checkpoints present continues from the latest.

Optional params beyond the contract: ``compute_dtype`` ("float32", or "bfloat16" for
bfloat16 matmuls with float32 variables: ~1.1-2x faster on CPUs with AMX, the TPU way) and
``jit_compile`` (XLA for the gradient computation; not faster for bigger models on CPU).
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from runexp.runtime import checkpoints, pretraining_data, strategy as strategy_lib
from runexp.runtime.model import BertConfig, BertPretrainer, count_parameters
from runexp.runtime.optimizer import AdamW, WarmupLinearDecay
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


def run(ctx) -> dict:
    p, inputs = ctx.params, ctx.inputs
    strategy_lib.configure_threads()
    config = BertConfig.from_dict(p["model"])
    check_vocab(config, inputs.get("vocab_dir"))
    seed = int(p.get("seed", 0))
    tf.random.set_seed(seed)
    strategy = strategy_lib.make_strategy(strategy_lib.accelerator_of(ctx))
    with strategy.scope():
        model = BertPretrainer(config, compute_dtype=p.get("compute_dtype") or "float32",
                               seed=seed)
        schedule = WarmupLinearDecay(p["learning_rate"], p.get("warmup_steps", 0),
                                     p["train_steps"])
        optimizer = AdamW(schedule, weight_decay=p.get("weight_decay", 0.01))
    write_bert_config(config, ctx.work_dir)

    loop_config = TrainLoopConfig(
        train_steps=int(p["train_steps"]), batch_size=int(p["batch_size"]),
        steps_per_loop=int(p.get("steps_per_loop") or 100),
        log_every=int(p.get("log_every") or 100),
        checkpoint_every=int(p.get("checkpoint_every") or 1000),
        keep_checkpoints=int(p.get("keep_checkpoints") or 3),
        jit_compile=bool(p.get("jit_compile", False)))
    trainer = Trainer(strategy, model, optimizer, ctx.work_dir, loop_config,
                      metrics_fn=pretraining_metrics, progress=ctx.progress,
                      on_checkpoint=ctx.sync)

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
                 f"{strategy.num_replicas_in_sync} replica(s)")

    def make_dataset(skip_batches: int):
        return pretraining_data.pretraining_dataset(
            inputs["data_dir"], "train", batch_size=int(p["batch_size"]),
            max_seq_length=int(p["max_seq_length"]),
            max_predictions_per_seq=int(p["max_predictions_per_seq"]), seed=seed,
            training=True, skip_batches=skip_batches)

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
    if init_report is not None:
        summary["init_checkpoint"] = init_report
    return summary
