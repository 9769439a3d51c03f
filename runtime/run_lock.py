"""One writer per output root: the lock a run holds in ``<root>/RUN_LOCK.json``.

The lock records who runs (host, pid, command), since when, which stage, and a heartbeat
refreshed every HEARTBEAT_SECONDS by a daemon thread. A second run on the same root is
refused while the lock is live. A lock is stale, and taken over by the next run, when

- its heartbeat is older than STALE_SECONDS (a killed machine, a lost VM), or
- it was written on this host by a process that no longer exists (a SIGKILL, an OOM kill:
  the next run on the same machine need not wait).

Breaking a lock by hand (only when sure the run is gone): ``runexp unlock ROOT``, which
refuses a live lock unless given ``--force``; or delete ``RUN_LOCK.json``.

Creation is atomic on both backends (storage.create_text: O_EXCL locally, ifGenerationMatch=0
on GCS). Standard library and runexp's storage layer only: `runexp status` reads it without
TensorFlow.

Usage:
    with RunLock.acquire(root, command=" ".join(sys.argv)) as lock:   # raises LockHeld
        lock.set_stage("pretrain")
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Optional

from runexp.compiler import uris
from runexp.runtime import storage

LOCK_FILE = "RUN_LOCK.json"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0


class LockHeld(Exception):
    """Another live run holds the root's lock."""

    def __init__(self, root: str, record: dict):
        self.root, self.record = root, record
        age = time.time() - float(record.get("heartbeat", 0))
        super().__init__(
            f"another runexp run is writing {root}: {describe(record)}, last heartbeat "
            f"{age:.0f} s ago\n  hint: wait for it (`runexp status {root}` shows it), or, if "
            f"that run is gone, `runexp unlock {root}` (a lock is also taken over by itself "
            f"{STALE_SECONDS / 60:.0f} min after its last heartbeat)")


def lock_path(root: str) -> str:
    return uris.join(root, LOCK_FILE)


def describe(record: dict) -> str:
    stage = f", stage {record['stage']}" if record.get("stage") else ""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record.get("started", 0))))
    return f"pid {record.get('pid')} on {record.get('host')}, started {started}{stage}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def stale_reason(record: dict, now: Optional[float] = None) -> Optional[str]:
    """Why a lock record no longer protects anything; None while it is live."""
    age = (now or time.time()) - float(record.get("heartbeat", 0))
    if age > STALE_SECONDS:
        return f"its last heartbeat was {age:.0f} s ago"
    if record.get("host") == socket.gethostname() and not _pid_alive(int(record.get("pid", 0))):
        return f"process {record.get('pid')} on this host is gone"
    return None


def read(root: str) -> Optional[dict]:
    """The lock record of ``root``, or None when no run holds it (or it is unreadable)."""

    try:
        return json.loads(storage.read_text(lock_path(root)))
    except (OSError, ValueError, storage.StorageError):
        return None


class RunLock:
    """A held lock; release() (or leaving the ``with`` block) deletes it."""

    def __init__(self, root: str, record: dict):
        self.root = root
        self.record = record
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="runexp-lock-heartbeat",
                                        daemon=True)

    @classmethod
    def acquire(cls, root: str, command: str = "") -> "RunLock":
        """Takes the lock of ``root``, replacing a stale one. Raises LockHeld."""

        now = time.time()
        record = {"host": socket.gethostname(), "pid": os.getpid(), "started": now,
                  "heartbeat": now, "command": command, "stage": None,
                  "token": uuid.uuid4().hex}
        path = lock_path(root)
        text = json.dumps(record, indent=2)
        for _ in range(3):
            # Looked at first, then created with a precondition: the look refuses a live
            # lock on any backend, the precondition settles two runs starting at once.
            held = read(root)
            if held is not None and held.get("token") == record["token"]:
                break  # our own create, retried after a lost response
            if held is not None and stale_reason(held) is None:
                raise LockHeld(root, held)
            if held is not None:
                storage.delete(path, missing_ok=True)  # stale: race for a fresh create
            if storage.create_text(path, text):
                break
        else:
            raise LockHeld(root, read(root) or {})
        lock = cls(root, record)
        lock._thread.start()
        return lock

    def set_stage(self, stage: Optional[str]) -> None:
        with self._mutex:
            self.record["stage"] = stage
        self._write()

    def _write(self) -> None:
        with self._mutex:
            self.record["heartbeat"] = time.time()
            text = json.dumps(self.record, indent=2)
        try:
            current = read(self.root)
            if current is not None and current.get("token") != self.record["token"]:
                self._stop.set()  # broken by hand and taken by another run: let it be
                print(f"WARNING: the lock of {self.root} was taken over by another run "
                      f"({describe(current)}); this run no longer holds it", flush=True)
                return
            storage.write_text(lock_path(self.root), text)
        except (OSError, storage.StorageError) as e:
            print(f"WARNING: could not refresh the lock heartbeat of {self.root}: {e}",
                  flush=True)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            self._write()

    def release(self) -> None:
        self._stop.set()
        current = read(self.root)
        if current is not None and current.get("token") == self.record["token"]:
            try:
                storage.delete(lock_path(self.root), missing_ok=True)
            except (OSError, storage.StorageError):
                pass  # stale after STALE_SECONDS anyway

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def break_lock(root: str, force: bool = False) -> str:
    """`runexp unlock`: removes the lock of ``root``; a live one only with ``force``.
    Returns what was done, for the console. Raises LockHeld for a live lock without force."""

    held = read(root)
    if held is None:
        return f"{root} is not locked"
    reason = stale_reason(held)
    if reason is None and not force:
        raise LockHeld(root, held)
    storage.delete(lock_path(root), missing_ok=True)
    return f"removed the lock of {root} ({describe(held)}; " + (
        f"stale: {reason})" if reason else "it was live: forced)")
