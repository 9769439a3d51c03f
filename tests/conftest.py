"""Shared fixtures: a real GCS JSON API server on loopback, and a fault proxy in front of it.

- ``gcs_emulator`` (session): starts gcp-storage-emulator (the ``test`` extra) in a
  subprocess on a free 127.0.0.1 port, in memory, with one bucket; sets
  ``STORAGE_EMULATOR_HOST`` for the session (restored afterwards); yields
  ``(endpoint, bucket_name)``.
- ``gcs_prefix``: a fresh ``gs://bucket/...`` prefix per test.
- ``fault_proxy``: a FaultProxy (tests/support/fault_proxy.py) in front of the emulator,
  with ``STORAGE_EMULATOR_HOST`` pointed at it for the test.
- the ``gcs`` marker on every test that uses ``gcs_emulator`` (through ``gcs_prefix`` or
  ``fault_proxy`` too): ``-m "not gcs"`` leaves out every test that needs the emulator.
- ``fast_retries``: a retry policy with millisecond backoff (6 tries; its deadline and
  request timeout are generous, they only end a hang: the faults are counted in tries, and a
  busy machine must not add a timeout of its own) and zeroed retry counters, restored
  afterwards.

Every test, and every `runexp` it starts, runs with RUNEXP_STRICT_SUMMARIES set: a handler's
summary key its kind does not declare fails the stage (runtime/executor.py).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

os.environ["RUNEXP_STRICT_SUMMARIES"] = "1"

EMULATOR_BUCKET = "runexp-test"

# The emulator runs in a child process that exits on its own once pytest is gone (even after
# a SIGKILL), so an interrupted run never leaves a server behind.
_EMULATOR_MAIN = """
import os, sys, time
from gcp_storage_emulator.server import create_server
parent = os.getppid()
server = create_server("127.0.0.1", int(sys.argv[1]), in_memory=True,
                       default_bucket=sys.argv[2])
server.start()
try:
    while os.getppid() == parent:
        time.sleep(0.5)
finally:
    server.stop()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _start_emulator(log_path: str, attempts: int = 3):
    """Start the emulator on a free port; retry if the port was taken in the meantime."""
    last = ""
    for _ in range(attempts):
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        log = open(log_path, "ab")
        proc = subprocess.Popen(
            [sys.executable, "-c", _EMULATOR_MAIN, str(port), EMULATOR_BUCKET],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(endpoint):
                return proc, endpoint
            time.sleep(0.05)
        _stop(proc)
        with open(log_path, "rb") as f:
            last = f.read()[-2000:].decode("utf-8", "replace")
    raise RuntimeError(f"gcp-storage-emulator did not start; log tail:\n{last}")


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def pytest_collection_modifyitems(items):
    """Marks ``gcs`` each test that needs the emulator, whichever fixture brings it in; then
    puts the files holding slow or end-to-end tests first (each file's order kept), so that
    under pytest-xdist the longest files start early and the run does not end on one worker
    with a long file while the other waits.

    Refuses a test id made from raw bytes: such data can differ between processes (a gzip
    header carries the time it was written), and pytest-xdist stops the whole run when its
    workers collect different ids. Name such cases with ``ids=``."""
    for item in items:
        if "\\x" in item.nodeid:
            raise pytest.UsageError(f"{item.nodeid}: a test id made from bytes; give the "
                                    "parametrize case a name with ids=")
        if "gcs_emulator" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gcs)
    long_files = {item.nodeid.split("::")[0] for item in items
                  if item.get_closest_marker("slow") or item.get_closest_marker("e2e")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in long_files)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """(endpoint, bucket_name) of a GCS JSON API server on loopback, for the whole session."""
    pytest.importorskip("gcp_storage_emulator",
                        reason="needs the test extra: pip install -e '.[test]'")
    log_path = str(tmp_path_factory.mktemp("gcs-emulator") / "emulator.log")
    proc, endpoint = _start_emulator(log_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STORAGE_EMULATOR_HOST", endpoint)
        try:
            yield endpoint, EMULATOR_BUCKET
        finally:
            _stop(proc)


@pytest.fixture
def gcs_prefix(gcs_emulator, request):
    """A fresh gs:// prefix (no trailing slash) that no other test uses."""
    _, bucket = gcs_emulator
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name)[:60]
    return f"gs://{bucket}/tests/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def fault_proxy(gcs_emulator, monkeypatch):
    """A FaultProxy in front of the emulator; the storage client talks to it for this test."""
    from tests.support.fault_proxy import FaultProxy

    proxy = FaultProxy(gcs_emulator[0], socket_timeout=15)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def fast_retries():
    """Millisecond backoff so fault tests are quick; counters zeroed; old policy restored."""
    from runexp.runtime import storage

    policy = storage.RetryPolicy(max_tries=6, initial_delay=0.01, max_delay=0.2,
                                 deadline=300.0, timeout=60.0)
    previous = storage.set_retry_policy(policy)
    storage.reset_retry_stats()
    try:
        yield policy
    finally:
        storage.set_retry_policy(previous)
