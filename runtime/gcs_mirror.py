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
- `sync` uploads what changed (verified, `transfer.TRANSFER_THREADS` files at once): every
  other file, then checkpoints' .index files (without one TensorFlow sees no checkpoint),
  then TensorFlow's `checkpoint` state file, so the remote "latest" only ever names a
  checkpoint whose files are all uploaded; remote files that disappeared locally (checkpoints
  dropped by keep-last-K) are deleted only after that, .index first.

The handler's `ctx.sync` is a `StageSync`: called, it waits for the upload in flight and
syncs at once; `start()` (the trainer, after each checkpoint but the last) freezes what is to
upload and uploads it in a background thread while training goes on. At most one upload is in
flight: the next `start()` or call waits for it, and raises its error if it failed. The frozen
copy (`snapshot`) is a staging directory next to the work directory: checkpoint files
hard-linked (TensorFlow's CheckpointManager deletes old checkpoints while their upload may
still read them; a link keeps the bytes; copied where linking fails), other files copied
(logs grow while training goes on). The snapshot's file list is what the remote keeps: its
pointer names only checkpoints of that list, and only files missing from it are deleted.
`RUNEXP_CHECKPOINT_UPLOAD=sync` makes `start()` upload in the foreground (the old behaviour,
for comparisons: bench/checkpoint_upload.py).

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
from runexp.runtime.storage import transfer
from runexp.runtime.storage.background import Background, Job
from runexp.runtime.progress import Meter
from runexp.tasks.sources.input_files import pinned

# Written last by sync: TensorFlow's pointer to the latest checkpoint.
CHECKPOINT_STATE = "checkpoints/checkpoint"
MIRROR_MARK = ".runexp-mirror"
# Next to a stage's work directory: the files of the checkpoint upload in flight.
STAGING_SUFFIX = ".upload"
# Remote files of a stage that sync never deletes (the executor's).
EXECUTOR_FILES = ("STARTED.json", "MANIFEST.json", "COMPLETED")
# "sync": StageSync.start() uploads in the foreground, like a call.
UPLOAD_MODE_ENV = "RUNEXP_CHECKPOINT_UPLOAD"


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

    def _localize(self, value, in_place: bool = False):
        """``value`` with its gs:// URIs as local copies; with ``in_place``, a user's gs://
        files as the versions the plan listed (``gs://bucket/key#generation``,
        tasks/sources/input_files.py), read where they are by the stage."""
        if isinstance(value, dict):
            return {k: self._localize(v, in_place) for k, v in value.items()}
        if isinstance(value, list):
            out = []
            for v in value:
                local = self._localize(v, in_place)
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
        listing = self._listing(value)
        if in_place:
            return [pinned(uri, listing[uri].get("generation")) for uri in sorted(listing)]
        local = self._download_inputs(value, listing)
        if not globs.has_magic(value) and value not in listing:
            # A TensorFlow checkpoint prefix or a directory names no object: the local prefix
            # (or directory) stands for the files under it.
            return self._input_path(value.rstrip("/"))
        return local

    def _listing(self, value: str) -> dict:
        """{uri: version} of the objects a user's gs:// input names (FileNotFoundError when
        none)."""
        listing = self._listed.get(value)
        if listing is None:
            listing = {o["uri"]: o for o in storage.glob_objects(value)}
            if not listing and not globs.has_magic(value):
                # A TensorFlow checkpoint prefix (<prefix>.index, <prefix>.data-*), or a
                # Hugging Face model directory (<dir>/config.json, <dir>/model.safetensors...).
                listing = {o["uri"]: o for o in storage.glob_objects(globs.escape(value) + ".*")}
                if not listing:
                    listing = {o["uri"]: o for o in storage.glob_objects(
                        globs.escape(value.rstrip("/")) + "/*")}
        if not listing:
            raise FileNotFoundError(f"{value} matches no object")
        return listing

    def _download_inputs(self, value: str, listing: dict) -> list[str]:
        """The listed objects of one input, downloaded (or found cached), with progress in
        bytes (runtime/progress.py: a bar on a terminal, a line every 15 s in a log)."""

        total = sum(int(o.get("size") or 0) for o in listing.values())
        with Meter(f"    reading {value}", total=total or None, unit="B",
                   say=lambda line: print(line, flush=True)) as meter:
            local = []
            for uri in sorted(listing):
                local.append(self._download_input(uri, listing[uri]))
                meter.advance(int(listing[uri].get("size") or 0))
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

    def local_inputs(self, stage: Stage, in_place: tuple = ()) -> Stage:
        """The stage with its gs:// inputs as local copies (read-only views: a local output
        root reading a gs:// corpus, or a worker joining a gs:// experiment); the inputs
        named in ``in_place`` as the listed versions, read where they are."""
        return dataclasses.replace(stage, inputs={k: self._localize(v, k in in_place)
                                                  for k, v in stage.inputs.items()})

    def local_stage(self, stage: Stage, resume: bool, in_place: tuple = ()) -> Stage:
        """The stage as its handler sees it: local inputs (``in_place``: as local_inputs)
        and a local work directory."""
        inputs = {k: self._localize(v, k in in_place) for k, v in stage.inputs.items()}
        work = self.local_dir(stage) + ".work"
        for leftover in (work, self.staging_dir(stage)):  # a killed run's
            if os.path.isdir(leftover):
                shutil.rmtree(leftover)
        synced = {}
        if resume and storage.exists(stage.output_dir):
            storage.download_dir(stage.output_dir, work)
            _drop_uncommitted_checkpoints(work)
            # What was just downloaded is in the bucket already: sync uploads only changes.
            synced = _file_states(work)
        os.makedirs(work, exist_ok=True)
        self._synced[stage.id] = synced
        return dataclasses.replace(stage, inputs=inputs, output_dir=work)

    def staging_dir(self, stage: Stage) -> str:
        return self.local_dir(stage) + STAGING_SUFFIX

    def sync(self, stage: Stage, work: str) -> None:
        """Uploads new and changed files of `work`, .index files and then the checkpoint
        pointer last, then deletes remote files that no longer exist locally."""
        self.upload(self.snapshot(stage, work, staged=False))

    def snapshot(self, stage: Stage, work: str, staged: bool = True) -> "Snapshot":
        """What `sync` would upload now. ``staged``: frozen into the staging directory (hard
        links for checkpoint files, copies of the others), so that the work directory may
        change while it uploads; else read from `work` itself."""
        seen = self._synced.setdefault(stage.id, {})
        states = _file_states(work)
        changed = {rel: st for rel, st in states.items() if seen.get(rel) != st}
        source, staging = work, None
        if staged:
            source = staging = self.staging_dir(stage)
            if os.path.isdir(staging):
                shutil.rmtree(staging)
            for rel in sorted(changed):
                src = os.path.join(work, *rel.split("/"))
                dst = os.path.join(staging, *rel.split("/"))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                try:
                    _freeze(src, dst, link=_is_checkpoint_file(rel))
                except FileNotFoundError:  # gone since listed: not part of this snapshot
                    del changed[rel], states[rel]
        return Snapshot(stage, source, changed, frozenset(states), staging)

    def upload(self, snapshot: "Snapshot") -> None:
        """Uploads a snapshot (module docstring: the order), then deletes the remote files
        it does not hold. Safe to cut short anywhere."""
        stage, seen = snapshot.stage, self._synced.setdefault(snapshot.stage.id, {})
        rels = sorted(snapshot.changed)
        indexes = [r for r in rels if r.endswith(".index") and _is_checkpoint_file(r)]
        others = [r for r in rels if r != CHECKPOINT_STATE and r not in indexes]
        pointer = [CHECKPOINT_STATE] if CHECKPOINT_STATE in snapshot.changed else []
        for phase in (others, indexes, pointer):
            transfer.upload_files([(os.path.join(snapshot.source, *rel.split("/")),
                                    storage.join(stage.output_dir, rel)) for rel in phase])
            seen.update({rel: snapshot.changed[rel] for rel in phase})
        prefix = stage.output_dir.rstrip("/") + "/"
        stale = [uri for uri in storage.list(stage.output_dir)
                 if uri[len(prefix):] not in snapshot.files
                 and uri[len(prefix):] not in EXECUTOR_FILES]
        # A checkpoint's .index first: without it TensorFlow sees no checkpoint there, so a
        # deletion cut short never leaves something that looks like a whole one.
        for uri in sorted(stale, key=lambda u: not u.endswith(".index")):
            storage.delete(uri, missing_ok=True)
            seen.pop(uri[len(prefix):], None)
        if snapshot.staging:
            shutil.rmtree(snapshot.staging, ignore_errors=True)

    def stage_sync(self, stage: Stage, work: str) -> "StageSync":
        """The handler's ``ctx.sync`` for `stage` working in `work`."""
        return StageSync(self, stage, work)

    def finish(self, stage: Stage, work: str) -> None:
        """After the stage completed remotely: the work directory becomes the mirror."""
        local = self.local_dir(stage)
        shutil.rmtree(self.staging_dir(stage), ignore_errors=True)
        if os.path.isdir(local):
            shutil.rmtree(local)
        os.replace(work, local)
        with open(os.path.join(local, MIRROR_MARK), "w") as f:
            f.write(stage.fingerprint)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Files to upload, frozen: ``changed`` ({relative path: state}) read from ``source``;
    ``files``, every file the work directory held (the remote keeps these); ``staging``, the
    directory to remove once uploaded (None: ``source`` is the work directory)."""

    stage: Stage
    source: str
    changed: dict
    files: frozenset
    staging: str | None


class StageSync:
    """``ctx.sync`` of a stage on a gs:// output root (module docstring).

    Calling it syncs now (after the upload in flight). ``start()`` starts a background
    upload of what is there now; True if it runs in the background, False if it was done
    in the foreground (``RUNEXP_CHECKPOINT_UPLOAD=sync``). ``poll()`` / ``wait()`` return the
    background upload's ``Job`` (``seconds``: how long it took) once it ended, raising its
    error; ``in_flight`` is the job running now, or None.
    """

    def __init__(self, mirror: Mirror, stage: Stage, work: str):
        self.mirror, self.stage, self.work = mirror, stage, work
        self.background = os.environ.get(UPLOAD_MODE_ENV, "background") != "sync"
        self._worker = Background("checkpoint upload")

    def __call__(self) -> None:
        self.wait()
        self.mirror.sync(self.stage, self.work)

    def start(self) -> bool:
        self.wait()
        if not self.background:
            self.mirror.sync(self.stage, self.work)
            return False
        snapshot = self.mirror.snapshot(self.stage, self.work)
        self._worker.submit(lambda: self.mirror.upload(snapshot),
                            what=f"upload of {self.stage.id}")
        return True

    def poll(self) -> Job | None:
        return self._worker.poll()

    def wait(self) -> Job | None:
        return self._worker.wait()

    @property
    def in_flight(self) -> Job | None:
        return self._worker.in_flight


def _is_checkpoint_file(rel: str) -> bool:
    """A training checkpoint's .index or .data file: written once, never changed."""
    directory, _, name = rel.rpartition("/")
    return directory == CHECKPOINT_STATE.rpartition("/")[0] and \
        _CHECKPOINT_FILE.match(name) is not None


def _freeze(src: str, dst: str, link: bool) -> None:
    """``dst`` becomes a copy of ``src`` that later changes of ``src`` leave alone: a hard
    link for a file never written again (``link``), else (or where linking fails) a copy."""
    if link:
        try:
            os.link(src, dst)
            return
        except FileNotFoundError:
            raise
        except OSError:  # another filesystem, no hard links there, the link limit
            pass
    shutil.copyfile(src, dst)


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
