"""Every bad input a user gives is one clear error: exit code 1, where (file[:line]) and what
is wrong, a hint saying what to do, no traceback, and nothing half-written.

One case per class of mistake, each run through the `runexp` command as a user runs it
(a subprocess, real files). A case names the input to break and what the user must see.
Cases marked ``run`` are run for real (not as a dry run): they assert that the error stops
the run before the stage that reads the input is completed, and that the stages before it
are kept.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from typing import Callable, Optional

import pytest
from tests.support.checkpoint_files import bert_variables, write_index
from tests.support.cli import run_cli

pytestmark = pytest.mark.e2e

TEXT = ("The parser reads the file.\nIt returns a list of names.\n\n"
        "A second document starts here.\nIt has two sentences.\n") * 40
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "good", "bad", "fine"]
TSV = "label\tsentence\npos\tgood\nneg\tbad\npos\tfine\n"

PRETRAIN = """include 'runs/pretrain.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{root}/out'
CORPUS_FILES = ['{root}/corpus/*.txt']
VOCAB_SIZE = 200
"""
FINETUNE = """include 'runs/finetune.gin'
include 'models/bert_tiny.gin'
OUTPUT_ROOT = '{root}/out'
VOCAB = '{root}/uncased_L-2_H-128_A-2/vocab.txt'
INIT_CHECKPOINT = '{root}/uncased_L-2_H-128_A-2/bert_model.ckpt'
FINETUNE_TASK = 'sst'
sst/classification_task.train_file = '{root}/data/train.tsv'
sst/classification_task.dev_file = '{root}/data/dev.tsv'
"""


def _pretrain_files(root: str) -> None:
    _write(root, "corpus/a.txt", TEXT)


def _finetune_files(root: str) -> None:
    _write(root, "uncased_L-2_H-128_A-2/vocab.txt", "\n".join(VOCAB) + "\n")
    write_index(f"{root}/uncased_L-2_H-128_A-2/bert_model.ckpt",
                bert_variables(2, 128, 512, vocab=len(VOCAB)))
    _write(root, "data/train.tsv", TSV)
    _write(root, "data/dev.tsv", TSV)


def _write(root: str, rel: str, content) -> str:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(content, bytes) else "w") as f:
        f.write(content)
    return path


@dataclasses.dataclass
class Case:
    name: str
    experiment: str                       # PRETRAIN or FINETUNE (formatted with root)
    breaks: Callable[[str], None]         # root -> makes the input bad
    first: str                            # in the first line of the error ({root} filled)
    hint: str                             # in the hint line
    params: tuple = ()
    extra_gin: str = ""
    run: bool = False                     # run for real, not as a dry run
    not_completed: Optional[str] = None   # (run) this stage must not be COMPLETED
    kept: tuple = ()                      # (run) these stages must be COMPLETED
    env: Optional[dict] = None


def _remove(rel):
    return lambda root: os.remove(os.path.join(root, rel))


CASES = [
    # --- corpora ---------------------------------------------------------------------------
    Case("empty corpus", PRETRAIN, lambda r: _write(r, "corpus/a.txt", ""),
         "{root}/corpus/a.txt: no text: the file is empty", "remove it from the glob"),
    Case("blank lines only", PRETRAIN, lambda r: _write(r, "corpus/a.txt", "\n \n\n"),
         "{root}/corpus/a.txt: no text: only blank lines", "remove it from the glob"),
    Case("no line breaks", PRETRAIN, lambda r: _write(r, "corpus/a.txt", "word " * 20000),
         "no line break in its first 64 KB", "one sentence per line"),
    Case("gzip corpus", PRETRAIN,
         lambda r: _write(r, "corpus/a.txt", gzip.compress(TEXT.encode())),
         "{root}/corpus/a.txt: gzip-compressed, not text", "decompress it first"),
    Case("binary corpus", PRETRAIN, lambda r: _write(r, "corpus/a.txt", b"\x00\x01" * 500),
         "binary data, not text", "give text files"),
    Case("latin-1 corpus", PRETRAIN,
         lambda r: _write(r, "corpus/a.txt", bytes(range(160, 256)) * 20),
         "mostly not UTF-8 text", "convert it to UTF-8"),
    Case("corpus glob matches nothing", PRETRAIN, _remove("corpus/a.txt"),
         "matches no file", "check the path or glob"),
    # --- gin ---------------------------------------------------------------------------------
    Case("macro nothing uses", PRETRAIN, lambda r: None,
         "macro TRAIN_STEP is set but nothing uses it", "did you mean 'TRAIN_STEPS'",
         params=("TRAIN_STEP=20",)),
    Case("unquoted string", PRETRAIN, lambda r: None,
         "'big' is not a gin value: strings need quotes", "write MODEL_SIZE = 'big'",
         params=("MODEL_SIZE=big",)),
    Case("gin import of a missing module", PRETRAIN, lambda r: None,
         "no_such_project", "", extra_gin="import no_such_project.tasks\n"),
    # --- vocabularies ------------------------------------------------------------------------------
    Case("vocab.txt without [MASK]", FINETUNE, lambda r: _write(
        r, "uncased_L-2_H-128_A-2/vocab.txt", "\n".join(t for t in VOCAB if t != "[MASK]") + "\n"),
         "vocab.txt has no [MASK]", "add them"),
    Case("vocab.txt with a duplicate", FINETUNE, lambda r: _write(
        r, "uncased_L-2_H-128_A-2/vocab.txt", "\n".join(VOCAB + ["good"]) + "\n"),
         "vocab.txt lists 'good' twice (lines 7 and 10)", "remove the duplicate"),
    Case("vocab.txt with a blank line", FINETUNE, lambda r: _write(
        r, "uncased_L-2_H-128_A-2/vocab.txt", "\n".join(VOCAB[:6] + [""] + VOCAB[6:]) + "\n"),
         "uncased_L-2_H-128_A-2/vocab.txt:7: error: vocab.txt has 1 blank line(s)",
         "remove the blank lines"),
    Case("vocab.txt not UTF-8", FINETUNE, lambda r: _write(
        r, "uncased_L-2_H-128_A-2/vocab.txt", ("\n".join(VOCAB) + "\n").encode() + b"caf\xe9\n"),
         "vocab.txt:10: error: vocab.txt is not UTF-8", "save it as UTF-8"),
    Case("a text file given as a SentencePiece model", PRETRAIN,
         lambda r: _write(r, "spm.model", "not a model\n"),
         "{root}/spm.model is not a SentencePiece model", "give the .model file",
         params=("VOCAB='{root}/spm.model'",)),
    # --- fine-tune data and checkpoints -----------------------------------------------------------
    Case("dev labels never trained on", FINETUNE,
         lambda r: _write(r, "data/dev.tsv", "label\tsentence\nPOS\tgood\n"),
         "{root}/data/dev.tsv: dev set 'dev' has labels the model is never trained on: 'POS'",
         "fix the dev labels"),
    Case("malformed TSV row", FINETUNE,
         lambda r: _write(r, "data/train.tsv", TSV + "neg\tbad\textra\n"),
         "{root}/data/train.tsv:5: error: 3 tab-separated fields, the header has 2",
         "one example per line"),
    Case("TSV without the label column", FINETUNE,
         lambda r: _write(r, "data/train.tsv", "sentence\ngood\n"),
         "{root}/data/train.tsv:1: error: the header has no column 'label'",
         "the first line must name the columns"),
    Case("TSV not UTF-8", FINETUNE,
         lambda r: _write(r, "data/train.tsv", TSV.encode() + b"neg\tcaf\xe9\n"),
         "{root}/data/train.tsv:5: error: not UTF-8 text", "save the file as UTF-8"),
    Case("train with one label", FINETUNE,
         lambda r: _write(r, "data/train.tsv", "label\tsentence\npos\tgood\npos\tfine\n"),
         "every example has the label 'pos'", "check label_field"),
    Case("missing init checkpoint", FINETUNE,
         _remove("uncased_L-2_H-128_A-2/bert_model.ckpt.index"),
         "no checkpoint at {root}/uncased_L-2_H-128_A-2/bert_model.ckpt",
         "INIT_CHECKPOINT is a prefix"),
    Case("truncated checkpoint index", FINETUNE,
         lambda r: open(f"{r}/uncased_L-2_H-128_A-2/bert_model.ckpt.index", "r+b").truncate(30),
         "cannot be read", "copy the checkpoint again"),
    Case("checkpoint of another model", FINETUNE,
         lambda r: write_index(f"{r}/uncased_L-2_H-128_A-2/bert_model.ckpt",
                               bert_variables(4, 256, 1024, vocab=len(VOCAB))),
         "the init checkpoint does not fit the model", "choose the model size"),
    # --- environment and flags -----------------------------------------------------------------
    Case("output root is a file", PRETRAIN, lambda r: _write(r, "out", "x"),
         "{root}/out is a file, not a directory", "choose another OUTPUT_ROOT"),
    Case("gs:// root without credentials", PRETRAIN, lambda r: None,
         "no Google credentials to reach gs://some-bucket/exp",
         "gcloud auth application-default login",
         params=("OUTPUT_ROOT='gs://some-bucket/exp'",), run=True,
         env={"NO_GCE_CHECK": "True"}),
    Case("--only with an unfinished input", PRETRAIN, lambda r: None,
         "--only: stage pretrain reads preprocess.pretrain, which is not finished",
         "--until=preprocess.pretrain", params=("--only=pretrain",)),
    # --- at run time: the stage that reads the input stops, earlier stages are kept ------------
    Case("seqio task without its text feature", PRETRAIN, lambda r: _write(
        r, "proj/tasks.py", "import seqio\nimport tensorflow as tf\n"
        "seqio.TaskRegistry.add('no_text', source=seqio.FunctionDataSource(\n"
        "    lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices(\n"
        "        {'body': ['a b c', 'd e f']}), splits=['train']), output_features={})\n"),
         "seqio task 'no_text'", "text", extra_gin="import proj.tasks\n"
         "CORPUS_FILES = []\nVOCAB = '{root}/vocab.txt'\n"
         "pretrain/bert_pretraining_task.format = 'seqio_documents'\n"
         "pretrain/bert_pretraining_task.seqio_task = 'no_text'\n", run=True,
         not_completed="vocab"),  # its first reader: the vocab report samples the text
]


def _env(cwd, env=None) -> dict:
    """This process's environment; with ``env``, that on a machine with no Google account
    (no emulator, no credentials, an empty home) plus ``env``."""
    full_env = dict(os.environ)
    if env:
        full_env.pop("STORAGE_EMULATOR_HOST", None)
        full_env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
        full_env.update(env, HOME=os.path.join(cwd, "home"),
                        CLOUDSDK_CONFIG=os.path.join(cwd, "gcloud"))
    return full_env


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_clear_error(case, tmp_path):
    root = str(tmp_path)
    if case.experiment is PRETRAIN:
        _pretrain_files(root)
        if "VOCAB = " in case.extra_gin:
            _write(root, "vocab.txt", "\n".join(VOCAB + ["a", "b", "c", "d", "e", "f"]) + "\n")
    else:
        _finetune_files(root)
    case.breaks(root)
    gin = _write(root, "exp.gin", case.experiment.format(root=root)
                 + case.extra_gin.format(root=root))
    args = [f"--gin_file={gin}"]
    args += [p if p.startswith("--") else f"--gin_param={p.format(root=root)}"
             for p in case.params]
    if not case.run:
        args.append("--dry_run")
    proc = run_cli(*args, cwd=root, env=_env(root, case.env), timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    first = case.first.format(root=root)
    error_lines = [line for line in out.splitlines() if "error" in line]
    assert error_lines and any(first in line for line in error_lines), out[-3000:]
    if case.hint:
        hints = [line for line in out.splitlines() if "hint" in line]
        assert any(case.hint in line for line in hints) or case.hint in out, out[-3000:]
    out_dir = os.path.join(root, "out")
    if case.not_completed:
        assert not os.path.exists(os.path.join(out_dir, case.not_completed, "COMPLETED"))
    for stage in case.kept:
        assert os.path.isfile(os.path.join(out_dir, stage, "COMPLETED")), stage
    if not case.run and os.path.isdir(out_dir) and case.name != "output root is a file":
        assert not os.listdir(out_dir), "a dry run writes nothing"


def test_the_suite_covers_each_class_once():
    assert len({c.name for c in CASES}) == len(CASES) >= 20
    print(json.dumps([c.name for c in CASES]))
