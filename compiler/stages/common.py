"""What every stage kind's planning shares: the plan being built, params with provenance,
input files, and the checks that several kinds make.

Usage (inside compiler/stages/<kind>.py):
    b = StageBuilder(ctx.r)
    b.take_spec(EvaluateSpec, "evaluate")           # every gin setting of the spec
    b.set("model", pretrain.params["model"], pretrain.provenance["model"])
    ctx.add("evaluate", "evaluate", b, inputs, fingerprints, deps)
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

from runexp.compiler import uris
from runexp.compiler.errors import ErrorCollector, Location, did_you_mean
from runexp.compiler.fingerprint import checkpoint_digest, files_digest, stage_fingerprint
from runexp.compiler.gcs_inputs import NOT_LISTED, InputLister, listing_digest
from runexp.compiler.kinds import KINDS
from runexp.compiler.plan import Stage
from runexp.compiler.schema import CONFIGURABLES
from runexp.compiler.specs import CorpusSpec
from runexp.compiler.user_modules import resolve_imports

# The fingerprint of an input whose content the compiler cannot see: a gs:// input that
# could not be listed (compiler/gcs_inputs.py), a file that does not exist (yet).
AT_RUN_TIME = NOT_LISTED


class StageBuilder:
    """Collects one stage's params with their provenance."""

    def __init__(self, resolver):
        self.resolver = resolver
        self.params: dict[str, Any] = {}
        self.provenance: dict[str, str] = {}

    def take(self, name: str, configurable: str, param: str, scope: str = "") -> Any:
        value = self.resolver.get(configurable, param, scope)
        self.params[name] = value
        self.provenance[name] = self.resolver.provenance(configurable, param, scope).short()
        return value

    def take_spec(self, spec: type, configurable: str, scope: str = "",
                  only: Sequence[str] = ()) -> dict:
        """Takes every gin-bound setting of `spec` (or those named in `only`): its own from
        `configurable`, the others from the configurable their `gin` names (scoped by
        `scope` when that configurable is scoped). Derived settings are the caller's."""
        for s in spec.settings():
            if s.gin is None or not s.planned or (only and s.name not in only):
                continue
            owner, _, param = s.gin.rpartition(".")
            owner = owner or configurable
            self.take(s.name, owner, param, scope if CONFIGURABLES[owner].scoped else "")
        return self.params

    def set(self, name: str, value: Any, why: str = "derived") -> Any:
        self.params[name] = value
        self.provenance[name] = why
        return value

    def copy(self, stage: Stage, *names: str) -> None:
        """Params derived from an upstream stage, with that stage's provenance."""
        for name in names:
            self.set(name, stage.params[name], stage.provenance[name])


class PlanContext:
    """The plan under construction, and the services every kind's planning uses."""

    def __init__(self, resolver, collector: ErrorCollector, gin_files: Sequence[str]):
        self.r = resolver
        self.c = collector
        self.gin_files = gin_files
        self.stages: list[Stage] = []
        self.output_root = ""
        self.corpus_stage: Optional[Stage] = None
        self.checked_mixtures: dict[str, Optional[list[str]]] = {}  # checked (and reported) once
        self.gcs = InputLister()  # gs:// inputs, each listed once per compile
        # init_checkpoint -> its Hugging Face directory (or None), read once per compile
        # (compiler/stages/huggingface_init.py).
        self.huggingface_inits: dict = {}
        # The gin imports, found once per compile (never imported: compiler/user_modules.py);
        # one that names no module is an error of every experiment.
        self.modules = resolve_imports(resolver.config.imports, collector)

    def loc(self, configurable: str, param: str, scope: str = "") -> Optional[Location]:
        return self.r.provenance(configurable, param, scope).location

    def add(self, stage_id: str, kind: str, b: StageBuilder, inputs: dict,
            input_fps: dict, deps: Sequence[str]) -> Stage:
        # Operational params (how, not what: the preprocess runner) are not fingerprinted.
        made = {k: v for k, v in b.params.items() if k not in KINDS[kind].operational}
        fingerprint = stage_fingerprint(kind, made, input_fps)
        resume_key = ""
        resumable = KINDS[kind].resumable
        if resumable:
            kept = {k: v for k, v in made.items() if k not in resumable}
            resume_key = stage_fingerprint(kind, kept, input_fps)
        stage = Stage(id=stage_id, kind=kind, params=b.params, inputs=inputs,
                      output_dir=uris.join(self.output_root, stage_id), deps=tuple(deps),
                      fingerprint=fingerprint, resume_key=resume_key, provenance=b.provenance,
                      input_objects=self._listed(inputs))
        self.stages.append(stage)
        return stage

    def _listed(self, inputs: dict) -> dict:
        """The listing of every gs:// input of ``inputs`` that was fingerprinted by one."""
        return {value: self.gcs.listings[value] for value in uris.strings_in(inputs)
                if value in self.gcs.listings}

    def file_digest(self, path: str) -> str:
        """One input file's fingerprint: a gs:// object by its listing, a local file by its
        content; AT_RUN_TIME for a local file that does not exist."""
        if uris.is_gcs(path):
            return listing_digest(self.gcs.objects(path))
        return files_digest([path]) if os.path.isfile(path) else AT_RUN_TIME

    def checkpoint_digest(self, prefix: str, directory: bool = False) -> str:
        """A TensorFlow checkpoint's fingerprint, or (``directory``) a Hugging Face model
        directory's: on gs:// by the listing of its objects, locally by their content."""
        if uris.is_gcs(prefix):
            return listing_digest(self.gcs.directory(prefix) if directory
                                  else self.gcs.checkpoint(prefix))
        if directory:
            files = sorted(os.path.join(prefix, f) for f in os.listdir(prefix)
                           if os.path.isfile(os.path.join(prefix, f)))
            return files_digest(files)
        return checkpoint_digest(prefix)

    def files(self, patterns: list, label: str, location: Optional[Location],
              required: bool = True) -> tuple[list, dict, list]:
        """Resolves input globs: builtin:// -> corpus stage outputs; local -> absolute;
        gs:// -> as given, fingerprinted by one listing (compiler/gcs_inputs.py).

        Returns (uris, fingerprints, deps).
        """

        out, fps, deps = [], {}, []
        for pattern in patterns or []:
            if uris.is_builtin(pattern):
                corpus, name = uris.split_builtin(pattern)
                if corpus not in uris.BUILTIN_CORPORA or name not in uris.BUILTIN_CORPORA[corpus]:
                    valid = [f"{uris.BUILTIN_SCHEME}{c}/{n}" for c, ns in
                             uris.BUILTIN_CORPORA.items() for n in ns]
                    self.c.error(f"{label}: unknown builtin corpus file {pattern!r}", location,
                                 hint=did_you_mean(pattern, valid))
                    continue
                stage = self.builtin_corpus()
                out.append(uris.join(stage.output_dir, name))
                fps[pattern] = stage.fingerprint
                deps.append(stage.id)
            elif uris.is_gcs(pattern):
                out.append(pattern)
                fps[pattern] = listing_digest(self.gcs.objects(pattern))
            else:
                path = uris.absolute(pattern)
                matched = uris.expand_local(path)
                if not matched and required:
                    self.c.error(f"{label}: {pattern!r} matches no file", location,
                                 hint="check the path or glob (relative paths are relative to "
                                      "the directory runexp is started in)")
                    continue
                out.append(path)
                fps[pattern] = files_digest(matched)
        return out, fps, sorted(set(deps))

    def builtin_corpus(self) -> Stage:
        """The plan's one corpus stage (the built-in corpus), added the first time a
        builtin:// file is named."""
        if self.corpus_stage is None:
            b = StageBuilder(self.r)
            b.set("source", CorpusSpec.source, "builtin:// corpus")
            b.take_spec(CorpusSpec, "builtin_corpus")
            b.set("python_version", "%d.%d" % sys.version_info[:2], "the running Python")
            self.corpus_stage = self.add("corpus", "corpus", b, {}, {}, [])
        return self.corpus_stage

    def check_batch(self, batch, accel, what: str, location: Optional[Location]) -> None:
        """Each replica takes an equal share of a batch."""
        if accel is not None and batch and batch % accel.replicas:
            self.c.error(f"{what} {batch} is not divisible by the {accel.replicas} replicas of "
                         f"{accel.name}", location,
                         hint=f"use a multiple of {accel.replicas}, e.g. "
                              f"{-(-batch // accel.replicas) * accel.replicas}")


def has_validation(pre: Stage) -> bool:
    """A preprocess stage makes a validation split: from held-out files, or from a seqio
    source's validation split."""
    return bool(pre.inputs.get("validation_files") or pre.params.get("validation_split"))


def data_inputs(pre) -> tuple[dict, dict, list]:
    """Where a training or evaluation stage reads its data: one preprocess stage
    (``data_dir``), or a mixture's (``data_dirs``, task -> dir)."""
    if isinstance(pre, Stage):
        return {"data_dir": pre.output_dir}, {"data": pre.fingerprint}, [pre.id]
    return ({"data_dirs": {p.params["task"]: p.output_dir for p in pre}},
            {"data": {p.params["task"]: p.fingerprint for p in pre}}, [p.id for p in pre])
