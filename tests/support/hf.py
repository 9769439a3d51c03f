"""Runs tests/support/hf_consumer.py (transformers, no runexp) in its own process and reads
back what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tests.support import child_env

# python -m, from any directory (child_env): the consumer imports nothing of runexp.
CONSUMER = [sys.executable, "-m", "tests.support.hf_consumer"]


def run_consumer(*args: str, timeout: float = 600) -> None:
    """The consumer with the virtualenv's python (the one running the tests), offline."""
    env = child_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                    TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    done = subprocess.run([*CONSUMER, *map(str, args)], env=env,
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


def check_export_against_runexp(root: str, lines: list, work_dir: str,
                                tolerance: float = 1e-4) -> dict:
    """A finished experiment's export/huggingface/ read by transformers alone, against
    runexp's own: AutoTokenizer's ids of ``lines`` against runexp's tokenizer (every line),
    AutoModel's hidden states and pooled output against the encoder SavedModel, and (after a
    fine-tune) AutoModelForSequenceClassification's logits against the classifier SavedModel,
    on the lines packed by the export's preprocessing SavedModel. Returns the figures."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - the preprocessing SavedModel's ops

    from runexp.tasks.vocabulary.tokenizer import load_tokenizer

    export, hf = os.path.join(root, "export"), os.path.join(root, "export", "huggingface")
    os.makedirs(work_dir, exist_ok=True)
    lines_path, ids_path = os.path.join(work_dir, "lines.json"), os.path.join(work_dir,
                                                                              "ids.json")
    with open(lines_path, "w", encoding="utf-8") as f:
        json.dump(lines, f)
    run_consumer("tokenize", hf, lines_path, ids_path)
    with open(ids_path) as f:
        theirs = json.load(f)["ids"]
    ours = load_tokenizer(os.path.join(root, "vocab"))
    equal = sum(ours.encode(line) == ids for line, ids in zip(lines, theirs))
    figures = {"lines": len(lines), "equal_lines": equal}

    preprocess = tf.saved_model.load(os.path.join(export, "preprocessing"))
    packed = {k: v.numpy() for k, v in preprocess(tf.constant(lines)).items()}
    inputs = {"input_ids": packed["input_word_ids"], "attention_mask": packed["input_mask"],
              "token_type_ids": packed["input_type_ids"]}
    classes = ["AutoModel"]
    classifier_dir = os.path.join(export, "classifier")
    if os.path.isdir(classifier_dir):
        classes.append("AutoModelForSequenceClassification")
    got, loading = transformers_outputs(hf, inputs, os.path.join(work_dir, "out"), *classes)
    assert all(not info["missing_keys"] for info in loading.values()), loading
    encoded = tf.saved_model.load(os.path.join(export, "encoder"))(packed)
    figures["last_hidden_state"] = max_diff(got["AutoModel.last_hidden_state"],
                                            encoded["sequence_output"].numpy())
    figures["pooler_output"] = max_diff(got["AutoModel.pooler_output"],
                                        encoded["pooled_output"].numpy())
    if len(classes) == 2:
        logits = tf.saved_model.load(classifier_dir).signatures["classify_ids"](
            **{k: tf.constant(v) for k, v in packed.items()})["logits"].numpy()
        figures["classifier_logits"] = max_diff(
            got["AutoModelForSequenceClassification.logits"], logits)
    print(f"\nHugging Face export of {root}: " + ", ".join(
        f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
    assert equal == len(lines), f"{len(lines) - equal} of {len(lines)} lines tokenise apart"
    diffs = {k: v for k, v in figures.items() if isinstance(v, float)}
    assert all(v < tolerance for v in diffs.values()), diffs
    return figures
