"""Planning the corpus stage: the built-in corpus, made when a builtin:// file is named."""

from __future__ import annotations

import sys

from runexp.compiler.plan import Stage
from runexp.compiler.specs import CorpusSpec
from runexp.compiler.stages.common import PlanContext, StageBuilder


def ensure_corpus_stage(ctx: PlanContext) -> Stage:
    """The one corpus stage of the plan, added the first time a builtin:// file is used."""
    if ctx.corpus_stage is None:
        b = StageBuilder(ctx.r)
        b.set("source", CorpusSpec.source, "builtin:// corpus")
        b.take_spec(CorpusSpec, "builtin_corpus")
        b.set("python_version", "%d.%d" % sys.version_info[:2], "the running Python")
        ctx.corpus_stage = ctx.add("corpus", "corpus", b, {}, {}, [])
    return ctx.corpus_stage
