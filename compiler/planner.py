"""Resolved configuration -> Plan: the stages an experiment needs, chained.

Each kind's planning and checks live in compiler/stages/<kind>.py; this module decides which
stages the experiment has and in what order, then checks the plan as a whole.

Usage:
    compiled = compile_experiment(["quickstart.gin"], ["TRAIN_STEPS=20"])
    compiled.plan            # the immutable Plan the runtime runs
    compiled.resolver        # for --explain
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

from runexp.compiler import uris
from runexp.compiler.ablation import merge, read_ablation
from runexp.compiler.accelerators import ACCELERATORS
from runexp.compiler.errors import ErrorCollector, Location, UserError, did_you_mean
from runexp.compiler.estimates import estimate, fit_options, memory_params, stage_memory
from runexp.compiler.loader import load
from runexp.compiler.plan import Plan
from runexp.compiler.resolve import Resolver
from runexp.compiler.specs import TrainSpec
from runexp.compiler.specs.launch import LAUNCH_FIELDS
from runexp.compiler.stages.common import PlanContext, has_validation
from runexp.compiler.stages.evaluate import plan_evaluate
from runexp.compiler.stages.export import plan_export
from runexp.compiler.stages.finetune import plan_finetune
from runexp.compiler.stages.mixture import pretraining_members
from runexp.compiler.stages.phases import read_phases
from runexp.compiler.stages.preprocess import plan_preprocess
from runexp.compiler.stages.pretrain import plan_pretrain
from runexp.compiler.stages.suite import plan_suite
from runexp.compiler.stages.huggingface_init import huggingface_init, init_checkpoint
from runexp.compiler.stages.vocab import plan_vocab
from runexp.compiler.sweep import read_grid


@dataclasses.dataclass
class Compiled:
    plan: Plan
    resolver: Resolver
    collector: ErrorCollector


def _plan(ctx: PlanContext) -> Optional[Plan]:
    """vocab -> preprocess (one per task and phase) -> pretrain (one per phase) -> evaluate
    -> finetune (one, or one per task of a suite, then the suite stage) -> export. None after
    reporting why nothing can be planned."""
    r, c = ctx.r, ctx.c
    root = r.get("experiment", "output_root")
    accel_name = r.get("experiment", "accelerator")
    accel = ACCELERATORS.get(accel_name) if accel_name else None
    if accel_name and accel is None:
        c.error(f"unknown accelerator profile {accel_name!r}",
                ctx.loc("experiment", "accelerator"), hint=did_you_mean(accel_name, ACCELERATORS))
    if root is None:
        return None
    ctx.output_root = uris.absolute(root)
    if accel is not None and accel.needs_gcs and not uris.is_gcs(ctx.output_root):
        c.error(f"a TPU ({accel.name}) cannot write to the local path {root!r}",
                ctx.loc("experiment", "output_root"),
                hint="TPUs read and write only Cloud Storage: set OUTPUT_ROOT = 'gs://BUCKET/PATH'")
    name = r.get("experiment", "name") or os.path.splitext(os.path.basename(ctx.gin_files[0]))[0]

    task = r.get("train", "task")
    ft_task = r.get("finetune", "task")
    suite = r.get("finetune", "suite") or []
    tasks = r.scopes("bert_pretraining_task")
    mixtures = r.scopes("bert_pretraining_mixture")
    if task is not None and task not in tasks and task not in mixtures:
        c.error(f"train.task names {task!r}, which is not a registered bert_pretraining_task "
                "or bert_pretraining_mixture", ctx.loc("train", "task"),
                hint=(did_you_mean(task, [*tasks, *mixtures]) or "") + f" (register one with "
                f"{task}/bert_pretraining_task.train_files = [...])")
        return None
    if task is not None and pretraining_members(ctx, task) is None:
        return None
    if task is None and ft_task is None and not suite:
        c.error("nothing to run: neither train.task nor finetune.task is set",
                Location(ctx.gin_files[0]),
                hint="include runs/pretrain.gin (pretraining) or runs/finetune.gin "
                     "(fine-tuning a released checkpoint) and set what it requires")
        return None
    if ft_task is not None and suite:
        c.error(f"finetune.task ({ft_task!r}) and finetune.suite are both set",
                ctx.loc("finetune", "suite"),
                hint=f"fine-tune one task (unset FINETUNE_SUITE) or a suite (unset "
                     f"FINETUNE_TASK; the suite may name {ft_task!r})")
        return None

    # A Hugging Face init_checkpoint brings its vocabulary and casing when VOCAB is unset.
    init_of = "train" if task is not None else "finetune"
    init = init_checkpoint(ctx, init_of)
    hf = init and huggingface_init(ctx, init, ctx.loc(init_of, "init_checkpoint"))
    vocab = plan_vocab(ctx, task, hf)
    pretrain = None
    if task is None and r.get("train", "phases"):
        c.warn("train.phases is set, but this experiment does not pretrain (train.task is "
               "None): it is ignored", ctx.loc("train", "phases"),
               hint="remove it, or set train.task to pretrain in phases")
    if task is not None:
        phases = read_phases(ctx)
        if phases is None:
            return None
        members = pretraining_members(ctx, task)
        # The data of every phase first, then the training: a TPU run finds all of it made
        # (and --until=preprocess makes all of it on a cheap machine).
        firsts = [plan_preprocess(ctx, t, vocab, phases[0]) for t in members]
        by_phase = [firsts] + [[plan_preprocess(ctx, t, vocab, phase, first)
                                for t, first in zip(members, firsts)] for phase in phases[1:]]
        for phase, pres in zip(phases, by_phase):
            pretrain = plan_pretrain(ctx, pres[0] if task in tasks else pres, vocab, accel,
                                     phase, previous=pretrain)
            if pretrain is None:
                return None
        if r.get("evaluate", "enabled"):  # on the last phase's model and held-out examples
            _plan_evaluate(ctx, by_phase[-1], pretrain, single=task in tasks, firsts=firsts)
    finetune = None
    grid = read_grid(ctx)  # finetune.sweep: one finetune stage per point (compiler/sweep.py)
    if ft_task is not None:
        finetune = plan_finetune(ctx, ft_task, vocab, pretrain, accel, grid=grid)
        if finetune is None and pretrain is None:
            return None
    elif suite:  # several fine-tunes: the export (if any) is of the pretrained encoder
        if not plan_suite(ctx, suite, vocab, pretrain, accel, grid=grid) and pretrain is None:
            return None
    if r.get("export", "enabled"):
        plan_export(ctx, vocab, pretrain, finetune)
    launch = {k: r.get("experiment", k) for k in LAUNCH_FIELDS}
    return Plan(experiment=name, output_root=ctx.output_root, stages=tuple(ctx.stages),
                accelerator=_accelerator(ctx, accel), launch=launch)


def _plan_evaluate(ctx: PlanContext, pres: list, pretrain, single: bool, firsts: list) -> None:
    """Evaluates on the held-out split of every task that has one; warns for the others.
    ``pres``: the last phase's preprocess stages; ``firsts``: the first phase's, which read
    the held-out data (a later phase's make their examples from them)."""
    held = [pre for pre, first in zip(pres, firsts) if has_validation(first)]
    for pre in firsts:
        if not has_validation(pre):
            t = pre.params["task"]
            seqio = "seqio_task" in pre.params or "tfds_name" in pre.params
            ctx.c.warn("no held-out data: the evaluate stage is left out" if not held
                       else f"task {t!r} has no held-out data: the evaluate stage leaves it out",
                       ctx.loc("bert_pretraining_task", "validation_split" if seqio
                               else "validation_files", t),
                       hint=f"set {t}/bert_pretraining_task.validation_split to a split the "
                            "model does not train on" if seqio else
                            "set HELDOUT_FILES (validation_files) to text not used for "
                            "training")
    if held:
        plan_evaluate(ctx, held[0] if single else held, pretrain)


def _accelerator(ctx: PlanContext, accel) -> dict:
    """The profile, plus where the TPU is (not in stage fingerprints: which TPU trains does
    not change what is trained)."""
    if accel is None:
        return {}
    out = accel.to_dict()
    if accel.type == "tpu":
        out.update(tpu=ctx.r.get("experiment", "tpu"), zone=ctx.r.get("experiment", "tpu_zone"),
                   project=ctx.r.get("experiment", "gcp_project"),
                   service_account=ctx.r.get("experiment", "tpu_service_account"))
    return out


# Parameters holding local paths: written absolute, so the file replays from anywhere.
_PATH_PARAMS = frozenset({"output_root", "path", "train_files", "validation_files",
                          "train_file", "dev_file", "dev_files", "init_checkpoint",
                          "tfds_data_dir"})


def _absolute_paths(value):
    if isinstance(value, str):
        return uris.absolute(value) if value else value
    if isinstance(value, (list, tuple)):
        return [_absolute_paths(v) for v in value]
    if isinstance(value, dict):
        return {k: _absolute_paths(v) for k, v in value.items()}
    return value


def operative_config(resolver: Resolver, experiment: str, imports: Sequence[str]) -> str:
    """Every value the plan used, one `name = value  # where` line each: a gin file that
    replays the experiment from any directory (local paths absolute, the experiment's name
    bound, the gin imports first)."""
    lines = [f"# The values experiment {experiment!r} was planned with; replay it with",
             "#   runexp --gin_file=operative_config.gin", *imports]
    for (scope, configurable, param), prov in sorted(resolver._provenance.items()):
        value = prov.value
        if configurable == "experiment" and param == "name":
            value = experiment  # else the replay would be named after this file
        elif param in _PATH_PARAMS and value is not None:
            value = _absolute_paths(value)
        lines.append(f"{prov.name} = {value!r}  # {prov.short()}")
    return "\n".join(lines) + "\n"


def _setting_name(name: str, value, phased: bool, number: int) -> str:
    """How the user sets ``name`` for this stage: a phase's key when the phase may set it."""
    setting = next(s for s in TrainSpec.settings() if s.name == name)
    if phased and setting.phase:  # a phase's key is the gin parameter's name
        return f"phase {number}'s {setting.gin!r}: {value!r}"
    return f"train.{setting.gin} = {value!r}"


def _check_estimates(plan: Plan, resolver: Resolver, collector: ErrorCollector) -> None:
    """A pretraining phase whose memory estimate exceeds the accelerator's is an error listing
    the changes that would fit, each with its estimate; experiment.memory_check = 'warn'
    plans it anyway, recorded as a warning."""
    if not plan.accelerator:
        return
    limit = plan.accelerator["memory_gb_per_replica"]
    if not limit:
        return
    overridden = resolver.get("experiment", "memory_check") == "warn"
    pretrains = [s for s in plan.stages if s.kind == "pretrain"]
    phased = len(pretrains) > 1
    name = plan.accelerator["name"]
    for number, stage in enumerate(pretrains, 1):
        est = estimate(plan, stage.id)
        if est is None or est.memory_gb_per_replica <= limit:
            continue
        p = memory_params(plan, stage)  # a packed phase: its rows a step
        mem = stage_memory(p, plan.accelerator)
        t = TrainSpec.pick(p)
        per_replica = p["batch_size"] // max(1, plan.accelerator["replicas"])
        micro = per_replica // t.grad_accum_steps
        message = (f"{stage.id} needs about {mem.gb:.1f} GB per replica "
                   f"({mem.state / 1e9:.1f} GB weights, gradients and "
                   f"{t.optimization.optimizer} state; {mem.activations / 1e9:.1f} GB "
                   f"activations of {micro} "
                   f"examples x {p['max_seq_length']} tokens); {name} has {limit:g} GB")
        options = fit_options(p, plan.accelerator)
        lines = []
        for option in options:
            changes = " with ".join(_setting_name(n, v, phased, number) for n, v in option.changes)
            note = ""
            if "grad_accum_steps" in dict(option.changes):
                micro = per_replica // dict(option.changes)["grad_accum_steps"]
                note = f", micro-batches of {micro} per replica, the same global batch"
            lines.append(f"    {changes}: about {option.gb:.1f} GB{note}")
        if lines:
            hint = "changes that would fit (each with its estimate):\n" + "\n".join(lines)
        else:
            hint = ("no change of grad_accum_steps, recompute or compute_dtype fits: lower "
                    "the batch size or max_seq_length, or choose a larger accelerator")
        if overridden:
            hint += "\n  (experiment.memory_check = 'warn': planned anyway)"
        else:
            hint += ("\n  or, knowing the estimate is wrong, set experiment.memory_check = "
                     "'warn'")
        where = resolver.provenance("train", "phases" if phased else "batch_size").location
        if overridden:
            collector.warn(f"memory check overridden: {message}", where, hint=hint)
        else:
            collector.error(message, where, hint=hint)


def compile_experiment(gin_files: Sequence[str], gin_params: Sequence[str] = (),
                       search_paths: Sequence[str] = ()) -> Compiled:
    """Loads, resolves and plans an experiment.

    Raises:
      UserError: every problem found, each with its file and line.
    """
    config = load(gin_files, gin_params, search_paths)
    ablation, collector = read_ablation(config)  # experiment.ablation (compiler/ablation.py)
    collector.raise_if_any()
    if ablation is not None:
        points = {}
        for name in ablation.points:
            try:
                points[name] = _compile(ablation.bound(config, name), gin_files, gin_params,
                                        search_paths)
            except UserError as e:  # say which point: the others may be fine
                raise UserError([dataclasses.replace(p, message=f"{p.message} (in the "
                                                     f"ablation's point {name})")
                                 for p in e.problems]) from None
        first = next(iter(points.values()))
        plan = merge(ablation, {n: c.plan for n, c in points.items()}, collector,
                     first.resolver._provenance)
        collector.raise_if_any()
        return Compiled(plan=plan, resolver=first.resolver, collector=collector)
    return _compile(config, gin_files, gin_params, search_paths)


def _compile(config, gin_files: Sequence[str], gin_params: Sequence[str],
             search_paths: Sequence[str]) -> Compiled:
    """Resolves and plans a loaded experiment (one point of an ablation)."""
    collector = ErrorCollector()
    resolver = Resolver(config, collector)
    resolver.check_names()
    plan = _plan(PlanContext(resolver, collector, gin_files))
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
        operative_config=operative_config(resolver, plan.experiment,
                                          [text for text, _ in config.imports]),
    )
    return Compiled(plan=plan, resolver=resolver, collector=collector)
