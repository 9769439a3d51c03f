"""Scale-out preprocessing: the preprocess stage's shards built by an Apache Beam pipeline.

``bert_pretraining_task.runner = 'beam'`` (compiler/specs/runner.py). The pipeline runs the
local runner's own code (tasks/instances/pretraining_shards.py ``run_shard_jobs``), step for step, so
its records, stats and bad-input report are the same, byte for byte, whatever the runner and
its number of workers:

1. **Tokenise** (``tokenize_range``): one element per byte range of a split's files (the
   same ``RangeJob``s: ``plan_ranges`` over the split's sorted files, ``num_shards`` ranges,
   cut anywhere, not one worker per file), spread over the workers by a ``Reshuffle``. Each
   writes its range's tokens, sentence lengths and fragments; its element carries only the
   small ``RangeResult``.
2. **Join** (``build_split_index``): a ``GroupByKey`` of the range results by split. The join
   is global (documents are stitched across range ends, blocks and their seeds are numbered
   over the whole split), so it runs once per split, on one worker, as the local runner's
   parent does; it streams the range files into the index (memory: 16 bytes per document,
   as the parent's). Chosen over running it on the launcher between two pipelines: one job
   (one worker start-up on Dataflow, one place to watch it), a launcher that moves no data,
   and a split's shards start as soon as its own index is built. It emits the split's shard
   jobs.
3. **Shards** (``write_shard``): a ``Reshuffle`` spreads the shard jobs over the workers;
   each builds its shard from the index with the same per-block seeds and writes the same
   TFRecord file, and records its ``ShardStats``.

The launcher (``run_beam_shard_jobs``) yields each shard's ``(split, shard, stats)`` as it is
recorded, like ``run_shard_jobs``: the stage (runtime/stages/preprocess.py) then writes info,
stats and, last, COMPLETED, as for the local runner. Memory per worker: a range's tokens
batch by batch (phase 1), a shard's documents and plan (phase 2): the local runner's.

Where the files live: the workers read the corpus where it is: local files, or on Cloud
Storage the object versions the plan listed (``gs://bucket/key#generation``, read by byte
ranges: tasks/sources/input_files.py; the executor hands them over without downloading them,
runtime/stages/preprocess.py ``inputs_read_in_place``). With a local runner (DirectRunner:
worker processes on this machine) the index is built in the stage's spill directory and the
shards are written in place. With a runner whose workers are elsewhere (Dataflow) everything
a worker hands on goes through a shared directory (``shared_dir``:
``<temp_location>/runexp-preprocess-<id>``, on gs://) with runexp's storage layer: the
vocabulary down to each worker, range files up, the joining worker downloads them and
uploads the index, each shard worker downloads the index once per process (it reads random
windows of the whole split for random next segments) and uploads its shard and stats; the
launcher downloads the shards into the stage directory. Tests run that path on DirectRunner
with a local and with a gs:// shared directory. A corpus on this machine cannot be read by
remote workers: refused at plan time (compiler/stages/runner.py) and again at launch.

DirectRunner here is Beam's FnApiRunner, which is what DirectRunner runs a batch pipeline on,
without DirectRunner's first attempt to download the PrismRunner binary from the network.
Options default to one worker process per core (``direct_num_workers``, in
``multi_processing`` mode).

Imported only with runner 'beam' (apache-beam: ``pip install runexp[beam]``). No TensorFlow.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import shutil
import tempfile
import threading
import uuid
from typing import Callable, Iterator, Mapping, Optional, Sequence



class _QuietImports(logging.Filter):
    """Drops Beam's import-time note that its BigQuery client is missing (never used here)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("apitools not found")


logging.getLogger().addFilter(_QuietImports())
import apache_beam as beam  # noqa: E402

from runexp.compiler.errors import UserError
from runexp.compiler.specs.runner import LOCAL_BEAM_RUNNERS, canonical_runner
from runexp.runtime import storage
from runexp.tasks.sources import input_files
from runexp.tasks.instances.pretraining_shards import (ShardJob, ShardStats, plan_range_jobs,
                                             remove_split_indexes, write_shard)
from runexp.tasks.instances.split_index import (RangeJob, RangeResult, build_split_index, tokenize_range)
from runexp.tasks.vocabulary.tokenizer import cached_tokenizer

# The files of a split's index (tasks/instances/split_index.py build_split_index), meta.json last.
INDEX_FILES = ("tokens.bin", "offsets.bin", "documents.npy", "blocks.npy", "block_tokens.npy",
               "meta.json")
_RANGE_FILES = ("tokens", "lengths", "fragments.npy")
POLL_SECONDS = 0.5


# --- files, local or shared (runexp's storage layer: a path or gs://) ------------------------
# Not Beam's FileSystems: runexp's layer checks every copy (size, crc32c), retries within its
# budget, honours STORAGE_EMULATOR_HOST, and is what the rest of runexp reads gs:// with.

def _write_pickle(uri: str, obj) -> None:
    storage.write_bytes(uri, pickle.dumps(obj))  # a retried bundle writes the same content


def _read_pickle(uri: str):
    return pickle.loads(storage.read_bytes(uri))


def _list(directory: str) -> list[str]:
    """The files directly in ``directory`` (none when it does not exist), but temporary ones
    (the storage layer's local writes: ``.<name>.tmp-*``)."""
    return [uri for uri in storage.list(directory)
            if not uri.rsplit("/", 1)[-1].startswith(".")]


# --- the pipeline's steps ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the pipeline's files are. ``stats_dir``: each range's and shard's record
    (pickled), which the launcher polls. ``shared_dir``: None when the workers share this
    machine's disk (the index and shards are written where the local runner writes them),
    else a directory every worker and the launcher reach (``keys``: a split index's
    directory name there, by its local ``index_dir``)."""
    stats_dir: str
    shared_dir: Optional[str] = None
    keys: Mapping[str, str] = dataclasses.field(default_factory=dict)
    vocabs: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the same, of vocabs

    def shared(self, what: str, *parts: str) -> str:
        return storage.join(self.shared_dir, what, *parts)

    def vocab(self, vocab_dir: str) -> str:
        """Where this worker reads a job's vocabulary: the launcher's directory, or its copy
        of the one handed on through the shared directory."""
        if self.shared_dir is None:
            return vocab_dir
        return _local_copy(self.shared("vocab", self.vocabs[vocab_dir]))


class TokenizeRange(beam.DoFn):
    """Phase 1 on one byte range: ``(index_dir, (job, result))``."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def process(self, job: RangeJob):
        layout = self.layout
        if layout.shared_dir is None:
            result = tokenize_range(job)
        else:  # tokenised here, handed on through the shared directory
            key = layout.keys[job.index_dir]
            with tempfile.TemporaryDirectory(prefix="runexp-range-") as tmp:
                result = tokenize_range(dataclasses.replace(
                    job, index_dir=tmp, vocab_dir=layout.vocab(job.vocab_dir)))
                for what in _RANGE_FILES:
                    name = f"range-{job.index:05d}.{what}"
                    storage.upload_file(os.path.join(tmp, name), layout.shared("ranges", key, name))
        _write_pickle(storage.join(layout.stats_dir, f"range.{_split_of(job)}.{job.index:05d}"),
                      (os.path.basename(job.index_dir), result.index, result.bytes_read,
                       result.sentences, result.tokens))
        yield job.index_dir, (job, result)


def _split_of(job: RangeJob) -> str:
    return os.path.basename(job.index_dir)


class JoinSplit(beam.DoFn):
    """Between the phases, once per split: its range results joined into its index
    (``build_split_index``); emits the split's shard jobs."""

    def __init__(self, layout: Layout, shard_jobs: Mapping[str, Sequence[ShardJob]]):
        self.layout = layout
        self.shard_jobs = shard_jobs

    def process(self, element):
        index_dir, pairs = element
        pairs = sorted(pairs, key=lambda p: p[0].index)
        jobs = [p[0] for p in pairs]
        results: list[RangeResult] = [p[1] for p in pairs]
        layout = self.layout
        vocab_size = cached_tokenizer(layout.vocab(jobs[0].vocab_dir)).vocab_size
        if layout.shared_dir is None:
            # A retried join finds the index built (meta.json is written last).
            if not os.path.exists(os.path.join(index_dir, "meta.json")):
                build_split_index(jobs, results, vocab_size)
        else:
            key = layout.keys[index_dir]
            if not storage.exists(layout.shared("index", key, "meta.json")):
                with tempfile.TemporaryDirectory(prefix="runexp-join-") as tmp:
                    for job in jobs:
                        for what in _RANGE_FILES:
                            name = f"range-{job.index:05d}.{what}"
                            storage.download_file(layout.shared("ranges", key, name),
                                      os.path.join(tmp, name))
                    build_split_index([dataclasses.replace(j, index_dir=tmp) for j in jobs],
                                      results, vocab_size)
                    for name in INDEX_FILES:  # meta.json last: the index is whole
                        storage.upload_file(os.path.join(tmp, name), layout.shared("index", key, name))
        yield from self.shard_jobs[index_dir]


_LOCAL_COPIES: dict[str, str] = {}
_COPY_LOCK = threading.Lock()


def _local_copy(uri: str, names: Optional[Sequence[str]] = None) -> str:
    """A shared directory (a split's index: shards read all of it; a vocabulary), downloaded
    once per worker process: ``names``, or every file in it."""
    with _COPY_LOCK:
        if uri not in _LOCAL_COPIES:
            local = tempfile.mkdtemp(prefix="runexp-copy-")
            if names is None:
                names = [u.rsplit("/", 1)[-1] for u in _list(uri)]
            for name in names:
                storage.download_file(storage.join(uri, name), os.path.join(local, name))
            _LOCAL_COPIES[uri] = local
        return _LOCAL_COPIES[uri]


class WriteShard(beam.DoFn):
    """Phase 2 on one shard: ``write_shard``; its stats recorded for the launcher."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def process(self, job: ShardJob):
        layout = self.layout
        if layout.shared_dir is None or job.index_dir is None:
            split, shard, stats = write_shard(job)
        else:
            index = _local_copy(layout.shared("index", layout.keys[job.index_dir]),
                                INDEX_FILES)
            name = os.path.basename(job.out_path)
            with tempfile.TemporaryDirectory(prefix="runexp-shard-") as tmp:
                out = os.path.join(tmp, name)
                split, shard, stats = write_shard(dataclasses.replace(
                    job, index_dir=index, out_path=out, vocab_dir=layout.vocab(job.vocab_dir)))
                storage.upload_file(out, layout.shared("out", name))
        _write_pickle(storage.join(layout.stats_dir, f"shard.{split}.{shard:05d}"),
                      (split, shard, stats))
        yield split, shard


def build_pipeline(pipeline: beam.Pipeline, range_jobs: Sequence[RangeJob],
                   shard_jobs: Mapping[str, Sequence[ShardJob]],
                   direct_jobs: Sequence[ShardJob], layout: Layout) -> None:
    """The steps: ranges -> tokenise -> join per split -> shards (module docstring).
    ``direct_jobs``: shard jobs with nothing to tokenise (a prebuilt index)."""
    branches = []
    if range_jobs:
        branches.append(
            pipeline
            | "Ranges" >> beam.Create(list(range_jobs), reshuffle=False)
            | "SpreadRanges" >> beam.Reshuffle()
            | "Tokenize" >> beam.ParDo(TokenizeRange(layout))
            | "BySplit" >> beam.GroupByKey()
            | "JoinIndex" >> beam.ParDo(JoinSplit(layout, shard_jobs)))
    if direct_jobs:
        branches.append(pipeline | "PrebuiltShards" >> beam.Create(list(direct_jobs),
                                                                   reshuffle=False))
    shards = branches[0] if len(branches) == 1 else tuple(branches) | beam.Flatten()
    (shards
     | "SpreadShards" >> beam.Reshuffle()
     | "WriteShards" >> beam.ParDo(WriteShard(layout)))


# --- the launcher -----------------------------------------------------------------------------

def pipeline_options(beam_options: Optional[Mapping], workers: int):
    """(runner, PipelineOptions) of the stage's ``beam_options``: passed through; a
    DirectRunner gets ``workers`` processes unless it says otherwise."""
    from apache_beam.options.pipeline_options import PipelineOptions
    options = dict(beam_options or {})
    name = canonical_runner(options.pop("runner", None) or "DirectRunner")
    if name == "DirectRunner":
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner
        options.setdefault("direct_num_workers", max(1, workers))
        options.setdefault("direct_running_mode", "multi_processing"
                           if options["direct_num_workers"] > 1 else "in_memory")
        # The worker processes' own INFO and WARNING lines (start-up, shutdown) are noise
        # on the stage's console; their errors still show, and fail the stage.
        options.setdefault("default_sdk_harness_log_level", "ERROR")
        return FnApiRunner(), PipelineOptions(flags=[], **options)
    return name, PipelineOptions(flags=[], runner=name, **options)


class _WorkerLog:
    """While a local pipeline runs, this process's stderr (which the worker processes
    inherit) goes to a file: each worker's start-up warnings and the runner's relays of them
    are noise on the stage's console. A failure says its tail."""

    def __init__(self, path: str):
        self.path = path
        self._saved: Optional[int] = None

    def start(self) -> None:
        import sys
        sys.stderr.flush()
        self._saved = os.dup(2)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(
            logging.ERROR)

    def stop(self) -> None:
        if self._saved is None:
            return
        import sys
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._saved = None

    def tail(self, lines: int = 40) -> str:
        try:
            with open(self.path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def _check_reachable(jobs: Sequence[ShardJob], runner: str) -> None:
    """A remote runner's workers read the corpus on Cloud Storage, not this machine's files."""
    local = sorted({p for job in jobs for p in job.files if not input_files.is_remote(p)})
    if local:
        raise UserError(
            f"Beam runner {runner}: its workers run on other machines and cannot read the "
            f"corpus on this one ({local[0]}{', ...' if len(local) > 1 else ''})\n  hint: "
            "copy the corpus to Cloud Storage (gcloud storage cp -r DIR gs://BUCKET/corpus/) "
            "and point the task's files at it; or build on this machine with runner "
            "'DirectRunner' (beam_options = {'runner': 'DirectRunner'}) or runner = 'local' "
            "(README, 'Scale-out preprocessing')")


def run_beam_shard_jobs(jobs: Sequence[ShardJob], beam_options: Optional[Mapping],
                        workers: int, progress: Optional[Callable[[str], None]] = None,
                        shared_dir: Optional[str] = None
                        ) -> Iterator[tuple[str, int, ShardStats]]:
    """``run_shard_jobs`` on Apache Beam: the same jobs, the same files, the same results.

    Args:
      jobs: from plan_shard_jobs or plan_prebuilt_shard_jobs.
      beam_options: the stage's beam_options (None: DirectRunner, ``workers`` processes).
      workers: DirectRunner's worker processes, unless beam_options set them.
      progress: reports a line per range tokenised and per step.
      shared_dir: where workers hand files on (module docstring); default: none for a
        DirectRunner, ``<temp_location>/runexp-preprocess-<id>`` for another runner.

    Yields ``(split, shard, stats)`` per shard, as each is recorded.
    """
    say = progress or (lambda _: None)
    runner, options = pipeline_options(beam_options, workers)
    runner_name = runner if isinstance(runner, str) else "DirectRunner"
    remote = runner_name not in LOCAL_BEAM_RUNNERS
    if remote:
        _check_reachable(jobs, runner_name)
        temp = (beam_options or {}).get("temp_location")
        shared_dir = shared_dir or storage.join(temp, f"runexp-preprocess-{uuid.uuid4().hex[:12]}")

    splits, range_jobs = plan_range_jobs(jobs)
    shard_jobs = {d: [j for j in jobs if j.index_dir == d] for d in splits}
    direct_jobs = [j for j in jobs if j.index_dir not in splits]
    scratch = tempfile.mkdtemp(prefix="runexp-beam-")
    keys = {d: f"{i:03d}-{os.path.basename(d)}" for i, d in enumerate(
        sorted({j.index_dir for j in jobs if j.index_dir}))}
    vocabs = {d: f"{i:03d}" for i, d in enumerate(sorted({j.vocab_dir for j in jobs}))}
    if shared_dir is None:
        layout = Layout(stats_dir=scratch)
    else:
        layout = Layout(stats_dir=storage.join(shared_dir, "stats"), shared_dir=shared_dir, keys=keys,
                        vocabs=vocabs)
        for vocab_dir, key in vocabs.items():  # the workers tokenise with the same vocabulary
            for name in sorted(os.listdir(vocab_dir)):
                if os.path.isfile(os.path.join(vocab_dir, name)):
                    storage.upload_file(os.path.join(vocab_dir, name), layout.shared("vocab", key, name))
        for index_dir in sorted({j.index_dir for j in direct_jobs if j.index_dir}):
            for name in INDEX_FILES:  # a prebuilt index, for the shard workers
                storage.upload_file(os.path.join(index_dir, name), layout.shared("index", keys[index_dir],
                                                                     name))
    pipeline = beam.Pipeline(runner=runner, options=options)
    build_pipeline(pipeline, range_jobs, shard_jobs, direct_jobs, layout)
    say(f"Apache Beam {runner_name}: {len(range_jobs)} range(s) to tokenise, {len(jobs)} "
        f"shard(s)" + (f"; files handed on through {shared_dir}" if shared_dir else ""))
    outcome: dict = {}

    def run() -> None:
        try:
            result = pipeline.run()
            state = result.wait_until_finish()
            outcome["state"] = str(state)
        except BaseException as e:  # re-raised by the launcher's thread
            outcome["error"] = e

    thread = threading.Thread(target=run, name="beam-pipeline", daemon=True)
    log = _WorkerLog(os.path.join(scratch, "workers.log")) if not remote else None
    try:
        if log is not None:
            log.start()
        thread.start()
        seen: set[str] = set()
        ranges_done = 0
        expected = {(j.split, j.shard) for j in jobs}
        yielded: set[tuple[str, int]] = set()
        while True:
            finished = not thread.is_alive()
            for path in _list(layout.stats_dir):
                if path in seen:
                    continue
                seen.add(path)
                name = path.rsplit("/", 1)[-1]
                if name.startswith("range."):
                    ranges_done += 1
                    split, index, read, sentences, tokens = _read_pickle(path)
                    say(f"[{ranges_done}/{len(range_jobs)}] read {split} range {index}: "
                        f"{read:,} bytes, {sentences:,} sentences, {tokens:,} tokens")
                elif name.startswith("shard."):
                    split, shard, stats = _read_pickle(path)
                    if (split, shard) not in yielded:
                        yielded.add((split, shard))
                        if shared_dir is not None:
                            job = next(j for j in jobs if (j.split, j.shard) == (split, shard))
                            storage.download_file(layout.shared("out", os.path.basename(job.out_path)),
                                      job.out_path)
                        yield split, shard, stats
            if finished:
                break
            thread.join(POLL_SECONDS)
        if log is not None:
            log.stop()
        if "error" in outcome:
            if log is not None:
                say("the Beam workers' log ends with:\n" + log.tail())
            raise outcome["error"]
        if outcome.get("state", "DONE").split(".")[-1] != "DONE":
            raise RuntimeError(f"the Beam pipeline ended {outcome['state']}")
        missing = sorted(expected - yielded)
        if missing:
            raise RuntimeError(f"the Beam pipeline finished without shard(s) {missing[:5]}")
        if shared_dir is not None:
            for index_dir, job in splits.items():
                if job.keep_index:  # a later pretraining phase reads it here
                    for name in INDEX_FILES:
                        storage.download_file(layout.shared("index", keys[index_dir], name),
                                  os.path.join(index_dir, name))
    finally:
        # Interrupted (Ctrl-C), the pipeline's thread is a daemon: not waited for.
        if log is not None:
            log.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        if shared_dir is not None:
            try:
                storage.delete_prefix(shared_dir)
            except Exception:  # noqa: BLE001 (scratch: never worth failing the stage)
                say(f"WARNING: could not delete the pipeline's scratch files in {shared_dir}")
        remove_split_indexes(splits)
