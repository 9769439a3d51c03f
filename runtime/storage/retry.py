"""Retrying transient GCS errors: the policy, the loop, and what the retries cost.

``with_retries(what, uri, attempt)`` calls ``attempt()`` again on a transient error (429,
408, 5xx, connection resets, timeouts) after an exponential backoff with jitter, within the
bounds of the installed ``RetryPolicy``; retries and the seconds they cost are counted in
``retry_stats()``. When the budget runs out, ``RetryBudgetExceeded`` names the URI, the tries
and the last error. google-cloud-storage is imported only to classify an error.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time

from runexp.runtime.storage.errors import RetryBudgetExceeded


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Bounds on retrying transient GCS errors.

    The n-th retry waits ``min(max_delay, initial_delay * multiplier**(n-1))`` scaled by a
    random factor in [0.5, 1] (jitter). No more than ``max_tries`` attempts, and no retry that
    would end later than ``deadline`` seconds after the first attempt started. ``timeout`` is
    the per-request HTTP timeout in seconds.
    """

    max_tries: int = 6
    initial_delay: float = 0.5
    max_delay: float = 16.0
    multiplier: float = 2.0
    deadline: float = 120.0
    timeout: float = 60.0

    def delay(self, retry_number: int) -> float:
        base = min(self.max_delay, self.initial_delay * self.multiplier ** (retry_number - 1))
        return base * random.uniform(0.5, 1.0)


@dataclasses.dataclass
class RetryStats:
    """What transient errors cost: retries made, seconds lost (failed attempts + waiting),
    operations given up on, and retries counted by error (e.g. ``"429"``, ``"ConnectionError"``)."""

    retries: int = 0
    seconds_lost: float = 0.0
    gave_up: int = 0
    by_error: dict = dataclasses.field(default_factory=dict)


_lock = threading.Lock()
_policy = RetryPolicy()
_stats = RetryStats()


def set_retry_policy(policy: RetryPolicy) -> RetryPolicy:
    """Install ``policy`` for all later calls; returns the previous one."""
    global _policy
    with _lock:
        previous, _policy = _policy, policy
    return previous


def retry_policy() -> RetryPolicy:
    return _policy


def retry_stats() -> RetryStats:
    """A snapshot of the retry counters since the last ``reset_retry_stats()``."""
    with _lock:
        return dataclasses.replace(_stats, by_error=dict(_stats.by_error))


def reset_retry_stats() -> None:
    global _stats
    with _lock:
        _stats = RetryStats()


def error_label(exc: BaseException) -> str:
    """``"429"`` for an HTTP status, else the exception's class name."""
    code = _status_code(exc)
    return str(code) if code else type(exc).__name__


def _status_code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)  # google.api_core exceptions
    if isinstance(code, int):
        return code
    response = getattr(exc, "response", None)  # InvalidResponse from the media layer
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


_TRANSIENT_CODES = frozenset({408, 429, 500, 502, 503, 504})


def is_transient(exc: BaseException) -> bool:
    import requests
    import urllib3
    from google.auth import exceptions as auth_exceptions

    if isinstance(exc, auth_exceptions.TransportError) and exc.args:
        inner = exc.args[0]
        return isinstance(inner, BaseException) and is_transient(inner)
    if isinstance(exc, (ConnectionError, TimeoutError, requests.ConnectionError,
                        requests.Timeout, requests.exceptions.ChunkedEncodingError,
                        urllib3.exceptions.ProtocolError, urllib3.exceptions.TimeoutError,
                        urllib3.exceptions.PoolError)):
        return True
    import http.client

    if isinstance(exc, (http.client.IncompleteRead, http.client.BadStatusLine,
                        http.client.ResponseNotReady)):
        return True
    return _status_code(exc) in _TRANSIENT_CODES


def with_retries(what: str, uri: str, attempt, policy: RetryPolicy | None = None):
    """Call ``attempt()`` until it succeeds, fails permanently, or the policy's budget ends."""
    policy = policy or _policy
    start = time.monotonic()
    for tries in range(1, policy.max_tries + 1):
        t0 = time.monotonic()
        try:
            return attempt()
        except Exception as exc:  # noqa: BLE001 - classified just below
            if not is_transient(exc):
                raise
            failed_for = time.monotonic() - t0
            label = error_label(exc)
            wait = policy.delay(tries)
            elapsed = time.monotonic() - start
            if tries >= policy.max_tries or elapsed + wait > policy.deadline:
                with _lock:
                    _stats.seconds_lost += failed_for
                    _stats.gave_up += 1
                raise RetryBudgetExceeded(
                    f"{what} {uri}: gave up after {tries} tries in {elapsed:.1f}s "
                    f"(retry budget: {policy.max_tries} tries, {policy.deadline:g}s); "
                    f"last error: {label} {short(exc)}", uri) from exc
            time.sleep(wait)
            with _lock:
                _stats.retries += 1
                _stats.seconds_lost += failed_for + wait
                _stats.by_error[label] = _stats.by_error.get(label, 0) + 1
    raise AssertionError("unreachable")


def short(exc: BaseException) -> str:
    """An exception's message on one line, at most 200 characters."""
    text = " ".join(str(exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")
