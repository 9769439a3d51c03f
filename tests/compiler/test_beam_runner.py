"""bert_pretraining_task.runner and .beam_options: checked by the compiler, shown in the plan,
never in the preprocess stage's fingerprint (compiler/stages/runner.py)."""

import os
import subprocess
import sys

import pytest

from runexp.compiler.errors import UserError
from runexp.compiler.planner import compile_experiment
from runexp.compiler.render import render_plan
from runexp.compiler.state import CREATE, StageState

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATAFLOW = ("{'runner': 'DataflowRunner', 'project': 'p', 'region': 'us-central1', "
            "'temp_location': 'gs://bucket/tmp', 'extra_packages': ['dist/runexp.tar.gz']}")


def _compile(write, minimal, extra, name="runner.gin"):
    return compile_experiment([write(name, f"include '{minimal}'\n{extra}\n")])


def _errors(write, minimal, extra):
    with pytest.raises(UserError) as e:
        _compile(write, minimal, extra)
    return e.value.render()


def _text(plan):
    return render_plan(plan, {s.id: StageState(CREATE, "new") for s in plan.stages})


def test_the_runner_is_not_in_the_fingerprint(write, minimal, monkeypatch):
    local = compile_experiment([minimal]).plan
    explicit = _compile(write, minimal, "bert_pretraining_task.runner = 'local'").plan
    direct = _compile(write, minimal, "bert_pretraining_task.runner = 'beam'\n"
                      "bert_pretraining_task.beam_options = {'direct_num_workers': 2}").plan
    fingerprints = {s.id: s.fingerprint for s in local.stages}
    for plan in (explicit, direct):
        assert {s.id: s.fingerprint for s in plan.stages} == fingerprints
    # Dataflow's workers read a corpus on gs:// (planned here without listing it).
    monkeypatch.setenv("RUNEXP_NO_INPUT_LISTING", "1")
    on_gcs = ("CORPUS_FILES = 'gs://bucket/corpus/*.txt'\n"
              "HELDOUT_FILES = 'gs://bucket/corpus/heldout.txt'")
    gcs_local = _compile(write, minimal, on_gcs).plan
    dataflow = _compile(write, minimal, f"{on_gcs}\nbert_pretraining_task.runner = 'beam'\n"
                        f"bert_pretraining_task.beam_options = {DATAFLOW}").plan
    assert {s.id: s.fingerprint for s in dataflow.stages} == \
        {s.id: s.fingerprint for s in gcs_local.stages}
    # runner 'local' leaves the plan as it was; 'beam' shows the runner and its options.
    assert "runner" not in local.stage("preprocess.pretrain").params
    assert explicit.stage("preprocess.pretrain").params == \
        local.stage("preprocess.pretrain").params
    params = direct.stage("preprocess.pretrain").params
    assert params["runner"] == "beam" and params["beam_options"] == {"direct_num_workers": 2}
    assert "runner: Apache Beam DirectRunner on this machine, 2 worker processes" in _text(direct)
    text = _text(dataflow)
    assert "runner: Apache Beam DataflowRunner in p/us-central1, n1-standard-1 workers" in text
    assert "cost: about $" in text and "per 100 GB of text" in text  # the size is unknown


def test_dataflow_reads_a_listed_gcs_corpus_and_the_plan_prices_it(write, minimal, gcs_prefix):
    from runexp.runtime import storage

    storage.write_text(f"{gcs_prefix}/corpus/part-0.txt", "A sentence of text.\n" * 50000)
    storage.write_text(f"{gcs_prefix}/heldout.txt", "A held-out sentence.\n" * 100)
    plan = _compile(write, minimal, f"CORPUS_FILES = '{gcs_prefix}/corpus/*.txt'\n"
                    f"HELDOUT_FILES = '{gcs_prefix}/heldout.txt'\n"
                    "bert_pretraining_task.runner = 'beam'\n"
                    f"bert_pretraining_task.beam_options = {DATAFLOW}").plan
    text = _text(plan)
    assert "cost: about 0.00 vCPU-hours for 1.0 MB of text at dupe_factor" in text, text


def test_dataflow_with_a_corpus_on_this_machine_is_refused_at_plan_time(write, minimal):
    text = _errors(write, minimal, "bert_pretraining_task.runner = 'beam'\n"
                   f"bert_pretraining_task.beam_options = {DATAFLOW}")
    assert "DataflowRunner's workers read the corpus from Cloud Storage, but " in text
    assert f"{os.path.dirname(minimal)}/" in text and " is on this machine" in text
    assert "hint: copy the corpus to gs://" in text


def test_dataflow_needs_a_project_a_region_and_a_gs_temp_location(write, minimal):
    text = _errors(write, minimal, "bert_pretraining_task.runner = 'beam'\n"
                   "bert_pretraining_task.beam_options = {'runner': 'DataflowRunner'}")
    assert "DataflowRunner needs beam_options 'project', 'region', 'temp_location'" in text
    text = _errors(write, minimal, "bert_pretraining_task.runner = 'beam'\n"
                   "bert_pretraining_task.beam_options = {'runner': 'dataflow', 'project': "
                   "'p', 'region': 'r', 'temp_location': '/tmp/x'}")
    assert "beam_options['temp_location'] must be on gs:// for DataflowRunner" in text
    assert "needs beam_options" not in text  # 'dataflow' is DataflowRunner, as Beam reads it


def test_runner_names_are_checked_with_did_you_mean(write, minimal):
    text = _errors(write, minimal, "bert_pretraining_task.runner = 'bem'")
    assert "must be one of 'local', 'beam'" in text and "did you mean 'beam'" in text
    text = _errors(write, minimal, "bert_pretraining_task.runner = 'beam'\n"
                   "bert_pretraining_task.beam_options = {'runner': 'DataflowRuner'}")
    assert "unknown Beam runner 'DataflowRuner'" in text
    assert "did you mean 'DataflowRunner'" in text
    text = _errors(write, minimal, "bert_pretraining_task.runner = 'beam'\n"
                   "bert_pretraining_task.beam_options = {'runner': 'SparkRunner'}")
    assert "'SparkRunner' is not one runexp runs the preprocess pipeline on" in text
    text = _errors(write, minimal, "bert_pretraining_task.runner = 'beam'\n"
                   "bert_pretraining_task.beam_options = {'direct_num_workers': 0}")
    assert "beam_options['direct_num_workers'] must be a positive integer" in text


def test_warnings_for_options_that_do_nothing_or_look_mistyped(write, minimal):
    compiled = _compile(write, minimal, "bert_pretraining_task.beam_options = "
                                        "{'direct_num_workers': 2}")
    assert any("beam_options apply to runner = 'beam' only" in w
               for w in compiled.plan.warnings)
    assert "beam_options" not in compiled.plan.stage("preprocess.pretrain").params
    compiled = _compile(write, minimal, "bert_pretraining_task.runner = 'beam'\n"
                        "bert_pretraining_task.beam_options = {'temp_locaton': 'gs://b/t'}")
    assert any("'temp_locaton' is not an option runexp knows" in w
               and "did you mean 'temp_location'" in w for w in compiled.plan.warnings)


def test_the_dataflow_example_compiles_without_importing_beam(monkeypatch):
    """gin/experiments/scratch_base_dataflow_tpu_v3_8.gin: the README's worked example."""
    code = ("import os, sys\n"
            "os.environ['RUNEXP_NO_INPUT_LISTING'] = '1'\n"
            "from runexp.compiler.planner import compile_experiment\n"
            "plan = compile_experiment(['gin/experiments/scratch_base_dataflow_tpu_v3_8.gin'])"
            ".plan\n"
            "p = plan.stage('preprocess.pretrain').params\n"
            "assert p['runner'] == 'beam' and p['beam_options']['runner'] == 'DataflowRunner'\n"
            "assert 'apache_beam' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
