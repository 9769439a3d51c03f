"""Planning the vocab stage: adopt a vocab.txt or SentencePiece model, or train one.

A trained vocab reads the train text of every task it serves (a mixture's: all of them),
and the vocab's report measures the held-out text. Each task's text is read in its format
(compiler/specs/source.py); the stage's params are VocabSpec's alone, so the formats are in
its inputs, and in their fingerprints:

- every task in ``sentence_lines``: ``train_files`` and ``heldout_files``, the union of the
  tasks' globs (the plans of earlier runexp versions, unchanged);
- else ``sources``: per task its ``format`` and the settings the format reads, with
  ``train_files`` and ``heldout_files`` for a text format; a seqio source (``tfds``,
  ``seqio_documents``) names the preprocess stage that carries its settings
  (``settings_from``: a ``tfds_data_dir`` on gs:// must not be copied like an input file)
  and the stage gets the gin-imported ``modules``. A format that brings ready-made
  examples (``seqio_bert_features``, ``bert_tfrecord``) has no text, and is left out.
"""

from __future__ import annotations

import os
from typing import Optional

from runexp.compiler import uris
from runexp.compiler.errors import Location, Problem
from runexp.compiler.formats.huggingface_dir import TOKENIZER_FILE, HuggingFaceDirError, wordpiece_vocab
from runexp.compiler.plan import RUN_TIME, Stage
from runexp.compiler.specs import VocabSpec
from runexp.compiler.specs.vocab import SPECIAL_TOKENS
from runexp.compiler.vocab_roles import MISSING_ROLES_HINT, sentencepiece_roles
from runexp.compiler.specs.source import SourceSpec
from runexp.compiler.stages.common import PlanContext, StageBuilder
from runexp.compiler.stages.huggingface_init import HuggingFaceInit
from runexp.compiler.stages.mixture import member_files, member_source, pretraining_members
from runexp.compiler.user_modules import planned_modules

TASK = "bert_pretraining_task"


def plan_vocab(ctx: PlanContext, task: Optional[str],
               hf: Optional[HuggingFaceInit] = None) -> Stage:
    """An adopted vocab's stage carries vocab_path, do_lower_case and the vocab_size counted
    in the file (an adopted SentencePiece model's provenance of it also says which piece
    plays each of BERT's special roles); a trained one's every VocabSpec field. With VOCAB
    unset and a Hugging Face init_checkpoint ``hf``, its vocabulary and casing are adopted."""
    b = StageBuilder(ctx.r)
    path = b.take("vocab_path", "vocab", "path")
    b.take("do_lower_case", "vocab", "do_lower_case")
    if path is None and hf is not None and not hf.refused:
        path = _adopt_huggingface_vocab(ctx, b, hf)
    inputs, fps, deps = {}, {}, []
    if path is None and task is None:
        # Fine-tuning a released checkpoint: token ids must be the ones it was trained on.
        ctx.c.error("fine-tuning a released checkpoint needs its vocabulary, but vocab.path "
                    "is not set", ctx.loc("vocab", "path") or ctx.loc("finetune", "task"),
                    hint="set VOCAB to the vocab.txt that came with the checkpoint")
        b.set("vocab_size", None, "unknown")
    elif path is None:
        b.take_spec(VocabSpec, "vocab")
        if b.params["vocab_type"] == "wordpiece":  # model_type is SentencePiece's
            b.params.pop("model_type", None)
            b.provenance.pop("model_type", None)
        # A mixture's one vocab is trained on the union of its tasks' text.
        inputs, fps, deps = text_inputs(ctx, task, train=True)
    else:
        b.params["vocab_path"] = uris.absolute(path)
        vocab_size, roles = adopted_vocab(ctx, b.params["vocab_path"], ctx.loc("vocab", "path"),
                                          b.params["do_lower_case"])
        # Provenance, not a param: the file's fingerprint already holds what the roles are.
        b.set("vocab_size", vocab_size, RUN_TIME if vocab_size is None and uris.is_gcs(path)
              else f"counted in {os.path.basename(path)}" + (f"; roles {roles}" if roles
                                                              else ""))
        inputs["vocab_file"] = b.params["vocab_path"]
        fps = {"vocab": ctx.file_digest(b.params["vocab_path"])}
        if task is not None:  # the UNK rate and pieces per word on the task's text
            held, held_fps, deps = text_inputs(ctx, task, train=False)
            inputs.update(held)
            fps.update(held_fps)
    return ctx.add("vocab", "vocab", b, inputs, fps, deps)


def _adopt_huggingface_vocab(ctx: PlanContext, b: StageBuilder, hf: HuggingFaceInit) -> str:
    """The vocabulary file of a Hugging Face init_checkpoint (vocab.txt, else tokenizer.json)
    as vocab_path, and its tokenizer's casing as do_lower_case unless the experiment sets
    DO_LOWER_CASE itself (then they must agree: compiler/stages/encoder.py checks)."""
    record, where = hf.record, f"the vocabulary of init_checkpoint {hf.path.rstrip('/')}"
    if record is None:  # a gs:// directory not read now (--offline): its usual vocab.txt
        path = hf.path.rstrip("/") + "/vocab.txt"
        b.set("vocab_path", path, where + " (not read: planned without listing it)")
        return path
    path = record.vocab_file or record.tokenizer_file
    b.set("vocab_path", path, where)
    bound = ctx.loc("vocab", "do_lower_case")
    if bound is None or bound.file.startswith("gin/runs/"):  # a run template's default
        b.set("do_lower_case", record.do_lower_case,
              f"the tokenizer of init_checkpoint {hf.path.rstrip('/')}")
    return path


def text_inputs(ctx: PlanContext, task: str, train: bool) -> tuple[dict, dict, list]:
    """Inputs, fingerprints and dependencies of the text of ``task``'s members (module
    docstring): train and held-out text, or (``train`` False) held-out text only."""
    members = [(t, member_source(ctx, t)) for t in pretraining_members(ctx, task) or [task]]
    members = [(t, s) for t, s in members if s.makes_instances]  # the others bring no text
    inputs, fps, deps = {}, {}, []
    if all(s.format == SourceSpec.format for _, s in members):  # the files' default format
        names = [t for t, _ in members]
        if train:
            inputs["train_files"], fps["train"], d = member_files(ctx, task, "train_files",
                                                                  names)
            deps += d
        inputs["heldout_files"], fps["heldout"], d = member_files(ctx, task,
                                                                  "validation_files", names)
        return inputs, fps, sorted(set(deps + d))
    sources, settings_fps, seqio = {}, {}, False
    fps = {"train": {}, "heldout": {}} if train else {"heldout": {}}
    for t, source in members:
        settings = {"format": source.format,
                    **{name: getattr(source, name) for name in source.source_format.settings}}
        settings_fps[t] = settings
        if not source.reads_text_files:
            seqio = True
            sources[t] = {"format": source.format, "settings_from": f"preprocess.{t}"}
            continue
        entry = dict(settings)
        for param, key, fp in (("train_files", "train_files", "train"),
                               ("validation_files", "heldout_files", "heldout")):
            if fp in fps:
                entry[key], found, d = ctx.files(ctx.r.get(TASK, param, t) or [],
                                                 f"{t}.{param}", ctx.loc(TASK, param, t))
                fps[fp].update(found)
                deps += d
        sources[t] = entry
    inputs["sources"] = sources
    fps["sources"] = settings_fps
    if seqio:
        inputs["modules"], modules_fps = planned_modules(ctx)
        fps.update(modules_fps)
    return inputs, fps, sorted(set(deps))


def adopted_vocab(ctx: PlanContext, path: str, location: Optional[Location],
                  lower: bool) -> tuple[Optional[int], str]:
    """An adopted vocab's size (None: read at run time, or the file is refused) and, for a
    SentencePiece model, which piece plays each special role ("" for a vocab.txt, whose
    roles are its tokens' spellings)."""
    if uris.is_gcs(path):
        return None, ""  # read at run time
    if not os.path.isfile(path):
        ctx.c.error(f"vocab.path: {path!r} does not exist", location,
                    hint="give a BERT vocab.txt or a SentencePiece .model, or set VOCAB = "
                         "None to train one")
        return None, ""
    if path.endswith(".model"):
        return _spm_facts(ctx, path, location)
    if os.path.basename(path) == TOKENIZER_FILE:  # a Hugging Face directory's, no vocab.txt
        try:
            return len(wordpiece_vocab(path)), ""
        except HuggingFaceDirError as e:
            ctx.c.error(f"vocab.path: {e.file}: {e.message}", location, hint=e.hint)
            return None, ""
    tokens = _vocab_tokens(ctx, path, location)
    if tokens is None:
        return None, ""
    check_casing(ctx, tokens, location, lower)
    return len(tokens), ""


def _spm_facts(ctx: PlanContext, path: str, location: Optional[Location]
               ) -> tuple[Optional[int], str]:
    """The piece count of a SentencePiece model and its roles ("[PAD]=<pad> (0), ...");
    a file that is not a model, or a model without a piece for a role, is an error."""
    import sentencepiece  # light (no TensorFlow); gives the exact piece count

    try:
        processor = sentencepiece.SentencePieceProcessor(model_file=path)
    except (RuntimeError, OSError) as e:
        ctx.c.error(f"vocab.path: {path} is not a SentencePiece model "
                    f"({str(e).splitlines()[0][:120]})", location,
                    hint="give the .model file SentencePiece trained (not the .vocab), or a "
                         "BERT vocab.txt")
        return None, ""
    # [UNK] and [PAD] are roles: ALBERT's <unk> and <pad> play them.
    roles, missing = sentencepiece_roles(processor)
    if missing:
        ctx.c.error(f"vocab.path: {path} has no piece {', '.join(missing)}", location,
                    hint=MISSING_ROLES_HINT)
        return processor.get_piece_size(), ""
    return processor.get_piece_size(), ", ".join(
        f"{role}={processor.id_to_piece(i)} ({i})" for role, i in roles.items())


def _vocab_tokens(ctx: PlanContext, path: str, location: Optional[Location]
                  ) -> Optional[list[str]]:
    """A BERT vocab.txt's tokens, one a line (the line number is the id, as
    google-research/bert's load_vocab reads it); checked: UTF-8, no blank line, no
    duplicate, BERT's special tokens present."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith((b"\x1f\x8b", b"PK\x03\x04")) or b"\x00" in data[:4096]:
        ctx.c.error(f"vocab.path: {path} is not a text file", location,
                    hint="give a BERT vocab.txt (one token per line) or a SentencePiece .model")
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        ctx.c.problems([Problem(f"vocab.txt is not UTF-8 (byte {data[e.start]:#04x})",
                                Location(path, line), "save it as UTF-8")])
        return None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the last line
    tokens = [line.strip() for line in lines]
    problems = []
    blank = [i + 1 for i, t in enumerate(tokens) if not t]
    if blank:
        problems.append(Problem(f"vocab.txt has {len(blank)} blank line(s): each line is a "
                                "token, its line number the id", Location(path, blank[0]),
                                "remove the blank lines (or replace each with an unused "
                                "token such as [unused0], keeping the ids of what follows)"))
    seen: dict = {}
    for i, t in enumerate(tokens):
        if t and t in seen:
            problems.append(Problem(f"vocab.txt lists {t!r} twice (lines {seen[t] + 1} and "
                                    f"{i + 1}): one of the two ids can never be produced",
                                    Location(path, i + 1, 0, t),
                                    "remove the duplicate, or rename it to an unused token"))
            break
        seen[t] = i
    missing = [t for t in SPECIAL_TOKENS if t not in seen]
    if missing:
        problems.append(Problem(f"vocab.txt has no {', '.join(missing)}: BERT needs them for "
                                "its inputs ([CLS] a [SEP] b [SEP]), padding and masks",
                                Location(path), "add them (google-research/bert's vocabs "
                                "have them at ids 0, 100-103), or let runexp train a vocab "
                                "(VOCAB = None)"))
    if problems:
        ctx.c.problems(problems)
        return None
    return tokens


def check_casing(ctx: PlanContext, tokens: list[str], location: Optional[Location],
                 lower: bool) -> None:
    """A vocab.txt with capitalised word pieces is cased; lower-casing then loses them."""
    words = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
    upper = sum(1 for t in words if any(ch.isupper() for ch in t))
    cased = upper > 0.01 * max(1, len(words))
    where = ctx.loc("vocab", "do_lower_case")
    if cased and lower:
        ctx.c.error(f"DO_LOWER_CASE is True but the vocab is cased ({upper} of {len(words)} "
                    "tokens have capitals): capitalised words would never match",
                    where, hint="set DO_LOWER_CASE = False for a cased vocab")
    elif lower is False and upper == 0:
        ctx.c.warn("DO_LOWER_CASE is False but the vocab has no capitalised token: "
                   "capitalised words will fall apart into pieces or [UNK]", where,
                   hint="set DO_LOWER_CASE = True for an uncased vocab")
