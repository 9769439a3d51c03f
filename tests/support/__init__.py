"""Helpers shared by the tests (and bench/), one copy each:

- cli: the `runexp` command in its own process (``run_cli``, ``cli_args``), ``errors_of`` (a
  compile's user errors as the command prints them), the scaled-down quickstart
  (``QUICKSTART_SMALL``; ``QUICKSTART_SHORT``, shorter still; ``QUICKSTART_STAGES``);
- runtime: the tiny model (``TINY_MODEL``, ``TINY_SEQ``, ``TINY_PRED``), stage contexts,
  vocab and pretraining-record writers, the ``pretrain_data``/``pretrained`` fixtures;
- export: export-stage contexts and google-research/bert's modeling for the parity checks;
- checkpoint_files: checkpoint index files without TensorFlow;
- checkpoint_run: a one-stage pretrain experiment on a gs:// root, in or out of process;
- deadline_budget: a wall-time budget that starts at a known point of a run;
- fault_proxy: an HTTP proxy that injects faults in front of the GCS emulator;
- chinese_corpus: Chinese text and whole-word-masking checks;
- glue_files, spm_models, huggingface_dirs: GLUE-like data, SentencePiece models, directories
  as transformers saves them;
- hf, hf_consumer: transformers (never runexp) in its own process, reading runexp's exports.

A child process that imports them runs with ``child_env()`` (the repository root on
PYTHONPATH) and ``python -m tests.support.<module>``: no test edits ``sys.path``.
"""

from __future__ import annotations

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env(env: dict | None = None, **extra: str) -> dict:
    """``env`` (default: this process's environment) and ``extra``, with the repository root
    first on PYTHONPATH: a child can run ``python -m tests.<module>`` from any directory."""
    out = dict(os.environ if env is None else env, **extra)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, out.get("PYTHONPATH")) if p)
    return out
