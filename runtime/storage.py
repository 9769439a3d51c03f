"""One storage interface for local paths and ``gs://bucket/key`` URIs.

Every stage reads and writes through these functions, so a run behaves the same on local disk
and on Google Cloud Storage. The module is import-light: google-cloud-storage is imported only
when a ``gs://`` URI is first used, and TensorFlow never.

Semantics, the same for both backends:

- ``write_bytes`` / ``write_text`` are atomic: a reader sees the old object or the whole new
  one. Locally: a temporary file in the same directory, fsync, ``os.replace``. On GCS: one
  upload request (multipart up to 8 MiB, resumable above); GCS only creates the object when
  the upload completes.
- ``list`` and ``delete_prefix`` take a *directory*: ``list("gs://b/exp")`` lists the objects
  under ``exp/`` (never ``exp2/...``), recursively, as sorted URIs. ``glob`` matches
  ``fnmatch`` patterns against whole keys (``*`` also matches ``/``).
- ``upload_dir`` / ``download_dir`` check every file after transfer: size and crc32c of the
  local file against what the server reports (md5 where crc32c is absent); a mismatch raises
  ``IntegrityError``.
- GCS calls are retried on transient errors (429, 408, 5xx, connection resets, timeouts) with
  exponential backoff and jitter, bounded by ``RetryPolicy``; retries and the seconds they cost
  are counted in ``retry_stats()``. When the budget runs out, ``RetryBudgetExceeded`` names the
  URI, the tries and the last error.
- ``STORAGE_EMULATOR_HOST`` is honoured: the client then uses anonymous credentials and a
  placeholder project, so no credential lookup can hang. Otherwise credentials come from
  Google's default chain; they are never printed, logged or put in error messages.
"""

from __future__ import annotations

import base64
import dataclasses
import fnmatch
import os
import random
import shutil
import tempfile
import threading
import time
import uuid

GS_SCHEME = "gs://"


class StorageError(Exception):
    """A storage operation failed; ``uri`` says where."""

    def __init__(self, message: str, uri: str):
        super().__init__(message)
        self.uri = uri


class RetryBudgetExceeded(StorageError):
    """Transient errors went on for longer than the retry policy allows."""


class IntegrityError(StorageError):
    """A transferred file's size or checksum differs from the server's record."""


# ---------------------------------------------------------------------------------------------
# Retry policy and accounting


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


def _error_label(exc: BaseException) -> str:
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


def _is_transient(exc: BaseException) -> bool:
    import requests
    import urllib3
    from google.auth import exceptions as auth_exceptions

    if isinstance(exc, auth_exceptions.TransportError) and exc.args:
        inner = exc.args[0]
        return isinstance(inner, BaseException) and _is_transient(inner)
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


def _with_retries(what: str, uri: str, attempt, policy: RetryPolicy | None = None):
    """Call ``attempt()`` until it succeeds, fails permanently, or the policy's budget ends."""
    policy = policy or _policy
    start = time.monotonic()
    for tries in range(1, policy.max_tries + 1):
        t0 = time.monotonic()
        try:
            return attempt()
        except Exception as exc:  # noqa: BLE001 - classified just below
            if not _is_transient(exc):
                raise
            failed_for = time.monotonic() - t0
            label = _error_label(exc)
            wait = policy.delay(tries)
            elapsed = time.monotonic() - start
            if tries >= policy.max_tries or elapsed + wait > policy.deadline:
                with _lock:
                    _stats.seconds_lost += failed_for
                    _stats.gave_up += 1
                raise RetryBudgetExceeded(
                    f"{what} {uri}: gave up after {tries} tries in {elapsed:.1f}s "
                    f"(retry budget: {policy.max_tries} tries, {policy.deadline:g}s); "
                    f"last error: {label} {_short(exc)}", uri) from exc
            time.sleep(wait)
            with _lock:
                _stats.retries += 1
                _stats.seconds_lost += failed_for + wait
                _stats.by_error[label] = _stats.by_error.get(label, 0) + 1
    raise AssertionError("unreachable")


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")


# ---------------------------------------------------------------------------------------------
# URIs and the client


def is_gcs(uri: str | os.PathLike) -> bool:
    return isinstance(uri, str) and uri.startswith(GS_SCHEME)


def split_gcs(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    bucket, _, key = uri[len(GS_SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"not a gs:// URI with a bucket: {uri!r}")
    return bucket, key


def join(base: str, *parts: str) -> str:
    """Join URI or path segments with ``/`` (``os.path.join`` would drop ``gs://``)."""
    out = str(base)
    for part in parts:
        out = out.rstrip("/") + "/" + part.lstrip("/") if out else part
    return out


_client_lock = threading.Lock()
_client_cache: tuple[str | None, object] | None = None  # (STORAGE_EMULATOR_HOST, client)


def _client():
    """A google-cloud-storage client for the current environment, created once per endpoint."""
    global _client_cache
    emulator = os.environ.get("STORAGE_EMULATOR_HOST") or None
    with _client_lock:
        if _client_cache is None or _client_cache[0] != emulator:
            from google.cloud import storage as gcs

            if emulator:
                from google.auth.credentials import AnonymousCredentials

                project = os.environ.get("GOOGLE_CLOUD_PROJECT") or "runexp-emulator"
                client = gcs.Client(project=project, credentials=AnonymousCredentials())
            else:
                try:
                    client = gcs.Client()  # Google's default credential chain
                except OSError:  # credentials, but no project found: object work needs none
                    client = gcs.Client(project=None)
            # google-cloud-storage >= 3.11 fires a background buckets.get per bucket for
            # tracing metadata, even for object-only work: an unasked-for request (denied and
            # audit-logged for object-only roles; googleapis/google-cloud-python#17650).
            # Switch it off for this client only; the library checks the attribute is truthy.
            if getattr(client, "_bucket_metadata_cache", None) is not None:
                client._bucket_metadata_cache = None
            _client_cache = (emulator, client)
        return _client_cache[1]


def _blob(uri: str):
    bucket, key = split_gcs(uri)
    if not key or key.endswith("/"):
        raise ValueError(f"not an object URI (no key): {uri!r}")
    return _client().bucket(bucket).blob(key)


def _dir_key(key: str) -> str:
    return key if not key or key.endswith("/") else key + "/"


def _translate(uri: str, exc: Exception) -> Exception:
    """Map permanent google errors onto Python's own exceptions where one fits."""
    from google.api_core import exceptions as api

    from google.cloud.storage.exceptions import DataCorruption

    if isinstance(exc, api.NotFound):
        return FileNotFoundError(f"no such object: {uri}")
    if isinstance(exc, api.Forbidden):
        return PermissionError(f"permission denied: {uri} ({_short(exc)})")
    if isinstance(exc, DataCorruption):
        return IntegrityError(f"checksum mismatch while downloading {uri}: {_short(exc)}", uri)
    return exc


def _gcs_call(what: str, uri: str, attempt):
    try:
        return _with_retries(what, uri, attempt)
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001
        translated = _translate(uri, exc)
        if translated is exc:
            raise
        raise translated from exc


# ---------------------------------------------------------------------------------------------
# Files and objects


def exists(uri: str) -> bool:
    """True for an existing file/object, or a directory (locally) / a non-empty prefix (GCS)."""
    uri = _str(uri)
    if not is_gcs(uri):
        return os.path.exists(uri)
    bucket, key = split_gcs(uri)
    t = _policy.timeout
    if key and not key.endswith("/"):
        if _gcs_call("exists", uri, lambda: _blob(uri).exists(timeout=t, retry=None)):
            return True
    prefix = _dir_key(key)

    def any_under():
        blobs = _client().list_blobs(bucket, prefix=prefix, max_results=1, timeout=t, retry=None)
        return any(True for _ in blobs)

    return _gcs_call("exists", uri, any_under)


def read_bytes(uri: str) -> bytes:
    uri = _str(uri)
    if not is_gcs(uri):
        with open(uri, "rb") as f:
            return f.read()
    t = _policy.timeout
    return _gcs_call("read", uri, lambda: _blob(uri).download_as_bytes(timeout=t, retry=None))


def read_text(uri: str, encoding: str = "utf-8") -> str:
    return read_bytes(uri).decode(encoding)


def write_bytes(uri: str, data: bytes) -> None:
    """Atomically replace ``uri`` with ``data`` (parent directories are created locally)."""
    uri = _str(uri)
    data = bytes(data)
    if not is_gcs(uri):
        _atomic_local_write(uri, lambda f: f.write(data))
        return
    t = _policy.timeout
    _gcs_call("write", uri, lambda: _blob(uri).upload_from_string(
        data, content_type="application/octet-stream", timeout=t, retry=None))


def write_text(uri: str, text: str, encoding: str = "utf-8") -> None:
    write_bytes(uri, text.encode(encoding))


def size(uri: str) -> int:
    uri = _str(uri)
    if not is_gcs(uri):
        return os.path.getsize(uri)
    blob = _blob(uri)
    _gcs_call("size", uri, lambda: blob.reload(timeout=_policy.timeout, retry=None))
    return int(blob.size)


def delete(uri: str, missing_ok: bool = False) -> None:
    """Delete one file/object. A retry that finds the object gone counts as success."""
    uri = _str(uri)
    if not is_gcs(uri):
        try:
            os.remove(uri)
        except FileNotFoundError:
            if not missing_ok:
                raise
        return
    from google.api_core import exceptions as api

    tries = 0

    def attempt():
        nonlocal tries
        tries += 1
        try:
            _blob(uri).delete(timeout=_policy.timeout, retry=None)
        except api.NotFound:
            if not (missing_ok or tries > 1):
                raise

    _gcs_call("delete", uri, attempt)


def list(prefix_uri: str) -> list[str]:  # noqa: A001 - the interface's own name
    """Every file/object under the directory ``prefix_uri``, recursively, as sorted URIs."""
    prefix_uri = _str(prefix_uri)
    if not is_gcs(prefix_uri):
        return sorted(_walk_local(prefix_uri))
    return sorted(uri for uri, _ in _list_gcs(prefix_uri))


def glob(pattern_uri: str) -> list[str]:
    """Files/objects whose whole path matches the ``fnmatch`` pattern, sorted.

    Only the part before the first wildcard is used to narrow the listing.
    """
    pattern_uri = _str(pattern_uri)
    literal = _literal_prefix(pattern_uri)
    if not is_gcs(pattern_uri):
        base = os.path.dirname(literal) if literal else ""
        candidates = _walk_local(base or ".", join_to=base)
    else:
        bucket, key = split_gcs(literal)
        if "/" not in literal[len(GS_SCHEME):]:
            raise ValueError(f"wildcards in the bucket name are not supported: {pattern_uri!r}")
        candidates = (uri for uri, _ in _list_gcs_raw(bucket, key))
    return sorted(c for c in candidates if fnmatch.fnmatchcase(c, pattern_uri))


def delete_prefix(prefix_uri: str) -> int:
    """Delete everything under the directory ``prefix_uri``; returns how many files went."""
    prefix_uri = _str(prefix_uri)
    if not is_gcs(prefix_uri):
        if not os.path.exists(prefix_uri):
            return 0
        count = len(_walk_local(prefix_uri))
        shutil.rmtree(prefix_uri)
        return count
    if not split_gcs(prefix_uri)[1].strip("/"):
        raise ValueError(f"refusing to delete a whole bucket: {prefix_uri!r}")
    uris = [uri for uri, _ in _list_gcs(prefix_uri)]
    for uri in uris:
        delete(uri, missing_ok=True)
    return len(uris)


# ---------------------------------------------------------------------------------------------
# Directories, verified


def upload_file(path: str, uri: str) -> None:
    """Copy one local file to ``uri`` (GCS or local), checked (size, crc32c) against it."""
    path, uri = _str(path), _str(uri)
    if is_gcs(uri):
        _upload_file_verified(path, uri)
    else:
        _atomic_local_write(uri, lambda f: _copy_into(path, f))
        _verify(uri, _local_checksums(uri), _local_checksums(path))


def download_file(uri: str, dest: str) -> None:
    """Copy one object or file to the local path ``dest``, checked against the source; the
    file takes its final name only once complete."""
    uri, dest = _str(uri), _str(dest)
    if is_gcs(uri):
        blob = _blob(uri)
        _gcs_call("stat", uri, lambda: blob.reload(timeout=_policy.timeout, retry=None))
        _download_file_verified(blob, uri, dest)
    else:
        _atomic_local_write(dest, lambda f: _copy_into(uri, f))
        _verify(dest, _local_checksums(dest), _local_checksums(uri))


def upload_dir(local_dir: str, uri_prefix: str) -> list[str]:
    """Copy every file under ``local_dir`` to ``uri_prefix`` (GCS or local), keeping relative
    paths; each copy is checked (size, crc32c) against the source. Returns the sorted URIs.

    Symlinks that lead outside ``local_dir`` are refused."""
    local_dir, uri_prefix = _str(local_dir), _str(uri_prefix)
    root = os.path.realpath(local_dir)
    written = []
    for path in sorted(_walk_local(local_dir)):
        real = os.path.realpath(path)
        if os.path.commonpath([root, real]) != root:
            raise StorageError(f"refusing to upload {path}: it leads outside {local_dir}", path)
        rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
        dest = join(uri_prefix, rel)
        upload_file(path, dest)
        written.append(dest)
    return sorted(written)


def download_dir(uri_prefix: str, local_dir: str) -> list[str]:
    """Copy every file/object under ``uri_prefix`` into ``local_dir``, keeping relative paths;
    each file is checked (size, crc32c) against the server's metadata before it takes its
    final name. Returns the sorted local paths."""
    uri_prefix, local_dir = _str(uri_prefix), _str(local_dir)
    root = os.path.realpath(local_dir)
    written = []
    if is_gcs(uri_prefix):
        entries = _list_gcs(uri_prefix)
    else:
        entries = [(p, None) for p in sorted(_walk_local(uri_prefix))]
    base = uri_prefix.rstrip("/") + "/"
    for uri, blob in entries:
        rel = uri[len(base):] if uri.startswith(base) else os.path.relpath(uri, uri_prefix)
        dest = os.path.join(local_dir, *rel.split("/"))
        if os.path.commonpath([root, os.path.realpath(dest)]) != root:
            raise StorageError(f"refusing to download {uri}: it would land outside "
                               f"{local_dir}", uri)
        if blob is None:
            _atomic_local_write(dest, lambda f, src=uri: _copy_into(src, f))
            _verify(dest, _local_checksums(dest), _local_checksums(uri))
        else:
            _download_file_verified(blob, uri, dest)
        written.append(dest)
    return sorted(written)


def _upload_file_verified(path: str, uri: str) -> None:
    local = _local_checksums(path)
    blob = _blob(uri)
    t = _policy.timeout
    _gcs_call("upload", uri, lambda: blob.upload_from_filename(
        path, content_type="application/octet-stream", timeout=t, retry=None))
    # The upload response carries the server's size and hashes; ask again only if absent.
    if blob.size is None or not (blob.crc32c or blob.md5_hash):
        _gcs_call("upload", uri, lambda: blob.reload(timeout=t, retry=None))
    _verify(uri, _remote_checksums(blob), local)


def _download_file_verified(blob, uri: str, dest: str) -> None:
    remote = _remote_checksums(blob)
    t = _policy.timeout
    # Pin the listed generation so the bytes match the metadata they are checked against.
    pinned = blob.bucket.blob(blob.name, generation=blob.generation)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(dest) or ".")
    os.close(fd)
    try:
        _gcs_call("download", uri, lambda: pinned.download_to_filename(
            tmp, timeout=t, retry=None))
        _verify(uri, _local_checksums(tmp), remote, what="download")
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _verify(uri: str, got: dict, want: dict, what: str = "copy") -> None:
    """Compare size and the first hash both sides have (crc32c, else md5)."""
    if got["size"] != want["size"]:
        raise IntegrityError(f"{what} of {uri}: size {got['size']} != expected "
                             f"{want['size']}", uri)
    for name in ("crc32c", "md5"):
        if got.get(name) and want.get(name):
            if got[name] != want[name]:
                raise IntegrityError(f"{what} of {uri}: {name} {got[name]} != expected "
                                     f"{want[name]}", uri)
            return
    raise IntegrityError(f"{what} of {uri}: the server reported no checksum to verify", uri)


def _remote_checksums(blob) -> dict:
    return {"size": int(blob.size) if blob.size is not None else None,
            "crc32c": blob.crc32c, "md5": blob.md5_hash}


def _local_checksums(path: str) -> dict:
    """Size, crc32c and md5 of a local file, base64 as GCS reports them."""
    import hashlib

    import google_crc32c

    crc, md5, n = google_crc32c.Checksum(), hashlib.md5(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            crc.update(chunk)
            md5.update(chunk)
            n += len(chunk)
    return {"size": n, "crc32c": base64.b64encode(crc.digest()).decode("ascii"),
            "md5": base64.b64encode(md5.digest()).decode("ascii")}


# ---------------------------------------------------------------------------------------------
# Preflight


def preflight(uri_prefix: str, region: str | None = None) -> list[str]:
    """Cheap checks before a run writes under ``uri_prefix``; returns findings, never raises
    for an unreachable or missing destination. Each finding starts with ``ok:``,
    ``WARNING:``, ``error:`` or ``skipped:``.

    On GCS: the bucket exists; an object can be created and deleted under the prefix; the
    bucket's location suits ``region`` (the compute region, e.g. a TPU zone's, when given);
    no IAM binding makes the bucket public (when the policy is readable)."""
    uri_prefix = _str(uri_prefix)
    if not is_gcs(uri_prefix):
        return _preflight_local(uri_prefix)
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth_exceptions

    bucket_name, key = split_gcs(uri_prefix)
    bucket_uri = f"gs://{bucket_name}"
    quick = dataclasses.replace(_policy, max_tries=min(_policy.max_tries, 2),
                                timeout=min(_policy.timeout, 10.0), deadline=20.0)
    findings = []
    try:
        bucket = _client().bucket(bucket_name)
        _with_retries("preflight", bucket_uri,
                      lambda: bucket.reload(timeout=quick.timeout, retry=None), quick)
    except auth_exceptions.DefaultCredentialsError:
        return ["skipped: no Google credentials found (set up Application Default "
                "Credentials); storage checks not run"]
    except api.NotFound:
        return [f"error: bucket {bucket_uri} does not exist (or is not visible to these "
                "credentials)"]
    except api.Forbidden:
        findings.append(f"WARNING: cannot read the metadata of bucket {bucket_uri} (403); "
                        "continuing with the write probe")
        bucket = None
    except Exception as exc:  # noqa: BLE001 - offline, DNS, budget: a note, not a crash
        return [f"skipped: cannot reach storage for {bucket_uri} ({_error_label(exc)}); "
                "checks not run"]
    if bucket is not None:
        findings.append(f"ok: bucket {bucket_uri} exists (location {bucket.location}, "
                        f"storage class {bucket.storage_class})")
        if region:
            findings.append(_location_finding(bucket_uri, bucket.location or "", region))
        if bucket.iam_configuration.public_access_prevention == "enforced":
            findings.append(f"ok: public access prevention is enforced on {bucket_uri}")

    probe = join(uri_prefix, f".runexp-preflight-{uuid.uuid4().hex[:12]}")
    try:
        blob = _client().bucket(bucket_name).blob(split_gcs(probe)[1])
        _with_retries("preflight", probe, lambda: blob.upload_from_string(
            b"", timeout=quick.timeout, retry=None), quick)
        _with_retries("preflight", probe, lambda: blob.delete(
            timeout=quick.timeout, retry=None), quick)
        findings.append(f"ok: can create and delete objects under {uri_prefix}")
    except Exception as exc:  # noqa: BLE001
        findings.append(f"error: cannot create and delete a probe object under {uri_prefix} "
                        f"({_error_label(exc)})")

    try:
        policy = _with_retries("preflight", bucket_uri, lambda: _client().bucket(
            bucket_name).get_iam_policy(requested_policy_version=3,
                                        timeout=quick.timeout, retry=None), quick)
        public = []
        for binding in policy.bindings:
            for member in sorted(set(binding.get("members", ())) &
                                 {"allUsers", "allAuthenticatedUsers"}):
                public.append(f"{binding['role']} to {member}")
        if public:
            findings.append(f"WARNING: bucket {bucket_uri} is public: grants "
                            + "; ".join(public) + ". runexp never makes anything public; "
                            "remove these bindings unless you mean them")
        else:
            findings.append(f"ok: no allUsers/allAuthenticatedUsers bindings on {bucket_uri}")
    except Exception as exc:  # noqa: BLE001
        findings.append(f"skipped: IAM policy of {bucket_uri} not readable "
                        f"({_error_label(exc)}); public access not checked")
    return findings


_MULTI_REGIONS = {"US": "us-", "EU": "europe-", "ASIA": "asia-"}


def _location_finding(bucket_uri: str, location: str, region: str) -> str:
    loc, region = location.upper(), region.lower()
    if loc.lower() == region or region.startswith(_MULTI_REGIONS.get(loc, "\0")):
        return f"ok: bucket {bucket_uri} ({location}) serves region {region}"
    return (f"WARNING: bucket {bucket_uri} is in {location} but compute runs in {region}: "
            "cross-region reads add latency and egress charges")


def _preflight_local(path: str) -> list[str]:
    probe = os.path.join(path, f".runexp-preflight-{uuid.uuid4().hex[:12]}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as exc:
        return [f"error: cannot write under {path} ({exc.strerror or type(exc).__name__})"]
    return [f"ok: can create and delete files under {path}"]


# ---------------------------------------------------------------------------------------------
# Local helpers


def _str(uri) -> str:
    return os.fspath(uri) if not isinstance(uri, str) else uri


def _literal_prefix(pattern: str) -> str:
    cut = min((i for i, ch in enumerate(pattern) if ch in "*?["), default=len(pattern))
    return pattern[:cut]


def _walk_local(directory: str, join_to: str | None = None) -> list[str]:
    """Files under ``directory`` (not following directory symlinks), as paths starting with
    ``join_to`` (default: ``directory`` itself)."""
    if not os.path.isdir(directory):
        return []
    base = directory if join_to is None else join_to
    out = []
    for root, dirs, files in os.walk(directory):
        rel_root = os.path.relpath(root, directory)
        for name in files:
            rel = name if rel_root == "." else os.path.join(rel_root, name)
            out.append(os.path.join(base, rel) if base else rel)
    return out


def _copy_into(src: str, f) -> None:
    with open(src, "rb") as s:
        shutil.copyfileobj(s, f, 1 << 20)


def _atomic_local_write(path: str, fill) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # once, at import: os.umask cannot be read without setting it


def _list_gcs(prefix_uri: str):
    bucket, key = split_gcs(prefix_uri)
    return _list_gcs_raw(bucket, _dir_key(key))


def _list_gcs_raw(bucket: str, key_prefix: str):
    """[(uri, blob)] for every object whose key starts with ``key_prefix``."""
    uri = f"gs://{bucket}/{key_prefix}"
    t = _policy.timeout

    def attempt():
        blobs = _client().list_blobs(bucket, prefix=key_prefix or None, timeout=t, retry=None)
        return [(f"gs://{bucket}/{b.name}", b) for b in blobs if not b.name.endswith("/")]

    return _gcs_call("list", uri, attempt)
