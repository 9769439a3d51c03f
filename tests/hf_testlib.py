"""Runs tests/runtime/hf_consumer.py (transformers, no runexp) in its own process and reads
back what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

CONSUMER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_consumer.py")


def run_consumer(*args: str, timeout: float = 600) -> None:
    """The consumer with the virtualenv's python (the one running the tests), offline."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, CONSUMER, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise AssertionError(f"hf_consumer.py {args[0]} failed ({done.returncode}):\n"
                             f"{done.stderr[-4000:]}")


def transformers_outputs(model_dir: str, inputs: dict, out_dir: str, *classes: str):
    """({class.output: array}, loading info per class) of transformers over ``inputs``
    (input_ids, attention_mask, token_type_ids, and optionally labels and
    next_sentence_label)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "inputs.npz")
    np.savez(path, **{k: np.asarray(v) for k, v in inputs.items()})
    run_consumer("outputs", model_dir, path, out_dir, *classes)
    arrays = {name[:-len(".npy")]: np.load(os.path.join(out_dir, name))
              for name in os.listdir(out_dir) if name.endswith(".npy")}
    with open(os.path.join(out_dir, "loading.json")) as f:
        return arrays, json.load(f)


def max_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)))
