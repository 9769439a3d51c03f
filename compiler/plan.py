"""The Plan: what the compiler hands the runtime, and nothing else.

A Plan is an immutable, JSON-serialisable DAG of stages. Every value in it is plain data
(str, int, float, bool, None, lists and dicts of those), so the compiler never needs
TensorFlow and a saved plan can be reviewed, diffed and run later exactly as it was.

Usage:
    plan = Plan.from_json(text)
    for stage in plan.stages:          # topological order
        stage.output_dir, stage.inputs["vocab_dir"], stage.params["max_seq_length"]
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

# Bump when the meaning of a plan's fields changes; saved plans of another version are refused.
PLAN_FORMAT_VERSION = 1

# Files every stage directory ends with. MANIFEST.json first, COMPLETED last, so a stage that
# crashed half-way never looks done.
MANIFEST_FILE = "MANIFEST.json"
COMPLETED_FILE = "COMPLETED"

# Provenance of a value that only the run can know (e.g. the size of a vocab on gs://).
RUN_TIME = "known at run time"


@dataclasses.dataclass(frozen=True)
class Stage:
    """One step of an experiment.

    Attributes:
      id: unique, readable, used as the stage's directory name ("vocab", "pretrain",
        "preprocess.quickstart_mlm").
      kind: which runtime handler runs it (corpus, vocab, preprocess, pretrain, evaluate,
        finetune, export).
      params: resolved parameters, plain JSON values.
      inputs: named inputs: URIs of files, globs or upstream stage directories (a str or a
        list of str).
      output_dir: where the stage writes everything, MANIFEST.json and COMPLETED included.
      deps: ids of the stages whose outputs this one reads.
      fingerprint: hash of kind, params, input fingerprints and the format version.
      resume_key: for training stages, the hash of what must not change for a run to be
        continued from its checkpoints (train_steps, cadence and the like are left out).
      provenance: param name -> "file:line" that set it (the value's last setter).
      input_objects: for each gs:// input (a glob, an object or a checkpoint prefix, as in
        `inputs`), the objects it matched when the plan was compiled: {uri: {"size",
        "generation", "crc32c"}}, which its fingerprint rests on; or a str saying why they
        could not be listed (compiler/gcs_inputs.py). Left out of the JSON when empty.
    """

    id: str
    kind: str
    params: Mapping[str, Any]
    inputs: Mapping[str, Any]
    output_dir: str
    deps: tuple[str, ...] = ()
    fingerprint: str = ""
    resume_key: str = ""
    provenance: Mapping[str, str] = dataclasses.field(default_factory=dict)
    input_objects: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["deps"] = list(self.deps)
        if not self.input_objects:  # plans without gs:// inputs read as before
            del d["input_objects"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Stage":
        d = dict(d)
        d["deps"] = tuple(d.get("deps", ()))
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Plan:
    """An experiment resolved: stages in topological order plus what the reviewer needs."""

    experiment: str
    output_root: str
    stages: tuple[Stage, ...]
    accelerator: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # How to launch, not what to compute: max_attempts, relaunch_backoff_s, wall_time_hours.
    # Not part of any fingerprint.
    launch: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    gin_files: tuple[str, ...] = ()  # as given on the command line, made absolute
    gin_files_read: tuple[str, ...] = ()  # every file read, includes too, in order
    gin_params: tuple[str, ...] = ()
    gin_search_paths: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    operative_config: str = ""
    version: int = PLAN_FORMAT_VERSION
    # experiment.ablation's grid (compiler/ablation.py): where, keys, points, shared stages.
    ablation: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def stage(self, stage_id: str) -> Stage:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)

    def to_dict(self) -> dict:
        return {
            **({"ablation": dict(self.ablation)} if self.ablation else {}),
            "version": self.version,
            "experiment": self.experiment,
            "output_root": self.output_root,
            "accelerator": dict(self.accelerator),
            "launch": dict(self.launch),
            "warnings": list(self.warnings),
            "gin_files": list(self.gin_files),
            "gin_files_read": list(self.gin_files_read),
            "gin_params": list(self.gin_params),
            "gin_search_paths": list(self.gin_search_paths),
            "imports": list(self.imports),
            "operative_config": self.operative_config,
            "stages": [s.to_dict() for s in self.stages],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        if d.get("version") != PLAN_FORMAT_VERSION:
            raise ValueError(
                f"plan format version {d.get('version')!r} is not {PLAN_FORMAT_VERSION}: "
                "compile the experiment again with this runexp")
        return cls(
            experiment=d["experiment"],
            output_root=d["output_root"],
            stages=tuple(Stage.from_dict(s) for s in d["stages"]),
            accelerator=d.get("accelerator", {}),
            launch=d.get("launch", {}),
            warnings=tuple(d.get("warnings", ())),
            gin_files=tuple(d.get("gin_files", ())),
            gin_files_read=tuple(d.get("gin_files_read", ())),
            gin_params=tuple(d.get("gin_params", ())),
            gin_search_paths=tuple(d.get("gin_search_paths", ())),
            imports=tuple(d.get("imports", ())),
            operative_config=d.get("operative_config", ""),
            version=d["version"],
            ablation=d.get("ablation", {}),
        )

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))
