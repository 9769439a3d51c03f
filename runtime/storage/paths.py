"""Paths as the storage layer sees them: local paths and ``gs://bucket/key`` URIs, joined
with ``/``, and the check that output stays under an experiment's output root."""

from __future__ import annotations

import os

from runexp.runtime.storage.errors import OutsideRootError

GS_SCHEME = "gs://"


def as_str(uri) -> str:
    """A path-like as a str (URIs are str already)."""
    return os.fspath(uri) if not isinstance(uri, str) else uri


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


def confined(root: str, path: str) -> str:
    """``path`` if writing there stays inside the output root ``root``; otherwise
    ``OutsideRootError`` naming it. Nothing is created.

    gs://: the same bucket, a key under the root's, and no ``.`` or ``..`` segment in either
    (Cloud Storage keeps them literally while other tools resolve them, so such a key names
    two places). Locally: ``path`` resolved (``..`` and symlinks, e.g. ``<root>/pretrain ->
    /elsewhere``) must lie under the resolved root, and when it is an existing directory, so
    must every symlink inside it (a write would follow them)."""
    root, path = as_str(root), as_str(path)
    if is_gcs(root) or is_gcs(path):
        return _confined_gcs(root, path)
    real_root = os.path.realpath(root)

    def inside(p: str) -> bool:
        return os.path.commonpath([real_root, os.path.realpath(p)]) == real_root

    if not inside(path):
        real = os.path.realpath(path)
        how = f" (it resolves to {real})" if real != os.path.abspath(path) else ""
        raise OutsideRootError(f"{path} is outside the output root {root}{how}", path)
    if os.path.isdir(path):
        for dirpath, dirs, files in os.walk(path):  # does not descend into linked dirs
            for name in dirs + files:
                entry = os.path.join(dirpath, name)
                if os.path.islink(entry) and not inside(entry):
                    raise OutsideRootError(
                        f"{entry} is a symlink leading outside the output root {root} (to "
                        f"{os.path.realpath(entry)}); remove it or choose another output root",
                        entry)
    return path


def _confined_gcs(root: str, path: str) -> str:
    if not (is_gcs(root) and is_gcs(path)):
        raise OutsideRootError(f"{path} is outside the output root {root}", path)
    (root_bucket, root_key), (bucket, key) = split_gcs(root), split_gcs(path)
    for uri, k in ((root, root_key), (path, key)):
        if any(segment in (".", "..") for segment in k.split("/")):
            raise OutsideRootError(f"{uri} has a '.' or '..' segment: Cloud Storage keeps it "
                                   "as part of the name while other tools resolve it", uri)
    root_key, key = root_key.strip("/"), key.strip("/")
    if bucket != root_bucket or (root_key and key != root_key
                                 and not key.startswith(root_key + "/")):
        raise OutsideRootError(f"{path} is outside the output root {root}", path)
    return path
