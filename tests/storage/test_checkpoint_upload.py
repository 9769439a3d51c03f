"""Checkpoint uploads in the background and parallel transfers, part by part:

- ``storage.background.Background``: one job at a time, its error raised once in the
  waiting thread;
- the stop planner keeps free the rest of an upload in flight;
- ``upload_dir`` / ``download_dir`` move several files at once and never more than
  ``TRANSFER_THREADS`` (seen at the fault proxy, which holds requests until that many are in
  flight together), each still verified, the first error raised;
- the mirror's snapshot: checkpoint files hard-linked, other files copied, the upload and the
  remote deletions governed by the snapshot whatever the work directory became since;
  ``StageSync`` in both modes;
- the trainer: every checkpoint but the last uploads in the background while training goes
  on, an upload's error is raised in the training thread, the planner learns what each
  checkpoint took with its upload.

The whole run (kills, exact resume, keep-last-K during an upload) is in
test_checkpoint_faults.py.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.request

import pytest

from runexp.compiler.plan import Plan, Stage
from runexp.runtime import storage
from runexp.runtime.stop_planner import StopPlanner
from runexp.runtime import gcs_mirror as mirror
from runexp.runtime.storage import transfer
from runexp.runtime.storage.background import Background
from tests.support import runtime as tiny


# -- the one-slot worker ------------------------------------------------------------------------

def test_background_runs_one_job_at_a_time_and_raises_its_error_once():
    worker, order = Background("test"), []
    release = threading.Event()

    def first():
        release.wait(5)
        order.append("first")

    job = worker.submit(first)
    assert worker.in_flight is job and worker.poll() is None
    threading.Timer(0.2, release.set).start()
    worker.submit(lambda: order.append("second"))  # waits for the first
    assert order[0] == "first"
    assert worker.wait().seconds >= 0 and order == ["first", "second"]
    assert worker.wait() is None and worker.poll() is None  # collected

    worker.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        worker.wait()
    assert worker.wait() is None  # raised once, not again

    worker.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # the next submit raises it, and starts nothing
        worker.submit(lambda: order.append("never"))
    assert worker.wait() is None and "never" not in order

    worker.submit(lambda: 1 / 0)
    give_up = time.monotonic() + 120  # only ends a hang: a busy machine may be slow to run it
    while worker.in_flight is not None and time.monotonic() < give_up:
        time.sleep(0.01)
    with pytest.raises(ZeroDivisionError):
        worker.poll()


# -- the stop planner ---------------------------------------------------------------------------

def test_the_planner_keeps_the_rest_of_an_upload_in_flight_free():
    now = [0.0]
    planner = StopPlanner(deadline=100.0, margin_s=10.0, assumed_save_s=5.0,
                          clock=lambda: now[0])
    planner.record_save(8.0)  # a checkpoint, written and uploaded, took 8 s
    assert planner.spare_s() == pytest.approx(100 - 10 - 8)
    planner.record_upload_started()  # the next one uploads in the background
    assert planner.upload_wait_s() == pytest.approx(8.0)
    assert planner.spare_s() == pytest.approx(100 - 10 - 8 - 8)
    now[0] = 5.0
    assert planner.upload_wait_s() == pytest.approx(3.0)  # 5 s of it are behind
    assert planner.spare_s() == pytest.approx(95 - 10 - 8 - 3)
    now[0] = 6.0
    planner.record_save(9.0)  # it ended: written and uploaded in 9 s
    assert planner.upload_wait_s() == 0.0
    assert planner.spare_s() == pytest.approx(94 - 10 - 9)
    assert planner.seconds_left_at_save() == pytest.approx(94.0)


# -- parallel transfers -------------------------------------------------------------------------

def _files(directory, count: int, size: int = 3000) -> dict:
    out = {}
    for i in range(count):
        rel = f"sub{i % 3}/f{i:02d}.bin"
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        out[rel] = data
    return out


def test_directories_move_several_files_at_once(fault_proxy, fast_retries, gcs_prefix,
                                                tmp_path):
    threads = transfer.TRANSFER_THREADS
    files = _files(tmp_path / "src", 2 * threads)
    # Every request is slow, so a request beyond the pool's would show in the count; the
    # first `threads` uploads are held until all of them are held at once: the pool's
    # overlap is seen at the proxy, not inferred from a clock.
    fault_proxy.latency(0.2)
    # (The gathering's timeout only ends a hang: a busy machine may start its threads late.)
    barrier = fault_proxy.gather(threads, match="upload", timeout=300)
    dest = storage.join(gcs_prefix, "d")
    uploaded = storage.upload_dir(str(tmp_path / "src"), dest)
    assert uploaded == sorted(storage.join(dest, rel) for rel in files)
    assert barrier.met.is_set(), f"only {barrier.most} uploads were in flight together"
    assert fault_proxy.max_in_flight == threads  # never more than the promise
    fault_proxy.reset_in_flight()
    barrier = fault_proxy.gather(threads, match="download", timeout=300)
    back = storage.download_dir(dest, str(tmp_path / "back"))
    assert barrier.met.is_set(), f"only {barrier.most} downloads were in flight together"
    assert fault_proxy.max_in_flight == threads  # the listing comes before them
    assert len(back) == len(files)
    for rel, data in files.items():
        assert (tmp_path / "back" / rel).read_bytes() == data
    # Nothing was retried: no request the client gave up on is still counted at the proxy.
    assert storage.retry_stats().retries == 0


def test_the_proxy_counts_a_request_until_its_answer_starts(fault_proxy, gcs_emulator):
    """What the concurrency bound above rests on: a client that sends one request at a time
    is never counted twice, even when the proxy's handler of a request goes on after the
    client has its answer and sends the next one (here it waits for that next one)."""
    handler = sys.modules[type(fault_proxy).__module__]._Handler
    handled, next_arrived = [], threading.Event()
    original = handler._handle_request

    def lingering(self):
        if handled:
            next_arrived.set()
        handled.append(self.path)
        original(self)
        if len(handled) == 1:
            next_arrived.wait(30)  # only ends a hang: the client sends its next request

    handler._handle_request = lingering
    try:
        bucket = f"{fault_proxy.endpoint}/storage/v1/b/{gcs_emulator[1]}"
        for _ in range(2):  # one after the other
            with urllib.request.urlopen(bucket, timeout=60) as reply:
                assert reply.status == 200
    finally:
        handler._handle_request = original
    assert next_arrived.is_set() and fault_proxy.max_in_flight == 1


def test_a_failed_file_fails_the_directory_and_stops_the_rest(fault_proxy, fast_retries,
                                                              gcs_prefix, tmp_path):
    threads = transfer.TRANSFER_THREADS
    _files(tmp_path / "src", 40)
    # The first file (sorted: sub0/f00.bin) meets a permanent error, not retried; the other
    # uploads are held until that error is answered, so every thread of the pool is busy
    # with its first file when it comes, whatever the machine's speed.
    failed = threading.Event()

    def refuse(method, path):
        failed.set()
        return 403, b'{"error": {"code": 403, "message": "injected"}}'

    fault_proxy.hook(refuse, times=100, match="upload", key=r"/f00\.bin$")
    fault_proxy.hook(lambda method, path: failed.wait(60) and None, times=10 ** 6,
                     match="upload")
    with pytest.raises(PermissionError, match=r"f00\.bin"):
        storage.upload_dir(str(tmp_path / "src"), storage.join(gcs_prefix, "d"))
    # Those under way when it failed ended; the ones not started were dropped: at most
    # each other thread's first file and the one it may have picked up before the error
    # reached the pool.
    uploaded = len(storage.list(storage.join(gcs_prefix, "d")))
    assert uploaded <= 2 * (threads - 1), uploaded


def test_a_corrupted_file_in_a_parallel_download_keeps_no_final_name(fault_proxy, fast_retries,
                                                                    gcs_prefix, tmp_path):
    _files(tmp_path / "src", 12)
    dest = storage.join(gcs_prefix, "d")
    storage.upload_dir(str(tmp_path / "src"), dest)
    fault_proxy.corrupt(times=100, match="download", strip_hash=True, key=r"/f05\.bin$")
    with pytest.raises(storage.IntegrityError, match=r"f05\.bin"):
        storage.download_dir(dest, str(tmp_path / "back"))
    assert not (tmp_path / "back" / "sub2" / "f05.bin").exists()
    leftovers = [n for _, _, names in os.walk(tmp_path / "back") for n in names
                 if n.startswith(".tmp-")]
    assert leftovers == []


# -- the mirror's snapshot ----------------------------------------------------------------------

def _plan(root: str) -> tuple[Plan, Stage]:
    stage = Stage(id="pretrain", kind="pretrain", params={}, inputs={},
                  output_dir=f"{root}/pretrain", fingerprint="f", resume_key="r")
    return Plan(experiment="upload", output_root=root, stages=(stage,),
                accelerator={"type": "cpu"}), stage


def _pointer(*steps: int) -> str:
    return (f'model_checkpoint_path: "ckpt-{steps[-1]}"\n'
            + "".join(f'all_model_checkpoint_paths: "ckpt-{s}"\n' for s in steps))


def _checkpoint(work, step: int, *kept: int) -> None:
    ckpt = work / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / f"ckpt-{step}.data-00000-of-00001").write_bytes(os.urandom(5000))
    (ckpt / f"ckpt-{step}.index").write_bytes(os.urandom(100))
    (ckpt / "checkpoint").write_text(_pointer(*kept, step))
    with open(work / "train_log.jsonl", "a") as f:
        f.write(f'{{"step": {step}}}\n')


def test_a_snapshot_is_what_gets_uploaded_whatever_the_work_dir_became(gcs_prefix, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("RUNEXP_CACHE_DIR", str(tmp_path / "cache"))
    plan, stage = _plan(gcs_prefix)
    m = mirror.Mirror(plan)
    work = tmp_path / "work"
    _checkpoint(work, 2)
    m.sync(stage, str(work))
    _checkpoint(work, 4, 2)
    snapshot = m.snapshot(stage, str(work))
    staging = m.staging_dir(stage)
    assert sorted(snapshot.changed) == ["checkpoints/checkpoint", "checkpoints/ckpt-4.data-"
                                        "00000-of-00001", "checkpoints/ckpt-4.index",
                                        "train_log.jsonl"]
    for rel in snapshot.changed:  # checkpoint files linked, the others copied
        same = os.stat(os.path.join(staging, rel)).st_ino == os.stat(work / rel).st_ino
        assert same == ("/ckpt-" in rel), rel
    data4 = (work / "checkpoints" / "ckpt-4.data-00000-of-00001").read_bytes()
    # Meanwhile training goes on: ckpt-6, keep 1 (ckpt-2 and ckpt-4 gone locally).
    _checkpoint(work, 6)
    for step in (2, 4):
        for f in (work / "checkpoints").glob(f"ckpt-{step}.*"):
            f.unlink()
    m.upload(snapshot)
    ckpt_uri = f"{stage.output_dir}/checkpoints"
    assert storage.read_text(f"{ckpt_uri}/checkpoint") == _pointer(2, 4)
    assert storage.read_bytes(f"{ckpt_uri}/ckpt-4.data-00000-of-00001") == data4
    assert storage.read_text(f"{stage.output_dir}/train_log.jsonl") == \
        '{"step": 2}\n{"step": 4}\n'  # as it was at the snapshot
    assert [u.rsplit("/", 1)[1] for u in storage.list(ckpt_uri)] == [
        "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index",
        "ckpt-4.data-00000-of-00001", "ckpt-4.index"]  # what the snapshot held stays
    assert not os.path.exists(staging)
    m.sync(stage, str(work))  # now ckpt-6 alone
    assert [u.rsplit("/", 1)[1] for u in storage.list(ckpt_uri)] == [
        "checkpoint", "ckpt-6.data-00000-of-00001", "ckpt-6.index"]


def test_stage_sync_uploads_in_the_background_or_in_sync_mode_at_once(fault_proxy, gcs_prefix,
                                                                      tmp_path, monkeypatch):
    monkeypatch.setenv("RUNEXP_CACHE_DIR", str(tmp_path / "cache"))
    plan, stage = _plan(gcs_prefix)
    work = tmp_path / "work"
    _checkpoint(work, 2)
    sync = mirror.Mirror(plan).stage_sync(stage, str(work))
    fault_proxy.latency(0.3, match="upload")
    released = threading.Event()  # its first request is held until the check below
    fault_proxy.hook(lambda method, path: released.wait(600) and None, match="upload")
    assert sync.start() is True
    # start() returned while the upload is still going on (held at the proxy, so a busy
    # machine that runs this line late sees it in flight too).
    assert sync.in_flight is not None
    released.set()
    job = sync.wait()
    assert job.seconds >= 0.3 * 3  # three phases: data and log, index, pointer
    assert storage.read_text(f"{stage.output_dir}/checkpoints/checkpoint") == _pointer(2)

    monkeypatch.setenv(mirror.UPLOAD_MODE_ENV, "sync")
    _checkpoint(work, 4, 2)
    sync = mirror.Mirror(plan).stage_sync(stage, str(work))
    assert sync.start() is False and sync.in_flight is None and sync.poll() is None
    assert storage.read_text(f"{stage.output_dir}/checkpoints/checkpoint") == _pointer(2, 4)


# -- the trainer --------------------------------------------------------------------------------

class FakeSync:
    """An ``on_checkpoint`` that uploads in the background (like mirror.StageSync): each
    upload goes on until the trainer waits for it (its next save, or the end), then sleeps
    ``upload_s``; the one of ``fail_step`` fails. Notes what was called, and the step
    training had reached when each upload ended: how far training went meanwhile does not
    depend on how fast the machine runs steps."""

    def __init__(self, trainer_of, upload_s: float, fail_step: int | None = None):
        self.trainer_of, self.upload_s, self.fail_step = trainer_of, upload_s, fail_step
        self.calls, self.reached = [], {}
        self.worker = Background("fake upload")
        self.waited = threading.Event()

    def _step(self) -> int:
        return self.trainer_of().step

    def __call__(self):
        self.wait()
        self.calls.append(("sync", self._step()))

    def start(self) -> bool:
        self.worker.wait()
        step = self._step()
        self.calls.append(("start", step))
        self.waited.clear()

        def upload():
            self.waited.wait(600)  # only ends a hang: the trainer waits for it
            time.sleep(self.upload_s)
            self.reached[step] = self._step()
            if step == self.fail_step:
                raise storage.StorageError(f"upload of ckpt-{step} failed", "gs://b/x")

        self.worker.submit(upload)
        return True

    def poll(self):
        return self.worker.poll()

    def wait(self):
        self.waited.set()
        return self.worker.wait()


def _trainer(work_dir: str, on_checkpoint, train_steps: int = 6, **loop):
    import tensorflow as tf

    from runexp.compiler.specs import OptimizerSpec
    from runexp.runtime.model import BertConfig, BertPretrainer
    from runexp.runtime.optimizer import optimizer_from_spec
    from runexp.runtime.train_loop_config import TrainLoopConfig
    from runexp.runtime.train_log import pretraining_metrics
    from runexp.runtime.trainer import Trainer

    tf.random.set_seed(0)
    config = TrainLoopConfig(**{"train_steps": train_steps, "batch_size": 8,
                                "steps_per_loop": 2, "log_every": 2, "checkpoint_every": 2,
                                "keep_checkpoints": 2, "jit_compile": False, **loop})
    return Trainer(tf.distribute.get_strategy(),
                   BertPretrainer(BertConfig.from_dict(tiny.TINY_MODEL)),
                   optimizer_from_spec(OptimizerSpec(optimizer="adamw", learning_rate=1e-3),
                                       100, 8),
                   work_dir, config, pretraining_metrics, progress=lambda _: None,
                   on_checkpoint=on_checkpoint)


def _data():
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    rows = [tiny.make_instance(rng, tiny.TINY_MODEL["vocab_size"], tiny.TINY_SEQ,
                               tiny.TINY_PRED)
            for _ in range(8)]
    batch = {k: np.array([r[k] for r in rows], np.float32 if k == "masked_lm_weights"
                         else np.int32) for k in rows[0]}
    return lambda skip: tf.data.Dataset.from_tensors(batch).repeat()


def test_the_trainer_uploads_all_but_the_last_checkpoint_while_training_goes_on(tmp_path,
                                                                                monkeypatch):
    holder = {}
    sync = FakeSync(lambda: holder["trainer"], upload_s=1.0)
    trainer = holder["trainer"] = _trainer(str(tmp_path / "t"), sync)
    # A far deadline: the planner is there to be told what each checkpoint took.
    planner = StopPlanner(time.time() + 3600, margin_s=0.0, assumed_save_s=0.1)
    monkeypatch.setattr(trainer, "_stop_planner", lambda: planner)
    summary = trainer.train(_data())
    assert summary["step"] == 6
    assert sync.calls == [("start", 2), ("start", 4), ("sync", 6)]
    # Training went on to the next checkpoint while each upload was in flight (that save
    # then waited for it).
    assert sync.reached == {2: 4, 4: 6}
    # The planner learnt each checkpoint's time with its upload: two background ones (at
    # least the 1 s upload each) and the last (in the foreground).
    assert len(planner.saves) == 3 and min(planner.saves[:2]) >= 1.0
    assert planner.upload_wait_s() == 0.0


def test_a_background_upload_error_reaches_the_training_thread(tmp_path):
    holder = {}
    sync = FakeSync(lambda: holder["trainer"], upload_s=0.2, fail_step=2)
    trainer = holder["trainer"] = _trainer(str(tmp_path / "t"), sync, train_steps=40)
    with pytest.raises(storage.StorageError, match="upload of ckpt-2 failed"):
        trainer.train(_data())
    assert ("sync", 40) not in sync.calls  # it never got to the end
    assert sync.worker.wait() is None  # raised once, nothing left behind


def test_a_plain_callable_on_checkpoint_is_called_after_every_checkpoint(tmp_path):
    holder, calls = {}, []
    trainer = holder["trainer"] = _trainer(str(tmp_path / "t"),
                                           lambda: calls.append(holder["trainer"].step))
    trainer.train(_data())
    assert calls == [2, 4, 6]
