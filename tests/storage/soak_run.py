"""A two-phase pretraining experiment on a gs:// root interrupted many times: SIGTERM and
SIGKILL at steps a seeded RNG picks, SIGKILL while a checkpoint's upload is held at the fault
proxy, in both phases; then run to its end. Used by tests/storage/test_soak.py (a short chain)
and bench/soak.py (at least 20 interruptions).

The experiment: the real pretrain stage twice, run by the executor (runexp's own run path,
uploads to the loopback GCS server included): ``pretrain`` (sequence length 32) and
``pretrain.phase2`` (length 64, from ``pretrain``'s final checkpoint), a tiny model,
TensorFlow's op determinism on.

As a child process (``python -m tests.storage.soak_run SPEC.json``; storage settings from the
environment) it records, in ``SPEC["markers"]``, one line per training step (``<sequence
length> <this process's step count at that length>``) and, at its first step, the seconds
since the process started (``FIRST_STEP <s>``: start-up, compile, checkpoint download and
restore, data position). With ``SPEC["hold"] = {"seq": L, "n": k}`` its k-th step at length L
does not end until the process gets SIGTERM (it then stops at that step) or is killed:
the parent acts at that step exactly, however fast or slow the machine.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before any import that takes time

import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

PHASES = ("pretrain", "pretrain.phase2")
SEQ = {"pretrain": 32, "pretrain.phase2": 64}
PREDICTIONS = {"pretrain": 5, "pretrain.phase2": 10}
HOLD_LIMIT_S = 600.0  # a held step goes on by itself after this long (a forgotten child)
KINDS = ("SIGTERM", "SIGKILL", "upload")


def write_data(data_dir: str) -> None:
    """vocab/, phase1/ and phase2/ (train records of length 32 and 64) for TINY_MODEL."""
    from tests.support import runtime as tiny

    vocab = tiny.TINY_MODEL["vocab_size"]
    tiny.write_vocab_dir(os.path.join(data_dir, "vocab"), vocab)
    tiny.write_pretraining_records(os.path.join(data_dir, "phase1"), "train", 96, vocab,
                                   SEQ["pretrain"], PREDICTIONS["pretrain"], seed=1,
                                   num_shards=2)
    tiny.write_pretraining_records(os.path.join(data_dir, "phase2"), "train", 64, vocab,
                                   SEQ["pretrain.phase2"], PREDICTIONS["pretrain.phase2"],
                                   seed=2, num_shards=1)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def plan(root: str, data_dir: str, steps: tuple[int, int]):
    """The two-phase Plan at ``root``."""
    from runexp.compiler.plan import Plan, Stage
    from tests.support import runtime as tiny

    root = root.rstrip("/")
    stages = []
    for phase, train_steps in zip(PHASES, steps):
        params = tiny.pretrain_params(
            batch_size=8, train_steps=train_steps, warmup_steps=2, checkpoint_every=4,
            keep_checkpoints=2, steps_per_loop=2, log_every=2, seed=7,
            max_seq_length=SEQ[phase], max_predictions_per_seq=PREDICTIONS[phase])
        inputs = {"data_dir": os.path.join(data_dir, "phase1" if phase == "pretrain"
                                           else "phase2"),
                  "vocab_dir": os.path.join(data_dir, "vocab")}
        deps = ()
        if phase != "pretrain":
            inputs["previous_phase_dir"] = f"{root}/pretrain"
            deps = ("pretrain",)
        key = _digest({"params": params, "inputs": sorted(inputs)})
        stages.append(Stage(id=phase, kind="pretrain", params=params, inputs=inputs,
                            output_dir=f"{root}/{phase}", deps=deps, fingerprint=key,
                            resume_key=key))
    return Plan(experiment="soak", output_root=root, stages=tuple(stages),
                accelerator={"type": "cpu"})


def _install_hooks(markers: str, hold: dict | None) -> None:
    import tensorflow as tf

    from runexp.runtime import preemption
    from runexp.runtime.model import BertPretrainer

    original = BertPretrainer.loss_stats
    counts: dict[int, int] = {}
    sigterm = threading.Event()
    request = preemption.PreemptionWatcher._request

    def on_request(self, signum):  # the watcher's thread: the stop flag is set, then this
        request(self, signum)
        sigterm.set()

    preemption.PreemptionWatcher._request = on_request

    def note(line: str) -> None:
        with open(markers, "a") as f:
            f.write(line + "\n")

    def after_step(seq: int):
        if not counts:
            note(f"FIRST_STEP {time.time() - STARTED:.3f}")
        counts[seq] = counts.get(seq, 0) + 1
        note(f"{seq} {counts[seq]}")
        if hold and hold["seq"] == seq and hold["n"] == counts[seq]:
            note("HELD")
            sigterm.wait(HOLD_LIMIT_S)
        return 0

    def loss_stats(self, features, training=False):
        if training:
            seq = int(features["input_ids"].shape[-1])
            tf.py_function(lambda: after_step(seq), [], [tf.int32])
        return original(self, features, training)

    BertPretrainer.loss_stats = loss_stats


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from runexp.runtime import executor, storage

    tf.config.experimental.enable_op_determinism()
    storage.set_retry_policy(storage.RetryPolicy(**spec.get("retry", {})))
    _install_hooks(spec["markers"], spec.get("hold"))
    return executor.run_plan(plan(spec["root"], spec["data_dir"], tuple(spec["steps"])))


# --- the parent: the chain of interrupted processes ------------------------------------------

class Hold:
    """A proxy hook that keeps one upload in flight until released (the request never
    reaches the server)."""

    def __init__(self):
        self.arrived, self.released = threading.Event(), threading.Event()

    def __call__(self, method, path):
        self.arrived.set()
        self.released.wait(timeout=HOLD_LIMIT_S)
        return 503, b'{"error": {"code": 503, "message": "held, then dropped"}}'


@dataclasses.dataclass
class Launch:
    """One process of the chain: how it ended and what its start-up cost."""

    n: int
    kind: str  # "SIGTERM", "SIGKILL", "upload" (SIGKILL while an upload is held), "end"
    phase: str  # the stage it was interrupted in (the last one it trained, for "end")
    started_from: dict  # phase -> the committed step the process found
    hold_n: int = 0  # the held step, counted in this process at the phase's length
    code: int | None = None
    first_step_s: float | None = None  # process start to its first step ending


class Soak:
    """The chain on ``root`` (behind ``proxy``), its processes' files in ``work``."""

    def __init__(self, root: str, data_dir: str, work: str, proxy, retry: dict,
                 steps: tuple[int, int] = (24, 16), env: dict | None = None,
                 say=lambda line: None):
        self.root, self.data_dir, self.work, self.proxy = root.rstrip("/"), data_dir, work, proxy
        self.retry, self.steps, self.env, self.say = retry, steps, env, say
        self.launches: list[Launch] = []

    # -- the bucket -------------------------------------------------------------------------
    def committed(self, phase: str) -> int:
        """The step of ``phase``'s checkpoint the bucket's pointer names (0: none)."""
        from runexp.runtime import storage

        try:
            pointer = storage.read_text(f"{self.root}/{phase}/checkpoints/checkpoint")
        except (OSError, storage.StorageError):
            return 0
        m = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', pointer, re.M)
        return int(m.group(1)) if m else 0

    def done(self, phase: str) -> bool:
        from runexp.runtime import storage

        return storage.exists(f"{self.root}/{phase}/COMPLETED")

    # -- processes --------------------------------------------------------------------------
    def spawn(self, name: str, root: str | None = None, hold: dict | None = None,
              env: dict | None = None) -> tuple[subprocess.Popen, str]:
        from tests.support import child_env

        spec = os.path.join(self.work, f"{name}.json")
        markers = os.path.join(self.work, f"{name}.markers")
        with open(spec, "w") as f:
            json.dump({"root": root or self.root, "data_dir": self.data_dir,
                       "steps": list(self.steps), "retry": self.retry, "markers": markers,
                       "hold": hold}, f)
        with open(os.path.join(self.work, f"{name}.log"), "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tests.storage.soak_run", spec],
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=child_env(env or self.env))
        return proc, markers

    def log(self, name: str, tail: int = 3000) -> str:
        with open(os.path.join(self.work, f"{name}.log"), errors="replace") as f:
            return f.read()[-tail:]

    @staticmethod
    def _markers(path: str) -> list[str]:
        try:
            with open(path) as f:
                return f.read().splitlines()
        except OSError:
            return []

    def _until(self, condition, proc, name: str, what: str, timeout: float = 600) -> None:
        """Waits for ``condition``; ``timeout`` only ends a hang (the child is held)."""
        deadline = time.monotonic() + timeout
        while not condition():
            if proc.poll() is not None:
                raise AssertionError(f"{name} ended (rc {proc.returncode}) before {what}:\n"
                                     f"{self.log(name)}")
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"timed out waiting for {what}:\n{self.log(name)}")
            time.sleep(0.02)

    def _first_step(self, markers: str) -> float | None:
        for line in self._markers(markers):
            if line.startswith("FIRST_STEP "):
                return float(line.split()[1])
        return None

    # -- the chain --------------------------------------------------------------------------
    def schedule(self, interruptions: int, seed: int) -> list[tuple[str, str]]:
        """(phase, kind) of each interruption: half in each phase, every kind in each phase
        (given three or more there), in an order the RNG shuffles."""
        import random

        rng = random.Random(seed)
        out = []
        for i, phase in enumerate(PHASES):
            count = interruptions // 2 + (interruptions % 2 if i == 0 else 0)
            kinds = [KINDS[j % len(KINDS)] for j in range(count)]
            rng.shuffle(kinds)
            out += [(phase, kind) for kind in kinds]
        return out

    def interrupt(self, n: int, phase: str, kind: str, rng) -> Launch:
        """Launch ``n``: a process interrupted in ``phase`` by ``kind``."""
        name = f"chain{n}"
        started = {p: self.committed(p) for p in PHASES}
        totals = dict(zip(PHASES, self.steps))
        if totals[phase] - started[phase] < 2 and phase != PHASES[-1]:
            phase = PHASES[-1]  # too little of this phase is left to stop in it
        total = totals[phase]
        left = total - started[phase]
        if left < 2:
            raise AssertionError(f"{phase} has {left} step(s) left: too few to interrupt; "
                                 "give the phases more steps")
        launch = Launch(n, kind, phase, started)
        hold = None
        held = Hold()
        if kind == "upload":
            stage_key = re.escape(f"/{phase}/checkpoints/")
            self.proxy.hook(held, match="upload", key=stage_key + r"ckpt-\d+\.data-",
                            skip=rng.randrange(2) if left > 8 else 0)
        else:
            # A step before the phase's last: a stop there leaves steps to train.
            launch.hold_n = rng.randint(1, max(1, min(left - 1, 2 * total // 5)))
            hold = {"seq": SEQ[phase], "n": launch.hold_n}
        proc, markers = self.spawn(name, hold=hold)
        try:
            if kind == "upload":
                if not held.arrived.wait(timeout=HOLD_LIMIT_S):  # only ends a hang
                    raise AssertionError(f"no upload of {phase} came:\n{self.log(name)}")
                proc.kill()
            else:
                self._until(lambda: "HELD" in self._markers(markers), proc, name,
                            f"{phase} step {launch.hold_n}")
                proc.send_signal(signal.SIGTERM if kind == "SIGTERM" else signal.SIGKILL)
            launch.code = proc.wait(timeout=HOLD_LIMIT_S)
        finally:
            held.released.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            self.proxy.clear()
        launch.first_step_s = self._first_step(markers)
        want = 75 if kind == "SIGTERM" else -signal.SIGKILL
        assert launch.code == want, f"{name} ({kind}) exit {launch.code}:\n{self.log(name)}"
        self.launches.append(launch)
        self.say(describe(launch))
        return launch

    def finish(self) -> Launch:
        """The last launch, to the end of both phases."""
        n = len(self.launches) + 1
        launch = Launch(n, "end", PHASES[-1], {p: self.committed(p) for p in PHASES})
        proc, markers = self.spawn(f"chain{n}")
        launch.code = proc.wait(timeout=HOLD_LIMIT_S * 2)
        launch.first_step_s = self._first_step(markers)
        assert launch.code == 0, self.log(f"chain{n}")
        self.launches.append(launch)
        self.say(describe(launch))
        return launch

    def run(self, interruptions: int, seed: int) -> list[Launch]:
        import random

        rng = random.Random(seed + 1)
        for n, (phase, kind) in enumerate(self.schedule(interruptions, seed), start=1):
            self.interrupt(n, phase, kind, rng)
        self.finish()
        return self.launches

    def final_state(self, root: str, phase: str, local: str) -> dict:
        """{tensor: value} of the checkpoint ``root``/``phase``'s pointer names latest."""
        import tensorflow as tf

        from runexp.runtime import storage

        ckpt = f"{root.rstrip('/')}/{phase}/checkpoints"
        pointer = storage.read_text(f"{ckpt}/checkpoint")
        latest = re.search(r'^model_checkpoint_path: "([^"]+)"', pointer, re.M).group(1)
        for uri in storage.glob(f"{ckpt}/{latest}.*"):
            storage.download_file(uri, os.path.join(local, uri.rsplit("/", 1)[1]))
        reader = tf.train.load_checkpoint(os.path.join(local, latest))
        return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
                if not n.startswith(("save_counter", "_CHECKPOINTABLE"))}


def describe(launch: Launch) -> str:
    at = (f" at its step {launch.hold_n} of {launch.phase}" if launch.hold_n else
          f" while a {launch.phase} checkpoint upload was held" if launch.kind == "upload"
          else "")
    start = ", ".join(f"{p} {s}" for p, s in launch.started_from.items())
    first = (f"{launch.first_step_s:.2f} s" if launch.first_step_s is not None else "none")
    return (f"soak: launch {launch.n}: {launch.kind}{at}; started from ({start}); "
            f"process start to first step {first}; exit {launch.code}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
