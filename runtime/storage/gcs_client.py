"""The google-cloud-storage client of the storage layer, and how its calls are made.

One client per endpoint (``STORAGE_EMULATOR_HOST`` honoured: anonymous credentials and a
placeholder project, so no credential lookup can hang; otherwise Google's default chain,
whose credentials are never printed, logged or put in error messages). Every call goes
through ``gcs_call``: retried on transient errors (retry.py), permanent google errors
mapped onto Python's own. google-cloud-storage is imported on first use.
"""

from __future__ import annotations

import os
import threading

from runexp.runtime.storage.errors import IntegrityError, StorageError
from runexp.runtime.storage.paths import split_gcs
from runexp.runtime.storage.retry import retry_policy, short, with_retries

_client_lock = threading.Lock()
_client_cache: tuple[str | None, object] | None = None  # (STORAGE_EMULATOR_HOST, client)


def client():
    """A google-cloud-storage client for the current environment, created once per endpoint."""
    global _client_cache
    emulator = os.environ.get("STORAGE_EMULATOR_HOST") or None
    with _client_lock:
        if _client_cache is None or _client_cache[0] != emulator:
            from google.cloud import storage as gcs

            if emulator:
                from google.auth.credentials import AnonymousCredentials

                project = os.environ.get("GOOGLE_CLOUD_PROJECT") or "runexp-emulator"
                made = gcs.Client(project=project, credentials=AnonymousCredentials())
            else:
                try:
                    made = gcs.Client()  # Google's default credential chain
                except OSError:  # credentials, but no project found: object work needs none
                    made = gcs.Client(project=None)
            # google-cloud-storage >= 3.11 fires a background buckets.get per bucket for
            # tracing metadata, even for object-only work: an unasked-for request (denied and
            # audit-logged for object-only roles; googleapis/google-cloud-python#17650).
            # Switch it off for this client only; the library checks the attribute is truthy.
            if getattr(made, "_bucket_metadata_cache", None) is not None:
                made._bucket_metadata_cache = None
            _client_cache = (emulator, made)
        return _client_cache[1]


def blob_of(uri: str):
    """The client's Blob for an object URI."""
    bucket, key = split_gcs(uri)
    if not key or key.endswith("/"):
        raise ValueError(f"not an object URI (no key): {uri!r}")
    return client().bucket(bucket).blob(key)


def dir_key(key: str) -> str:
    """A key prefix that names a directory: ``exp`` -> ``exp/`` (never ``exp2/...``)."""
    return key if not key or key.endswith("/") else key + "/"


def translate(uri: str, exc: Exception) -> Exception:
    """Map permanent google errors onto Python's own exceptions where one fits."""
    from google.api_core import exceptions as api

    from google.cloud.storage.exceptions import DataCorruption

    if isinstance(exc, api.NotFound):
        return FileNotFoundError(f"no such object: {uri}")
    if isinstance(exc, api.Forbidden):
        return PermissionError(f"permission denied: {uri} ({short(exc)})")
    if isinstance(exc, DataCorruption):
        return IntegrityError(f"checksum mismatch while downloading {uri}: {short(exc)}", uri)
    return exc


def gcs_call(what: str, uri: str, attempt, policy=None):
    """``attempt()`` with retries (``policy``, default the installed one); permanent google
    errors become Python's own (translate)."""
    try:
        return with_retries(what, uri, attempt, policy)
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001
        translated = translate(uri, exc)
        if translated is exc:
            raise
        raise translated from exc


def list_objects(prefix_uri: str):
    """[(uri, blob)] for every object under the directory ``prefix_uri``."""
    bucket, key = split_gcs(prefix_uri)
    return list_objects_under(bucket, dir_key(key))


def list_objects_under(bucket: str, key_prefix: str, policy=None):
    """[(uri, blob)] for every object whose key starts with ``key_prefix``; each blob carries
    the listing's metadata (size, generation, crc32c, md5)."""
    uri = f"gs://{bucket}/{key_prefix}"
    t = (policy or retry_policy()).timeout

    def attempt():
        blobs = client().list_blobs(bucket, prefix=key_prefix or None, timeout=t, retry=None)
        return [(f"gs://{bucket}/{b.name}", b) for b in blobs if not b.name.endswith("/")]

    return gcs_call("list", uri, attempt, policy)
