"""Local working copies of an experiment whose output root is on gs://.

Stage handlers read and write local files (TensorFlow's own gs:// filesystem ignores
STORAGE_EMULATOR_HOST, and sentencepiece, multiprocessing writers and SavedModel writers want
local paths). For a gs:// experiment the executor therefore gives each handler a local view:

- inputs on gs:// (upstream stage directories, corpus files) are downloaded, verified, into a
  cache directory first (`pull`); a mirrored stage directory is reused while its fingerprint
  matches; a user's object (corpus file, vocab, released checkpoint) is the version the plan
  listed (its generation, checked by crc32c; `InputChangedError` if it changed since), and
  its cached copy is reused while it is that version: same generation and crc32c, and the
  local file as it was downloaded (size, mtime);
- the handler writes into a local work directory; a resumed training stage's starts as a
  copy of the remote one, less checkpoint files the pointer does not list (what a run killed
  mid-upload or mid-deletion left);
- `sync` uploads what changed (verified), TensorFlow's `checkpoint` state file last, so the
  remote "latest" only ever names a checkpoint whose files are all uploaded; remote files that
  disappeared locally (checkpoints dropped by keep-last-K) are deleted only after that.

The executor then writes MANIFEST.json and COMPLETED remotely, COMPLETED last.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil

from runexp.compiler import globs, uris
from runexp.compiler.plan import Plan, Stage
from runexp.runtime import storage

# Written last by sync: TensorFlow's pointer to the latest checkpoint.
CHECKPOINT_STATE = "checkpoints/checkpoint"
MIRROR_MARK = ".runexp-mirror"


def cache_root(output_root: str) -> str:
    base = os.environ.get("RUNEXP_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "runexp")
    return os.path.join(base, hashlib.sha256(output_root.encode()).hexdigest()[:16])


class Mirror:
    """Local copies of the stage directories and input files of one gs:// experiment."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.root = cache_root(plan.output_root)
        self._synced: dict[str, dict[str, tuple]] = {}
        # What the plan listed of each gs:// input: the versions to read.
        self._listed = {key: listing for stage in plan.stages
                        for key, listing in (stage.input_objects or {}).items()
                        if isinstance(listing, dict)}

    def local_dir(self, stage: Stage) -> str:
        return os.path.join(self.root, "stages", stage.id)

    def _stage_of(self, uri: str):
        for stage in self.plan.stages:
            prefix = stage.output_dir.rstrip("/")
            if uri == prefix or uri.startswith(prefix + "/"):
                return stage, uri[len(prefix):].lstrip("/")
        return None, ""

    def pull(self, stage: Stage) -> str:
        """Downloads a finished (or resumable) stage directory unless already mirrored."""
        local = self.local_dir(stage)
        mark = os.path.join(local, MIRROR_MARK)
        if os.path.isfile(mark) and open(mark).read().strip() == stage.fingerprint:
            return local
        if os.path.isdir(local):
            shutil.rmtree(local)
        storage.download_dir(stage.output_dir, local)
        with open(mark, "w") as f:
            f.write(stage.fingerprint)
        return local

    def _localize(self, value):
        if isinstance(value, dict):
            return {k: self._localize(v) for k, v in value.items()}
        if isinstance(value, list):
            out = []
            for v in value:
                local = self._localize(v)
                out.extend(local if isinstance(local, list) else [local])
            return out
        if not isinstance(value, str) or not uris.is_gcs(value):
            return value
        stage, rest = self._stage_of(value)
        if stage is not None:
            local = self.pull(stage)
            return os.path.join(local, *rest.split("/")) if rest else local
        # A user's file on gs:// (corpus, fine-tune data, a released checkpoint): download what
        # it names into the input cache, in the versions the plan listed (listed now if the
        # plan has no listing: compiled offline, or an older plan).
        listing = self._listed.get(value)
        if listing is None:
            listing = {o["uri"]: o for o in storage.glob_objects(value)}
            if not listing and not globs.has_magic(value):
                listing = {o["uri"]: o for o in storage.glob_objects(globs.escape(value) + ".*")}
        if not listing:
            raise FileNotFoundError(f"{value} matches no object")
        local = [self._download_input(uri, listing[uri]) for uri in sorted(listing)]
        if not globs.has_magic(value) and value not in listing:
            # A TensorFlow checkpoint prefix names no object: its files are <prefix>.index and
            # <prefix>.data-*; the local prefix stands for them.
            return self._input_path(value)
        return local

    def _input_path(self, uri: str) -> str:
        bucket, key = storage.split_gcs(uri)
        if any(part in (".", "..") for part in key.split("/")):
            # Kept literally by Cloud Storage, resolved by the local filesystem: the copy
            # would land outside the cache.
            raise storage.OutsideRootError(f"{uri} has a '.' or '..' segment: rename the "
                                           "object, runexp will not copy it", uri)
        return os.path.join(self.root, "inputs", bucket, *key.split("/"))

    def _stamp_path(self, uri: str) -> str:
        bucket, key = storage.split_gcs(uri)
        return os.path.join(self.root, "input-stamps", bucket, *key.split("/")) + ".json"

    def _download_input(self, uri: str, version: dict) -> str:
        """The local copy of one version of an object (``version``: its generation and
        crc32c, from a listing): the cached one while it is that version and untouched,
        else downloaded (``InputChangedError`` if the object is no longer that version)."""
        dest = self._input_path(uri)
        stamp_path = self._stamp_path(uri)
        want = {"generation": version.get("generation"), "crc32c": version.get("crc32c")}
        try:
            with open(stamp_path, encoding="utf-8") as f:
                stamp = json.load(f)
            st = os.stat(dest)
            if stamp.get("generation") is not None and stamp.get("crc32c") \
                    and {k: stamp.get(k) for k in want} == want \
                    and [stamp.get("size"), stamp.get("mtime_ns")] == [st.st_size,
                                                                       st.st_mtime_ns]:
                return dest
        except (OSError, ValueError):
            pass
        if os.path.exists(stamp_path):
            os.remove(stamp_path)  # no stamp, no reuse: never a copy of unknown version
        storage.download_version(uri, dest, want["generation"], want["crc32c"])
        st = os.stat(dest)
        os.makedirs(os.path.dirname(stamp_path), exist_ok=True)
        with open(stamp_path, "w", encoding="utf-8") as f:
            json.dump({**want, "size": st.st_size, "mtime_ns": st.st_mtime_ns}, f)
        return dest

    def local_stage(self, stage: Stage, resume: bool) -> Stage:
        """The stage as its handler sees it: local inputs and a local work directory."""
        inputs = {k: self._localize(v) for k, v in stage.inputs.items()}
        work = self.local_dir(stage) + ".work"
        if os.path.isdir(work):
            shutil.rmtree(work)
        synced = {}
        if resume and storage.exists(stage.output_dir):
            storage.download_dir(stage.output_dir, work)
            _drop_uncommitted_checkpoints(work)
            # What was just downloaded is in the bucket already: sync uploads only changes.
            synced = _file_states(work)
        os.makedirs(work, exist_ok=True)
        self._synced[stage.id] = synced
        return dataclasses.replace(stage, inputs=inputs, output_dir=work)

    def sync(self, stage: Stage, work: str) -> None:
        """Uploads new and changed files of `work`, the checkpoint pointer last, then deletes
        remote files that no longer exist locally."""
        seen = self._synced.setdefault(stage.id, {})
        local_files = _file_states(work)
        order = sorted(r for r in local_files if r != CHECKPOINT_STATE)
        if CHECKPOINT_STATE in local_files:
            order.append(CHECKPOINT_STATE)
        for rel in order:
            if seen.get(rel) != local_files[rel]:
                storage.upload_file(os.path.join(work, rel), storage.join(stage.output_dir, rel))
                seen[rel] = local_files[rel]
        prefix = stage.output_dir.rstrip("/") + "/"
        stale = [uri for uri in storage.list(stage.output_dir)
                 if uri[len(prefix):] not in local_files
                 and uri[len(prefix):] not in ("STARTED.json", "MANIFEST.json", "COMPLETED")]
        # A checkpoint's .index first: without it TensorFlow sees no checkpoint there, so a
        # deletion cut short never leaves something that looks like a whole one.
        for uri in sorted(stale, key=lambda u: not u.endswith(".index")):
            storage.delete(uri, missing_ok=True)
            seen.pop(uri[len(prefix):], None)

    def finish(self, stage: Stage, work: str) -> None:
        """After the stage completed remotely: the work directory becomes the mirror."""
        local = self.local_dir(stage)
        if os.path.isdir(local):
            shutil.rmtree(local)
        os.replace(work, local)
        with open(os.path.join(local, MIRROR_MARK), "w") as f:
            f.write(stage.fingerprint)


def _file_states(work: str) -> dict[str, tuple]:
    """{relative path: (size, mtime)} of every file under ``work``: what sync compares."""
    states = {}
    for dirpath, _, names in os.walk(work):
        for name in names:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            states[os.path.relpath(path, work).replace(os.sep, "/")] = (st.st_size,
                                                                        st.st_mtime_ns)
    return states


_CHECKPOINT_FILE = re.compile(r"^(.+)\.(index|data-\d+-of-\d+)$")
_LISTED = re.compile(r'^(?:all_)?model_checkpoint_paths?:\s*"([^"]*)"', re.M)


def _drop_uncommitted_checkpoints(work: str) -> None:
    """Removes checkpoint files that TensorFlow's pointer does not list: what a run killed
    mid-upload or mid-deletion left. They were never (or are no longer) committed, and
    TensorFlow would neither use nor delete them; the next sync deletes them remotely, after
    the pointer is uploaded."""
    directory = os.path.join(work, *CHECKPOINT_STATE.split("/")[:-1])
    if not os.path.isdir(directory):
        return
    pointer = os.path.join(work, *CHECKPOINT_STATE.split("/"))
    listed = set()
    if os.path.isfile(pointer):
        with open(pointer, encoding="utf-8") as f:
            listed = {os.path.basename(p) for p in _LISTED.findall(f.read())}
    for name in os.listdir(directory):
        match = _CHECKPOINT_FILE.match(name)
        if match and match.group(1) not in listed:
            os.remove(os.path.join(directory, name))
