"""What a report shows, gathered from an output root (runtime/report/report.py): the plan,
each stage's status, manifest and logs, read where the experiment is now (its own paths
rebased onto the root given: a moved or copied experiment is read where it lies).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from runexp.compiler.kinds import KINDS, read_summary
from runexp.compiler.plan import COMPLETED_FILE, MANIFEST_FILE, Plan, Stage
from runexp.compiler.specs.outputs import Summary
from runexp.runtime.report import curves
from runexp.compiler.estimates import estimates as plan_estimates
from runexp.runtime import storage
from runexp.runtime.storage import list_objects


PLAN_FILE = "plan.json"
REPORT_FILE = "report.html"
STARTED_FILE = "STARTED.json"
BOOKKEEPING = (STARTED_FILE, MANIFEST_FILE, COMPLETED_FILE)

DONE, OUT_OF_DATE, STARTED, NOT_STARTED = "done", "out of date", "started", "not started"
STATUS_TEXT = {DONE: "done", OUT_OF_DATE: "not done: holds an earlier build",
                STARTED: "not done: started, not finished", NOT_STARTED: "not done"}

class RootReader:
    """Reads files under an experiment root, local or gs://. ``text`` and ``data`` return
    None for a missing file; ``files`` lists a directory as [(relative path, size)]."""

    def __init__(self, root: str):
        self.root = root.rstrip("/") or "/"
        self.gcs = self.root.startswith("gs://")
        if self.gcs:
            self._storage = storage

    def join(self, *parts: str) -> str:
        if self.gcs:
            return "/".join([parts[0].rstrip("/"), *parts[1:]])
        return os.path.join(*parts)

    def data(self, path: str) -> Optional[bytes]:
        if self.gcs:
            try:
                return self._storage.read_bytes(path)
            except (OSError, self._storage.StorageError):
                return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def text(self, path: str) -> Optional[str]:
        raw = self.data(path)
        return None if raw is None else raw.decode("utf-8", "replace")

    def files(self, directory: str) -> list[tuple[str, int]]:
        out = []
        if self.gcs:
            prefix = directory.rstrip("/") + "/"
            try:
                for uri, blob in list_objects(directory):
                    out.append((uri[len(prefix):], int(getattr(blob, "size", 0) or 0)))
            except (OSError, self._storage.StorageError):
                return []
            return sorted(out)
        for dirpath, _, names in os.walk(directory):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    size = os.path.getsize(path)
                except OSError:
                    continue
                out.append((os.path.relpath(path, directory).replace(os.sep, "/"), size))
        return sorted(out)


@dataclasses.dataclass
class StageReport:
    stage: Stage
    dir: str  # the stage directory under the root given
    status: str
    manifest: dict
    logs: Optional[curves.Logs] = None
    curves_png: Optional[bytes] = None
    curves_error: str = ""

    @property
    def summary(self) -> dict:
        """The MANIFEST summary as written (the curves' references read it so)."""
        return self.manifest.get("summary") or {}

    @property
    def outputs(self) -> Summary:
        """The summary as the stage's kind declares it (compiler/specs/outputs.py): every
        key an attribute, None when this manifest lacks it."""
        if self.stage.kind not in KINDS:  # a plan from a newer runexp
            return Summary()
        return read_summary(self.stage.kind, self.summary)

    @property
    def done(self) -> bool:
        return self.status == DONE


@dataclasses.dataclass
class Report:
    root: str
    plan: Plan
    stages: list  # StageReport, in plan order
    estimates: dict  # stage id -> Estimate
    estimate_error: str = ""

    def by_kind(self, kind: str) -> list:
        return [s for s in self.stages if s.stage.kind == kind]

    def get(self, stage_id: str) -> Optional[StageReport]:
        return next((s for s in self.stages if s.stage.id == stage_id), None)


class NoExperiment(Exception):
    """The root holds no readable plan.json."""


def _rebase(path: str, plan_root: str, root: str) -> str:
    """A path of the plan, moved under ``root`` when the experiment is read from elsewhere."""
    plan_root = plan_root.rstrip("/")
    if path == plan_root:
        return root
    if plan_root and path.startswith(plan_root + "/"):
        rest = path[len(plan_root) + 1:]
        return f"{root}/{rest}" if root.startswith("gs://") else os.path.join(root, rest)
    return path


def _status(reader: RootReader, stage: Stage, directory: str) -> tuple[str, dict]:
    completed = reader.text(reader.join(directory, COMPLETED_FILE))
    manifest: dict = {}
    text = reader.text(reader.join(directory, MANIFEST_FILE))
    if text:
        try:
            manifest = json.loads(text)
        except ValueError:
            manifest = {}
    if completed is not None and manifest:
        if completed.strip() == stage.fingerprint or not stage.fingerprint:
            return DONE, manifest
        return OUT_OF_DATE, manifest
    if reader.text(reader.join(directory, STARTED_FILE)) is not None:
        return STARTED, {}
    return NOT_STARTED, {}


def collect(root: str, draw: bool = True) -> Report:
    """Everything the report shows, read from ``root``. Raises NoExperiment."""
    reader = RootReader(root)
    root = reader.root
    text = reader.text(reader.join(root, PLAN_FILE))
    if text is None:
        raise NoExperiment(f"{root} holds no runexp experiment (no {PLAN_FILE})")
    try:
        plan = Plan.from_json(text)
    except (ValueError, KeyError, TypeError) as e:
        raise NoExperiment(f"{reader.join(root, PLAN_FILE)} is not a plan runexp can read: {e}")
    stages = []
    for stage in plan.stages:
        directory = _rebase(stage.output_dir, plan.output_root, root)
        status, manifest = _status(reader, stage, directory)
        sr = StageReport(stage, directory, status, manifest)
        if stage.kind in curves.PANELS:
            sr.logs = curves.read_logs(directory)
        stages.append(sr)
    estimates, error = {}, ""
    try:
        estimates = plan_estimates(plan)
    except Exception as e:  # noqa: BLE001 - the report goes on without estimates
        error = f"{type(e).__name__}: {e}"
    report = Report(root, plan, stages, estimates, error)
    if draw:
        summaries = {s.stage.id: s.summary for s in stages if s.summary}
        for sr in stages:
            if sr.logs:
                try:
                    fig = curves.curves_figure(
                        sr.stage.kind, sr.logs, curves.references(plan, sr.stage, summaries),
                        title=curves.stage_title(plan, sr.stage, sr.logs),
                        total_steps=sr.stage.params.get("train_steps"))
                    sr.curves_png = curves.figure_png(fig)
                except Exception as e:  # noqa: BLE001 - the stage's own PNG, if any
                    sr.curves_error = f"{type(e).__name__}: {e}"
                    sr.curves_png = reader.data(reader.join(sr.dir, curves.CURVES_FILE))
    return report
