"""The corpus stage: the quickstart corpus from the Python standard library's prose.

See docs/STAGES.md ("corpus") and tasks/sources/stdlib_corpus.py.
"""

from __future__ import annotations

import platform

from runexp.compiler.specs import CorpusSpec
from runexp.runtime.context import StageContext
from runexp.tasks.sources import stdlib_corpus


def run(ctx: StageContext) -> dict:
    spec = CorpusSpec.from_stage(ctx)  # refuses an unknown source
    running = ".".join(platform.python_version_tuple()[:2])
    if spec.python_version and spec.python_version != running:
        # The text depends on the stdlib: a plan made for another Python would mislabel it.
        raise ValueError(f"the plan's corpus is for Python {spec.python_version}, but this is "
                         f"Python {running}: compile the experiment again with this Python")
    ctx.progress(f"reading docstrings and comments of {stdlib_corpus.stdlib_dir()}")
    corpus = stdlib_corpus.build_corpus(
        min_bytes=spec.min_bytes, heldout_fraction=spec.heldout_fraction,
        finetune_classes=spec.finetune_classes, seed=spec.seed)
    summary = stdlib_corpus.write_corpus(corpus, ctx.work_dir)
    ctx.progress(f"train {summary['train']['bytes']:,} bytes in {summary['train']['documents']} "
                 f"documents; fine-tuning labels {', '.join(summary['labels'])}")
    return summary
