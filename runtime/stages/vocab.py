"""The vocab stage: train a SentencePiece vocab or adopt a given one, and report on it.

See docs/STAGES.md ("vocab"). Writes vocab.txt, spm.model (SentencePiece only), report.json.
"""

from __future__ import annotations

import os

from runexp.compiler.specs import VocabSpec
from runexp.runtime.context import StageContext
from runexp.tasks import spm_vocab
from runexp.tasks.text_files import expand_globs, sample_lines

_DIAGNOSTIC_LINES = 20_000


def run(ctx: StageContext) -> dict:
    spec = VocabSpec.from_stage(ctx)
    train_files = expand_globs(ctx.inputs.get("train_files") or [])
    heldout_patterns = ctx.inputs.get("heldout_files") or []
    if spec.vocab_path:
        # The input is the local copy of a gs:// vocab (a one-file list), or the path itself.
        local = ctx.inputs.get("vocab_file") or spec.vocab_path
        local = local[0] if isinstance(local, list) else local
        ctx.progress(f"adopting {spec.vocab_path}")
        vocab_type = spm_vocab.adopt_vocab(local, ctx.work_dir)
    else:
        ctx.progress(f"training a {spec.model_type} SentencePiece vocab of {spec.vocab_size} "
                     f"on up to {spec.max_sentences:,} lines of {len(train_files)} file(s)")
        spm_vocab.train_sentencepiece(
            train_files, ctx.work_dir, vocab_size=spec.vocab_size,
            do_lower_case=spec.do_lower_case, model_type=spec.model_type,
            max_sentences=spec.max_sentences, seed=spec.seed,
            num_threads=min(os.cpu_count() or 1, 8))
        vocab_type = "sentencepiece"
    # Held-out text when there is some; else a train sample (then the UNK rate is optimistic).
    diag_files = expand_globs(heldout_patterns) if heldout_patterns else train_files
    seed = 0 if spec.vocab_path else spec.seed  # an adopted vocab has no sampling seed
    lines = sample_lines(diag_files, _DIAGNOSTIC_LINES, seed + 1) if diag_files else []
    report = spm_vocab.write_report(ctx.work_dir, vocab_type, spec.do_lower_case, lines,
                                    "held-out text" if heldout_patterns else "a train sample")
    if "warning" in report:
        ctx.progress("WARNING: " + report["warning"])
    summary = {k: report[k] for k in ("vocab_size", "unk_rate", "pieces_per_word")}
    summary["type"] = vocab_type
    summary["diagnostics_on"] = ("heldout" if heldout_patterns else
                                 "train sample" if train_files else "no text (none given)")
    if "warning" in report:
        summary["warning"] = report["warning"]
    return summary
