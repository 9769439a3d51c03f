"""Training checkpoints on a gs:// output root when storage misbehaves or the process dies.

Each scenario runs the real pretrain stage through the executor (a tiny model: checkpoints
at steps 2, 4 and 6, a few seconds a run) with a FaultProxy between runexp and the loopback
GCS server, then checks what a user relies on:

- the remote checkpoint set is consistent: ``checkpoints/checkpoint`` (TensorFlow's pointer,
  the commit of a checkpoint) lists only checkpoints whose .index and every .data shard are
  in the bucket and read back in full: no dangling or partial "latest";
- nothing committed is deleted before its replacement is committed: every deletion of a
  checkpoint's objects comes after the upload of a newer checkpoint and of the pointer
  naming it;
- a rerun resumes from the last committed checkpoint (not from scratch), finishes, and
  leaves no stray checkpoint files behind.

Checkpoints but the last upload in the background while training goes on (at most one in
flight); the last scenarios hold such an upload at the proxy: killed then, the rerun ends
bitwise where an uninterrupted run ends (both with TensorFlow's op determinism); keep-last-K
deleting the held checkpoint's local files does not stop its upload (it reads a snapshot);
an upload's error ends the stage from the training thread.

Each scenario prints one line "CHECKPOINT FAULT <scenario>: ..." (run with -s) with the
retries made, the seconds they cost, the training steps redone and the wall times.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from runexp.compiler.exit_codes import EXIT_OK, EXIT_STAGE_FAILED
from runexp.runtime import storage
from tests.support import checkpoint_run, child_env, deadline_budget

_CHECKPOINT_FILE = re.compile(r"^(ckpt-(\d+))\.(index|data-(\d{5})-of-(\d{5}))$")


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("tiny-pretrain-data"))
    checkpoint_run.write_tiny_data(data_dir)
    return data_dir


class Experiment:
    """The one-stage tiny pretrain experiment at a fresh gs:// root, behind the proxy."""

    def __init__(self, root, data_dir, tmp_path, proxy, retry):
        self.root, self.data_dir, self.tmp_path, self.proxy = root, data_dir, tmp_path, proxy
        self.stage_uri = f"{root}/{checkpoint_run.STAGE_ID}"
        self.ckpt_uri = f"{self.stage_uri}/checkpoints"
        self.retry = retry
        self.output = ""

    def run(self, **params) -> int:
        """Runs the experiment in this process; returns run_plan's exit code."""
        from runexp.runtime import executor

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = executor.run_plan(checkpoint_run.tiny_plan(self.root, self.data_dir,
                                                              **params))
        self.output = out.getvalue()
        return code

    def spawn(self, root: str | None = None, name: str = "child",
              deterministic: bool = False, storage_host: str | None = None,
              **params) -> subprocess.Popen:
        """Runs the experiment (at ``root``, default this one's) in a child process (a test
        kills it); output in <name>.log. ``deterministic``: TensorFlow's op determinism;
        ``storage_host``: the GCS endpoint, if not the proxy."""
        spec = self.tmp_path / f"{name}.json"
        spec.write_text(json.dumps({"root": root or self.root, "data_dir": self.data_dir,
                                    "params": params, "retry": self.retry,
                                    "deterministic": deterministic}))
        env = child_env()
        if storage_host:
            env["STORAGE_EMULATOR_HOST"] = storage_host
        log = open(self.tmp_path / f"{name}.log", "wb")
        with log:
            return subprocess.Popen([sys.executable, "-m", checkpoint_run.__name__, str(spec)],
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env)

    def child_log(self, name: str = "child", tail: int = 3000) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")[-tail:]

    def committed(self, strict: bool = False) -> list[int]:
        """The steps of the checkpoints the remote pointer lists, after checking that each
        is complete: its .index and all of its .data shards are there and every tensor
        reads back in full. ``strict``: no other checkpoint file may be in the bucket."""
        import tensorflow as tf

        self.proxy.clear()  # the checks read through the proxy: no fault is meant for them
        pointer = storage.read_text(f"{self.ckpt_uri}/checkpoint")
        latest = re.search(r'^model_checkpoint_path: "([^"]+)"', pointer, re.M)
        listed = re.findall(r'^all_model_checkpoint_paths: "([^"]+)"', pointer, re.M)
        assert latest and latest.group(1) in listed, pointer
        names = [uri.rsplit("/", 1)[1] for uri in storage.list(self.ckpt_uri)]
        files = {}
        for name in names:
            match = _CHECKPOINT_FILE.match(name)
            if match:
                files.setdefault(match.group(1), []).append(match)
        for prefix in listed:
            assert "/" not in prefix, f"{prefix}: a path valid only where it was written"
            parts = files.get(prefix, [])
            assert any(m.group(3) == "index" for m in parts), f"{prefix}.index is missing"
            shards = sorted((int(m.group(4)), int(m.group(5))) for m in parts if m.group(4))
            assert shards and [i for i, _ in shards] == list(range(shards[0][1])), (
                f"{prefix}: data shards (number, of) {shards}")
            local = self.tmp_path / "check" / prefix
            for m in parts:
                storage.download_file(f"{self.ckpt_uri}/{m.group(0)}", str(local / m.group(0)))
            reader = tf.train.load_checkpoint(str(local / prefix))
            for tensor in reader.get_variable_to_shape_map():
                reader.get_tensor(tensor)  # raises on a short or missing data file
        if strict:
            kept = {m.group(0) for prefix in listed for m in files.get(prefix, [])}
            stray = sorted(set(names) - kept - {"checkpoint"})
            assert not stray, f"files in checkpoints/ that no listed checkpoint owns: {stray}"
        return sorted(int(p.rsplit("-", 1)[1]) for p in listed)

    def assert_deletions_follow_commits(self) -> None:
        """Every checkpoint object deleted went only after a newer checkpoint's .index and
        .data and then the pointer were uploaded (in the proxy's log of both runs)."""
        uploaded, newest_committed = set(), 0  # {(step, "index" | "data-")}
        for entry in self.proxy.log:
            method, path, outcome = entry
            name = (entry.key or "").rsplit("/", 1)[-1]
            match = _CHECKPOINT_FILE.match(name)
            if method == "POST" and path.startswith("/upload/") and outcome == "200":
                if match:
                    uploaded.add((int(match.group(2)), match.group(3)[:5]))
                elif name == "checkpoint":
                    whole = [step for step, part in uploaded
                             if part == "index" and (step, "data-") in uploaded]
                    newest_committed = max(whole, default=0)
            elif method == "DELETE" and match:
                assert int(match.group(2)) < newest_committed, (
                    f"{name} deleted before a newer checkpoint was committed "
                    f"(newest committed: ckpt-{newest_committed})")

    def resume(self, from_step: int, train_steps: int = 6, deterministic: bool = False,
               **params) -> dict:
        """Reruns; checks that it resumed from ckpt-<from_step>, trained only the steps
        left, completed the stage and left a consistent set, without uploading again the
        checkpoint it resumed from; returns the summary. ``deterministic``: in a child
        process with TensorFlow's op determinism."""
        start = len(self.proxy.log)
        if deterministic:
            child = self.spawn(name="resume", deterministic=True, train_steps=train_steps,
                               **params)
            code = child.wait(timeout=600)  # only ends a hang
            self.output = self.child_log("resume", tail=10 ** 6)
        else:
            code = self.run(train_steps=train_steps, **params)
        assert code == EXIT_OK, self.output[-3000:]
        assert "> pretrain: resuming" in self.output, self.output[-2000:]
        summary = json.loads(storage.read_text(f"{self.stage_uri}/MANIFEST.json"))["summary"]
        assert summary["resumed_from"].endswith(f"/ckpt-{from_step}"), summary
        assert summary["step"] == train_steps
        assert summary["steps_trained"] == train_steps - from_step
        assert storage.exists(f"{self.stage_uri}/COMPLETED")
        again = [e.key for e in self.proxy.log[start:] if e[1].startswith("/upload/")
                 and f"/ckpt-{from_step}." in (e.key or "")]
        assert again == [], f"uploaded again after resuming: {again}"
        assert self.committed(strict=True)[-1] == train_steps
        self.assert_deletions_follow_commits()
        return summary


@pytest.fixture
def experiment(gcs_prefix, tiny_data, tmp_path, monkeypatch, fault_proxy, fast_retries):
    monkeypatch.setenv("RUNEXP_CACHE_DIR", str(tmp_path / "cache"))
    return Experiment(gcs_prefix, tiny_data, tmp_path, fault_proxy,
                      retry=dataclasses.asdict(fast_retries))


class Hold:
    """A proxy hook that keeps one request in flight until released: the moment a test
    kills the client. The request never reaches the server."""

    def __init__(self):
        self.arrived, self.released = threading.Event(), threading.Event()

    def __call__(self, method, path):
        self.arrived.set()
        self.released.wait(timeout=600)  # only ends a hang: the test releases it
        return 503, b'{"error": {"code": 503, "message": "held, then dropped"}}'


def kill_when_held(experiment: Experiment, hold: Hold, **params) -> float:
    """Starts the experiment in a child, SIGKILLs it while ``hold`` holds its request;
    returns the child's wall time."""
    t0 = time.monotonic()
    child = experiment.spawn(**params)
    try:
        # Only ends a hang: the child starts TensorFlow and trains to its second checkpoint.
        assert hold.arrived.wait(timeout=600), (
            f"the held request never came; child:\n{experiment.child_log()}")
        child.kill()
        child.wait(timeout=30)
    finally:
        hold.released.set()
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -9, experiment.child_log()
    return time.monotonic() - t0


def report(scenario: str, redone: int, **walls: float) -> storage.RetryStats:
    stats = storage.retry_stats()
    times = " ".join(f"{name}={seconds:.1f}s" for name, seconds in walls.items())
    print(f"\nCHECKPOINT FAULT {scenario}: retries={stats.retries} by_error={stats.by_error} "
          f"gave_up={stats.gave_up} seconds_lost={stats.seconds_lost:.3f} "
          f"steps_redone={redone} {times}")
    return stats


def test_429_storm_during_a_checkpoint_upload(experiment):
    proxy = experiment.proxy
    # A storm the retries ride out on ckpt-2's data, then one on ckpt-4's index that outlasts
    # the retry budget: the stage stops with ckpt-4's data uploaded but not its index.
    proxy.fail(429, times=4, match="upload", key=r"/ckpt-2\.data-")
    proxy.fail(429, times=100, match="upload", key=r"/ckpt-4\.index$")
    t0 = time.monotonic()
    assert experiment.run() == EXIT_STAGE_FAILED, experiment.output[-3000:]
    failed = time.monotonic() - t0
    assert "ckpt-4.index: gave up after 6 tries" in experiment.output
    assert experiment.committed() == [2]
    assert not storage.exists(f"{experiment.stage_uri}/COMPLETED")
    t1 = time.monotonic()
    experiment.resume(from_step=2)
    stats = report("429 storm on a checkpoint upload (x4 ridden out, then past the budget)",
                   redone=2, failed_run=failed, resume=time.monotonic() - t1)
    assert stats.by_error == {"429": 4 + 5} and stats.gave_up == 1


def test_503_mid_upload_of_a_checkpoint_data_file(experiment):
    proxy = experiment.proxy
    # The server stores ckpt-4's data file but the reply is a 503, twice: the retries upload
    # it again. Then ckpt-6's data file meets 503s past the budget.
    lost_reply = lambda status, headers, body: (  # noqa: E731
        503, headers, b'{"error": {"code": 503, "message": "injected"}}')
    proxy.rewrite(lost_reply, times=2, match="upload", key=r"/ckpt-4\.data-")
    proxy.fail(503, times=100, match="upload", key=r"/ckpt-6\.data-")
    t0 = time.monotonic()
    assert experiment.run() == EXIT_STAGE_FAILED, experiment.output[-3000:]
    failed = time.monotonic() - t0
    assert experiment.committed() == [2, 4]
    t1 = time.monotonic()
    experiment.resume(from_step=4)
    stats = report("503 mid-upload of a checkpoint data file (x2 lost replies, then past "
                   "the budget)", redone=2, failed_run=failed, resume=time.monotonic() - t1)
    assert stats.by_error == {"503": 2 + 5} and stats.gave_up == 1


def test_connection_reset_mid_download_of_the_checkpoint_on_resume(experiment):
    t0 = time.monotonic()
    assert experiment.run(train_steps=4) == EXIT_OK, experiment.output[-3000:]
    first = time.monotonic() - t0
    assert experiment.committed() == [2, 4]
    storage.reset_retry_stats()
    # Continuing the finished run to 6 steps downloads ckpt-4; its data is cut off twice.
    experiment.proxy.reset(times=2, match="download", key=r"/ckpt-4\.data-",
                           after_bytes=100_000)
    t1 = time.monotonic()
    experiment.resume(from_step=4, train_steps=6)
    resets = [o for _, _, o in experiment.proxy.log if o.startswith("reset after")]
    stats = report("connection reset x2 mid-download of ckpt-4 on resume", redone=0,
                   first_run=first, resume=time.monotonic() - t1)
    assert len(resets) == 2 and stats.retries == 2 and stats.gave_up == 0


@pytest.mark.parametrize("held, key, skip", [
    # ckpt-4's data is in the bucket, its index in flight.
    ("ckpt-4.index", r"/ckpt-4\.index$", 0),
    # ckpt-4 is whole in the bucket, the pointer naming it in flight (the first pointer
    # upload, ckpt-2's, goes through).
    ("checkpoints/checkpoint", r"/checkpoints/checkpoint$", 1),
], ids=["index-in-flight", "pointer-in-flight"])
def test_process_killed_mid_checkpoint_upload(experiment, held, key, skip):
    hold = Hold()
    experiment.proxy.hook(hold, match="upload", key=key, skip=skip)
    killed = kill_when_held(experiment, hold)
    assert experiment.committed() == [2]  # the pointer still names ckpt-2, which is whole
    assert storage.glob(f"{experiment.ckpt_uri}/ckpt-4.data-*"), "killed too early"
    assert not storage.exists(f"{experiment.stage_uri}/COMPLETED")
    t1 = time.monotonic()
    experiment.resume(from_step=2)
    report(f"SIGKILL while uploading {held}", redone=2, killed_child=killed,
           resume=time.monotonic() - t1)


def test_process_killed_during_keep_last_k_deletion(experiment):
    # keep 1: saving ckpt-4 drops ckpt-2. After ckpt-4 and the pointer are uploaded, the
    # bucket's ckpt-2 objects are deleted; the second deletion is held and the run killed.
    hold = Hold()
    experiment.proxy.hook(hold, match="^DELETE ", key=r"/ckpt-2\.", skip=1)
    killed = kill_when_held(experiment, hold, keep_checkpoints=1)
    assert experiment.committed() == [4]
    # ckpt-2's .index went first: what is left of it is no checkpoint to TensorFlow.
    left = [u.rsplit("/", 1)[1] for u in storage.glob(f"{experiment.ckpt_uri}/ckpt-2.*")]
    assert left == ["ckpt-2.data-00000-of-00001"], left
    t1 = time.monotonic()
    experiment.resume(from_step=4, keep_checkpoints=1)
    report("SIGKILL during keep-last-K deletion of ckpt-2", redone=0, killed_child=killed,
           resume=time.monotonic() - t1)


def test_keep_last_k_never_deletes_the_only_complete_checkpoint(experiment):
    # keep 1: TensorFlow drops ckpt-2 locally as soon as ckpt-4 is saved. ckpt-4's index
    # never uploads, so in the bucket ckpt-2 stays the only complete checkpoint.
    experiment.proxy.fail(503, times=100, match="upload", key=r"/ckpt-4\.index$")
    t0 = time.monotonic()
    assert experiment.run(keep_checkpoints=1) == EXIT_STAGE_FAILED, experiment.output[-3000:]
    failed = time.monotonic() - t0
    deletes = [e.key for e in experiment.proxy.log
               if e[0] == "DELETE" and "/ckpt-" in (e.key or "")]
    assert deletes == []
    assert experiment.committed() == [2]
    t1 = time.monotonic()
    experiment.resume(from_step=2, keep_checkpoints=1)
    report("newest checkpoint's upload fails with keep-last-1", redone=2, failed_run=failed,
           resume=time.monotonic() - t1)


def pointer_commits(proxy) -> list[float]:
    """When the bucket answered each upload of the checkpoint pointer from now on (a
    checkpoint is committed then), filled in as the run goes."""
    committed_at = []

    def note(status, headers, body):
        committed_at.append(time.time())
        return status, headers, body

    proxy.rewrite(note, times=10 ** 6, match="upload", key=r"/checkpoints/checkpoint$")
    return committed_at


def slow_uploads(proxy, seconds: float = 0.3) -> None:
    """Every upload request waits ``seconds`` at the proxy: a checkpoint's sync (data,
    index, pointer, one after the other) takes several times that."""
    proxy.hook(lambda method, path: time.sleep(seconds), times=10 ** 6, match="upload")


def test_slow_uploads_still_commit_the_last_checkpoint_before_the_deadline(experiment,
                                                                          monkeypatch):
    """The wall-time budget on gs://: every upload is slowed down, so a checkpoint takes far
    longer than a local save. The stop is planned from this run's checkpoints, uploads
    included: the last one is committed in the bucket before the deadline. The budget
    starts once the resumed run has traced its loop (deadline_budget): a second start-up
    as slow as a busy machine makes it takes nothing from it."""
    from runexp.runtime import executor

    t0 = time.monotonic()
    assert experiment.run(train_steps=2) == EXIT_OK, experiment.output[-3000:]
    first_run = time.monotonic() - t0  # a budget is a multiple of it: a busy machine's longer
    committed_at = pointer_commits(experiment.proxy)
    slow_uploads(experiment.proxy)
    planners = deadline_budget.install(monkeypatch, budget_s=2 * first_run + 5.0,
                                       starts=deadline_budget.AFTER_TRACING)
    monkeypatch.setenv(executor.DEADLINE_ENV, str(time.time() + 3600))
    assert experiment.run(train_steps=100_000) == 124, experiment.output[-3000:]
    deadline = planners[-1].deadline
    assert committed_at and max(committed_at) < deadline, (
        f"committed {max(committed_at) - deadline:.2f} s after the deadline\n"
        + experiment.output[-3000:])
    last = experiment.committed()[-1]
    assert last > 2 and f"at step {last}; latest checkpoint" in experiment.output
    assert "before the deadline" in experiment.output
    record = json.loads(storage.read_text(f"{experiment.stage_uri}/train_log.jsonl")
                        .splitlines()[-1])
    assert record["event"] == "deadline_stop" and record["step"] == last
    assert 0 < record["deadline_seconds_left"] <= deadline - max(committed_at) + 0.01  # rounding


def test_a_start_up_that_leaves_no_time_stops_without_training(experiment, monkeypatch):
    """A slow start-up: the resumed run downloads ckpt-2 while it starts, and the budget ends
    1 s after the bucket answers that download (the deadline is set from that moment, not
    from the launch: however slow this machine is before or after it). Not even a step
    and a checkpoint fit: the run says so and stops at once; ckpt-2 stays the committed
    checkpoint and nothing is committed after the deadline."""
    from runexp.runtime import executor, trainer

    assert experiment.run(train_steps=2) == EXIT_OK, experiment.output[-3000:]
    committed_at = pointer_commits(experiment.proxy)
    held = []  # when the download of ckpt-2 was answered

    def note_the_download(method, path):
        held.append(time.time())

    class OneSecondAfterTheDownload(trainer.StopPlanner):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.deadline = held[-1] + 1.0

    experiment.proxy.hook(note_the_download, match="download", key=r"/ckpt-2\.data-")
    monkeypatch.setattr(trainer, "StopPlanner", OneSecondAfterTheDownload)
    monkeypatch.setenv(executor.DEADLINE_ENV, str(time.time() + 3600))
    assert experiment.run(train_steps=100_000) == 124, experiment.output[-3000:]
    assert len(held) == 1  # the start-up downloaded it
    assert committed_at == []
    assert experiment.committed(strict=True) == [2]
    assert "left when training starts" in experiment.output, experiment.output[-3000:]
    assert "stopping without training or saving anything" in experiment.output
    assert "at step 2; latest checkpoint" in experiment.output
    assert not storage.exists(f"{experiment.stage_uri}/COMPLETED")


def test_a_first_call_that_overran_commits_nothing_after_the_deadline(experiment,
                                                                     monkeypatch):
    """A slow start-up that still let training start: the first call of the loop (tracing,
    on a busy machine) ends with 0.5 s left, less than a checkpoint takes with every upload
    slowed down. The stop keeps ckpt-2, committed long before, says so, and commits nothing
    after the deadline; the next run trains step 3 again."""
    from runexp.runtime import executor, trainer

    assert experiment.run(train_steps=2) == EXIT_OK, experiment.output[-3000:]
    planners = deadline_budget.install(monkeypatch, budget_s=10.0,
                                       starts=deadline_budget.TRAIN_START)
    build_loop = trainer.build_loop

    def first_call_overruns(*args, **kw):
        loop, calls = build_loop(*args, **kw), []

        def call(iterator, num_steps):
            out = loop(iterator, num_steps)
            if not calls:  # ends 0.5 s before the deadline, or later on a slower machine
                time.sleep(max(planners[-1].deadline - 0.5 - time.time(), 0))
            calls.append(num_steps)
            return out
        return call

    monkeypatch.setattr(trainer, "build_loop", first_call_overruns)
    committed_at = pointer_commits(experiment.proxy)
    slow_uploads(experiment.proxy)
    monkeypatch.setenv(executor.DEADLINE_ENV, str(time.time() + 3600))
    assert experiment.run(train_steps=100_000) == 124, experiment.output[-3000:]
    deadline = planners[-1].deadline
    assert committed_at == [], (
        f"committed {max(committed_at) - deadline:.2f} s after the deadline\n"
        + experiment.output[-3000:])
    assert experiment.committed(strict=True) == [2]
    assert "not enough to complete a checkpoint" in experiment.output, \
        experiment.output[-3000:]
    assert "trains step 3 again" in experiment.output
    assert "at step 2; latest checkpoint" in experiment.output
    record = json.loads(storage.read_text(f"{experiment.stage_uri}/train_log.jsonl")
                        .splitlines()[-1])
    assert record["event"] == "deadline_stop"
    assert (record["step"], record["unsaved_steps"]) == (2, 1)
    monkeypatch.setattr(trainer, "build_loop", build_loop)
    monkeypatch.delenv(executor.DEADLINE_ENV)
    experiment.proxy.clear()
    experiment.resume(from_step=2, train_steps=4)


# -- background uploads: training goes on while a checkpoint uploads ----------------------------

def until(condition, child: subprocess.Popen, what: str, log, timeout: float = 600) -> None:
    """Waits for ``condition``; ``timeout`` only ends a hang (the child is held)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert child.poll() is None, f"the child ended before {what}:\n{log()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log()}"
        time.sleep(0.05)


def final_state(experiment: Experiment, stage_uri: str, name: str) -> dict:
    """{tensor name: value} of the checkpoint the pointer at ``stage_uri`` names latest."""
    import tensorflow as tf

    experiment.proxy.clear()
    ckpt_uri = f"{stage_uri}/checkpoints"
    pointer = storage.read_text(f"{ckpt_uri}/checkpoint")
    latest = re.search(r'^model_checkpoint_path: "([^"]+)"', pointer, re.M).group(1)
    local = experiment.tmp_path / "state" / name
    for uri in storage.glob(f"{ckpt_uri}/{latest}.*"):
        storage.download_file(uri, str(local / uri.rsplit("/", 1)[1]))
    reader = tf.train.load_checkpoint(str(local / latest))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if not n.startswith(("save_counter", "_CHECKPOINTABLE"))}


def train_log(stage_uri: str) -> dict:
    """{step: the train_log.jsonl record without its timings} of a finished stage."""
    lines = storage.read_text(f"{stage_uri}/train_log.jsonl").splitlines()
    return {r["step"]: {k: v for k, v in r.items()
                        if k not in ("time", "examples_per_second", "step_time")}
            for r in map(json.loads, lines) if "event" not in r}


def test_killed_while_a_background_upload_is_held_resumes_exactly(experiment, gcs_emulator):
    """ckpt-4's upload is held in flight; training goes on to step 6 meanwhile (its save,
    the last, then waits for ckpt-4's upload), and the process is killed there. The bucket
    still names ckpt-2, whole; the rerun resumes from it and ends exactly where an
    uninterrupted run ends: the same weights and optimizer slots, bit for bit, the same
    metrics."""
    import numpy as np

    reference_root = experiment.root + "-reference"
    # Alongside, straight to the server: none of its requests meet the proxy's faults or
    # enter its log (the checks of the chain read it).
    reference = experiment.spawn(root=reference_root, name="reference", deterministic=True,
                                 storage_host=gcs_emulator[0])
    from runexp.runtime import gcs_mirror as mirror

    hold = Hold()
    experiment.proxy.hook(hold, match="upload", key=r"/ckpt-4\.data-")
    # The child's local work directory (it inherits this test's RUNEXP_CACHE_DIR).
    work = os.path.join(mirror.cache_root(experiment.root), "stages",
                        checkpoint_run.STAGE_ID + ".work", "checkpoints")
    t0 = time.monotonic()
    child = experiment.spawn(deterministic=True)
    try:
        assert hold.arrived.wait(timeout=600), experiment.child_log()  # only ends a hang
        # Training went on while ckpt-4 was uploading: step 6's line is printed before its
        # save, which then waits for the upload in flight.
        until(lambda: "step 6/6" in experiment.child_log(), child, "step 6",
              experiment.child_log)
        # The final save is written locally (then waits for ckpt-4's upload): seen on disk,
        # not guessed from a sleep.
        until(lambda: os.path.exists(os.path.join(work, "ckpt-6.index")), child,
              "ckpt-6 saved locally", experiment.child_log)
        assert child.poll() is None, experiment.child_log()
        child.kill()
        child.wait(timeout=30)
    finally:
        hold.released.set()
        if child.poll() is None:
            child.kill()
            child.wait()
    killed = time.monotonic() - t0
    assert child.returncode == -9, experiment.child_log()
    assert experiment.committed() == [2]
    assert not storage.glob(f"{experiment.ckpt_uri}/ckpt-4.index")
    assert not storage.exists(f"{experiment.stage_uri}/COMPLETED")
    t1 = time.monotonic()
    summary = experiment.resume(from_step=2, deterministic=True)
    resumed = time.monotonic() - t1
    assert reference.wait(timeout=600) == EXIT_OK, experiment.child_log("reference")
    reference_stage = f"{reference_root}/{checkpoint_run.STAGE_ID}"
    expected = json.loads(storage.read_text(f"{reference_stage}/MANIFEST.json"))["summary"]
    for key in ("step", "loss", "mlm_accuracy", "nsp_accuracy", "batches_consumed"):
        assert summary[key] == expected[key], key
    assert train_log(experiment.stage_uri) == train_log(reference_stage)
    final = final_state(experiment, experiment.stage_uri, "resumed")
    want = final_state(experiment, reference_stage, "reference")
    assert set(final) == set(want) and any("optimizer/m/" in n for n in want)
    for name, value in want.items():
        np.testing.assert_array_equal(final[name], value, err_msg=name)
    report("SIGKILL while a background upload (ckpt-4) is held, training at step 6",
           redone=4, killed_child=killed, resume=resumed)


def test_a_checkpoint_dropped_locally_still_uploads_from_its_snapshot(experiment):
    """keep 1: saving ckpt-6 deletes ckpt-4's local files while ckpt-4's upload is held in
    flight. The upload reads its snapshot (hard links): once released it completes, and the
    bucket ends with ckpt-6 alone, every deletion after the commit that replaced it."""
    from runexp.runtime import gcs_mirror as mirror

    hold = Hold()
    experiment.proxy.hook(hold, match="upload", key=r"/ckpt-4\.data-")
    work = os.path.join(mirror.cache_root(experiment.root), "stages",
                        checkpoint_run.STAGE_ID + ".work", "checkpoints")
    seen = {}

    def release_when_dropped():
        try:
            if hold.arrived.wait(timeout=600):
                give_up = time.monotonic() + 600  # only ends a hang
                while time.monotonic() < give_up and (
                        os.path.exists(os.path.join(work, "ckpt-4.index"))
                        or not os.path.exists(os.path.join(work, "ckpt-6.index"))):
                    time.sleep(0.02)
                seen["dropped while held"] = not os.path.exists(
                    os.path.join(work, "ckpt-4.index"))
        finally:
            hold.released.set()

    helper = threading.Thread(target=release_when_dropped, daemon=True)
    helper.start()
    t0 = time.monotonic()
    code = experiment.run(keep_checkpoints=1)
    helper.join(timeout=30)
    assert code == EXIT_OK, experiment.output[-3000:]
    assert seen == {"dropped while held": True}
    uploads = [(e.key.rsplit("/", 1)[1], e[2]) for e in experiment.proxy.log
               if e[1].startswith("/upload/") and "/ckpt-4." in (e.key or "")]
    assert ("ckpt-4.data-00000-of-00001", "hook 503") in uploads  # held, then dropped
    assert ("ckpt-4.data-00000-of-00001", "200") in uploads  # the retry, from the snapshot
    assert ("ckpt-4.index", "200") in uploads
    assert experiment.committed(strict=True) == [6]
    experiment.assert_deletions_follow_commits()
    stage_dir = os.path.join(mirror.cache_root(experiment.root), "stages",
                             checkpoint_run.STAGE_ID)
    assert not os.path.exists(stage_dir + mirror.STAGING_SUFFIX)
    report("keep-last-1 drops ckpt-4 locally while its upload is held", redone=0,
           run=time.monotonic() - t0)


def test_a_background_upload_error_is_raised_in_the_training_thread(experiment):
    """ckpt-2's upload fails past the retry budget in the background: the stage fails with
    that error (not lost, nothing committed) instead of going on as if it were saved; the
    rerun starts over and completes."""
    experiment.proxy.fail(503, times=100, match="upload", key=r"/ckpt-2\.data-")
    t0 = time.monotonic()
    assert experiment.run() == EXIT_STAGE_FAILED, experiment.output[-3000:]
    failed = time.monotonic() - t0
    assert "ckpt-2.data-00000-of-00001: gave up after 6 tries" in experiment.output
    assert not storage.exists(f"{experiment.ckpt_uri}/checkpoint")
    assert not storage.exists(f"{experiment.stage_uri}/COMPLETED")
    # The training thread raised it: at its next look between two calls or at ckpt-4's save,
    # before the last checkpoint.
    assert not storage.glob(f"{experiment.ckpt_uri}/ckpt-6.*")
    experiment.proxy.clear()
    t1 = time.monotonic()
    assert experiment.run() == EXIT_OK, experiment.output[-3000:]
    assert "> pretrain: resuming" not in experiment.output
    assert experiment.committed(strict=True) == [4, 6]
    stats = report("a background upload fails past the budget", redone=4, failed_run=failed,
                   rerun=time.monotonic() - t1)
    assert stats.gave_up == 1
