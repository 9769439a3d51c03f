"""Planning where a preprocess stage builds its shards (compiler/specs/runner.py): the checks
of `bert_pretraining_task.runner` and `.beam_options`, and the plan's lines on the runner,
its workers and, on Dataflow, an estimated cost.

The runner changes how the records are made, never what they are: its params are in the plan
(with runner 'beam') but not in the stage's fingerprint (StageKind.operational). With runner
'local' (the default) both are left out of the plan, as in plans made before they existed.

Standard library only (never imports apache_beam: it is only looked for).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from typing import Optional

from runexp.compiler import uris
from runexp.compiler.errors import did_you_mean
from runexp.compiler.specs.preprocess import PreprocessSpec
from runexp.compiler.specs.runner import (LOCAL_BEAM_RUNNERS, OPERATIONAL, OTHER_BEAM_RUNNERS,
                                          REMOTE_BEAM_RUNNERS, RunnerSpec, canonical_runner)
from runexp.compiler.specs.source import SourceSpec
from runexp.compiler.specs.source_formats import TEXT_FORMATS, listed

TASK = "bert_pretraining_task"

# Dataflow batch worker prices, us-central1, on demand (https://cloud.google.com/dataflow/
# pricing, "Dataflow compute resources", batch; other regions differ by up to ~40%):
DATAFLOW_USD_PER_VCPU_HOUR = 0.056
DATAFLOW_USD_PER_GB_HOUR = 0.003557
DATAFLOW_USD_PER_PD_GB_HOUR = 0.000054  # standard persistent disk
DATAFLOW_DISK_GB = 25      # a batch worker's boot disk with Dataflow Shuffle (the default)
DATAFLOW_DEFAULT_MACHINE = "n1-standard-1"  # Dataflow's batch default without machine_type
DATAFLOW_STARTUP_HOURS = 4 / 60  # worker VMs start and install runexp: ~4 min, billed
# The preprocess stage's CPU per MB of text, both phases (tokenise, then instances, masks and
# records at dupe_factor 5, max_seq_length 128, a 30k WordPiece vocab): the local runner's
# median "CPU s per MB" of `bench/preprocess.py --runner=beam` on this kind of machine (the
# Beam runner's workers spend about the same; DirectRunner adds its own). Dataflow's vCPUs
# are hyperthreads of about the same speed. Assumed, not measured: a fifth of it is
# tokenising, the rest scales with dupe_factor.
CPU_SECONDS_PER_MB = 0.27
TOKENIZE_SHARE = 0.2
ASSUMED_UTILISATION = 0.8  # of the workers' vCPUs, over the job (stragglers, the join)
# GB of memory per vCPU of the machine families' standard, highmem and highcpu types.
_GB_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}
_GB_PER_VCPU_N2 = {"standard": 4.0, "highmem": 8.0, "highcpu": 1.0}

# Options a Dataflow job cannot start without (Beam's GoogleCloudOptions).
DATAFLOW_REQUIRED = ("project", "region", "temp_location")
# How Dataflow workers get runexp (its pipeline's code runs there): one of these.
DATAFLOW_PACKAGING = ("setup_file", "extra_packages", "sdk_container_image",
                      "requirements_file")
# Options runexp reads or sets itself, and common ones of Beam's that a typo is likely in
# (an unknown key is only a warning: Beam has hundreds).
KNOWN_OPTIONS = (
    "runner", "direct_num_workers", "direct_running_mode", "project", "region",
    "temp_location", "staging_location", "job_name", "num_workers", "max_num_workers",
    "autoscaling_algorithm", "machine_type", "worker_machine_type", "disk_size_gb",
    "worker_disk_type", "network", "subnetwork", "service_account_email",
    "use_public_ips", "no_use_public_ips", "experiments", "dataflow_service_options",
    "labels", "worker_zone", "worker_region", "flexrs_goal", "save_main_session",
    "sdk_location", "number_of_worker_harness_threads", *DATAFLOW_PACKAGING)


def check_runner(ctx, task: str, b) -> None:
    """Checks the stage's runner settings; leaves them out of the plan with runner 'local'.

    DataflowRunner needs a project, a region and a gs:// temp_location (there the split's
    index and the shards are staged for the workers); an unknown runner is an error with
    did-you-mean; apache-beam must be installed (runexp[beam])."""
    p = b.params
    runner, options = p.get("runner"), p.get("beam_options")
    loc_runner = ctx.loc(TASK, "runner", task)
    loc_options = ctx.loc(TASK, "beam_options", task) or loc_runner
    if runner != "beam":
        if options and runner is not None:
            ctx.c.warn(f"{task}: beam_options apply to runner = 'beam' only; with runner = "
                       f"{runner!r} they are ignored", loc_options,
                       hint=f"set {task}/bert_pretraining_task.runner = 'beam', or remove them")
        for name in OPERATIONAL:
            p.pop(name, None)
            b.provenance.pop(name, None)
        return
    if importlib.util.find_spec("apache_beam") is None:
        ctx.c.error(f"{task}: runner = 'beam' needs Apache Beam, which is not installed",
                    loc_runner, hint="pip install 'runexp[beam]' (apache-beam>=2.60,<3)")
    if not SourceSpec.pick(p).makes_instances:
        ctx.c.warn(f"{task}: format {p.get('format')!r} brings ready-made examples, cached as "
                   "they are: runner = 'beam' changes nothing", loc_runner,
                   hint="remove the runner setting")
    options = options or {}
    bad_keys = sorted(str(k) for k in options if not isinstance(k, str) or not k)
    if bad_keys:
        ctx.c.error(f"{task}: beam_options keys must be option names (strings), got "
                    f"{', '.join(bad_keys)}", loc_options)
        return
    for key in sorted(options):
        if key not in KNOWN_OPTIONS:
            hint = did_you_mean(key, KNOWN_OPTIONS)
            if hint.startswith("did you mean"):
                ctx.c.warn(f"{task}: beam_options {key!r} is not an option runexp knows; it "
                           "is passed to Beam as it is", loc_options, hint=hint)
    name = options.get("runner") or "DirectRunner"
    if not isinstance(name, str):
        ctx.c.error(f"{task}: beam_options['runner'] must be a runner's name, got {name!r}",
                    loc_options)
        return
    runner_name = canonical_runner(name)
    supported = LOCAL_BEAM_RUNNERS + REMOTE_BEAM_RUNNERS
    if runner_name in OTHER_BEAM_RUNNERS:
        ctx.c.error(f"{task}: Beam runner {runner_name!r} is not one runexp runs the "
                    "preprocess pipeline on", loc_options,
                    hint="use 'DirectRunner' (this machine) or 'DataflowRunner'")
        return
    if runner_name not in supported:
        ctx.c.error(f"{task}: unknown Beam runner {name!r}", loc_options,
                    hint=did_you_mean(name, supported + OTHER_BEAM_RUNNERS))
        return
    for key in ("num_workers", "max_num_workers", "direct_num_workers"):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            ctx.c.error(f"{task}: beam_options[{key!r}] must be a positive integer, got "
                        f"{value!r}", loc_options)
    if runner_name == "DataflowRunner":
        _check_dataflow(ctx, task, options, loc_options, b)


def _check_dataflow(ctx, task: str, options: dict, loc, b) -> None:
    missing = [k for k in DATAFLOW_REQUIRED if not options.get(k)]
    if missing:
        ctx.c.error(f"{task}: DataflowRunner needs beam_options {', '.join(map(repr, missing))}",
                    loc, hint="e.g. {'runner': 'DataflowRunner', 'project': 'my-project', "
                              "'region': 'us-central1', 'temp_location': "
                              "'gs://my-bucket/tmp'}")
    for key in ("temp_location", "staging_location"):
        value = options.get(key)
        if value and (not isinstance(value, str) or not uris.is_gcs(value)):
            ctx.c.error(f"{task}: beam_options[{key!r}] must be on gs:// for DataflowRunner "
                        f"(its workers stage files there), got {value!r}", loc,
                        hint="e.g. 'gs://my-bucket/tmp'")
    if not any(options.get(k) for k in DATAFLOW_PACKAGING):
        ctx.c.warn(f"{task}: Dataflow workers run runexp's code, but beam_options do not say "
                   f"how they get it ({', '.join(DATAFLOW_PACKAGING)})", loc,
                   hint="build an sdist (python -m build --sdist) and set 'extra_packages': "
                        "['dist/runexp-<version>.tar.gz'], or use an sdk_container_image "
                        "with runexp installed")


def check_corpus_reachable(ctx, task: str, p: dict, inputs: dict) -> None:
    """Dataflow's workers read the corpus ranges from Cloud Storage themselves
    (tasks/sources/input_files.py): a corpus on this machine, or documents a seqio source writes on
    it, is an error at plan time rather than at launch."""
    spec = RunnerSpec.pick(p)
    if spec.runner != "beam" or spec.beam_runner() not in REMOTE_BEAM_RUNNERS:
        return
    loc = ctx.loc(TASK, "beam_options", task) or ctx.loc(TASK, "runner", task)
    source = SourceSpec.pick(p)
    if source.reads_seqio:
        ctx.c.error(f"{task}: format {source.format!r} is read through seqio on this machine, "
                    f"whose documents {spec.beam_runner()}'s workers cannot read", loc,
                    hint="write the documents to gs:// in a text format "
                         f"({listed(TEXT_FORMATS, quote=True)}), or use runner "
                         "'DirectRunner' or 'local'")
        return
    local = [v for key in ("train_files", "validation_files")
             for v in inputs.get(key) or [] if not uris.is_gcs(v)]
    if local:
        ctx.c.error(f"{task}: {spec.beam_runner()}'s workers read the corpus from Cloud "
                    f"Storage, but {local[0]} is on this machine", loc,
                    hint="copy the corpus to gs:// (gcloud storage cp -r DIR gs://BUCKET/"
                         "corpus/) and point the task's files there, or use runner "
                         "'DirectRunner' or 'local'")


# --- the plan's lines -----------------------------------------------------------------------

def _machine(options: dict) -> tuple[str, int, float]:
    """(machine type, vCPUs, GB of memory) of a Dataflow worker."""
    name = str(options.get("machine_type") or options.get("worker_machine_type")
               or DATAFLOW_DEFAULT_MACHINE)
    match = re.fullmatch(r"([a-z0-9]+)-(standard|highmem|highcpu)-(\d+)", name)
    if not match:
        return name, 1, 3.75
    family, kind, vcpus = match.group(1), match.group(2), int(match.group(3))
    per_vcpu = (_GB_PER_VCPU if family == "n1" else _GB_PER_VCPU_N2)[kind]
    return name, vcpus, vcpus * per_vcpu


def _text_bytes(plan, stage) -> Optional[int]:
    """The bytes of text the stage reads (a later phase: its first phase's), or None."""
    by_id = {s.id: s for s in plan.stages}
    source = stage
    while "split_index_dir" in source.inputs:
        source = next((by_id[d] for d in source.deps if d in by_id
                       and by_id[d].kind == "preprocess"), None)
        if source is None:
            return None
    total = 0
    corpus = next((s for s in plan.stages if s.kind == "corpus"), None)
    builtin = False  # the corpus stage's text (its size: min_bytes, all files together)
    for key in ("train_files", "validation_files"):
        for pattern in source.inputs.get(key) or []:
            if corpus is not None and pattern.startswith(corpus.output_dir):
                builtin = True
            elif uris.is_gcs(pattern):  # by the listing the plan was made from, if any
                listing = (source.input_objects or {}).get(pattern)
                if not isinstance(listing, dict):
                    return None
                total += sum(o.get("size") or 0 for o in listing.values())
            else:
                total += sum(os.path.getsize(p) for p in uris.expand_local(pattern))
    if builtin:
        total += corpus.params["min_bytes"]
    return total or None


def runner_lines(plan, stage) -> list[str]:
    """What the plan says of a preprocess stage's Beam runner: its workers and, on Dataflow,
    an estimated cost (empty for the local runner)."""
    spec = RunnerSpec.pick(stage.params)
    if spec.runner != "beam":
        return []
    options = spec.beam_options or {}
    runner = spec.beam_runner()
    if runner in LOCAL_BEAM_RUNNERS:
        workers = options.get("direct_num_workers") or PreprocessSpec.pick(
            stage.params).num_workers or os.cpu_count() or 1
        return [f"runner: Apache Beam {runner} on this machine, {workers} worker "
                f"process{'es' if workers != 1 else ''} (the same records as runner 'local')"]
    machine, vcpus, memory = _machine(options)
    workers = options.get("max_num_workers") or options.get("num_workers")
    lines = [f"runner: Apache Beam {runner} in {options.get('project')}/"
             f"{options.get('region')}, {machine} workers ({vcpus} vCPU, {memory:g} GB), "
             + (f"up to {workers}" if workers else "as many as Dataflow's autoscaling picks"),
             f"staging: the split index and the shards under {options.get('temp_location')}"]
    dupe = PreprocessSpec.pick(stage.params).dupe_factor
    scale = TOKENIZE_SHARE + (1 - TOKENIZE_SHARE) * dupe / 5
    per_vcpu_hour = (DATAFLOW_USD_PER_VCPU_HOUR + memory / vcpus * DATAFLOW_USD_PER_GB_HOUR
                     + DATAFLOW_DISK_GB / vcpus * DATAFLOW_USD_PER_PD_GB_HOUR)
    per_100gb = 1e5 * CPU_SECONDS_PER_MB * scale / 3600 / ASSUMED_UTILISATION * per_vcpu_hour
    how = (f"{CPU_SECONDS_PER_MB:g} CPU s per MB of text at dupe_factor 5, measured; "
           "us-central1 batch prices")
    size = _text_bytes(plan, stage)
    if size is None:
        most = options.get("max_num_workers") or options.get("num_workers")
        startup = (f", plus about ${most * vcpus * DATAFLOW_STARTUP_HOURS * per_vcpu_hour:,.2f}"
                   f" for {most} workers' start-up") if most else ", plus start-up"
        lines.append(f"cost: about ${per_100gb:,.2f} per 100 GB of text at dupe_factor {dupe}"
                     f"{startup} (the corpus size is known at run time; {how})")
        return lines
    vcpu_hours = size / 1e6 * CPU_SECONDS_PER_MB * scale / 3600 / ASSUMED_UTILISATION
    # Workers: a fixed num_workers, or as many as about an hour's work each (autoscaling),
    # up to max_num_workers.
    fixed, most = options.get("num_workers"), options.get("max_num_workers")
    n = fixed if fixed and not most else min(most or 1 << 30,
                                             max(1, math.ceil(vcpu_hours / vcpus)))
    hours = vcpu_hours / (n * vcpus) + DATAFLOW_STARTUP_HOURS
    usd = (vcpu_hours + n * vcpus * DATAFLOW_STARTUP_HOURS) * per_vcpu_hour
    lines.append(f"cost: about {vcpu_hours:,.2f} vCPU-hours for {size / 1e6:,.1f} MB of text "
                 f"at dupe_factor {dupe}: about {hours * 60:,.0f} min on {n} worker"
                 f"{'s' if n != 1 else ''}, about ${usd:,.2f} with start-up ({how})")
    return lines
