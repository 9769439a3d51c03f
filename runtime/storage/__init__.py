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
  under ``exp/`` (never ``exp2/...``), recursively, as sorted URIs. ``glob`` has runexp's
  one glob semantics (compiler/globs.py), on local disk and on GCS alike: ``*``, ``?`` and
  ``[...]`` never cross ``/``, ``**`` spans directories; a GCS pattern is answered by one
  listing of the text before its first wildcard. ``glob_objects`` is the same listing with
  each object's size, generation and crc32c: what the compiler fingerprints gs:// inputs by.
- ``upload_dir`` / ``download_dir`` check every file after transfer: size and crc32c of the
  local file against what the server reports (md5 where crc32c is absent); a mismatch raises
  ``IntegrityError``.
- GCS calls are retried on transient errors (429, 408, 5xx, connection resets, timeouts) with
  exponential backoff and jitter, bounded by ``RetryPolicy``; retries and the seconds they cost
  are counted in ``retry_stats()``. When the budget runs out, ``RetryBudgetExceeded`` names the
  URI, the tries and the last error.
- ``confined(root, path)`` refuses paths and keys that would put output outside an
  experiment's output root (``..`` segments, symlinks leading out).
- ``STORAGE_EMULATOR_HOST`` is honoured: the client then uses anonymous credentials and a
  placeholder project, so no credential lookup can hang. Otherwise credentials come from
  Google's default chain; they are never printed, logged or put in error messages.

The parts live in small modules of this package, re-exported here: errors, paths (URIs,
join, confined), retry (policy, backoff, stats), gcs_client (the client and its calls),
local_files (atomic local writes), transfer (verified copies) and preflight. The package also
holds mirror (local working copies of a gs:// experiment), which is not re-exported.
"""

from __future__ import annotations

import os
import shutil

from runexp.compiler import globs as _globs  # stdlib only
from runexp.runtime.storage.errors import (InputChangedError, IntegrityError,
                                           OutsideRootError, RetryBudgetExceeded, StorageError)
from runexp.runtime.storage.gcs_client import (blob_of, client, dir_key, gcs_call,
                                               list_objects, list_objects_under)
from runexp.runtime.storage.local_files import atomic_write, walk_files
from runexp.runtime.storage.paths import GS_SCHEME, as_str, confined, is_gcs, join, split_gcs
# Binds the name ``preflight`` to the function, over the submodule of the same name.
from runexp.runtime.storage.preflight import preflight
from runexp.runtime.storage.retry import (RetryPolicy, RetryStats, reset_retry_stats,
                                          retry_policy, retry_stats, set_retry_policy)
from runexp.runtime.storage.transfer import (download_dir, download_file, download_version,
                                             upload_dir, upload_file)

__all__ = [
    "GS_SCHEME", "InputChangedError", "IntegrityError", "OutsideRootError",
    "RetryBudgetExceeded", "RetryPolicy", "RetryStats", "StorageError", "confined",
    "create_text", "delete",
    "delete_prefix", "download_dir", "download_file", "download_version", "exists", "glob",
    "glob_objects", "is_gcs", "join", "list", "object_info", "preflight", "read_bytes",
    "read_text", "reset_retry_stats", "retry_policy", "retry_stats", "set_retry_policy",
    "size", "split_gcs", "upload_dir", "upload_file", "write_bytes", "write_text",
]

_client = client  # tests reach the client (e.g. to create a bucket) by this name


def exists(uri: str) -> bool:
    """True for an existing file/object, or a directory (locally) / a non-empty prefix (GCS)."""
    uri = as_str(uri)
    if not is_gcs(uri):
        return os.path.exists(uri)
    bucket, key = split_gcs(uri)
    t = retry_policy().timeout
    if key and not key.endswith("/"):
        if gcs_call("exists", uri, lambda: blob_of(uri).exists(timeout=t, retry=None)):
            return True
    prefix = dir_key(key)

    def any_under():
        blobs = client().list_blobs(bucket, prefix=prefix, max_results=1, timeout=t, retry=None)
        return any(True for _ in blobs)

    return gcs_call("exists", uri, any_under)


def read_bytes(uri: str) -> bytes:
    uri = as_str(uri)
    if not is_gcs(uri):
        with open(uri, "rb") as f:
            return f.read()
    t = retry_policy().timeout
    return gcs_call("read", uri, lambda: blob_of(uri).download_as_bytes(timeout=t, retry=None))


def read_text(uri: str, encoding: str = "utf-8") -> str:
    return read_bytes(uri).decode(encoding)


def write_bytes(uri: str, data: bytes) -> None:
    """Atomically replace ``uri`` with ``data`` (parent directories are created locally)."""
    uri = as_str(uri)
    data = bytes(data)
    if not is_gcs(uri):
        atomic_write(uri, lambda f: f.write(data))
        return
    t = retry_policy().timeout
    gcs_call("write", uri, lambda: blob_of(uri).upload_from_string(
        data, content_type="application/octet-stream", timeout=t, retry=None))


def write_text(uri: str, text: str, encoding: str = "utf-8") -> None:
    write_bytes(uri, text.encode(encoding))


def create_text(uri: str, text: str) -> bool:
    """Writes ``uri`` only if no such file/object exists (atomically: one of two racing
    writers wins). True when written. On GCS a precondition (``ifGenerationMatch=0``); a
    retried request whose first try succeeded reads as "exists": callers that must know
    compare the content."""
    uri = as_str(uri)
    data = text.encode("utf-8")
    if not is_gcs(uri):
        os.makedirs(os.path.dirname(uri) or ".", exist_ok=True)
        try:
            fd = os.open(uri, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True
    from google.api_core import exceptions as api

    t = retry_policy().timeout
    try:
        gcs_call("create", uri, lambda: blob_of(uri).upload_from_string(
            data, content_type="application/json", timeout=t, retry=None,
            if_generation_match=0))
    except api.PreconditionFailed:
        return False
    return True


def size(uri: str) -> int:
    uri = as_str(uri)
    if not is_gcs(uri):
        return os.path.getsize(uri)
    blob = blob_of(uri)
    gcs_call("size", uri, lambda: blob.reload(timeout=retry_policy().timeout, retry=None))
    return int(blob.size)


def delete(uri: str, missing_ok: bool = False) -> None:
    """Delete one file/object. A retry that finds the object gone counts as success."""
    uri = as_str(uri)
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
            blob_of(uri).delete(timeout=retry_policy().timeout, retry=None)
        except api.NotFound:
            if not (missing_ok or tries > 1):
                raise

    gcs_call("delete", uri, attempt)


def list(prefix_uri: str) -> list[str]:  # noqa: A001 - the interface's own name
    """Every file/object under the directory ``prefix_uri``, recursively, as sorted URIs."""
    prefix_uri = as_str(prefix_uri)
    if not is_gcs(prefix_uri):
        return sorted(walk_files(prefix_uri))
    return sorted(uri for uri, _ in list_objects(prefix_uri))


def glob(pattern_uri: str) -> list[str]:
    """Files/objects the pattern matches (compiler/globs.py semantics), sorted."""
    pattern_uri = as_str(pattern_uri)
    if not is_gcs(pattern_uri):
        return _globs.expand_local(pattern_uri)
    return [o["uri"] for o in glob_objects(pattern_uri)]


def glob_objects(pattern_uri: str, policy: RetryPolicy | None = None) -> list[dict]:
    """``[{"uri", "size", "generation", "crc32c"}]`` of the GCS objects the pattern matches
    (compiler/globs.py semantics; a pattern without wildcards names one object), sorted by
    URI, from one listing of the key text before the first wildcard. ``policy``: the retry
    policy of that listing (default: the installed one)."""
    pattern_uri = as_str(pattern_uri)
    bucket, key_pattern = split_gcs(pattern_uri)
    if _globs.has_magic(bucket):
        raise ValueError(f"wildcards in the bucket name are not supported: {pattern_uri!r}")
    listed = list_objects_under(bucket, _globs.literal_prefix(key_pattern), policy)
    return [object_info(uri, blob) for uri, blob in listed
            if _globs.match(key_pattern, uri[len(GS_SCHEME) + len(bucket) + 1:])]


def object_info(uri: str, blob) -> dict:
    """What identifies one version of an object: its URI, size, generation and crc32c."""
    return {"uri": uri, "size": int(blob.size) if blob.size is not None else None,
            "generation": int(blob.generation) if blob.generation is not None else None,
            "crc32c": blob.crc32c}


def delete_prefix(prefix_uri: str) -> int:
    """Delete everything under the directory ``prefix_uri``; returns how many files went."""
    prefix_uri = as_str(prefix_uri)
    if not is_gcs(prefix_uri):
        if not os.path.exists(prefix_uri):
            return 0
        count = len(walk_files(prefix_uri))
        shutil.rmtree(prefix_uri)
        return count
    if not split_gcs(prefix_uri)[1].strip("/"):
        raise ValueError(f"refusing to delete a whole bucket: {prefix_uri!r}")
    uris = [uri for uri, _ in list_objects(prefix_uri)]
    for uri in uris:
        delete(uri, missing_ok=True)
    return len(uris)
