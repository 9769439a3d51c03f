"""The preprocess stage: BERT pretraining records in seqio's cache layout.

See docs/STAGES.md ("preprocess") and tasks/instances/pretraining_shards.py. The stage directory is a
seqio cache root: the task's cache is ``<work_dir>/<task>/`` (tasks/cache/records.py), found by
``seqio.get_mixture_or_task(task).get_dataset(use_cached=True)`` once the stage directory is
a global cache dir (tasks/cache/seqio_tasks.py). Shards are built in parallel worker processes
(forked when nothing unsafe to fork is loaded, else spawned: never with TensorFlow in them);
each worker writes its own TFRecord file, and this process writes info.*.json, stats.*.json
and, last, COMPLETED.

Pretraining in phases (compiler/stages/phases.py): the first phase's stage (param
``keep_split_index``) keeps its tokenised splits in ``<work_dir>/split_index/<split>/``; a
later phase's stage (input ``split_index_dir``) makes its examples from them, reading no
corpus byte (its summary's ``input_bytes_read`` is 0).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import threading
import time

from runexp.compiler.errors import UserError
from runexp.compiler.specs.preprocess import MAX_INSTANCES_PER_ROW, SPLIT_INDEX_DIR
from runexp.runtime.context import StageContext
from runexp.runtime.progress import Meter
from runexp.tasks.cache import records
from runexp.tasks.instances.pretraining_shards import (SPILL_DIR, PretrainingConfig, ShardJob,
                                             ShardStats, packing_summary,
                                             plan_prebuilt_shard_jobs, plan_shard_jobs,
                                             run_shard_jobs, summary_fields)
from runexp.tasks.sources.text_files import InputIssues, expand_globs
from runexp.compiler.specs.source import SourceSpec
from runexp.tasks.instances.pretraining_shards import cached_tokenizer

SPLITS = ("train", "validation")


def inputs_read_in_place(stage) -> tuple[str, ...]:
    """The inputs the executor hands this stage as they are when on gs:// (the versions the
    plan listed, tasks/sources/input_files.py) rather than downloading them first: with runner
    'beam', the corpus files, whose ranges the pipeline's workers read from Cloud Storage
    themselves (on Dataflow they could not read a copy on this machine; on this machine
    the launcher need not download a large corpus before the workers start)."""
    source = SourceSpec.pick(stage.params)
    if stage.params.get("runner") != "beam" or not source.makes_instances \
            or source.reads_seqio:
        return ()
    return tuple(f"{split}_files" for split in SPLITS)


def _jobs(ctx: StageContext, config: PretrainingConfig, num_shards: int,
          cache_dir: str) -> list[ShardJob]:
    index_root = ctx.inputs.get("split_index_dir")
    if index_root:  # a later pretraining phase: the first phase's tokenised splits
        jobs = plan_prebuilt_shard_jobs(index_root, ctx.inputs["vocab_dir"], config,
                                        num_shards, cache_dir)
        if not jobs:
            raise UserError(f"no tokenised split in {index_root}: the first phase's preprocess "
                            "stage keeps them there\n  hint: run that stage again (delete its "
                            "directory), then this one")
        ctx.progress(f"examples from the first phase's tokenised splits in {index_root}: no "
                     "corpus file is read")
        return jobs
    spill_dir = os.path.join(ctx.work_dir, SPILL_DIR)
    if config.source.reads_seqio:
        # Documents read through seqio are written once as JSONL in the spill, then built
        # into shards like any text corpus.
        from runexp.tasks.sources.seqio_sources import write_documents
        files, config = write_documents(ctx, config, spill_dir)
    else:
        files = {split: tuple(expand_globs(ctx.inputs[f"{split}_files"]))
                 for split in SPLITS if ctx.inputs.get(f"{split}_files")}
    # Kept for the later pretraining phases, which make their examples from it.
    index_dir = os.path.join(ctx.work_dir, SPLIT_INDEX_DIR) if config.keep_split_index else None
    return plan_shard_jobs(files, ctx.inputs["vocab_dir"], config, num_shards, cache_dir,
                           spill_dir=spill_dir, index_dir=index_dir)


def _check_vocab_casing(ctx: StageContext, wanted: bool) -> None:
    tokenizer = cached_tokenizer(ctx.inputs["vocab_dir"])  # forked workers inherit it
    if bool(wanted) != tokenizer.do_lower_case:
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
    config = PretrainingConfig.from_stage(ctx)
    num_shards = config.num_shards or 1
    workers = config.num_workers or os.cpu_count() or 1
    _check_vocab_casing(ctx, config.do_lower_case)
    if not config.task:
        raise UserError("the preprocess stage needs its task's name (param 'task'): the "
                        "seqio cache is <stage dir>/<task>/")
    cache_dir = records.task_cache_dir(ctx.work_dir, config.task)
    os.makedirs(cache_dir, exist_ok=True)
    if not config.source.makes_instances:
        # Ready-made BERT examples: checked, and cached as they are.
        from runexp.tasks.cache.example_sources import cache_examples
        return cache_examples(ctx, config, cache_dir)
    try:
        return _build_shards(ctx, config, num_shards, workers, cache_dir)
    finally:  # the spill (tokenised text, seqio documents) is scratch: never part of a stage
        shutil.rmtree(os.path.join(ctx.work_dir, SPILL_DIR), ignore_errors=True)


def _build_shards(ctx: StageContext, config: PretrainingConfig, num_shards: int, workers: int,
                  cache_dir: str) -> dict:
    """The shards of a text source, in parallel workers, then info, stats, COMPLETED."""
    jobs = _jobs(ctx, config, num_shards, cache_dir)
    workers = max(1, min(workers, len(jobs)))
    ctx.progress(f"building {len(jobs)} shard(s) of {', '.join(sorted({j.split for j in jobs}))}"
                 f" with {workers} worker process(es)")
    start = time.monotonic()
    totals = _run_jobs(ctx, config, jobs, workers, start)
    summary: dict = {}
    issues = InputIssues()
    for split in SPLITS:
        if any(j.split == split for j in jobs):
            summary[split] = _write_split_files(ctx, config, cache_dir, num_shards, split,
                                                totals[split])
            issues.add(totals[split].issues)
    if config.dynamic_masking and any(j.split == "train" for j in jobs):
        records.write_masking(cache_dir,
                              config.masking_spec(cached_tokenizer(ctx.inputs["vocab_dir"])))
        summary["dynamic_masking"] = True
    records.write_completed(cache_dir)  # last: seqio uses the cache only when it is whole
    summary.update(_input_fields(ctx, config, totals))
    # Bad input is counted, never fatal and never silent: in the summary and on the console.
    summary["bad_input"] = issues.summary()
    for line in issues.describe():
        ctx.progress("WARNING: skipped or repaired bad input: " + line)
    summary["seconds"] = round(time.monotonic() - start, 2)
    return summary


def _run_jobs(ctx: StageContext, config: PretrainingConfig, jobs: list[ShardJob],
              workers: int, start: float) -> dict[str, ShardStats]:
    """Runs the shard jobs under a progress meter (shards done; instances made, a second
    since ``start``). Returns each split's stats, summed over its shards."""
    totals = {split: ShardStats() for split in SPLITS}

    def made() -> str:
        instances = sum(t.instances for t in totals.values())
        seconds = max(time.monotonic() - start, 1e-9)
        return f"{instances:,} instances ({instances / seconds:,.0f}/s)"

    with Meter("shards", total=len(jobs), unit="shards", say=ctx.progress,
               detail=made) as meter:
        for split, _shard, stats in _shard_results(ctx, config, jobs, workers):
            totals[split].add(stats)
            meter.advance()
    return totals


def _shard_results(ctx: StageContext, config: PretrainingConfig, jobs: list[ShardJob],
                   workers: int):
    """(split, shard, stats) of each job as it is done: by an Apache Beam pipeline, in this
    process (one worker), or in a pool of worker processes. The shards are the same."""
    if config.execution.runner == "beam":
        from runexp.tasks.instances.beam_preprocess import run_beam_shard_jobs
        yield from run_beam_shard_jobs(jobs, config.execution.beam_options, workers,
                                       ctx.progress)
    elif workers == 1:
        yield from run_shard_jobs(jobs, map, ctx.progress)
    else:
        with multiprocessing.get_context(_start_method()).Pool(workers) as pool:
            yield from run_shard_jobs(jobs, pool.imap_unordered, ctx.progress)


def _write_split_files(ctx: StageContext, config: PretrainingConfig, cache_dir: str,
                       num_shards: int, split: str, stats: ShardStats) -> dict:
    """Writes a split's info and stats files. Returns its summary; a packed split's also
    has its packing figures, which the console gets too."""
    packed = config.is_packed(split)
    records.write_info(cache_dir, split, num_shards, config.max_seq_length,
                       config.predictions_per_row if packed
                       else config.masking.max_predictions_per_seq,
                       config.is_dynamic(split), MAX_INSTANCES_PER_ROW if packed else 0)
    records.write_stats(cache_dir, split, {
        "examples": stats.records, "input_ids_tokens": stats.tokens,
        "masked_lm_ids_tokens": stats.masked, **stats.counts(),
        "bad_input": stats.issues.summary()})
    summary = {"documents": stats.documents, "instances": stats.instances,
               "tokens": stats.tokens, "masked": stats.masked}
    if packed:
        pk = summary["packing"] = packing_summary(stats, config.max_seq_length)
        ctx.progress(f"{split}: {stats.instances:,} instances packed into {stats.rows:,} rows "
                     f"of {config.max_seq_length} tokens: {pk['factor']:.2f} instances a row, "
                     f"rows {pk['fill']:.1%} full (unpacked: {pk['unpacked_fill']:.1%})")
    return summary


def _input_fields(ctx: StageContext, config: PretrainingConfig,
                  totals: dict[str, ShardStats]) -> dict:
    """The summary's figures of the input: the rate of unknown tokens, the bytes there were
    and the bytes read (the cost), and the size of the split index kept for later phases."""
    unk = sum(t.unk_tokens for t in totals.values())
    tokens = sum(t.document_tokens for t in totals.values())
    fields = {"unk_rate": unk / max(tokens, 1), **summary_fields(totals)}
    if config.keep_split_index:
        fields["split_index_bytes"] = _tree_bytes(os.path.join(ctx.work_dir, SPLIT_INDEX_DIR))
    return fields


def _tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files)
