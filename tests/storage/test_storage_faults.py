"""Transient faults between runexp and GCS: a FaultProxy (tests/support/fault_proxy.py) in
front of the loopback emulator injects them; storage must retry what is transient, give up
within its budget with a clear error, and never take corrupt or partial data for good.

Each test prints one line "FAULT <scenario>: ..." with the retries made and the seconds lost
(run with -s to see them); ``fast_retries`` shrinks the backoff to milliseconds.

Time budgets are checked on the retry loop's own clock (``retry_clock``): its waits are
counted, not slept, so a slow machine neither fails them nor a fast one hides a wrong wait.
Timeouts are derived from a request timed in the test itself."""

import json
import os
import sys
import threading
import time

import pytest

from runexp.runtime import storage


class RetryClock:
    """Stands in for the retry module's ``time``: ``sleep`` is counted, not slept, and
    ``monotonic`` is the waits so far: an attempt takes no time on it, so how fast a busy
    machine answers decides neither how many waits fit in a budget nor when they end."""

    def __init__(self):
        self.waits: list[float] = []
        self.ends: list[float] = []  # when each wait ended, on this clock
        self.first: float | None = None  # the first reading: when the first attempt started
        self.last: float | None = None  # the latest reading (the one a wait was decided on)

    def monotonic(self) -> float:
        self.last = sum(self.waits)
        if self.first is None:
            self.first = self.last
        return self.last

    def sleep(self, seconds: float) -> None:
        self.ends.append(self.last + seconds)
        self.waits.append(seconds)


@pytest.fixture
def retry_clock(monkeypatch):
    clock = RetryClock()
    monkeypatch.setattr(sys.modules[storage.RetryPolicy.__module__], "time", clock)
    return clock


def report(scenario: str, started: float) -> storage.RetryStats:
    stats = storage.retry_stats()
    print(f"\nFAULT {scenario}: retries={stats.retries} by_error={stats.by_error} "
          f"gave_up={stats.gave_up} seconds_lost={stats.seconds_lost:.3f} "
          f"wall={time.monotonic() - started:.3f}s")
    return stats


def test_429_storm_shorter_than_the_budget_succeeds(fault_proxy, fast_retries, gcs_prefix):
    uri = storage.join(gcs_prefix, "MANIFEST.json")
    fault_proxy.fail(429, times=4)
    t0 = time.monotonic()
    storage.write_text(uri, '{"ok": true}')
    stats = report("429 storm x4 on write", t0)
    assert stats.retries == 4 and stats.by_error == {"429": 4} and stats.gave_up == 0
    assert storage.read_text(uri) == '{"ok": true}'
    assert [outcome for _, _, outcome in fault_proxy.log[:5]] == ["429"] * 4 + ["200"]


def test_storm_longer_than_the_budget_fails_naming_the_uri(fault_proxy, fast_retries,
                                                          gcs_prefix, retry_clock):
    uri = storage.join(gcs_prefix, "ckpt/ckpt-7.index")
    fault_proxy.fail(503, times=100)
    t0 = time.monotonic()
    with pytest.raises(storage.RetryBudgetExceeded) as info:
        storage.write_bytes(uri, b"x")
    stats = report("503 storm x100 on write (gives up)", t0)
    message = str(info.value)
    assert uri in message and "6 tries" in message and "503" in message
    assert info.value.uri == uri
    assert stats.retries == 5 and stats.gave_up == 1
    assert fault_proxy.pending() == 100 - 6
    # Five waits, each within its jittered backoff: the tries ran out, not the time.
    assert len(retry_clock.waits) == 5
    for n, wait in enumerate(retry_clock.waits, 1):
        full = min(fast_retries.max_delay, fast_retries.initial_delay * 2 ** (n - 1))
        assert 0.5 * full <= wait <= full


def test_deadline_bounds_the_time_spent(fault_proxy, gcs_prefix, retry_clock):
    previous = storage.set_retry_policy(storage.RetryPolicy(
        max_tries=100, initial_delay=0.2, multiplier=2.0, max_delay=1.0, deadline=1.5))
    storage.reset_retry_stats()
    try:
        fault_proxy.fail(503, times=1000, match="download")
        t0 = time.monotonic()
        with pytest.raises(storage.RetryBudgetExceeded, match="1.5s"):
            storage.read_bytes(storage.join(gcs_prefix, "anything"))
        stats = report("503 storm on read, 1.5 s deadline (gives up)", t0)
        # The deadline, not the tries, ended it; no wait ended past the deadline (so no
        # attempt started after it), on the retry loop's clock.
        assert stats.gave_up == 1 and 1 <= len(retry_clock.waits) < 99
        assert max(retry_clock.ends) - retry_clock.first <= 1.5 + 1e-9
    finally:
        storage.set_retry_policy(previous)


def test_503_mid_upload_dir_recovers(fault_proxy, fast_retries, gcs_prefix, tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    for i in range(5):
        (src / f"part-{i}").write_bytes(os.urandom(50_000))
    # The first two files go through; the next two upload requests get 503.
    fault_proxy.fail(503, times=2, match="upload", skip=2)
    t0 = time.monotonic()
    uploaded = storage.upload_dir(str(src), storage.join(gcs_prefix, "ckpt"))
    stats = report("503 x2 in the middle of upload_dir (5 files)", t0)
    assert stats.retries == 2 and stats.by_error == {"503": 2}
    assert len(uploaded) == 5
    back = storage.download_dir(storage.join(gcs_prefix, "ckpt"), str(tmp_path / "back"))
    for path in back:
        assert open(path, "rb").read() == (src / os.path.basename(path)).read_bytes()


def test_503_on_the_data_request_of_a_resumable_upload_recovers(fault_proxy, fast_retries,
                                                                gcs_prefix, tmp_path):
    src = tmp_path / "big"
    src.mkdir()
    (src / "data").write_bytes(os.urandom(9 << 20))  # > 8 MiB: initiate, then PUT the bytes
    fault_proxy.fail(503, times=1, match=r"^PUT /upload/")
    t0 = time.monotonic()
    storage.upload_dir(str(src), storage.join(gcs_prefix, "big"))
    stats = report("503 on the PUT of a 9 MiB resumable upload", t0)
    assert stats.retries == 1
    assert [o for m, _, o in fault_proxy.log if m == "PUT"][0] == "503"
    assert storage.size(storage.join(gcs_prefix, "big/data")) == 9 << 20


def test_upload_cut_after_k_bytes_recovers(fault_proxy, fast_retries, gcs_prefix, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(2 << 20)
    (src / "shard").write_bytes(data)
    fault_proxy.cut_upload(after_bytes=64 << 10, times=2)
    t0 = time.monotonic()
    storage.upload_dir(str(src), storage.join(gcs_prefix, "d"))
    stats = report("upload cut after 64 KiB, twice (2 MiB file)", t0)
    assert stats.retries == 2
    assert storage.read_bytes(storage.join(gcs_prefix, "d/shard")) == data


def test_cut_upload_leaves_the_old_object_whole(fault_proxy, gcs_prefix):
    """GCS creates an object only when its upload completes: a cut write leaves the old one."""
    uri = storage.join(gcs_prefix, "latest")
    storage.write_text(uri, "ckpt-1")
    previous = storage.set_retry_policy(storage.RetryPolicy(max_tries=1))
    try:
        fault_proxy.cut_upload(after_bytes=10)
        with pytest.raises(storage.RetryBudgetExceeded, match=uri):
            storage.write_text(uri, "ckpt-2" + "x" * 100_000)
    finally:
        storage.set_retry_policy(previous)
    assert storage.read_text(uri) == "ckpt-1"
    storage.write_text(uri, "ckpt-2")
    assert storage.read_text(uri) == "ckpt-2"


def test_connection_reset_mid_download_recovers(fault_proxy, fast_retries, gcs_prefix,
                                                tmp_path):
    uri = storage.join(gcs_prefix, "shards/train.tfrecord-00000-of-00001")
    data = os.urandom(1 << 20)
    storage.write_bytes(uri, data)
    fault_proxy.reset(match="download", after_bytes=100_000)
    t0 = time.monotonic()
    assert storage.read_bytes(uri) == data
    stats = report("connection reset after 100 kB of a 1 MiB read", t0)
    assert stats.retries == 1 and "reset after" in fault_proxy.log[1][2]

    storage.reset_retry_stats()
    fault_proxy.reset(match="download", after_bytes=0, times=2)
    t0 = time.monotonic()
    [path] = storage.download_dir(storage.join(gcs_prefix, "shards"), str(tmp_path / "d"))
    stats = report("connection reset x2 at the start of download_dir", t0)
    assert stats.retries == 2 and open(path, "rb").read() == data


def test_timeout_is_retried(fault_proxy, gcs_prefix):
    uri = storage.join(gcs_prefix, "slow")
    storage.write_text(uri, "eventually")
    # The timeout: far longer than a read takes here and now, so only the stalled one
    # times out however slow the machine.
    t0 = time.monotonic()
    storage.read_text(uri)
    timeout = max(1.0, 20 * (time.monotonic() - t0))
    previous = storage.set_retry_policy(storage.RetryPolicy(
        max_tries=3, initial_delay=0.01, max_delay=0.05, timeout=timeout))
    storage.reset_retry_stats()
    released = threading.Event()
    try:
        # The server stalls the first read until the test is over: past any timeout.
        fault_proxy.hook(lambda method, path: released.wait(10 * timeout) and None,
                         match="download")
        t0 = time.monotonic()
        assert storage.read_text(uri) == "eventually"
        stats = report(f"server stalls a read, {timeout:.1f} s timeout", t0)
        # The stalled read timed out and was retried; a retry slowed past the timeout by a
        # busy machine would be one more ReadTimeout, not another outcome.
        assert set(stats.by_error) == {"ReadTimeout"} and stats.gave_up == 0
    finally:
        released.set()
        storage.set_retry_policy(previous)


def test_corrupted_download_is_detected(fault_proxy, fast_retries, gcs_prefix, tmp_path):
    uri = storage.join(gcs_prefix, "ckpt/data")
    storage.write_bytes(uri, os.urandom(200_000))

    # Bytes altered in flight, hash header intact: the client library's check catches it.
    fault_proxy.corrupt(match="download")
    with pytest.raises(storage.IntegrityError, match=uri):
        storage.read_bytes(uri)

    # Bytes altered and x-goog-hash dropped: only download_dir's own check (crc32c of the
    # local file vs the listing's metadata) can catch it; nothing lands in the destination.
    fault_proxy.corrupt(match="download", strip_hash=True)
    with pytest.raises(storage.IntegrityError, match="crc32c") as info:
        storage.download_dir(storage.join(gcs_prefix, "ckpt"), str(tmp_path / "out"))
    assert info.value.uri == uri
    assert os.listdir(tmp_path / "out") == []
    assert storage.retry_stats().retries == 0  # corruption is not a transient error


def test_upload_verification_catches_a_mismatched_server_record(fault_proxy, fast_retries,
                                                                gcs_prefix, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "weights").write_bytes(os.urandom(10_000))

    def wrong_crc(status, headers, body):
        meta = json.loads(body)
        meta["crc32c"] = "AAAAAA=="
        return status, headers, json.dumps(meta).encode()

    fault_proxy.rewrite(wrong_crc, match="upload")
    with pytest.raises(storage.IntegrityError, match="crc32c"):
        storage.upload_dir(str(src), storage.join(gcs_prefix, "up"))


def test_delete_retried_after_it_succeeded_is_not_an_error(fault_proxy, fast_retries,
                                                           gcs_prefix):
    uri = storage.join(gcs_prefix, "ckpt-1/data")
    storage.write_text(uri, "x")
    # The server deletes the object, but the reply is lost as a 503: the retry sees 404.
    fault_proxy.rewrite(lambda status, headers, body: (503, headers, b""), match="^DELETE ")
    storage.delete(uri)
    assert storage.retry_stats().retries == 1
    assert not storage.exists(uri)


def test_permanent_errors_are_not_retried(fault_proxy, fast_retries, gcs_prefix):
    fault_proxy.fail(403, times=1)
    with pytest.raises(PermissionError, match=gcs_prefix):
        storage.write_text(storage.join(gcs_prefix, "x"), "x")
    assert storage.retry_stats().retries == 0


def test_download_dir_refuses_keys_escaping_the_destination(fault_proxy, gcs_prefix,
                                                            tmp_path):
    # The emulator will not store such a key; a hostile or buggy listing can still name one.
    storage.write_text(storage.join(gcs_prefix, "d/ok"), "x")

    def escape(status, headers, body):
        listing = json.loads(body)
        listing["items"][0]["name"] = listing["items"][0]["name"].replace("d/ok",
                                                                        "d/../../escape")
        return status, headers, json.dumps(listing).encode()

    fault_proxy.rewrite(escape, match=r"^GET /storage/v1/b/[^/]+/o\?")
    with pytest.raises(storage.StorageError, match="outside"):
        storage.download_dir(storage.join(gcs_prefix, "d"), str(tmp_path / "out"))
    assert not list((tmp_path).rglob("escape"))


def test_preflight_with_an_unreadable_iam_policy(fault_proxy, gcs_prefix):
    fault_proxy.fail(403, match=r"/iam\b")
    findings = storage.preflight(gcs_prefix)
    assert [f.split(":")[0] for f in findings] == ["ok", "ok", "skipped"], findings
    assert "403" in findings[2] and "public access not checked" in findings[2]
