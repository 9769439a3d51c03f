"""Batch semantics of packed pretraining (issue 27): how many rows a step trains on, and the
packing factor it rests on, measured or estimated. Standard library only.

A packed row holds about ``factor`` instances (tasks/instances/packing.py). ``train.batch_counts``
says what ``batch_size`` counts:

- ``'instances'`` (the default): a step trains on ``batch_size`` instances, in
  ``rows_per_step(batch_size, factor, multiple)`` rows, so the learning rate, the warmup and
  the step count mean what they mean unpacked; each step costs about ``1 / factor`` of an
  unpacked one.
- ``'rows'``: a step trains on ``batch_size`` rows, about ``factor x batch_size`` instances:
  a larger batch (the learning rate that suited ``batch_size`` instances is then a small-batch
  rate: scale it as for the larger batch, e.g. by ``sqrt(factor)``), and the same number of
  steps sees ``factor`` times the data.

The factor is the preprocess stage's measurement once it has run (its MANIFEST summary:
``train.packing.factor``); before, an estimate: packed rows as full as SPFHP makes them
(``PACKED_FILL``) over the fill of unpacked rows at that length (``UNPACKED_FILL``; both by
sequence length, interpolated in log2 of the length), as measured on the quickstart's corpus
(bench/packing_data.py). The factor is a property of the corpus: documents shorter than a
row pack more (bench's man pages: 2.59 at 512), long ones less, so the dry run says
"estimated" until the stage has run. The runtime computes the rows of a step from the measured factor with
``rows_per_step`` too, so plan and run agree once the data exists.

Usage:
    pk = packing_of(plan, stage)     # None for an unpacked pretrain stage
    pk.rows, pk.instances_per_step, pk.factor, pk.source
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional

from runexp.compiler.kinds import manifest_summary
from runexp.compiler.specs import TrainSpec
from runexp.compiler.specs.preprocess import PackedRows

# Before preprocessing: the share of a row's tokens that are real, by sequence length, with
# one instance a row and packed (bench/packing_data.py, short_seq_prob 0.1; the quickstart's
# docstrings, whose 512-token rows are about half padding as the issue saw; bench's man pages
# are shorter documents: 0.65 and 0.24 unpacked, 0.99 and 0.61 packed, factors 1.53 and 2.59).
UNPACKED_FILL = {128: 0.81, 512: 0.54}
PACKED_FILL = {128: 0.99, 512: 0.91}


def rows_per_step(batch_size: int, factor: float, multiple: int = 1) -> int:
    """Rows that hold ``batch_size`` instances at ``factor`` instances a row: rounded to a
    multiple of ``multiple`` (replicas x micro-batches), at least one multiple, at most
    ``batch_size``."""
    multiple = max(1, multiple)
    rows = round(batch_size / max(factor, 1.0) / multiple) * multiple
    return int(min(max(rows, multiple), max(batch_size, multiple)))


def _by_length(table: dict, max_seq_length: int) -> float:
    """``table``'s value at a length, interpolated in log2 of it (held at the ends)."""
    lengths = sorted(table)
    x = math.log2(min(max(max_seq_length, lengths[0]), lengths[-1]))
    lo = max(n for n in lengths if math.log2(n) <= x)
    hi = min(n for n in lengths if math.log2(n) >= x)
    if lo == hi:
        return table[lo]
    t = (x - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return table[lo] + t * (table[hi] - table[lo])


def estimated_factor(max_seq_length: int) -> tuple[float, float, float]:
    """(factor, packed fill, unpacked fill) before the data exists (module docstring)."""
    packed = _by_length(PACKED_FILL, max_seq_length)
    unpacked = _by_length(UNPACKED_FILL, max_seq_length)
    return max(1.0, packed / unpacked), packed, unpacked


@dataclasses.dataclass(frozen=True)
class Packing:
    """A packed pretrain stage's batch: ``rows`` a step for ``instances_per_step``."""

    factor: float            # instances a row
    fill: float              # real tokens / row tokens, packed
    unpacked_fill: float     # the same, one instance a row
    source: str              # "measured by preprocess.X" or "estimated ..."
    counts: str              # train.batch_counts: 'instances' or 'rows'
    rows: int                # rows a step
    instances_per_step: int  # instances a step (about, with 'rows')

    def lines(self, max_seq_length: int) -> list[str]:
        """The plan's account of the batch (render.py, estimates.py)."""
        out = [f"packing: {self.factor:.2f} instances a row ({self.source}); rows "
               f"{self.fill:.0%} full, {self.unpacked_fill:.0%} unpacked"]
        if self.counts == "instances":
            out.append(f"batch: {self.rows:,} rows of {max_seq_length} a step, about "
                       f"{self.instances_per_step:,} instances (train.batch_counts = "
                       "'instances': the learning rate and steps mean what they mean unpacked)")
        else:
            out.append(f"batch: {self.rows:,} rows of {max_seq_length} a step, about "
                       f"{self.instances_per_step:,} instances (train.batch_counts = 'rows': "
                       f"{self.factor:.2f}x the instances of an unpacked step: scale the "
                       "learning rate as for that larger batch)")
        return out


def measured(manifest_path: str, fingerprint: Optional[str] = None) -> Optional[PackedRows]:
    """The train split's packing entry of a finished preprocess stage's MANIFEST (of the
    stage with ``fingerprint``, when given: not an older build's), or None."""
    if not os.path.isfile(manifest_path):
        return None
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        if fingerprint is not None and manifest.get("fingerprint") != fingerprint:
            return None
    except (OSError, ValueError, AttributeError):
        return None
    train = manifest_summary("preprocess", manifest).train
    entry = train.packing if train is not None else None
    return entry if entry is not None and entry.factor else None


def packing_of(plan, stage) -> Optional[Packing]:
    """The batch of a pretrain stage that trains on packed rows; None for one that does
    not."""
    p = stage.params
    if not p.get("packing"):
        return None
    by_id = {s.id: s for s in plan.stages}
    pre = next((by_id[d] for d in stage.deps if d in by_id and by_id[d].kind == "preprocess"),
               None)
    entry = measured(os.path.join(pre.output_dir, "MANIFEST.json"), pre.fingerprint) \
        if pre is not None else None
    if entry is not None:
        factor, fill = float(entry.factor), float(entry.fill)
        unpacked = float(entry.unpacked_fill)
        source = f"measured by {pre.id}"
    else:
        factor, fill, unpacked = estimated_factor(p["max_seq_length"])
        source = "estimated before preprocessing; measured once it has run"
    accel = plan.accelerator or {}
    t = TrainSpec.pick(p)
    multiple = (accel.get("replicas") or 1) * max(1, t.grad_accum_steps)
    counts, batch = t.batch_counts, t.batch_size
    if counts == "instances":
        rows, per_step = rows_per_step(batch, factor, multiple), batch
    else:
        rows, per_step = batch, int(round(batch * factor))
    return Packing(factor, fill, unpacked, source, counts, rows, per_step)
