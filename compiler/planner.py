"""Resolved configuration -> Plan: stages, their inputs and outputs, fingerprints, checks.

Usage:
    compiled = compile_experiment(["quickstart.gin"], ["TRAIN_STEPS=20"])
    compiled.plan            # the immutable Plan the runtime runs
    compiled.resolver        # for --explain
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from typing import Any, Optional, Sequence

from runexp.compiler import uris
from runexp.compiler.accelerators import ACCELERATORS
from runexp.compiler.estimates import estimate
from runexp.compiler.errors import ErrorCollector, Location, UserError, did_you_mean
from runexp.compiler.fingerprint import checkpoint_digest, files_digest, stage_fingerprint
from runexp.compiler.loader import load
from runexp.compiler.model_sizes import bert_config
from runexp.compiler.plan import RUN_TIME, Plan, Stage
from runexp.compiler.resolve import Resolver

# Pretrain params that may change while a run is continued from its checkpoints.
# Training files up to this size are read at compile time to check their labels.
LABEL_CHECK_BYTES = 16 << 20

# Google's released checkpoints live in directories named like uncased_L-12_H-768_A-12.
GOOGLE_RELEASE = re.compile(r"(?:^|/)(?:wwm_)?(?P<name>uncased|cased|multi_cased|multilingual|"
                            r"chinese)_L-(?P<layers>\d+)_H-(?P<hidden>\d+)_A-(?P<heads>\d+)/")
# Those trained on lower-cased text (google-research/bert's tokenization.py says which).
LOWER_CASED_RELEASES = ("uncased", "multilingual", "chinese")
# bert_config.json fields that must equal the model's for a checkpoint to load.
MODEL_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "vocab_size", "max_position_embeddings", "type_vocab_size", "hidden_act")

RESUMABLE_PARAMS = ("train_steps", "checkpoint_every", "keep_checkpoints", "log_every",
                    "steps_per_loop", "eval_every", "jit_compile")


@dataclasses.dataclass
class Compiled:
    plan: Plan
    resolver: Resolver
    collector: ErrorCollector


class _StageBuilder:
    """Collects one stage's params with their provenance."""

    def __init__(self, resolver: Resolver):
        self.resolver = resolver
        self.params: dict[str, Any] = {}
        self.provenance: dict[str, str] = {}

    def take(self, name: str, configurable: str, param: str, scope: str = "") -> Any:
        value = self.resolver.get(configurable, param, scope)
        self.params[name] = value
        self.provenance[name] = self.resolver.provenance(configurable, param, scope).short()
        return value

    def set(self, name: str, value: Any, why: str = "derived") -> Any:
        self.params[name] = value
        self.provenance[name] = why
        return value


class _Planner:
    def __init__(self, resolver: Resolver, collector: ErrorCollector, gin_files: Sequence[str]):
        self.r = resolver
        self.c = collector
        self.gin_files = gin_files
        self.stages: list[Stage] = []
        self.output_root = ""
        self.corpus_stage: Optional[Stage] = None
        self.checked_mixtures: dict[str, Optional[list[str]]] = {}  # checked (and reported) once

    # --- helpers -------------------------------------------------------------------------

    def loc(self, configurable: str, param: str, scope: str = "") -> Optional[Location]:
        return self.r.provenance(configurable, param, scope).location

    def add(self, stage_id: str, kind: str, b: _StageBuilder, inputs: dict,
            input_fps: dict, deps: Sequence[str], resume_exclude: Sequence[str] = ()) -> Stage:
        fingerprint = stage_fingerprint(kind, b.params, input_fps)
        resume_key = ""
        if resume_exclude:
            kept = {k: v for k, v in b.params.items() if k not in resume_exclude}
            resume_key = stage_fingerprint(kind, kept, input_fps)
        stage = Stage(id=stage_id, kind=kind, params=b.params, inputs=inputs,
                      output_dir=uris.join(self.output_root, stage_id), deps=tuple(deps),
                      fingerprint=fingerprint, resume_key=resume_key, provenance=b.provenance)
        self.stages.append(stage)
        return stage

    def files(self, patterns: list, label: str, location: Optional[Location],
              required: bool = True) -> tuple[list, dict, list]:
        """Resolves input globs: builtin:// -> corpus stage outputs; local -> absolute.

        Returns (uris, fingerprints, deps).
        """
        out, fps, deps = [], {}, []
        for pattern in patterns or []:
            if uris.is_builtin(pattern):
                corpus, name = uris.split_builtin(pattern)
                if corpus not in uris.BUILTIN_CORPORA or name not in uris.BUILTIN_CORPORA[corpus]:
                    valid = [f"{uris.BUILTIN_SCHEME}{c}/{n}" for c, ns in
                             uris.BUILTIN_CORPORA.items() for n in ns]
                    self.c.error(f"{label}: unknown builtin corpus file {pattern!r}", location,
                                 hint=did_you_mean(pattern, valid))
                    continue
                stage = self.ensure_corpus_stage()
                out.append(uris.join(stage.output_dir, name))
                fps[pattern] = stage.fingerprint
                deps.append(stage.id)
            elif uris.is_gcs(pattern):
                out.append(pattern)
                fps[pattern] = "checked at run time"
            else:
                path = uris.absolute(pattern)
                matched = uris.expand_local(path)
                if not matched and required:
                    self.c.error(f"{label}: {pattern!r} matches no file", location,
                                 hint="check the path or glob (relative paths are relative to "
                                      "the directory runexp is started in)")
                    continue
                out.append(path)
                fps[pattern] = files_digest(matched)
        return out, fps, sorted(set(deps))

    def check_batch(self, batch, accel, what: str, location: Optional[Location]) -> None:
        """Each replica takes an equal share of a batch."""
        if accel is not None and batch and batch % accel.replicas:
            self.c.error(f"{what} {batch} is not divisible by the {accel.replicas} replicas of "
                         f"{accel.name}", location,
                         hint=f"use a multiple of {accel.replicas}, e.g. "
                              f"{-(-batch // accel.replicas) * accel.replicas}")

    def ensure_corpus_stage(self) -> Stage:
        if self.corpus_stage is None:
            b = _StageBuilder(self.r)
            b.set("source", "python_stdlib_docstrings", "builtin:// corpus")
            b.take("min_bytes", "builtin_corpus", "min_bytes")
            b.take("heldout_fraction", "builtin_corpus", "heldout_fraction")
            b.take("finetune_classes", "builtin_corpus", "finetune_classes")
            b.take("seed", "builtin_corpus", "seed")
            b.set("python_version", "%d.%d" % sys.version_info[:2], "the running Python")
            self.corpus_stage = self.add("corpus", "corpus", b, {}, {}, [])
        return self.corpus_stage

    # --- the experiment ----------------------------------------------------------------

    def plan(self) -> Optional[Plan]:
        r, c = self.r, self.c
        root = r.get("experiment", "output_root")
        accel_name = r.get("experiment", "accelerator")
        accel = ACCELERATORS.get(accel_name) if accel_name else None
        if accel_name and accel is None:
            c.error(f"unknown accelerator profile {accel_name!r}",
                    self.loc("experiment", "accelerator"), hint=did_you_mean(accel_name, ACCELERATORS))
        if root is None:
            return None
        self.output_root = uris.absolute(root)
        if accel is not None and accel.needs_gcs and not uris.is_gcs(self.output_root):
            c.error(f"a TPU ({accel.name}) cannot write to the local path {root!r}",
                    self.loc("experiment", "output_root"),
                    hint="TPUs read and write only Cloud Storage: set OUTPUT_ROOT = 'gs://BUCKET/PATH'")
        name = r.get("experiment", "name") or os.path.splitext(
            os.path.basename(self.gin_files[0]))[0]

        task = r.get("train", "task")
        ft_task = r.get("finetune", "task")
        tasks = r.scopes("bert_pretraining_task")
        mixtures = r.scopes("bert_pretraining_mixture")
        if task is not None and task not in tasks and task not in mixtures:
            c.error(f"train.task names {task!r}, which is not a registered bert_pretraining_task "
                    "or bert_pretraining_mixture", self.loc("train", "task"),
                    hint=(did_you_mean(task, [*tasks, *mixtures]) or "") + f" (register one with "
                    f"{task}/bert_pretraining_task.train_files = [...])")
            return None
        if task is not None and self.pretraining_members(task) is None:
            return None
        if task is None and ft_task is None:
            c.error("nothing to run: neither train.task nor finetune.task is set",
                    Location(self.gin_files[0]),
                    hint="include runs/pretrain.gin (pretraining) or runs/finetune.gin "
                         "(fine-tuning a released checkpoint) and set what it requires")
            return None

        vocab = self.plan_vocab(task)
        pretrain = None
        if task is not None:
            pres = [self.plan_preprocess(t, vocab) for t in self.pretraining_members(task)]
            pretrain = self.plan_pretrain(pres[0] if task in tasks else pres, vocab, accel)
            if pretrain is None:
                return None
            if r.get("evaluate", "enabled"):
                held = [pre for pre in pres if pre.inputs["validation_files"]]
                for pre in pres:
                    if not pre.inputs["validation_files"]:
                        t = pre.params["task"]
                        c.warn("no held-out files: the evaluate stage is left out" if not held
                               else f"task {t!r} has no held-out files: the evaluate stage "
                                    "leaves it out",
                               self.loc("bert_pretraining_task", "validation_files", t),
                               hint="set HELDOUT_FILES (validation_files) to text not used for "
                                    "training")
                if held:
                    self.plan_evaluate(held[0] if task in tasks else held, pretrain)
        finetune = None
        if ft_task is not None:
            finetune = self.plan_finetune(ft_task, vocab, pretrain, accel)
            if finetune is None and pretrain is None:
                return None
        if r.get("export", "enabled"):
            self.plan_export(vocab, pretrain, finetune)
        launch = {k: r.get("experiment", k)
                  for k in ("max_attempts", "relaunch_backoff_s", "wall_time_hours")}
        return Plan(experiment=name, output_root=self.output_root, stages=tuple(self.stages),
                    accelerator=self.accelerator_dict(accel), launch=launch)

    def accelerator_dict(self, accel) -> dict:
        """The profile, plus where the TPU is (not in stage fingerprints: which TPU trains
        does not change what is trained)."""
        if accel is None:
            return {}
        out = accel.to_dict()
        if accel.type == "tpu":
            out.update(tpu=self.r.get("experiment", "tpu"), zone=self.r.get("experiment", "tpu_zone"),
                       project=self.r.get("experiment", "gcp_project"),
                       service_account=self.r.get("experiment", "tpu_service_account"))
        return out

    def plan_vocab(self, task: Optional[str]) -> Stage:
        b = _StageBuilder(self.r)
        path = b.take("vocab_path", "vocab", "path")
        b.take("do_lower_case", "vocab", "do_lower_case")
        inputs, fps, deps = {}, {}, []
        if path is None and task is None:
            # Fine-tuning a released checkpoint: token ids must be the ones it was trained on.
            self.c.error("fine-tuning a released checkpoint needs its vocabulary, but vocab.path "
                         "is not set", self.loc("vocab", "path") or self.loc("finetune", "task"),
                         hint="set VOCAB to the vocab.txt that came with the checkpoint")
            b.set("vocab_size", None, "unknown")
        elif path is None:
            b.take("vocab_size", "vocab", "size")
            b.take("model_type", "vocab", "model_type")
            b.take("max_sentences", "vocab", "max_sentences")
            b.take("seed", "vocab", "seed")
            # A mixture's one vocab is trained on the union of its tasks' text.
            inputs["train_files"], f1, d1 = self.member_files(task, "train_files")
            inputs["heldout_files"], f2, d2 = self.member_files(task, "validation_files")
            fps, deps = {"train": f1, "heldout": f2}, sorted(set(d1 + d2))
        else:
            b.params["vocab_path"] = uris.absolute(path)
            vocab_size = self.adopted_vocab_size(b.params["vocab_path"],
                                                 self.loc("vocab", "path"))
            b.set("vocab_size", vocab_size, RUN_TIME if vocab_size is None and uris.is_gcs(path)
                  else f"counted in {os.path.basename(path)}")
            inputs["vocab_file"] = b.params["vocab_path"]
            fps = {"vocab": files_digest([b.params["vocab_path"]])
                   if os.path.isfile(b.params["vocab_path"]) else "checked at run time"}
            if task is not None:  # the UNK rate and pieces per word on the task's text
                inputs["heldout_files"], fps["heldout"], deps = self.member_files(
                    task, "validation_files")
        return self.add("vocab", "vocab", b, inputs, fps, deps)

    def adopted_vocab_size(self, path: str, location: Optional[Location]) -> Optional[int]:
        if uris.is_gcs(path):
            return None  # read at run time
        if not os.path.isfile(path):
            self.c.error(f"vocab.path: {path!r} does not exist", location,
                         hint="give a BERT vocab.txt or a SentencePiece .model, or set VOCAB = "
                              "None to train one")
            return None
        if path.endswith(".model"):
            import sentencepiece  # light (no TensorFlow); gives the exact piece count

            return sentencepiece.SentencePieceProcessor(model_file=path).get_piece_size()
        with open(path, encoding="utf-8", errors="replace") as f:
            tokens = [line.strip() for line in f if line.strip()]
        self.check_casing(tokens, location)
        return len(tokens)

    def check_casing(self, tokens: list[str], location: Optional[Location]) -> None:
        """A vocab.txt with capitalised word pieces is cased; lower-casing then loses them."""
        words = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
        upper = sum(1 for t in words if any(ch.isupper() for ch in t))
        cased = upper > 0.01 * max(1, len(words))
        lower = self.r.get("vocab", "do_lower_case")
        where = self.loc("vocab", "do_lower_case")
        if cased and lower:
            self.c.error(f"DO_LOWER_CASE is True but the vocab is cased ({upper} of {len(words)} "
                         "tokens have capitals): capitalised words would never match",
                         where, hint="set DO_LOWER_CASE = False for a cased vocab")
        elif lower is False and upper == 0:
            self.c.warn("DO_LOWER_CASE is False but the vocab has no capitalised token: "
                        "capitalised words will fall apart into pieces or [UNK]", where,
                        hint="set DO_LOWER_CASE = True for an uncased vocab")

    def member_files(self, task: str, param: str) -> tuple[list, dict, list]:
        """``self.files`` of a task's train_files or validation_files; of a mixture, the
        union over its tasks (in name order)."""
        out, fps, deps = [], {}, []
        for t in self.pretraining_members(task) or [task]:
            patterns = self.r.get("bert_pretraining_task", param, t) or []
            found, f, d = self.files(patterns, f"{t}.{param}",
                                     self.loc("bert_pretraining_task", param, t))
            out.extend(u for u in found if u not in out)
            fps.update(f)
            deps.extend(d)
        return out, fps, sorted(set(deps))

    def pretraining_members(self, name: str) -> Optional[list[str]]:
        """The bert_pretraining_tasks that train.task = ``name`` trains on: the task itself,
        or a mixture's tasks in name order (the runtime samples them in that order, so
        reordering the gin dict changes nothing). None after reporting a problem."""
        if name not in self.r.scopes("bert_pretraining_mixture"):
            return [name]
        if name not in self.checked_mixtures:
            self.checked_mixtures[name] = self.check_mixture(name)
        return self.checked_mixtures[name]

    def check_mixture(self, name: str) -> Optional[list[str]]:
        tasks = self.r.scopes("bert_pretraining_task")
        mixtures = self.r.scopes("bert_pretraining_mixture")
        label = f"{name}/bert_pretraining_mixture.rates"
        loc = self.loc("bert_pretraining_mixture", "rates", name)
        errors = len(self.c.errors)
        if name in tasks:
            self.c.error(f"{name!r} is both a bert_pretraining_task and a "
                         "bert_pretraining_mixture", loc,
                         hint="rename one of them: tasks and mixtures share one seqio registry")
        rates = self.r.get("bert_pretraining_mixture", "rates", name)
        if rates is None:
            return None  # reported by the resolver
        if not rates:
            self.c.error(f"{label} is empty", loc,
                         hint="name the tasks and their rates, e.g. {'wiki': 0.7, 'books': 0.3}")
        for task, rate in rates.items():
            if task in mixtures:
                self.c.error(f"{label}: {task!r} is a mixture; the members of a mixture must "
                             "be bert_pretraining_tasks", loc,
                             hint=f"list the tasks of {task!r} here instead")
            elif task not in tasks:
                self.c.error(f"{label} names {task!r}, which is not a registered "
                             "bert_pretraining_task", loc,
                             hint=(did_you_mean(str(task), tasks) or "") + " (register one "
                             f"with {task}/bert_pretraining_task.train_files = [...])")
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) \
                    or not 0 < rate < float("inf"):
                self.c.error(f"{label}: the rate of {task!r} must be a positive number, got "
                             f"{rate!r}", loc,
                             hint="rates are relative: {'wiki': 0.7, 'books': 0.3} samples wiki "
                                  "7 times in 10")
        if len(self.c.errors) > errors:
            return None
        members = sorted(rates)
        shared = ["max_seq_length", "max_predictions_per_seq", "dynamic_masking"]
        why = {p: "one model reads every task's examples" for p in shared[:2]}
        why["dynamic_masking"] = "a batch mixes the tasks' examples"
        if all(self.r.get("bert_pretraining_task", "dynamic_masking", t) for t in members):
            for p in ("masked_lm_prob", "mask_token_prob", "random_token_prob",
                      "whole_word_masking"):
                shared.append(p)
                why[p] = "a batch of examples masked at training time is masked at once"
        first = members[0]
        for p in shared:
            want = self.r.get("bert_pretraining_task", p, first)
            for task in members[1:]:
                got = self.r.get("bert_pretraining_task", p, task)
                if got != want:
                    self.c.error(f"mixture {name!r}: task {task!r} has {p} = {got!r} but task "
                                 f"{first!r} has {want!r}",
                                 self.loc("bert_pretraining_task", p, task) or loc,
                                 hint=f"{why[p]}: give its tasks the same {p}")
        return None if len(self.c.errors) > errors else members

    def plan_preprocess(self, task: str, vocab: Stage) -> Stage:
        b = _StageBuilder(self.r)
        target = self.r.get("train", "task")
        if target == task:
            b.set("task", task, f"train.task @ {self.r.provenance('train', 'task').short()}")
        else:
            b.set("task", task, f"{target}/bert_pretraining_mixture.rates @ "
                  f"{self.r.provenance('bert_pretraining_mixture', 'rates', target).short()}")
        for p in ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "dupe_factor",
                  "short_seq_prob", "random_next_prob", "mask_token_prob", "random_token_prob",
                  "whole_word_masking", "pair_objective", "ngram_max", "dynamic_masking",
                  "random_seed", "num_shards", "num_workers"):
            b.take(p, "bert_pretraining_task", p, task)
        if b.params["dynamic_masking"]:
            self.check_dynamic_masking(task, b.params)
        b.set("do_lower_case", vocab.params["do_lower_case"], vocab.provenance["do_lower_case"])
        mask, rnd = b.params["mask_token_prob"], b.params["random_token_prob"]
        if mask is not None and rnd is not None and mask + rnd > 1.0 + 1e-9:
            self.c.error(f"mask_token_prob + random_token_prob = {mask + rnd:g} exceeds 1",
                         self.loc("bert_pretraining_task", "random_token_prob", task),
                         hint="the rest of the masked positions keep their token: use e.g. 0.8 and 0.1")
        length, preds = b.params["max_seq_length"], b.params["max_predictions_per_seq"]
        prob = b.params["masked_lm_prob"]
        if length and preds and prob is not None:
            expected = round(length * prob)
            if preds > length:
                self.c.error(f"max_predictions_per_seq ({preds}) exceeds max_seq_length ({length})",
                             self.loc("bert_pretraining_task", "max_predictions_per_seq", task),
                             hint=f"about max_seq_length x masked_lm_prob = {expected} is usual")
            elif preds < expected:
                self.c.warn(f"max_predictions_per_seq ({preds}) < max_seq_length x masked_lm_prob "
                            f"({expected}): fewer tokens than masked_lm_prob asks will be masked",
                            self.loc("bert_pretraining_task", "max_predictions_per_seq", task),
                            hint=f"set MAX_PREDICTIONS_PER_SEQ = {expected}")
        train = self.r.get("bert_pretraining_task", "train_files", task) or []
        held = self.r.get("bert_pretraining_task", "validation_files", task) or []
        loc_t = self.loc("bert_pretraining_task", "train_files", task)
        loc_v = self.loc("bert_pretraining_task", "validation_files", task)
        train_uris, f1, d1 = self.files(train, f"{task}.train_files", loc_t)
        if b.params["num_shards"] == 0:
            b.set("num_shards", *self.auto_shards(train_uris))
        held_uris, f2, d2 = self.files(held, f"{task}.validation_files", loc_v)
        if train and held and sorted(train_uris) == sorted(held_uris):
            self.c.warn("the held-out files are the training files: evaluation will measure "
                        "memorisation, not generalisation", loc_v,
                        hint="hold out documents the model never trains on")
        inputs = {"train_files": train_uris, "validation_files": held_uris,
                  "vocab_dir": vocab.output_dir}
        fps = {"train": f1, "validation": f2, "vocab": vocab.fingerprint}
        return self.add(f"preprocess.{task}", "preprocess", b, inputs, fps,
                        sorted(set(d1 + d2 + [vocab.id])))

    def check_dynamic_masking(self, task: str, params: dict) -> None:
        loc = self.loc("bert_pretraining_task", "dynamic_masking", task)
        if params["ngram_max"] and params["ngram_max"] > 1:
            self.c.error(f"{task}: dynamic_masking masks single tokens or whole words, not "
                         f"n-grams (ngram_max = {params['ngram_max']})",
                         self.loc("bert_pretraining_task", "ngram_max", task) or loc,
                         hint="set ngram_max = 1, or dynamic_masking = False for static n-gram "
                              "masks")
        dupe = params["dupe_factor"]
        if dupe and dupe > 1:
            self.c.warn(f"{task}: with dynamic_masking the train split is built in one pass; "
                        f"dupe_factor = {dupe} would only duplicate its instances (each epoch "
                        "draws new masks), so it applies to the validation split only",
                        self.loc("bert_pretraining_task", "dupe_factor", task) or loc,
                        hint=f"set {task}/bert_pretraining_task.dupe_factor = 1 to silence this")

    def auto_shards(self, train_uris: list) -> tuple[int, str]:
        """Shards bound each worker's memory and set the parallelism: one per 16 MB, at
        least 4. Decided here, not from the machine's cores, so output is the same anywhere."""
        size = 0
        for pattern in train_uris:
            if self.corpus_stage is not None and pattern.startswith(self.corpus_stage.output_dir):
                size += self.corpus_stage.params["min_bytes"] or 0
            elif uris.is_gcs(pattern):
                return 64, "auto: 64 for gs:// corpora (size known at run time)"
            else:
                size += sum(os.path.getsize(p) for p in uris.expand_local(pattern))
        shards = max(4, -(-size // (16 << 20)))
        return shards, f"auto: {size / 1e6:.1f} MB of text, one shard per 16 MB, at least 4"

    def model_config(self, b: _StageBuilder, vocab: Stage) -> Optional[dict]:
        size = self.r.get("model", "size")
        overrides = {}
        for p in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "vocab_size", "hidden_act", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                  "initializer_range"):
            overrides[p] = self.r.get("model", p)
        if size is None:
            return None
        vocab_size = vocab.params.get("vocab_size")
        if overrides["vocab_size"] is None and vocab_size is None \
                and vocab.params.get("vocab_path"):
            self.c.error("the vocab on gs:// is only counted at run time, so the model's "
                         "vocab_size is unknown", self.loc("model", "size"),
                         hint="set model.vocab_size to the vocab's token count (for a released "
                              "checkpoint: the rows of its embedding table, in bert_config.json)")
        if overrides["vocab_size"] is None:
            overrides["vocab_size"] = vocab_size
        elif vocab_size and overrides["vocab_size"] < vocab_size:
            padded = -(-vocab_size // 128) * 128
            self.c.error(f"model.vocab_size ({overrides['vocab_size']}) is smaller than the "
                         f"vocabulary ({vocab_size} tokens)", self.loc("model", "vocab_size"),
                         hint=f"set model.vocab_size = {padded} (the vocab size padded to a "
                              "multiple of 128) or leave it unset")
        config = bert_config(size, overrides)
        if config["hidden_size"] % config["num_attention_heads"]:
            self.c.error(f"hidden_size ({config['hidden_size']}) is not a multiple of "
                         f"num_attention_heads ({config['num_attention_heads']})",
                         self.loc("model", "num_attention_heads"),
                         hint="choose heads that divide the hidden size")
        b.set("model", config, f"model.size = {size!r} @ {self.r.provenance('model', 'size').short()}")
        return config

    def data_inputs(self, pre) -> tuple[dict, dict, list]:
        """Where a training or evaluation stage reads its data: one preprocess stage
        (``data_dir``), or a mixture's (``data_dirs``, task -> dir)."""
        if isinstance(pre, Stage):
            return {"data_dir": pre.output_dir}, {"data": pre.fingerprint}, [pre.id]
        return ({"data_dirs": {p.params["task"]: p.output_dir for p in pre}},
                {"data": {p.params["task"]: p.fingerprint for p in pre}}, [p.id for p in pre])

    def mixture_params(self, b: _StageBuilder) -> None:
        name = self.r.get("train", "task")
        prov = self.r.provenance("bert_pretraining_mixture", "rates", name).short()
        rates = self.r.get("bert_pretraining_mixture", "rates", name)
        b.set("mixture", name, f"train.task @ {self.r.provenance('train', 'task').short()}")
        b.set("mixture_rates", {t: float(rates[t]) for t in sorted(rates)}, prov)

    def plan_pretrain(self, pre, vocab: Stage, accel) -> Optional[Stage]:
        """``pre``: the preprocess stage, or a mixture's list of them."""
        pres = pre if isinstance(pre, list) else [pre]
        b = _StageBuilder(self.r)
        config = self.model_config(b, vocab)
        b.take("batch_size", "train", "batch_size")
        b.take("train_steps", "train", "steps")
        b.take("warmup_steps", "train", "warmup_steps")
        b.take("learning_rate", "train", "learning_rate")
        b.take("weight_decay", "train", "weight_decay")
        b.take("checkpoint_every", "train", "checkpoint_every")
        b.take("keep_checkpoints", "train", "keep_checkpoints")
        init = b.take("init_checkpoint", "train", "init_checkpoint")
        if init is not None:
            b.params["init_checkpoint"] = uris.absolute(init)
        b.take("steps_per_loop", "train", "steps_per_loop")
        b.take("log_every", "train", "log_every")
        b.take("seed", "train", "seed")
        for name in ("optimizer", "decay", "decay_power", "end_learning_rate", "clip_norm",
                     "grad_accum_steps", "compute_dtype", "jit_compile", "eval_every"):
            b.take(name, "train", name)
        if b.params["jit_compile"] is None:
            # bench/train.py: one CPU replica trains ~13% faster compiled; under
            # MirroredStrategy only the gradients compile, which gains little.
            b.set("jit_compile", accel is not None and (accel.type == "tpu" or accel.replicas == 1),
                  "auto: on for TPUs and for one replica (see train.jit_compile)")
        b.set("max_seq_length", pres[0].params["max_seq_length"],
              pres[0].provenance["max_seq_length"])
        b.set("max_predictions_per_seq", pres[0].params["max_predictions_per_seq"],
              pres[0].provenance["max_predictions_per_seq"])
        if isinstance(pre, list):
            self.mixture_params(b)
        b.set("accelerator", accel.to_dict() if accel else None, "experiment.accelerator")
        if config is None:
            return None
        length = b.params["max_seq_length"]
        if length and length > config["max_position_embeddings"]:
            self.c.error(f"max_seq_length ({length}) exceeds the model's max_position_embeddings "
                         f"({config['max_position_embeddings']})",
                         self.loc("bert_pretraining_task", "max_seq_length",
                                  pres[0].params["task"]),
                         hint="shorten MAX_SEQ_LENGTH or raise model.max_position_embeddings")
        batch = b.params["batch_size"]
        self.check_batch(batch, accel, "global batch size", self.loc("train", "batch_size"))
        accum = b.params["grad_accum_steps"]
        if accel is not None and batch and accum and batch % accel.replicas == 0 \
                and batch % (accel.replicas * accum):
            self.c.error(f"global batch size {batch} cannot be split into {accum} micro-batches "
                         f"across {accel.replicas} replica(s)", self.loc("train", "grad_accum_steps"),
                         hint=f"use a batch size divisible by {accel.replicas * accum}")
        dtype = b.params["compute_dtype"]
        if accel is not None and dtype == "mixed_float16" and accel.type == "tpu":
            self.c.error("mixed_float16 is for GPUs; TPUs compute in bfloat16",
                         self.loc("train", "compute_dtype"), hint="set train.compute_dtype = 'bfloat16'")
        steps, warmup = b.params["train_steps"], b.params["warmup_steps"]
        if steps and warmup is not None and warmup > steps:
            self.c.warn(f"warmup_steps ({warmup}) exceeds train steps ({steps}): the learning "
                        "rate never reaches its peak", self.loc("train", "warmup_steps"),
                        hint="warm up over about 1-10% of training")
        every, loop = b.params["checkpoint_every"], b.params["steps_per_loop"]
        if every and loop and every % loop:
            self.c.error(f"checkpoint_every ({every}) is not a multiple of steps_per_loop ({loop})",
                         self.loc("train", "checkpoint_every"),
                         hint="checkpoints are written between host loops")
        inputs, fps, deps = self.data_inputs(pre)
        inputs["vocab_dir"] = vocab.output_dir
        fps["vocab"] = vocab.fingerprint
        if init is not None:
            self.check_init_checkpoint(b.params["init_checkpoint"], config,
                                       self.loc("train", "init_checkpoint"), accel)
            inputs["init_checkpoint"] = b.params["init_checkpoint"]
            fps["init_checkpoint"] = checkpoint_digest(b.params["init_checkpoint"])
        return self.add("pretrain", "pretrain", b, inputs, fps, [*deps, vocab.id],
                        resume_exclude=RESUMABLE_PARAMS)

    def plan_evaluate(self, pre, pretrain: Stage) -> Stage:
        """``pre``: the preprocess stage, or the list of a mixture's with held-out files."""
        pres = pre if isinstance(pre, list) else [pre]
        b = _StageBuilder(self.r)
        b.set("model", pretrain.params["model"], pretrain.provenance["model"])
        b.take("batch_size", "evaluate", "batch_size")
        b.take("max_examples", "evaluate", "max_examples")
        b.set("max_seq_length", pres[0].params["max_seq_length"],
              pres[0].provenance["max_seq_length"])
        b.set("max_predictions_per_seq", pres[0].params["max_predictions_per_seq"],
              pres[0].provenance["max_predictions_per_seq"])
        inputs, fps, deps = self.data_inputs(pre)
        inputs["checkpoint_dir"] = pretrain.output_dir
        fps["checkpoint"] = pretrain.fingerprint
        return self.add("evaluate", "evaluate", b, inputs, fps, [*deps, pretrain.id])

    def plan_finetune(self, task: str, vocab: Stage, pretrain: Optional[Stage],
                      accel) -> Optional[Stage]:
        tasks = self.r.scopes("classification_task")
        if task not in tasks:
            self.c.error(f"finetune.task names {task!r}, which is not a registered "
                         "classification_task", self.loc("finetune", "task"),
                         hint=(did_you_mean(task, tasks) or "") + f" (register one with "
                         f"{task}/classification_task.train_file = '...')")
            return None
        b = _StageBuilder(self.r)
        b.set("task", task, self.r.provenance("finetune", "task").short())
        labels = b.take("labels", "classification_task", "labels", task)
        b.take("text_fields", "classification_task", "text_fields", task)
        b.take("label_field", "classification_task", "label_field", task)
        init = b.take("init_checkpoint", "finetune", "init_checkpoint")
        if pretrain is not None:
            b.set("model", pretrain.params["model"], pretrain.provenance["model"])
            if init is not None:
                self.c.error("finetune.init_checkpoint is set, but this experiment also "
                             "pretrains: the fine-tune starts from the pretrain stage",
                             self.loc("finetune", "init_checkpoint"),
                             hint="remove finetune.init_checkpoint, or drop pretraining (unset "
                                  "train.task) to fine-tune that checkpoint")
                return None
        else:
            if self.model_config(b, vocab) is None:
                return None
            if init is None:
                self.c.error("a fine-tune without pretraining needs a checkpoint to start from, "
                             "but finetune.init_checkpoint is not set",
                             self.loc("finetune", "init_checkpoint") or self.loc("finetune", "task"),
                             hint="set INIT_CHECKPOINT to the released checkpoint's prefix, e.g. "
                                  "'gs://BUCKET/uncased_L-12_H-768_A-12/bert_model.ckpt'")
                return None
            b.params["init_checkpoint"] = uris.absolute(init)
            self.check_init_checkpoint(b.params["init_checkpoint"], b.params["model"],
                                       self.loc("finetune", "init_checkpoint"), accel)
        for name in ("batch_size", "learning_rate", "warmup_steps", "weight_decay", "seed"):
            b.take(name, "finetune", name)
        b.take("train_steps", "finetune", "steps")
        length = b.take("max_seq_length", "finetune", "max_seq_length")
        b.take("compute_dtype", "train", "compute_dtype")
        b.set("accelerator", accel.to_dict() if accel else None, "experiment.accelerator")
        fields = b.params["text_fields"]
        if fields is not None and len(fields) not in (1, 2):
            self.c.error(f"{task}/classification_task.text_fields must name one or two fields, "
                         f"got {fields!r}", self.loc("classification_task", "text_fields", task),
                         hint="['sentence'] or ['sentence1', 'sentence2']")
        if labels is not None and len(set(labels)) < 2:
            self.c.error(f"{task}: a classification task needs at least two labels, got {labels!r}",
                         self.loc("classification_task", "labels", task))
        max_pos = b.params["model"]["max_position_embeddings"]
        if length and length > max_pos:
            self.c.error(f"finetune.max_seq_length ({length}) exceeds max_position_embeddings "
                         f"({max_pos})", self.loc("finetune", "max_seq_length"),
                         hint=f"use at most {max_pos}")
        self.check_batch(b.params["batch_size"], accel, "fine-tune batch size",
                         self.loc("finetune", "batch_size"))
        inputs, fps, deps = self.finetune_files(task)
        if labels is not None and "train_file" in inputs and not uris.is_gcs(inputs["train_file"]):
            self.check_labels(task, inputs["train_file"], labels, b.params["text_fields"],
                              b.params["label_field"])
        inputs["vocab_dir"] = vocab.output_dir
        fps["vocab"] = vocab.fingerprint
        deps.append(vocab.id)
        if pretrain is not None:
            inputs["checkpoint_dir"] = pretrain.output_dir
            fps["checkpoint"] = pretrain.fingerprint
            deps.append(pretrain.id)
        else:
            inputs["init_checkpoint"] = b.params["init_checkpoint"]
            fps["checkpoint"] = checkpoint_digest(b.params["init_checkpoint"])
        return self.add(f"finetune.{task}", "finetune", b, inputs, fps, sorted(set(deps)))

    def finetune_files(self, task: str) -> tuple[dict, dict, list]:
        """The task's train file and its named dev sets (dev_file is the set named "dev")."""
        inputs, fps, deps = {}, {}, []

        def one(value, label, location):
            found, fp, d = self.files([value], label, location)
            deps.extend(d)
            return (found[0] if found else None), fp

        train = self.r.get("classification_task", "train_file", task)
        loc_train = self.loc("classification_task", "train_file", task)
        if train is not None:
            found, fps["train_file"] = one(train, f"{task}.train_file", loc_train)
            if found:
                inputs["train_file"] = found
        dev_file = self.r.get("classification_task", "dev_file", task)
        dev_files = self.r.get("classification_task", "dev_files", task)
        loc_dev = self.loc("classification_task", "dev_files", task)
        named: dict = {}
        if dev_file is not None:
            named["dev"] = (dev_file, self.loc("classification_task", "dev_file", task))
        for name, value in (dev_files or {}).items():
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name) \
                    or not isinstance(value, str):
                self.c.error(f"{task}/classification_task.dev_files: entry {name!r}: {value!r} "
                             "must map a plain name to a file", loc_dev,
                             hint="e.g. {'matched': 'dev_matched.tsv', 'mismatched': "
                                  "'dev_mismatched.tsv'}")
                continue
            if name in named:
                self.c.error(f"{task}: dev set {name!r} is given by both dev_file and dev_files",
                             loc_dev, hint="use one of them")
                continue
            named[name] = (value, loc_dev)
        if not named:
            self.c.error(f"{task}: no dev set: set {task}/classification_task.dev_file or "
                         "dev_files", self.loc("classification_task", "train_file", task),
                         hint="the fine-tune is scored on each dev set")
        dev_uris = {}
        for name, (value, location) in named.items():
            found, fps[f"dev_files.{name}"] = one(value, f"{task}.dev_files[{name!r}]", location)
            if found:
                dev_uris[name] = found
                if found == inputs.get("train_file"):
                    self.c.warn(f"{task}: dev set {name!r} is the train file: accuracy will be "
                                "optimistic", location,
                                hint="evaluate on examples the model does not train on")
        inputs["dev_files"] = dev_uris
        return inputs, fps, deps

    def check_init_checkpoint(self, init: str, model: dict, location: Optional[Location],
                              accel) -> None:
        """The checkpoint must fit the model and the casing: checked from the name of a Google
        release directory (cheap, also on gs://) and from a local bert_config.json beside it."""
        if accel is not None and accel.needs_gcs and not uris.is_gcs(init):
            self.c.error(f"a TPU cannot read the local init_checkpoint {init!r}", location,
                         hint="copy the checkpoint to gs:// and point INIT_CHECKPOINT there")
        expected: dict = {}
        release = GOOGLE_RELEASE.search(init)
        if release:
            expected = {"num_hidden_layers": int(release["layers"]),
                        "hidden_size": int(release["hidden"]),
                        "num_attention_heads": int(release["heads"])}
            lower = release["name"] in LOWER_CASED_RELEASES
            if self.r.get("vocab", "do_lower_case") != lower:
                self.c.error(f"DO_LOWER_CASE is {not lower} but the checkpoint "
                             f"{release.group(0).strip('/')} was trained "
                             f"{'lower-cased' if lower else 'cased'}",
                             self.loc("vocab", "do_lower_case") or location,
                             hint=f"set DO_LOWER_CASE = {lower}")
        config_path = os.path.join(os.path.dirname(init), "bert_config.json")
        if not uris.is_gcs(init) and os.path.isfile(config_path):
            try:
                with open(config_path, encoding="utf-8") as f:
                    config = json.load(f)
            except (OSError, ValueError) as e:
                self.c.error(f"cannot read {config_path}: {e}", location)
                return
            expected.update({k: v for k, v in config.items() if k in MODEL_FIELDS})
        wrong = [f"{k}: checkpoint {v!r}, model {model.get(k)!r}" for k, v in sorted(
            expected.items()) if model.get(k) is not None and model.get(k) != v]
        if wrong:
            self.c.error(f"the init checkpoint does not fit the model ({'; '.join(wrong)})",
                         location or self.loc("model", "size"),
                         hint="choose the model size of the checkpoint (e.g. include "
                              "models/bert_large.gin) or set model.* to its bert_config.json")

    def check_labels(self, task: str, path: str, labels: list, text_fields, label_field) -> None:
        """Labels in the training data that the task does not list (when the file is small)."""
        if not os.path.isfile(path) or os.path.getsize(path) > LABEL_CHECK_BYTES or not text_fields:
            return
        from runexp.tasks.classification import load_examples  # light: numpy, no TensorFlow

        loc = self.loc("classification_task", "labels", task)
        try:
            found = {label for _, label in load_examples(path, text_fields, label_field)}
        except ValueError as e:
            self.c.error(f"{task}: cannot read the training data: {e}", loc,
                         hint="fix the file, or check text_fields and label_field")
            return
        unknown = sorted(found - set(labels))
        if unknown:
            self.c.error(f"{task}: the training data has {len(found)} labels, "
                         f"{len(unknown)} of them not in {task}/classification_task.labels: "
                         f"{', '.join(map(repr, unknown[:5]))}", loc,
                         hint="add them to labels, or leave labels unset to read them from the data")

    def plan_export(self, vocab: Stage, pretrain: Optional[Stage],
                    finetune: Optional[Stage]) -> Optional[Stage]:
        """Exports the fine-tuned model when there is one, else the pretrained encoder."""
        source = finetune or pretrain
        if source is None:
            return None
        b = _StageBuilder(self.r)
        b.set("model", source.params["model"], source.provenance["model"])
        inputs = {"vocab_dir": vocab.output_dir}
        fps = {"vocab": vocab.fingerprint}
        deps = [vocab.id]
        if pretrain is not None:
            inputs["checkpoint_dir"] = pretrain.output_dir
            fps["checkpoint"] = pretrain.fingerprint
            deps.append(pretrain.id)
        if finetune is not None:
            inputs["finetune_dir"] = finetune.output_dir
            fps["finetune"] = finetune.fingerprint
            deps.append(finetune.id)
        return self.add("export", "export", b, inputs, fps, deps)


def operative_config(resolver: Resolver) -> str:
    """Every value the plan used, one `name = value  # where` line each."""
    lines = []
    for (scope, configurable, param), prov in sorted(resolver._provenance.items()):
        lines.append(f"{prov.name} = {prov.value!r}  # {prov.short()}")
    return "\n".join(lines) + "\n"


def _check_estimates(plan: Plan, resolver: Resolver, collector: ErrorCollector) -> None:
    est = estimate(plan)
    if est is None or not plan.accelerator:
        return
    limit = plan.accelerator["memory_gb_per_replica"]
    if limit and est.memory_gb_per_replica > limit:
        collector.warn(f"pretraining needs about {est.memory_gb_per_replica:.1f} GB per replica; "
                       f"{plan.accelerator['name']} has {limit:g} GB",
                       resolver.provenance("train", "batch_size").location,
                       hint="lower BATCH_SIZE or MAX_SEQ_LENGTH, or choose a larger accelerator")


def compile_experiment(gin_files: Sequence[str], gin_params: Sequence[str] = (),
                       search_paths: Sequence[str] = ()) -> Compiled:
    """Loads, resolves and plans an experiment.

    Raises:
      UserError: every problem found, each with its file and line.
    """
    config = load(gin_files, gin_params, search_paths)
    collector = ErrorCollector()
    resolver = Resolver(config, collector)
    resolver.check_names()
    planner = _Planner(resolver, collector, gin_files)
    plan = planner.plan()
    if plan is not None and not collector.errors:
        _check_estimates(plan, resolver, collector)
    collector.raise_if_any()
    if plan is None:  # every path that returns None reports an error; this is a bug if not
        raise UserError("internal error: the experiment could not be planned and no reason "
                        "was recorded; please report it with your gin files")
    plan = dataclasses.replace(
        plan,
        warnings=tuple(w.render() for w in collector.warnings),
        gin_files=tuple(config.top_level),
        gin_files_read=tuple(config.files),
        gin_params=tuple(gin_params),
        gin_search_paths=tuple(os.path.abspath(p) for p in search_paths),
        imports=tuple(f"{text}  # {loc}" for text, loc in config.imports),
        operative_config=operative_config(resolver),
    )
    return Compiled(plan=plan, resolver=resolver, collector=collector)
