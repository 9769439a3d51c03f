"""A tiny GLUE directory in GLUE's published layout: each task's directory, files, header
(CoLA: none), column order and label spelling as GLUE's download script writes them, and
MRPC's byte-order mark and unbalanced double quotes. The texts are made of a few words whose
group decides the label, so a tiny model learns each task in a few dozen steps.

Usage:
    write_glue_dir(tmp_path / "glue", ["mnli", "cola"], rows=32)
"""

from __future__ import annotations

import os

import numpy as np

POSITIVE = ["good", "great", "fine", "nice"]
NEGATIVE = ["bad", "awful", "poor", "sad"]
NEUTRAL = ["maybe", "perhaps", "some", "other"]
FILLER = ["the", "movie", "was", "very", "plot", "acting"]
WORDS = POSITIVE + NEGATIVE + NEUTRAL + FILLER
GROUPS = [NEGATIVE, POSITIVE, NEUTRAL]  # label id k's second sentence: words of group k

MNLI_TRAIN = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
              "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
              "sentence2", "label1", "gold_label"]
MNLI_DEV = MNLI_TRAIN[:11] + ["label2", "label3", "label4", "label5", "gold_label"]
STSB = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
        "sentence2", "score"]


def _texts(rng, group):
    return (" ".join(rng.choice(FILLER, 3)),
            " ".join(list(rng.choice(FILLER, 2)) + list(rng.choice(group, 2))))


def _rows(task: str, split: str, n: int, rng) -> tuple[list | None, list[list[str]]]:
    """(header or None, rows) of one file."""
    rows = []
    for i in range(n):
        if task == "stsb":
            positives = int(rng.integers(0, 3))
            mood = list(rng.choice(POSITIVE, positives)) + list(rng.choice(NEGATIVE, 2 - positives))
            a = " ".join(rng.choice(FILLER, 3))
            b = " ".join(list(rng.choice(FILLER, 2)) + mood)
            rows.append([str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none",
                         "none", a, b, f"{2.5 * positives:.3f}"])
            continue
        labels = {"mnli": ["contradiction", "entailment", "neutral"],
                  "qnli": ["entailment", "not_entailment"],
                  "rte": ["entailment", "not_entailment"]}.get(task, ["0", "1"])
        k = int(rng.integers(0, len(labels)))
        # Entailment-style labels list the positive class first: its words are POSITIVE.
        group = GROUPS[k] if task not in ("qnli", "rte") else [POSITIVE, NEGATIVE][k]
        a, b = _texts(rng, group)
        label = labels[k]
        if task == "mnli":
            header = MNLI_TRAIN if split == "train" else MNLI_DEV
            rows.append([str(i), str(1000 + i), f"{1000 + i}e", "fiction", f"( {a} )",
                         f"( {b} )", f"(ROOT {a})", f"(ROOT {b})", a, b,
                         *[label] * (len(header) - 10)])
        elif task == "qqp":
            rows.append([str(i), str(2 * i), str(2 * i + 1), a + " ?", b + " ?", label])
        elif task in ("qnli", "rte"):
            rows.append([str(i), a, b, label])
        elif task == "mrpc":
            # MRPC's strings carry unbalanced double quotes: read without quoting.
            rows.append([label, str(3000 + i), str(4000 + i), f'"{a}', f'{b} "'])
        elif task == "sst2":
            rows.append([b, label])
        elif task == "cola":
            rows.append(["gj04", label, "" if label == "1" else "*", b])
    header = {"mnli": MNLI_TRAIN if split == "train" else MNLI_DEV,
              "qqp": ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
              "qnli": ["index", "question", "sentence", "label"],
              "rte": ["index", "sentence1", "sentence2", "label"],
              "mrpc": ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
              "sst2": ["sentence", "label"], "cola": None, "stsb": STSB}[task]
    return header, rows


DIRECTORIES = {"mnli": "MNLI", "qqp": "QQP", "qnli": "QNLI", "rte": "RTE", "mrpc": "MRPC",
               "sst2": "SST-2", "cola": "CoLA", "stsb": "STS-B"}


def write_glue_dir(root, tasks=None, rows: int = 32, dev_rows: int = 24, seed: int = 0) -> str:
    """Writes ``tasks`` (default: all eight) under ``root``; returns root."""
    rng = np.random.default_rng(seed)
    for task in tasks or DIRECTORIES:
        folder = os.path.join(str(root), DIRECTORIES[task])
        os.makedirs(folder, exist_ok=True)
        splits = {"train.tsv": ("train", rows)}
        if task == "mnli":
            splits.update({"dev_matched.tsv": ("dev", dev_rows),
                           "dev_mismatched.tsv": ("dev", dev_rows)})
        else:
            splits["dev.tsv"] = ("dev", dev_rows)
        for name, (split, n) in splits.items():
            header, body = _rows(task, split, n, rng)
            lines = (["\t".join(header)] if header else []) + ["\t".join(r) for r in body]
            text = "\n".join(lines) + "\n"
            if task == "mrpc":
                text = "\ufeff" + text  # GLUE's MRPC files start with a byte-order mark
            with open(os.path.join(folder, name), "w", encoding="utf-8", newline="") as f:
                f.write(text)
    return str(root)
