"""Content fingerprints: a stage is reused only when everything it depends on is unchanged.

A stage's fingerprint hashes its kind, its format version, its canonical parameters and the
fingerprints of its inputs: upstream stages' fingerprints, or the content of input files
(size and SHA-256; files over LARGE_FILE_BYTES use size and modification time, so a dry run
stays fast on large corpora, and say so in the plan).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterable

from runexp.compiler.kinds import KINDS

LARGE_FILE_BYTES = 256 * 1024 * 1024


def digest(obj: Any) -> str:
    """SHA-256 of the canonical JSON of `obj` (sorted keys, no whitespace)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digest(path: str) -> dict:
    st = os.stat(path)
    entry = {"name": os.path.basename(path), "size": st.st_size}
    if st.st_size > LARGE_FILE_BYTES:
        entry["mtime_ns"] = st.st_mtime_ns
        return entry
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    entry["sha256"] = h.hexdigest()
    return entry


def files_digest(paths: Iterable[str]) -> str:
    return digest([file_digest(p) for p in paths])


def stage_fingerprint(kind: str, params: dict, input_fingerprints: dict) -> str:
    return digest({"kind": kind, "version": KINDS[kind].format_version, "params": params,
                   "inputs": input_fingerprints})


def checkpoint_digest(prefix: str) -> str:
    """A TensorFlow checkpoint's files (`<prefix>.index`, `<prefix>.data-*`) by content. One
    on gs:// gets the constant of an unlisted input here; the plan fingerprints it by its
    listing instead (PlanContext.checkpoint_digest, compiler/gcs_inputs.py)."""
    if prefix.startswith("gs://"):
        return "checked at run time"
    directory, name = os.path.split(prefix)
    try:
        files = sorted(os.path.join(directory, f) for f in os.listdir(directory or ".")
                       if f.startswith(name + "."))
    except OSError:
        files = []
    return files_digest(files) if files else "missing"
