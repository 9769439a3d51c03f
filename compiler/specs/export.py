"""The export stage's settings: SavedModel, Google-layout checkpoint, bert_config.json, vocab."""

from __future__ import annotations

import dataclasses

from runexp.compiler.specs.base import Spec, setting


@dataclasses.dataclass(frozen=True)
class ExportSpec(Spec):
    """`export` in gin (only `export.enabled`, which decides whether the stage exists)."""

    model: dict = setting(None, "the exported model's bert_config", gin=None)
