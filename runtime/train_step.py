"""One training step and the loop of steps one ``tf.function`` call runs (runtime/trainer.py
drives it): gradients of the loss over the global batch (micro-batches summed when
``grad_accum_steps`` > 1, replicas all-reduced), global-norm clipping in the optimizer's
apply, loss scaling for float16, and XLA where the config asks for it (the whole step on one
replica; the gradients under MirroredStrategy).
"""

from __future__ import annotations

import tensorflow as tf

from runexp.runtime.distributed import reduce_per_replica


def build_loop(strategy: tf.distribute.Strategy, model: tf.Module, optimizer, variables: list,
               config, loss_scale, stop: tf.Variable):
    """The training loop's ``tf.function``: ``loop(iterator, num_steps) -> (stat totals,
    extra totals, steps done)``, stopping early when ``stop`` (a bool variable) is set.

    ``config``: the TrainLoopConfig (grad_accum_steps, jit_compile); ``loss_scale``: a
    DynamicLossScale for float16, else None; ``stop``: set by the preemption watcher."""
    step_fn = build_step(strategy, model, optimizer, variables, config, loss_scale)

    def one_step(iterator):
        stats, extras = strategy.run(step_fn, args=(next(iterator),))
        return (reduce_per_replica(strategy, stats, tf.distribute.ReduceOp.SUM),
                reduce_per_replica(strategy, extras, tf.distribute.ReduceOp.MEAN))

    extra_keys = ["grad_norm"] + (["loss_scale", "skipped_steps"] if loss_scale else [])

    @tf.function
    def loop(iterator, num_steps):
        # One traced step in the graph (totals start at zero, not at a first step).
        totals = {name: tf.zeros([]) for name in model.STAT_KEYS}
        extras = {name: tf.zeros([]) for name in extra_keys}
        done = tf.constant(0, tf.int32)
        while tf.logical_and(done < num_steps, tf.logical_not(stop.read_value())):
            stats, more = one_step(iterator)
            totals = {n: totals[n] + stats[n] for n in totals}
            extras = {n: extras[n] + more[n] for n in extras}
            done += 1
        return totals, extras, done

    return loop


def build_step(strategy: tf.distribute.Strategy, model: tf.Module, optimizer, variables: list,
               config, loss_scale):
    """One replica's step: ``step_fn(features) -> (summed stats, extras)``, the update
    applied (``build_loop``'s arguments)."""
    replicas = strategy.num_replicas_in_sync
    k = max(int(config.grad_accum_steps), 1)
    gradients = _gradients_fn(model, variables, loss_scale)
    # jit_compile on one replica: the whole step is one XLA computation (step_fn below).
    whole_step_xla = config.jit_compile and replicas == 1
    apply = optimizer.apply
    if replicas == 1 and not whole_step_xla:
        # The update compiled by XLA even without jit_compile: ~10 elementwise passes
        # over every variable and its slots become one (3-5% of a step on CPU). Under
        # MirroredStrategy the update stays as it is: its variables are mirrored.
        apply = tf.function(optimizer.apply, jit_compile=True)
    if config.jit_compile and replicas > 1:
        gradients = tf.function(gradients, jit_compile=True)
    if k > 1:
        gradients = _accumulated(gradients, k)

    def step_fn(features):
        denominators = model.loss_denominators(features)
        ctx = tf.distribute.get_replica_context()
        if replicas > 1:
            denominators = ctx.all_reduce(tf.distribute.ReduceOp.SUM, denominators)
        grads, stats = gradients(features, denominators)
        if replicas > 1:
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        return stats, _apply(apply, grads, variables, loss_scale)

    if whole_step_xla:
        step_fn = tf.function(step_fn, jit_compile=True)
    return step_fn


def _gradients_fn(model: tf.Module, variables: list, loss_scale):
    """(features, denominators) -> (the gradients of the scaled loss, the stats)."""
    def gradients(features, denominators):
        with tf.GradientTape() as tape:
            stats = model.loss_stats(features, training=True)
            loss = model.objective(stats, denominators)
            if loss_scale is not None:
                loss *= loss_scale.scale
        return tape.gradient(loss, variables), stats

    return gradients


def _accumulated(gradients, k: int):
    """``gradients`` summed over ``k`` micro-batches of the batch (their stats too)."""
    def accumulated(features, denominators):
        # [b, ...] -> [k, b / k, ...]: micro-batch j holds examples j*b/k .. (j+1)*b/k-1.
        split = {}
        for name, t in features.items():
            b = t.shape[0] if t.shape[0] is not None else tf.shape(t)[0]
            split[name] = tf.reshape(t, tf.concat([[k, b // k], tf.shape(t)[1:]], 0))
        grads, stats = gradients({n: t[0] for n, t in split.items()}, denominators)
        grads = [tf.convert_to_tensor(g) for g in grads]
        for j in tf.range(1, k):
            g, s = gradients({n: t[j] for n, t in split.items()}, denominators)
            grads = [a + tf.convert_to_tensor(b) for a, b in zip(grads, g)]
            stats = {n: stats[n] + s[n] for n in stats}
        return grads, stats

    return accumulated


def _apply(apply, grads: list, variables: list, loss_scale) -> dict:
    """Applies the summed gradients (unscaled for float16, the update skipped when they are
    not finite); returns the step's extras: ``grad_norm`` and, for float16, ``loss_scale``
    and ``skipped_steps``."""
    finite = None
    extras = {}
    # Dense first: the norm of an IndexedSlices (a gather's gradient) is the norm of
    # its values, wrong when an index repeats.
    grads = [tf.convert_to_tensor(g) for g in grads]
    if loss_scale is not None:
        extras["loss_scale"] = loss_scale.scale.read_value()
        grads = [g / extras["loss_scale"] for g in grads]
    norm = tf.linalg.global_norm(grads)
    if loss_scale is not None:
        finite = tf.math.is_finite(norm)
    apply(grads, variables, global_norm=norm, update_if=finite)
    if loss_scale is not None:
        loss_scale.update(finite)
        extras["skipped_steps"] = 1.0 - tf.cast(finite, tf.float32)
    extras["grad_norm"] = norm
    return extras
