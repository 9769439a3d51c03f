"""Local files as the storage layer writes them: atomically (a temporary file beside the
target, fsync, rename), with the usual permissions, and walked without following links."""

from __future__ import annotations

import os
import shutil
import tempfile


def walk_files(directory: str, join_to: str | None = None) -> list[str]:
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


def copy_into(src: str, f) -> None:
    """Copies the file ``src`` into the open binary file ``f``."""
    with open(src, "rb") as s:
        shutil.copyfileobj(s, f, 1 << 20)


def atomic_write(path: str, fill) -> None:
    """Writes ``path`` through ``fill(f)`` into a temporary file beside it, fsynced, then
    renamed over it: a reader sees the old file or the whole new one."""
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
