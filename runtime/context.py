"""What a stage handler gets: its stage, where to write, where its inputs are, how to report.

Every handler is a module in runtime/stages/ with one function:

    def run(ctx: StageContext) -> XSummary   # or a dict of its keys

It writes its outputs under ``ctx.work_dir`` and returns its summary (counts, metrics): the
record its kind declares beside its spec (compiler/specs/outputs.py), or a dict the executor
checks against it, which the executor puts into MANIFEST.json. It never writes MANIFEST.json or
COMPLETED itself: the executor does, after the handler returned, so a crash never leaves a
stage that looks done.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable

from runexp.compiler.plan import Plan, Stage


def _print_progress(message: str) -> None:
    print(f"    {message}", file=sys.stdout, flush=True)


@dataclasses.dataclass
class StageContext:
    """Attributes:
      stage: the stage being run (params, inputs, fingerprint).
      plan: the whole plan, for handlers that need an upstream stage's params.
      work_dir: local directory the handler writes its outputs into; it exists and is
        empty, except when a training stage resumes (then it holds the earlier run's files).
      progress: reports one progress line to the user.
      sync: makes what is in work_dir durable where the experiment lives (uploads it for a
        gs:// output root; nothing to do locally). Training calls it after each checkpoint.
        For a gs:// root it is a ``gcs_mirror.StageSync``, which can also upload in the
        background: ``start()`` (the trainer, after each checkpoint but the last), ``poll()``,
        ``wait()``, ``in_flight``; a call waits for the upload in flight first.
    """

    stage: Stage
    plan: Plan
    work_dir: str
    progress: Callable[[str], None] = _print_progress
    sync: Callable[[], None] = lambda: None

    @property
    def params(self):
        return self.stage.params

    @property
    def inputs(self):
        return self.stage.inputs

    def upstream(self, stage_id: str) -> Stage:
        return self.plan.stage(stage_id)
