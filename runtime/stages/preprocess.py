"""The preprocess stage: BERT pretraining records in seqio's cache layout.

See docs/STAGES.md ("preprocess") and tasks/pretraining_shards.py. Shards are built in
parallel worker processes (forked when nothing unsafe to fork is loaded, else spawned: never
with TensorFlow in them); each worker writes its own TFRecord file, and this process writes
info.*.json and stats.*.json.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time

from runexp.compiler.errors import UserError
from runexp.runtime.context import StageContext
from runexp.tasks import records
from runexp.tasks.pretraining_shards import (PretrainingConfig, ShardJob, ShardStats,
                                             write_shard)
from runexp.tasks.text_files import InputIssues, expand_globs

SPLITS = ("train", "validation")


def _jobs(ctx: StageContext, config: PretrainingConfig, num_shards: int) -> list[ShardJob]:
    jobs = []
    for split in SPLITS:
        patterns = ctx.inputs.get(f"{split}_files") or []
        if not patterns:
            continue
        files = tuple(expand_globs(patterns))
        for shard in range(num_shards):
            jobs.append(ShardJob(files, ctx.inputs["vocab_dir"], config, split, shard, num_shards,
                                 records.shard_path(ctx.work_dir, split, shard, num_shards)))
    return jobs


def _check_vocab_casing(ctx: StageContext) -> None:
    from runexp.tasks.pretraining_shards import cached_tokenizer
    tokenizer = cached_tokenizer(ctx.inputs["vocab_dir"])  # forked workers inherit it
    wanted = ctx.params.get("do_lower_case")
    if wanted is not None and bool(wanted) != tokenizer.do_lower_case:
        raise UserError(
            f"preprocess do_lower_case={wanted} but the vocab in {ctx.inputs['vocab_dir']} "
            f"was built with do_lower_case={tokenizer.do_lower_case}\n"
            "  hint: set DO_LOWER_CASE to match the vocab")


def _start_method() -> str:
    """"fork" when it is safe (no TensorFlow loaded, no other thread): workers start in
    milliseconds with the modules already imported; "spawn" otherwise (a fresh interpreter,
    nothing inherited). The output is the same either way."""
    if ("fork" in multiprocessing.get_all_start_methods() and "tensorflow" not in sys.modules
            and threading.active_count() == 1):
        return "fork"
    return "spawn"


def run(ctx: StageContext) -> dict:
    p = ctx.params
    config = PretrainingConfig.from_params(p)
    num_shards = int(p.get("num_shards") or 1)
    workers = int(p.get("num_workers") or 0) or os.cpu_count() or 1
    _check_vocab_casing(ctx)
    jobs = _jobs(ctx, config, num_shards)
    workers = max(1, min(workers, len(jobs)))
    ctx.progress(f"building {len(jobs)} shard(s) of {', '.join(sorted({j.split for j in jobs}))}"
                 f" with {workers} worker process(es)")
    start = time.monotonic()
    totals = {split: ShardStats() for split in SPLITS}
    done = 0

    def collect(result):
        nonlocal done
        split, shard, stats = result
        totals[split].add(stats)
        done += 1
        ctx.progress(f"[{done}/{len(jobs)}] {split} shard {shard}: {stats.instances:,} "
                     f"instances from {stats.documents:,} documents "
                     f"({time.monotonic() - start:.1f}s)")

    if workers == 1:
        for job in jobs:
            collect(write_shard(job))
    else:
        with multiprocessing.get_context(_start_method()).Pool(workers) as pool:
            for result in pool.imap_unordered(write_shard, jobs):
                collect(result)

    summary: dict = {}
    issues = InputIssues()
    for split in SPLITS:
        if not any(j.split == split for j in jobs):
            continue
        s = totals[split]
        records.write_info(ctx.work_dir, split, num_shards, config.max_seq_length,
                           config.max_predictions_per_seq, config.is_dynamic(split))
        records.write_stats(ctx.work_dir, split, {
            "examples": s.instances, "input_ids_tokens": s.tokens,
            "masked_lm_ids_tokens": s.masked, **s.counts(),
            "bad_input": s.issues.summary()})
        summary[split] = {"documents": s.documents, "instances": s.instances,
                          "tokens": s.tokens, "masked": s.masked}
        issues.add(s.issues)
    if config.dynamic_masking and any(j.split == "train" for j in jobs):
        from runexp.tasks.pretraining_shards import cached_tokenizer
        records.write_masking(ctx.work_dir,
                              config.masking_spec(cached_tokenizer(ctx.inputs["vocab_dir"])))
        summary["dynamic_masking"] = True
    unk = sum(t.unk_tokens for t in totals.values())
    tokens = sum(t.document_tokens for t in totals.values())
    summary["unk_rate"] = unk / max(tokens, 1)
    # Bad input is counted, never fatal and never silent: in the summary and on the console.
    summary["bad_input"] = issues.summary()
    for line in issues.describe():
        ctx.progress("WARNING: skipped or repaired bad input: " + line)
    summary["seconds"] = round(time.monotonic() - start, 2)
    return summary
