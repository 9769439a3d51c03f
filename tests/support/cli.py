"""The `runexp` command as a user runs it (its own process, the virtualenv's python), and a
compile's user errors as the command prints them."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The quickstart, scaled down: same stages, same code paths, fewer steps.
QUICKSTART_SMALL = [
    "VOCAB_SIZE=2000", "MAX_SEQ_LENGTH=64", "MAX_PREDICTIONS_PER_SEQ=10", "DUPE_FACTOR=1",
    "TRAIN_STEPS=40", "WARMUP_STEPS=4", "CHECKPOINT_EVERY=20", "train.log_every=10",
    "evaluate.max_examples=256", "FINETUNE_STEPS=20", "finetune.warmup_steps=2",
    "vocab.max_sentences=20000",
]
# Shorter still, for tests of what a run exports and reads rather than what it learns.
QUICKSTART_SHORT = ["MAX_SEQ_LENGTH=64", "MAX_PREDICTIONS_PER_SEQ=10", "DUPE_FACTOR=1",
                    "TRAIN_STEPS=20", "WARMUP_STEPS=2", "CHECKPOINT_EVERY=10",
                    "train.log_every=10", "evaluate.max_examples=128", "FINETUNE_STEPS=10",
                    "finetune.warmup_steps=2"]
QUICKSTART_STAGES = ["corpus", "vocab", "preprocess.pretrain", "pretrain", "evaluate",
                     "finetune.stdlib_package", "export"]


def cli_args(*args, gin_file=None, root=None, params=()) -> list[str]:
    """``python -m runexp.compiler.cli ARGS [--gin_file=F] [--gin_param=OUTPUT_ROOT='R']
    [--gin_param=P ...]``: ARGS first, so a command (``status``, ``diff``...) leads."""
    cmd = [sys.executable, "-m", "runexp.compiler.cli", *map(str, args)]
    if gin_file is not None:
        cmd.append(f"--gin_file={gin_file}")
    if root is not None:
        cmd.append(f"--gin_param=OUTPUT_ROOT='{root}'")
    return cmd + [f"--gin_param={p}" for p in params]


def run_cli(*args, gin_file=None, root=None, params=(), env=None, cwd=None,
            timeout=900) -> subprocess.CompletedProcess:
    """The command of ``cli_args``, run to its end; its output captured as text. ``env`` is
    the child's whole environment (None: this process's)."""
    return subprocess.run(cli_args(*args, gin_file=gin_file, root=root, params=params),
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def output(proc, limit: int = 4000) -> str:
    """The ends of a finished command's stdout and stderr, for an assertion's message."""
    return proc.stdout[-limit:] + proc.stderr[-limit:]


def errors_of(path, params=()) -> str:
    """The user errors compiling ``path`` (with gin ``params``) raises, rendered as the
    command prints them; fails the test if it compiles."""
    from runexp.compiler.errors import UserError
    from runexp.compiler.planner import compile_experiment

    with pytest.raises(UserError) as info:
        compile_experiment([str(path)], list(params))
    return info.value.render()
