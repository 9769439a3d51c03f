"""Verified copies between local files and storage (local or ``gs://``): every file is
checked after the transfer, size and crc32c (md5 where crc32c is absent) of the local file
against what the other side reports; a mismatch raises ``IntegrityError``, and a download
takes its final name only once checked.

Directories (``upload_dir``, ``download_dir``) and lists of files (``upload_files``) move
``TRANSFER_THREADS`` files at once: a thread pool over the verified one-file functions, so
each file keeps its own retries (retry.py), verification and, for a download, its temporary
name. google-cloud-storage's ``transfer_manager`` is not used: it calls the library's own
upload and download methods with the library's retry, so runexp's retry budget, counters and
error translation would not apply; ``download_many`` writes to the final path directly (a
failed transfer leaves a partial file under the real name) and checks nothing against the
listing; its default workers are processes that rebuild the client from pickles.
"""

from __future__ import annotations

import base64
import concurrent.futures
import os
import tempfile

from runexp.runtime.storage.errors import InputChangedError, IntegrityError, StorageError
from runexp.runtime.storage.gcs_client import blob_of, client, gcs_call, list_objects
from runexp.runtime.storage.local_files import atomic_write, copy_into, walk_files
from runexp.runtime.storage.paths import as_str, is_gcs, join, split_gcs
from runexp.runtime.storage.retry import retry_policy

# Files a directory transfer moves at once.
TRANSFER_THREADS = 8


def upload_file(path: str, uri: str) -> None:
    """Copy one local file to ``uri`` (GCS or local), checked (size, crc32c) against it."""
    path, uri = as_str(path), as_str(uri)
    if is_gcs(uri):
        _upload_file_verified(path, uri)
    else:
        atomic_write(uri, lambda f: copy_into(path, f))
        _verify(uri, _local_checksums(uri), _local_checksums(path))


def download_file(uri: str, dest: str) -> None:
    """Copy one object or file to the local path ``dest``, checked against the source; the
    file takes its final name only once complete."""
    uri, dest = as_str(uri), as_str(dest)
    if is_gcs(uri):
        blob = blob_of(uri)
        gcs_call("stat", uri, lambda: blob.reload(timeout=retry_policy().timeout, retry=None))
        _download_file_verified(blob, uri, dest)
    else:
        atomic_write(dest, lambda f: copy_into(uri, f))
        _verify(dest, _local_checksums(dest), _local_checksums(uri))


def download_version(uri: str, dest: str, generation: int | None,
                     crc32c: str | None) -> None:
    """Copy one version of a GCS object, the one a listing saw (``generation``, ``crc32c``),
    to the local path ``dest``, checked like ``download_file``. ``InputChangedError`` when the
    object is no longer that version (overwritten or deleted since the listing)."""
    uri, dest = as_str(uri), as_str(dest)
    _download_file_verified(listed_version(uri, generation, crc32c), uri, dest)


def listed_version(uri: str, generation: int | None, crc32c: str | None = None):
    """The blob of the version of ``uri`` a listing saw, its metadata loaded (what
    download_version copies, and what tasks/sources/input_files.py reads by ranges);
    ``InputChangedError`` when the object is no longer that version."""
    bucket, key = split_gcs(uri)
    blob = client().bucket(bucket).blob(key, generation=generation)
    try:
        gcs_call("stat", uri, lambda: blob.reload(timeout=retry_policy().timeout, retry=None))
    except FileNotFoundError as exc:
        raise version_gone(uri, generation) from exc
    # A server that serves the live version whatever generation was asked (the emulator)
    # says here what Cloud Storage says with a 404 above.
    if (generation is not None and blob.generation != generation) or \
            (crc32c and blob.crc32c != crc32c):
        raise InputChangedError(f"{uri} changed after the plan listed it (generation "
                                f"{generation}, crc32c {crc32c}; now {blob.generation}, "
                                f"{blob.crc32c}): run the same command again to plan with the "
                                "current data", uri)
    return blob


def version_gone(uri: str, generation: int | None) -> InputChangedError:
    return InputChangedError(f"{uri} changed after the plan listed it (generation "
                             f"{generation} is gone): run the same command again to plan "
                             "with the current data", uri)


def upload_dir(local_dir: str, uri_prefix: str) -> list[str]:
    """Copy every file under ``local_dir`` to ``uri_prefix`` (GCS or local), keeping relative
    paths; each copy is checked (size, crc32c) against the source. Returns the sorted URIs.

    Symlinks that lead outside ``local_dir`` are refused."""
    local_dir, uri_prefix = as_str(local_dir), as_str(uri_prefix)
    root = os.path.realpath(local_dir)
    pairs = []
    for path in sorted(walk_files(local_dir)):
        real = os.path.realpath(path)
        if os.path.commonpath([root, real]) != root:
            raise StorageError(f"refusing to upload {path}: it leads outside {local_dir}", path)
        rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
        pairs.append((path, join(uri_prefix, rel)))
    upload_files(pairs)
    return sorted(dest for _, dest in pairs)


def upload_files(pairs, threads: int | None = None) -> None:
    """``upload_file`` for each ``(path, uri)`` of ``pairs``, ``threads`` (default
    ``TRANSFER_THREADS``) at a time. The first error is raised once the transfers under way
    ended (those not started are dropped)."""
    run_parallel([lambda p=path, u=uri: upload_file(p, u) for path, uri in pairs], threads)


def run_parallel(jobs, threads: int | None = None) -> None:
    """Calls each of ``jobs`` (no arguments) on a pool of ``threads`` (default
    ``TRANSFER_THREADS``) threads. After an error no job starts any more; the first error (in
    the order of ``jobs``) is raised once the jobs under way ended. One job, or one thread:
    in the calling thread."""
    jobs = list(jobs)
    threads = TRANSFER_THREADS if threads is None else threads
    if len(jobs) <= 1 or threads <= 1:
        for job in jobs:
            job()
        return
    failed = []

    def guarded(job):
        if failed:
            return None  # an earlier job failed: drop the ones not started
        try:
            return job()
        except BaseException as exc:
            failed.append(exc)
            raise

    with concurrent.futures.ThreadPoolExecutor(
            max_workers=min(threads, len(jobs)), thread_name_prefix="runexp-transfer") as pool:
        futures = [pool.submit(guarded, job) for job in jobs]
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error


def download_dir(uri_prefix: str, local_dir: str) -> list[str]:
    """Copy every file/object under ``uri_prefix`` into ``local_dir``, keeping relative paths;
    each file is checked (size, crc32c) against the server's metadata before it takes its
    final name. Returns the sorted local paths."""
    uri_prefix, local_dir = as_str(uri_prefix), as_str(local_dir)
    root = os.path.realpath(local_dir)
    written = []
    if is_gcs(uri_prefix):
        entries = list_objects(uri_prefix)
    else:
        entries = [(p, None) for p in sorted(walk_files(uri_prefix))]
    base = uri_prefix.rstrip("/") + "/"
    jobs = []
    for uri, blob in entries:
        rel = uri[len(base):] if uri.startswith(base) else os.path.relpath(uri, uri_prefix)
        dest = os.path.join(local_dir, *rel.split("/"))
        if os.path.commonpath([root, os.path.realpath(dest)]) != root:
            raise StorageError(f"refusing to download {uri}: it would land outside "
                               f"{local_dir}", uri)
        jobs.append(lambda uri=uri, blob=blob, dest=dest: _download_one(uri, blob, dest))
        written.append(dest)
    run_parallel(jobs)
    return sorted(written)


def _download_one(uri: str, blob, dest: str) -> None:
    if blob is None:
        atomic_write(dest, lambda f: copy_into(uri, f))
        _verify(dest, _local_checksums(dest), _local_checksums(uri))
    else:
        _download_file_verified(blob, uri, dest)


def _upload_file_verified(path: str, uri: str) -> None:
    local = _local_checksums(path)
    blob = blob_of(uri)
    t = retry_policy().timeout
    gcs_call("upload", uri, lambda: blob.upload_from_filename(
        path, content_type="application/octet-stream", timeout=t, retry=None))
    # The upload response carries the server's size and hashes; ask again only if absent.
    if blob.size is None or not (blob.crc32c or blob.md5_hash):
        gcs_call("upload", uri, lambda: blob.reload(timeout=t, retry=None))
    _verify(uri, _remote_checksums(blob), local)


def _download_file_verified(blob, uri: str, dest: str) -> None:
    remote = _remote_checksums(blob)
    t = retry_policy().timeout
    # Pin the listed generation so the bytes match the metadata they are checked against.
    pinned = blob.bucket.blob(blob.name, generation=blob.generation)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(dest) or ".")
    os.close(fd)
    try:
        gcs_call("download", uri, lambda: pinned.download_to_filename(
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
