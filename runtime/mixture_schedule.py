"""Which member of a mixture each position of a host's stream reads, in O(1) per restart.

Positions are cut into blocks of ``B`` (a power of two, at least 4096 and at least two
positions per member at the smallest rate). Member ``m`` has read ``T_m(x) = floor(x C_{m+1})
- floor(x C_m)`` examples before position ``x`` at a block boundary, ``C`` the cumulative
rates (``C_0 = 0``, ``C_M = 1``): the counts sum to ``x`` and follow the rates within one
example, and block ``b`` gives member ``m`` the quota ``T_m((b + 1) B) - T_m(b B)`` (never
negative: ``B r_m >= 2``). Inside a block the quotas are laid out in a seeded pseudorandom
order (stateless ``RandomIndexShuffle`` keyed by the seed and the block), so members
interleave at random while every block keeps the rates exactly.

A restart at position ``p`` needs only block ``p div B``: the members' counts at its start
(the formula) plus those among its first ``p mod B`` positions. No sidecar file, no
replay. (seqio's mixture samples each position independently: its counts drift from the
rates like a random walk; here they never stray by more than one block's worth.)

Heavy module: imports TensorFlow.

Usage:
    schedule = MixtureSchedule([0.7, 0.3], seed=5)
    starts = schedule.member_positions(10_000)     # [M] int64: each member's own position
    choices = schedule.choices(10_000)             # tf.data: member of each later position
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import tensorflow as tf

_MIN_BLOCK = 4096
_FOREVER = 1 << 62


class MixtureSchedule:
    """The member of every position of a mixture's stream (module docstring)."""

    def __init__(self, rates: Sequence[float], seed: int):
        rates = [float(r) for r in rates]
        if not rates or min(rates) <= 0:
            raise ValueError(f"mixture rates must be positive, got {rates}")
        total = sum(rates)
        cumulative = [0.0]
        for r in rates[:-1]:
            cumulative.append(cumulative[-1] + r / total)
        cumulative.append(1.0)  # exactly: the counts sum to the position
        self.cumulative = tf.constant(cumulative, tf.float64)
        self.members = len(rates)
        self.block = max(_MIN_BLOCK, 1 << math.ceil(math.log2(2 * total / min(rates))))
        self.seed = seed

    def _counts_before(self, boundary: tf.Tensor) -> tf.Tensor:
        """[M] int64: each member's examples before the block boundary ``boundary``."""
        x = tf.floor(tf.cast(boundary, tf.float64) * self.cumulative)
        return tf.cast(x[1:] - x[:-1], tf.int64)

    def block_members(self, block: tf.Tensor) -> tf.Tensor:
        """int64 [B]: the member of each position of ``block``."""
        block = tf.convert_to_tensor(block, tf.int64)
        quotas = self._counts_before((block + 1) * self.block) - self._counts_before(
            block * self.block)
        slots = tf.raw_ops.RandomIndexShuffle(
            index=tf.range(self.block, dtype=tf.int64),
            seed=tf.stack([tf.constant(self.seed, tf.int64), tf.constant(0x313, tf.int64),
                           block]),
            max_index=tf.constant(self.block - 1, tf.int64))
        return tf.searchsorted(tf.cumsum(quotas), slots, side="right", out_type=tf.int64)

    def member_positions(self, position: int) -> np.ndarray:
        """[M] int64: how many examples each member gave before ``position``."""
        block, inside = divmod(int(position), self.block)
        before = self._counts_before(tf.constant(block * self.block, tf.int64)).numpy()
        head = self.block_members(tf.constant(block, tf.int64)).numpy()[:inside]
        return before + np.bincount(head, minlength=self.members).astype(np.int64)

    def choices(self, position: int) -> tf.data.Dataset:
        """int64 scalars: the member of every position from ``position`` on."""
        block, inside = divmod(int(position), self.block)
        ds = tf.data.Dataset.range(block, _FOREVER).map(self.block_members)
        return ds.unbatch().skip(inside)
