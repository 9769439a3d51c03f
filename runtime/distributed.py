"""Running on every replica: the dataset each replica reads, reducing per-replica values,
broadcasting the chief's restored state, and summing a model's held-out stats.

One replica (the default strategy) takes the plain path everywhere: nothing is distributed
or reduced.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import tensorflow as tf

from runexp.runtime import cluster


@dataclasses.dataclass(frozen=True)
class PerHostDataset:
    """A dataset every input host (a worker, a TPU host) makes for itself: ``make(context)``
    gets the ``tf.distribute.InputContext`` (its ``input_pipeline_id`` of
    ``num_input_pipelines``) and returns that host's stream batched at the per-replica batch
    size; consecutive batches go to the host's replicas in turn, so on one host a step's
    replicas together read what one replica would read at the global batch size."""

    make: Callable[[tf.distribute.InputContext], tf.data.Dataset]


def distribute(strategy: tf.distribute.Strategy, dataset):
    """The dataset as the strategy's replicas read it (unchanged for one replica).

    ``dataset``: a global-batch ``tf.data.Dataset`` (each replica gets its slice of every
    batch; with several workers each reads the whole stream and keeps its share), or a
    ``PerHostDataset`` (each host reads its own share: ``distribute_datasets_from_function``).
    """
    if isinstance(dataset, PerHostDataset):
        if strategy.num_replicas_in_sync == 1:
            return dataset.make(tf.distribute.InputContext())
        return strategy.distribute_datasets_from_function(dataset.make)
    if strategy.num_replicas_in_sync == 1:
        return dataset
    if cluster.is_multi_worker():
        # Each worker reads the whole stream and keeps its share of every global batch: the
        # same examples per step, in the same order, as on one machine (and as a resumed run
        # skips to), whatever the number of files.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.DATA
        dataset = dataset.with_options(options)
    return strategy.experimental_distribute_dataset(dataset)


def broadcast_from_first_replica(strategy: tf.distribute.Strategy, variables) -> None:
    """Sets every replica's copy of ``variables`` to replica 0's (the chief's): after a restore
    that only the chief could make, every worker continues from the same state."""
    if strategy.num_replicas_in_sync == 1:
        return

    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        first = tf.equal(ctx.replica_id_in_sync_group, 0)
        out = [None] * len(variables)
        # One all-reduce per dtype (they are packed together); integer state (steps, data
        # position, RNG state) is summed as integers: exact.
        for dtype in {v.dtype for v in variables}:
            idx = [i for i, v in enumerate(variables) if v.dtype == dtype]
            summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                    [variables[i] * tf.cast(first, dtype) for i in idx])
            for i, value in zip(idx, summed):
                out[i] = value
        return out

    summed = strategy.run(tf.function(replica_fn))
    for var, value in zip(variables, summed):
        var.assign(strategy.experimental_local_results(value)[0])


def reduce_per_replica(strategy, per_replica: Mapping, op=tf.distribute.ReduceOp.SUM) -> dict:
    """A dict of per-replica values reduced over the replicas (as is for one replica)."""
    if strategy.num_replicas_in_sync == 1:
        return dict(per_replica)
    return {k: strategy.reduce(op, v, axis=None) for k, v in per_replica.items()}


def eval_step(strategy: tf.distribute.Strategy, model: tf.Module):
    """features -> ``model.loss_stats(features, training=False)`` summed over the replicas
    (a tf.function: make it once, call it for every batch and every evaluation)."""

    @tf.function(reduce_retracing=True)
    def step(features):
        return reduce_per_replica(strategy, strategy.run(
            lambda f: model.loss_stats(f, training=False), args=(features,)))

    return step


def evaluate_totals(strategy: tf.distribute.Strategy, model: tf.Module,
                    dataset: tf.data.Dataset, step=None, meter=None) -> dict:
    """Sums ``model.loss_stats(features, training=False)`` over one pass of ``dataset``
    (``step``: an ``eval_step`` made earlier, to trace it once; ``meter``: a
    runtime/progress.Meter advanced by the examples of each batch)."""
    step = step or eval_step(strategy, model)
    totals: dict = {}
    for features in distribute(strategy, dataset):
        for k, v in step(features).items():
            totals[k] = totals.get(k, 0.0) + float(v)
            if k == "examples" and meter is not None:
                meter.advance(float(v))
    return totals
