"""Each stage kind's spec is the one source of its settings: what the planner emits, what the
handler reads, the gin schema and the docs all come from it, and no default is written twice."""

import ast
import glob
import importlib
import os
import re

import pytest
from tests.support.checkpoint_files import bert_variables, write_index

from runexp.compiler.kinds import KINDS
from runexp.compiler.planner import compile_experiment
from runexp.compiler.schema import CONFIGURABLES
from runexp.compiler.specs import Spec
from runexp.compiler.specs.docs import refresh

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Plans that between them use every param of every kind: the shipped experiments, a
    mixture with dynamic masking, an adopted vocab, a fine-tune of a released checkpoint."""
    d = tmp_path_factory.mktemp("plans")
    corpus, held, tsv = d / "c.txt", d / "h.txt", d / "t.tsv"
    corpus.write_text("One sentence.\nAnother.\n\nA second document.\n")
    held.write_text("Held out.\n")
    tsv.write_text("label\tsentence\npos\tgood\nneg\tbad\n")
    vocab = d / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ngood\nbad\n")
    base = f"""include 'runs/pretrain_finetune.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{d}/out'
FINETUNE_TASK = 'sst'
sst/classification_task.train_file = '{tsv}'
sst/classification_task.dev_file = '{tsv}'
"""
    mixture = d / "mix.gin"
    mixture.write_text(base + f"""
a/bert_pretraining_task.train_files = '{corpus}'
a/bert_pretraining_task.validation_files = '{held}'
b/bert_pretraining_task.train_files = '{corpus}'
mix/bert_pretraining_mixture.rates = {{'a': 1, 'b': 2}}
PRETRAIN_TASK = 'mix'
CORPUS_FILES = []
bert_pretraining_task.dynamic_masking = True
bert_pretraining_task.dupe_factor = 1
""")
    adopted = d / "adopted.gin"
    adopted.write_text(base + f"CORPUS_FILES = '{corpus}'\nVOCAB = '{vocab}'\n")
    release = d / "uncased_L-2_H-128_A-2"
    release.mkdir()
    write_index(str(release / "bert_model.ckpt"), bert_variables(2, 128, 512, vocab=7))
    finetune_only = d / "ft.gin"
    finetune_only.write_text(f"""include 'runs/finetune.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{d}/out2'
VOCAB = '{vocab}'
INIT_CHECKPOINT = '{release}/bert_model.ckpt'
FINETUNE_TASK = 'sst'
sst/classification_task.train_file = '{tsv}'
sst/classification_task.dev_file = '{tsv}'
""")
    # A regression read from a TSV without a header (its columns declared), with its metrics.
    scores = d / "scores.tsv"
    scores.write_text("a\tgood\tbad\t0.5\nb\tbad\tbad\t4.0\n")
    kinds = d / "kinds.gin"
    kinds.write_text(finetune_only.read_text().replace("out2", "out3") + f"""
FINETUNE_TASK = 'sts'
sts/classification_task.train_file = '{scores}'
sts/classification_task.dev_file = '{scores}'
sts/classification_task.kind = 'regression'
sts/classification_task.metrics = ['pearson']
sts/classification_task.columns = ['id', 'sentence1', 'sentence2', 'score']
sts/classification_task.text_fields = ['sentence1', 'sentence2']
sts/classification_task.label_field = 'score'
""")
    # A downstream suite of GLUE tasks: one finetune stage each, then the suite stage.
    from tests.support.glue_files import write_glue_dir

    suite = d / "suite.gin"
    suite.write_text(finetune_only.read_text().replace("out2", "out4") + f"""
FINETUNE_TASK = None
GLUE_DIR = '{write_glue_dir(d / "glue", ["rte", "stsb"])}'
FINETUNE_SUITE = ['rte', 'stsb']
""")
    # seqio sources: a user's module registering a task, a prepared TFDS dataset's files.
    (d / "my_tasks.py").write_text("import seqio\n")
    prepared = d / "tfds" / "docs" / "1.0.0"
    prepared.mkdir(parents=True)
    (prepared / "dataset_info.json").write_text(
        '{"splits": [{"name": "train"}, {"name": "test"}]}')
    seqio_docs = d / "seqio_docs.gin"
    seqio_docs.write_text(base + f"""import my_tasks
CORPUS_FILES = []
VOCAB = '{vocab}'
pretrain/bert_pretraining_task.format = 'seqio_documents'
pretrain/bert_pretraining_task.seqio_task = 'my_docs'
""")
    tfds = d / "tfds.gin"
    tfds.write_text(base + f"""CORPUS_FILES = []
VOCAB = '{vocab}'
pretrain/bert_pretraining_task.format = 'tfds'
pretrain/bert_pretraining_task.tfds_name = 'docs:1.0.0'
pretrain/bert_pretraining_task.tfds_data_dir = '{d}/tfds'
pretrain/bert_pretraining_task.validation_split = 'test'
""")
    files = [os.path.join(REPO, "gin", "quickstart.gin"), str(mixture), str(adopted),
             str(finetune_only), str(kinds), str(suite), str(seqio_docs), str(tfds),
             *sorted(glob.glob(os.path.join(REPO, "gin/experiments/*.gin")))]
    return [compile_experiment([f]).plan for f in files]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_planner_emits_exactly_the_spec_fields(kind, plans):
    spec = KINDS[kind].spec
    planned = set(spec.param_names())
    emitted = set()
    for plan in plans:
        for stage in plan.stages:
            if stage.kind != kind:
                continue
            assert set(stage.params) <= planned, (stage.id, set(stage.params) - planned)
            emitted |= set(stage.params)
            # The handler's view of the plan is the plan: nothing lost, nothing added.
            parsed = spec.from_stage(stage).to_params()
            assert {k: parsed[k] for k in stage.params} == {
                k: list(v) if isinstance(v, tuple) else v for k, v in stage.params.items()}
    assert emitted == planned, f"fields no plan uses: {sorted(planned - emitted)}"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_handler_reads_its_params_through_the_spec(kind):
    path = os.path.join(REPO, "runtime", "stages", f"{kind}.py")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    assert "ctx.params" not in source, f"{kind}: read params through {KINDS[kind].spec.__name__}"
    names = re.findall(r"(\w+)\.from_stage\(ctx\)", source)
    assert names, f"runtime/stages/{kind}.py never parses its spec"
    handler = importlib.import_module(f"runexp.runtime.stages.{kind}")
    for name in names:
        assert issubclass(getattr(handler, name), KINDS[kind].spec)


def test_a_spec_refuses_params_it_does_not_know_and_values_out_of_range():
    spec = KINDS["preprocess"].spec
    with pytest.raises(ValueError, match="unknown params masked_lm_probability"):
        spec.from_params({"masked_lm_probability": 0.2})
    with pytest.raises(ValueError, match=r"MaskingSpec.masked_lm_prob must be at most 1"):
        spec.from_params({"masked_lm_prob": 1.5})
    with pytest.raises(ValueError, match=r"pair_objective must be one of 'nsp', 'sop', 'none'"):
        spec.from_params({"pair_objective": "mlm"})
    assert spec.from_params({}).masking.masked_lm_prob == 0.15  # a plan older than a setting


def _settings():
    for kind in KINDS.values():
        for s in kind.spec.settings():
            yield kind, s


def test_the_gin_schema_is_the_specs():
    for kind, s in _settings():
        if not s.settable or not s.planned:
            continue
        param = CONFIGURABLES[kind.configurable].params[s.gin]
        assert param == s.param, (kind.name, s.name)


def _runexp_sources():
    for folder in ("compiler", "tasks", "runtime"):
        for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True):
            if os.sep + "specs" + os.sep not in path:
                yield path


def _is_params(node) -> bool:
    """A stage's params: ``p``, ``params``, ``ctx.params``, ``stage.params`` and the like."""
    text = ast.unparse(node)
    return text in ("p", "params") or text.endswith(".params")


def _refers_to_a_spec(node) -> bool:
    """``TrainSpec.log_every``: the spec's default, referred to, not restated."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
        and node.value.id.endswith("Spec")


def test_no_setting_has_a_second_default():
    """Outside the specs, no code falls back to its own default for a setting: neither
    ``params.get("name", default)`` / ``params.get("name") or default`` nor a dataclass
    field named like a setting with a default of its own."""
    names = {s.name for _, s in _settings() if s.settable} | {
        s.gin for _, s in _settings() if s.settable}
    found = []
    for path in _runexp_sources():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        rel = os.path.relpath(path, REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "get" and node.args and _is_params(node.func.value) \
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in names:
                if len(node.args) > 1:
                    found.append(f"{rel}:{node.lineno}: .get({node.args[0].value!r}, default)")
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) \
                    and isinstance(node.values[0], ast.Call) \
                    and isinstance(node.values[0].func, ast.Attribute) \
                    and node.values[0].func.attr == "get" and node.values[0].args \
                    and _is_params(node.values[0].func.value) \
                    and isinstance(node.values[0].args[0], ast.Constant) \
                    and node.values[0].args[0].value in names:
                found.append(f"{rel}:{node.lineno}: .get({node.values[0].args[0].value!r}) "
                             "or default")
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "dataclass" or
                    getattr(d, "attr", "") == "dataclass" for d in node.decorator_list):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                            and item.target.id in names and item.value is not None \
                            and not _refers_to_a_spec(item.value):
                        found.append(f"{rel}:{item.lineno}: {node.name}.{item.target.id} "
                                     "has a default")
    assert not found, "\n".join(found)


def test_docs_parameter_tables_are_the_specs():
    path = os.path.join(REPO, "docs", "STAGES.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for kind in KINDS:
        assert f"<!-- params:{kind} " in text, f"docs/STAGES.md has no table for {kind}"
    assert refresh(text) == text, ("docs/STAGES.md's tables are stale: run "
                                   "python -m runexp.compiler.specs.docs --write docs/STAGES.md")


def test_specs_are_frozen_and_standard_library_only():
    for kind in KINDS.values():
        assert issubclass(kind.spec, Spec) and kind.spec.__dataclass_params__.frozen
    for path in glob.glob(os.path.join(REPO, "compiler", "specs", "*.py")):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                assert module.split(".")[0] in ("__future__", "dataclasses", "typing", "re",
                                                "argparse", "sys", "runexp"), (path, module)


def test_run_templates_restate_no_default_differently():
    """A run template names each knob as a macro (the user surface the README shows); the
    value it gives must be the spec's default, so the two cannot drift apart."""
    from runexp.compiler.loader import MacroRef, load
    from runexp.compiler.schema import REQUIRED

    differ = []
    for path in sorted(glob.glob(os.path.join(REPO, "gin", "runs", "*.gin"))):
        config = load([path], [], [])
        for (_, name, param), assignments in config.bindings.items():
            value = assignments[-1].value
            if not isinstance(value, MacroRef) or value.name not in config.macros \
                    or param == "task":  # the task a template trains is a name, not a knob
                continue
            literal = config.macros[value.name][-1].value
            default = CONFIGURABLES[name].params[param].default
            if not isinstance(literal, MacroRef) and default is not REQUIRED \
                    and literal != default:
                differ.append(f"{os.path.basename(path)}: {value.name} = {literal!r}, "
                              f"but {name}.{param} defaults to {default!r}")
    assert not differ, "\n".join(differ)


def test_plan_schema_lists_the_resumable_fields():
    with open(os.path.join(REPO, "docs", "PLAN_SCHEMA.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("**continued**"):]
    section = section[:section.index("Any other")]
    for kind in KINDS.values():
        for name in kind.resumable:
            assert f"`{name}`" in section, f"docs/PLAN_SCHEMA.md does not list {name}"


def test_fine_tuning_follows_the_pretrainings_recomputation_and_dtype():
    """finetune has no knob of its own for these: train.recompute and train.compute_dtype
    (FinetuneSpec's gin="train...."), so a user who needs recomputation to pretrain at a
    length gets it when fine-tuning at that length too."""
    quickstart = os.path.join(REPO, "gin", "quickstart.gin")
    plain = compile_experiment([quickstart]).plan
    plan = compile_experiment([quickstart], ["train.recompute = 'layers'"]).plan
    [before] = [s for s in plain.stages if s.kind == "finetune"]
    [after] = [s for s in plan.stages if s.kind == "finetune"]
    assert before.params["recompute"] == "none" and after.params["recompute"] == "layers"
    assert after.fingerprint != before.fingerprint
