"""Pretraining tasks whose documents come through seqio: a seqio task of the user's,
registered by a module the gin file imports, and a TFDS dataset built here with a real
builder. Each runs the ``runexp`` command up to the preprocess stage (an adopted vocab, so
nothing trains), then reads the cache back through seqio after ``runexp.tasks.register``.
A few CLI runs of some seconds each (TensorFlow's import dominates).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from runexp.compiler.exit_codes import EXIT_USER_ERROR
from tests.support.cli import run_cli

pytestmark = pytest.mark.e2e

WORDS = ("the cat sat on a mat and dog ran to red blue house tree sun moon "
         "big small old new fast slow").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]


def _documents(split: str, n: int) -> list[str]:
    """n documents of a few sentences each, from the vocabulary's words (deterministic)."""
    docs = []
    for i in range(n):
        sentences = []
        for j in range(3 + i % 4):
            k = (i * 7 + j * 3 + (split == "validation")) % len(WORDS)
            sentences.append(" ".join(WORDS[(k + m) % len(WORDS)] for m in range(5 + j)) + ".")
        docs.append(" ".join(sentences))
    return docs


TASKS_MODULE = f'''
"""A user's seqio tasks: documents in a "text" feature, and one without it."""
import seqio
import tensorflow as tf

WORDS = {WORDS!r}
{textwrap.dedent(__import__("inspect").getsource(_documents))}

def documents_fn(split, shuffle_files, seed=None):
    return tf.data.Dataset.from_tensor_slices(
        {{"text": _documents(split, 40 if split == "train" else 12)}})

def body_fn(split, shuffle_files, seed=None):
    return tf.data.Dataset.from_tensor_slices({{"body": _documents(split, 5)}})

seqio.TaskRegistry.add(
    "e2e_docs", source=seqio.FunctionDataSource(documents_fn, splits=["train", "validation"]),
    output_features={{}})
seqio.TaskRegistry.add(
    "e2e_no_text", source=seqio.FunctionDataSource(body_fn, splits=["train"]),
    output_features={{}})
'''

BUILDER_MODULE = f'''
"""A tiny TFDS dataset: documents in a Text feature."""
import numpy as np
import tensorflow_datasets as tfds

WORDS = {WORDS!r}
{textwrap.dedent(__import__("inspect").getsource(_documents))}

class RunexpE2eDocs(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {{"content": tfds.features.Text(), "id": tfds.features.Scalar(np.int64)}}))

    def _split_generators(self, dl_manager):
        return {{"train": self._generate_examples("train", 30),
                "test": self._generate_examples("validation", 10)}}

    def _generate_examples(self, split, n):
        for i, text in enumerate(_documents(split, n)):
            yield i, {{"content": text, "id": i}}
'''


def _gin(path, root, vocab, source: str, imports: str = "") -> str:
    text = f"""include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
{imports}
OUTPUT_ROOT = '{root}'
CORPUS_FILES = []
VOCAB = '{vocab}'
MAX_SEQ_LENGTH = 32
MAX_PREDICTIONS_PER_SEQ = 5
DUPE_FACTOR = 2
bert_pretraining_task.num_shards = 2
bert_pretraining_task.num_workers = 2
{source}"""
    path.write_text(text)
    return str(path)


def _runexp(gin, cwd, *args):
    """Up to the preprocess stages, from ``cwd``."""
    return run_cli("--until=preprocess", *args, gin_file=gin, cwd=cwd)


READ_BACK = """
import json, sys
from runexp.tasks import register
names = register(sys.argv[1])
import seqio
task = seqio.get_mixture_or_task(names[0])
out = {"names": names, "splits": sorted(task.splits)}
for split in task.splits:
    ds = task.get_dataset(split=split, sequence_length=None, use_cached=True, shuffle=False)
    examples = list(ds.as_numpy_iterator())
    unk = 0  # [UNK] among the original tokens (masked positions restored)
    for e in examples:
        ids = e["input_ids"].copy()
        real = e["masked_lm_weights"] > 0
        ids[e["masked_lm_positions"][real]] = e["masked_lm_ids"][real]
        unk += int((ids == 1).sum())
    out[split] = {"n": len(examples), "stats": task.get_cached_stats(split)["examples"],
                  "cls": int(examples[0]["input_ids"][0]), "unk": unk}
print(json.dumps(out))
"""


def _read_back(root):
    proc = subprocess.run([sys.executable, "-c", READ_BACK, root], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _summary(root):
    with open(os.path.join(root, "preprocess.pretrain", "MANIFEST.json")) as f:
        return json.load(f)["summary"]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A user's project: its seqio tasks module, a vocab, and an experiment directory."""
    d = tmp_path_factory.mktemp("project")
    (d / "e2e_project").mkdir()
    (d / "e2e_project" / "__init__.py").write_text("")
    (d / "e2e_project" / "tasks.py").write_text(TASKS_MODULE)
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return d


def _check_cache(root, splits, documents):
    got = _read_back(root)
    assert got["names"] == ["pretrain"] and got["splits"] == splits
    for split in splits:
        r = got[split]
        assert r["n"] == r["stats"] > 0 and r["cls"] == VOCAB.index("[CLS]"), (split, r)
        # Only the documents' words: no JSON syntax left in the text.
        assert r["unk"] == 0, (split, r)
    summary = _summary(root)
    for split, n in documents.items():
        assert summary[split]["documents"] == n, summary  # a JSONL line is one document


@pytest.mark.slow
def test_a_users_seqio_document_task_is_cached_and_read_back(project, tmp_path):
    root = tmp_path / "out"
    gin = _gin(project / "docs.gin", root, project / "vocab.txt",
               "pretrain/bert_pretraining_task.format = 'seqio_documents'\n"
               "pretrain/bert_pretraining_task.seqio_task = 'e2e_docs'\n"
               "pretrain/bert_pretraining_task.validation_split = 'validation'\n",
               imports="import e2e_project.tasks")
    proc = _runexp(gin, tmp_path)  # another directory: the module is found next to the gin
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "read 40 documents" in proc.stdout and "read 12 documents" in proc.stdout
    _check_cache(str(root), ["train", "validation"], {"train": 40, "validation": 12})
    again = _runexp(gin, tmp_path)
    assert again.returncode == 0 and "preprocess.pretrain: reused" in again.stdout, \
        again.stdout[-2000:]


@pytest.mark.slow
def test_a_task_without_the_text_feature_is_one_clear_error(project, tmp_path):
    root = tmp_path / "out"
    gin = _gin(project / "no_text.gin", root, project / "vocab.txt",
               "pretrain/bert_pretraining_task.format = 'seqio_documents'\n"
               "pretrain/bert_pretraining_task.seqio_task = 'e2e_no_text'\n",
               imports="import e2e_project.tasks")
    proc = _runexp(gin, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_USER_ERROR, out[-3000:]
    assert ("seqio task 'e2e_no_text' split 'train' (registered by e2e_project.tasks "
            "(gin import at ") in out, out[-3000:]
    assert "have no feature 'text'" in out and "features: body" in out
    assert "Traceback" not in out
    assert not os.path.exists(os.path.join(root, "preprocess.pretrain", "COMPLETED"))


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """A TFDS dataset prepared here with a real builder (in a subprocess: the test process
    keeps TFDS's registry clean); the runexp run reads its files without the builder."""
    d = tmp_path_factory.mktemp("tfds")
    (d / "e2e_builder.py").write_text(BUILDER_MODULE)
    data_dir = d / "data"
    # Run in the builder's directory, as its author would: ``-c`` finds modules there.
    code = ("import sys\nimport e2e_builder\n"
            "e2e_builder.RunexpE2eDocs(data_dir=sys.argv[1]).download_and_prepare()\n")
    proc = subprocess.run([sys.executable, "-c", code, str(data_dir)], cwd=str(d),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return data_dir


@pytest.mark.slow
def test_a_tfds_dataset_is_cached_and_counted(project, tfds_dir, tmp_path):
    root = tmp_path / "out"
    gin = _gin(tmp_path / "tfds.gin", root, project / "vocab.txt",
               "pretrain/bert_pretraining_task.format = 'tfds'\n"
               "pretrain/bert_pretraining_task.tfds_name = 'runexp_e2e_docs:1.0.0'\n"
               f"pretrain/bert_pretraining_task.tfds_data_dir = '{tfds_dir}'\n"
               "pretrain/bert_pretraining_task.text_field = 'content'\n"
               "pretrain/bert_pretraining_task.validation_split = 'test'\n")
    proc = _runexp(gin, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "read 30 documents" in proc.stdout and "read 10 documents" in proc.stdout
    _check_cache(str(root), ["train", "validation"], {"train": 30, "validation": 10})


def _planned(gin):
    """The preprocess stage's source and modules, as the compiler plans them."""
    from runexp.compiler.planner import compile_experiment
    from runexp.compiler.specs.source import SourceSpec

    pre = next(s for s in compile_experiment([gin]).plan.stages if s.kind == "preprocess")
    return SourceSpec.pick(pre.params), pre.inputs["modules"]


def test_documents_are_read_in_order_and_the_same_each_time(tmp_path):
    from runexp.tasks.sources.seqio_sources import iter_documents

    (tmp_path / "inproc_tasks.py").write_text(TASKS_MODULE.replace('"e2e_', '"inproc_'))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    gin = _gin(tmp_path / "exp.gin", tmp_path / "out", tmp_path / "vocab.txt",
               "pretrain/bert_pretraining_task.format = 'seqio_documents'\n"
               "pretrain/bert_pretraining_task.seqio_task = 'inproc_docs'\n"
               "pretrain/bert_pretraining_task.validation_split = 'validation'\n",
               imports="import inproc_tasks")
    source, modules = _planned(gin)
    first = list(iter_documents(source, "train", modules))
    assert first == _documents("train", 40)
    assert list(iter_documents(source, "train", modules)) == first
    assert list(iter_documents(source, "validation", modules)) == _documents("validation", 12)


def test_a_module_that_fails_to_import_is_one_error_naming_it(tmp_path):
    from runexp.compiler.errors import UserError
    from runexp.tasks.sources.seqio_sources import import_user_modules

    (tmp_path / "broken_tasks.py").write_text("import seqio\nraise ValueError('no data')\n")
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    gin = _gin(tmp_path / "exp.gin", tmp_path / "out", tmp_path / "vocab.txt",
               "pretrain/bert_pretraining_task.format = 'seqio_documents'\n"
               "pretrain/bert_pretraining_task.seqio_task = 'broken'\n",
               imports="import broken_tasks")
    _, modules = _planned(gin)
    with pytest.raises(UserError) as e:
        import_user_modules(modules)
    text = str(e.value)
    assert "gin import 'broken_tasks' (" in text and "exp.gin:3) failed: ValueError: no data" \
        in text and "broken_tasks.py:2" in text
