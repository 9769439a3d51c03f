"""The order in which one input host reads one task's examples: a function of the position.

A host's stream of a task is an endless sequence of positions 0, 1, 2, ...; position ``p``
is example ``perm_e(p mod n)`` of the host's share, in epoch ``e = p div n`` (``n``: the
share's size), where ``perm_e`` is a seeded pseudorandom permutation of ``[0, n)``
(TensorFlow's stateless ``RandomIndexShuffle``, keyed by the order's seed and the epoch).
Every epoch is therefore one pass over the share in a new order, and any position's example
is computed in O(1), with nothing read before it: a resumed run starts where it stopped.

Shares: host ``h`` of ``H`` owns the split's records ``[h n_all / H, (h + 1) n_all / H)``
(numbered in file order, tasks/cache/record_index.py), so the hosts' shares partition the split
whatever the number of files.

Heavy module: imports TensorFlow.

Usage:
    order = ExampleOrder(num_records=1200, seed=order_seed("wiki", 1), host=0, hosts=2)
    records = order.records(tf.range(4096, 4096 + 256, dtype=tf.int64))
"""

from __future__ import annotations

import hashlib

import tensorflow as tf


def stable_seed(*parts) -> int:
    """A non-negative int64 from ``parts`` (the same on every platform and run)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def order_seed(task: str, seed: int) -> int:
    """The seed of a task's order in a host's stream (``seed``: the host's stream seed)."""
    return stable_seed("order", seed, task)


class ExampleOrder:
    """Position -> record number of one task's split on one host (module docstring)."""

    def __init__(self, num_records: int, seed: int, host: int = 0, hosts: int = 1):
        self.first = host * num_records // hosts
        self.size = (host + 1) * num_records // hosts - self.first
        if self.size < 1:
            raise ValueError(f"{num_records} records cannot be shared by {hosts} input hosts")
        self.seed = seed

    def records(self, positions: tf.Tensor) -> tf.Tensor:
        """Record numbers (int64, the split's numbering) of int64 stream ``positions``."""
        positions = tf.convert_to_tensor(positions, tf.int64)
        epoch, offset = positions // self.size, positions % self.size
        # Three-word seeds, one per position: (seed, a constant word, epoch).
        seeds = tf.stack([tf.fill(tf.shape(positions), tf.constant(self.seed, tf.int64)),
                          tf.fill(tf.shape(positions), tf.constant(0x5EED, tf.int64)),
                          epoch], axis=-1)
        shuffled = tf.raw_ops.RandomIndexShuffle(
            index=offset, seed=seeds, max_index=tf.constant(self.size - 1, tf.int64))
        return self.first + shuffled
