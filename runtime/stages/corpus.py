"""The corpus stage: the quickstart corpus from the Python standard library's prose.

See docs/STAGES.md ("corpus") and tasks/stdlib_corpus.py.
"""

from __future__ import annotations

import platform

from runexp.runtime.context import StageContext
from runexp.tasks import stdlib_corpus

SOURCES = ("python_stdlib_docstrings",)


def run(ctx: StageContext) -> dict:
    p = ctx.params
    if p.get("source", SOURCES[0]) not in SOURCES:
        raise ValueError(f"corpus source must be one of {SOURCES}, got {p['source']!r}")
    running = ".".join(platform.python_version_tuple()[:2])
    if p.get("python_version") and p["python_version"] != running:
        # The text depends on the stdlib: a plan made for another Python would mislabel it.
        raise ValueError(f"the plan's corpus is for Python {p['python_version']}, but this is "
                         f"Python {running}: compile the experiment again with this Python")
    ctx.progress(f"reading docstrings and comments of {stdlib_corpus.stdlib_dir()}")
    corpus = stdlib_corpus.build_corpus(
        min_bytes=p["min_bytes"], heldout_fraction=p["heldout_fraction"],
        finetune_classes=p["finetune_classes"], seed=p["seed"])
    summary = stdlib_corpus.write_corpus(corpus, ctx.work_dir)
    ctx.progress(f"train {summary['train']['bytes']:,} bytes in {summary['train']['documents']} "
                 f"documents; fine-tuning labels {', '.join(summary['labels'])}")
    return summary
