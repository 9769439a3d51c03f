"""How a preprocess stage builds its shards: where, not what.

`bert_pretraining_task.runner` chooses the in-process worker pool ('local', the default) or an
Apache Beam pipeline ('beam', tasks/instances/beam_preprocess.py: DirectRunner on this machine, or
Dataflow); `bert_pretraining_task.beam_options` are the pipeline's options, passed through to
Beam. Both runners write the same records, info, stats and COMPLETED, so neither setting is in
the stage's fingerprint (``OPERATIONAL``, compiler/kinds.py): switching runners reuses a
cached stage, and a stage built by one is the same as one built by the other. compiler/stages/
runner.py checks the options; docs/STAGES.md ("preprocess") says when to use which.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from runexp.compiler.specs.base import Spec, setting


@dataclasses.dataclass(frozen=True)
class RunnerSpec(Spec):
    """Where a preprocess stage's shards are built (the output is the same either way)."""

    runner: str = setting("local", "where shards are built: 'local' worker processes, or an "
                                   "Apache Beam pipeline ('beam': pip install runexp[beam]); "
                                   "the records are the same", choices=("local", "beam"))
    beam_options: Optional[dict] = setting(None, "with runner 'beam': Beam pipeline options, "
                                                 "passed through (None: DirectRunner, a "
                                                 "worker per core), e.g. {'runner': "
                                                 "'DataflowRunner', 'project': ..., 'region': "
                                                 "..., 'temp_location': 'gs://...'}")

    def beam_runner(self) -> str:
        """The Beam runner's canonical name (DirectRunner when none is given)."""
        return canonical_runner((self.beam_options or {}).get("runner") or "DirectRunner")


# The params of RunnerSpec: how the records are made, never what they are. Left out of the
# preprocess stage's fingerprint (StageKind.operational).
OPERATIONAL = ("runner", "beam_options")

# Beam runners runexp runs a pipeline on; the local ones run their workers on this machine
# (they read the corpus and write the shards in place); the others need shared storage.
LOCAL_BEAM_RUNNERS = ("DirectRunner",)
REMOTE_BEAM_RUNNERS = ("DataflowRunner",)
# Beam's other runners (apache_beam.options.pipeline_options.StandardOptions): known, not
# supported here (an error says so, rather than did-you-mean).
OTHER_BEAM_RUNNERS = ("BundleBasedDirectRunner", "FlinkRunner", "FnApiRunner",
                      "InteractiveRunner", "PortableRunner", "PrismRunner", "SparkRunner",
                      "SwitchingDirectRunner", "TestDataflowRunner", "TestDirectRunner")


def canonical_runner(name: str) -> str:
    """A runner name as Beam resolves it (case-insensitive, 'Runner' optional: 'dataflow'
    is 'DataflowRunner'); an unknown name unchanged."""
    known = LOCAL_BEAM_RUNNERS + REMOTE_BEAM_RUNNERS + OTHER_BEAM_RUNNERS
    by_lower = {k.lower(): k for k in known}
    lower = str(name).lower()
    return by_lower.get(lower) or by_lower.get(lower + "runner") or str(name)
