"""Planning the vocab stage: adopt a vocab.txt or SentencePiece model, or train one."""

from __future__ import annotations

import os
from typing import Optional

from runexp.compiler import uris
from runexp.compiler.errors import Location
from runexp.compiler.plan import RUN_TIME, Stage
from runexp.compiler.specs import VocabSpec
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.stages.mixture import member_files

def plan_vocab(ctx: PlanContext, task: Optional[str]) -> Stage:
    """An adopted vocab's stage carries vocab_path, do_lower_case and the vocab_size counted
    in the file; a trained one's every VocabSpec field."""
    b = StageBuilder(ctx.r)
    path = b.take("vocab_path", "vocab", "path")
    b.take("do_lower_case", "vocab", "do_lower_case")
    inputs, fps, deps = {}, {}, []
    if path is None and task is None:
        # Fine-tuning a released checkpoint: token ids must be the ones it was trained on.
        ctx.c.error("fine-tuning a released checkpoint needs its vocabulary, but vocab.path "
                    "is not set", ctx.loc("vocab", "path") or ctx.loc("finetune", "task"),
                    hint="set VOCAB to the vocab.txt that came with the checkpoint")
        b.set("vocab_size", None, "unknown")
    elif path is None:
        b.take_spec(VocabSpec, "vocab")
        # A mixture's one vocab is trained on the union of its tasks' text.
        inputs["train_files"], f1, d1 = member_files(ctx, task, "train_files")
        inputs["heldout_files"], f2, d2 = member_files(ctx, task, "validation_files")
        fps, deps = {"train": f1, "heldout": f2}, sorted(set(d1 + d2))
    else:
        b.params["vocab_path"] = uris.absolute(path)
        vocab_size = adopted_vocab_size(ctx, b.params["vocab_path"], ctx.loc("vocab", "path"))
        b.set("vocab_size", vocab_size, RUN_TIME if vocab_size is None and uris.is_gcs(path)
              else f"counted in {os.path.basename(path)}")
        inputs["vocab_file"] = b.params["vocab_path"]
        fps = {"vocab": ctx.file_digest(b.params["vocab_path"])}
        if task is not None:  # the UNK rate and pieces per word on the task's text
            inputs["heldout_files"], fps["heldout"], deps = member_files(
                ctx, task, "validation_files")
    return ctx.add("vocab", "vocab", b, inputs, fps, deps)


def adopted_vocab_size(ctx: PlanContext, path: str, location: Optional[Location]
                       ) -> Optional[int]:
    if uris.is_gcs(path):
        return None  # read at run time
    if not os.path.isfile(path):
        ctx.c.error(f"vocab.path: {path!r} does not exist", location,
                    hint="give a BERT vocab.txt or a SentencePiece .model, or set VOCAB = "
                         "None to train one")
        return None
    if path.endswith(".model"):
        import sentencepiece  # light (no TensorFlow); gives the exact piece count

        return sentencepiece.SentencePieceProcessor(model_file=path).get_piece_size()
    with open(path, encoding="utf-8", errors="replace") as f:
        tokens = [line.strip() for line in f if line.strip()]
    check_casing(ctx, tokens, location)
    return len(tokens)


def check_casing(ctx: PlanContext, tokens: list[str], location: Optional[Location]) -> None:
    """A vocab.txt with capitalised word pieces is cased; lower-casing then loses them."""
    words = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
    upper = sum(1 for t in words if any(ch.isupper() for ch in t))
    cased = upper > 0.01 * max(1, len(words))
    lower = ctx.r.get("vocab", "do_lower_case")
    where = ctx.loc("vocab", "do_lower_case")
    if cased and lower:
        ctx.c.error(f"DO_LOWER_CASE is True but the vocab is cased ({upper} of {len(words)} "
                    "tokens have capitals): capitalised words would never match",
                    where, hint="set DO_LOWER_CASE = False for a cased vocab")
    elif lower is False and upper == 0:
        ctx.c.warn("DO_LOWER_CASE is False but the vocab has no capitalised token: "
                   "capitalised words will fall apart into pieces or [UNK]", where,
                   hint="set DO_LOWER_CASE = True for an uncased vocab")
