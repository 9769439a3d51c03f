"""The HTML report of an experiment's output root: one self-contained file.

What it shows, from the files the run left (nothing is recomputed but the curves' figures):
- the plan: experiment, accelerator, gin files and overrides, each stage with its key
  parameters and whether it is done (``plan.json``; a stage is done when its ``COMPLETED``
  holds the plan's fingerprint);
- time per stage, estimated (compiler/estimates.py, training stages) against actual
  (``MANIFEST.json`` ``seconds``), and money where the accelerator profile has a price;
- the metrics against their baselines (MANIFEST summaries of evaluate, pretrain, finetune);
- each training stage's curves (runexp.runtime.report.curves), drawn again from its logs
  with every reference known now, embedded as PNG data URIs;
- the data: corpus, vocab and preprocess counts, and the bad input the preprocess stages
  counted (``bad_input``);
- the artifacts of the export stage and how to load them, and the TensorBoard command.

Usage:
    report = collect("runexp_output/quickstart")      # local path or gs://
    html = render(report)

Reads through the storage layer on gs:// (runexp.runtime.storage.read_text: no TensorFlow);
local roots with plain file reads. A stage directory is found under the given root even when
the experiment was moved or copied since it ran (the plan's own paths are rebased onto it).
"""

from __future__ import annotations

import os
from typing import Callable, Optional

# The parts, by noun: what is read (collect), how values look (format), the page (sections).
from runexp.runtime.report.collect import (REPORT_FILE, NoExperiment, Report,  # noqa: F401
                                           collect)
from runexp.runtime.report.format import duration  # noqa: F401 - used by tests and callers
from runexp.runtime.report.sections import render
from runexp.runtime import storage


def build(root: str) -> str:
    """``collect`` then ``render``: the report of ``root`` as HTML. Raises NoExperiment."""
    return render(collect(root))


def write(root: str, html_text: str, out: Optional[str] = None,
          write_text: Optional[Callable[[str, str], None]] = None) -> str:
    """Writes the report (default ``<root>/report.html``); returns where."""
    root = root.rstrip("/") or "/"
    out = out or (f"{root}/{REPORT_FILE}" if root.startswith("gs://")
                  else os.path.join(root, REPORT_FILE))
    if out.startswith("gs://"):
        (write_text or storage.write_text)(out, html_text)
        return out
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(html_text)
    os.replace(tmp, out)
    return out
