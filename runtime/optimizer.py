"""AdamW as google-research/bert does it, over plain tf.Variables.

BERT's ``AdamWeightDecayOptimizer``: Adam without bias correction, epsilon 1e-6, decoupled
weight decay added to the update (not to the gradient), no decay on LayerNorm parameters
and biases; gradients clipped to a global norm of 1.0 first; learning rate warmed up
linearly to its peak, then decayed linearly to 0 at ``train_steps``.

Usage:
    schedule = WarmupLinearDecay(peak=1e-4, warmup_steps=100, train_steps=1000)
    opt = AdamW(schedule, weight_decay=0.01)
    opt.build(model.google_variables())     # slots exist before any tf.function runs
    opt.apply(grads, variables)             # in a train step; returns the learning rate

The slots (``m``, ``v``) and ``iterations`` are tracked attributes, so
``tf.train.Checkpoint(optimizer=opt)`` saves and restores them.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

import tensorflow as tf

# google-research/bert: exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"].
_NO_DECAY = re.compile(r"(LayerNorm|layer_norm|bias)")


def decays(name: str) -> bool:
    """Whether the variable with Google name ``name`` gets weight decay."""
    return not _NO_DECAY.search(name)


class WarmupLinearDecay:
    """Google BERT's schedule: ``peak * step / warmup`` while step < warmup, else
    ``peak * (1 - step / train_steps)``, never below 0. ``step`` counts from 0."""

    def __init__(self, peak: float, warmup_steps: int, train_steps: int):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.train_steps = max(int(train_steps), 1)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        decayed = self.peak * (1.0 - tf.minimum(step, self.train_steps) / self.train_steps)
        if self.warmup_steps <= 0:
            return decayed
        warmup = self.peak * step / float(self.warmup_steps)
        return tf.where(step < self.warmup_steps, warmup, decayed)


class AdamW(tf.Module):
    """BERT's AdamWeightDecay with global-norm clipping; see the module docstring."""

    def __init__(self, schedule: WarmupLinearDecay, weight_decay: float = 0.01,
                 beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
                 clip_norm: float | None = 1.0):
        super().__init__()
        self.schedule = schedule
        self.weight_decay = float(weight_decay)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.clip_norm = clip_norm
        self.iterations = tf.Variable(0, dtype=tf.int64, name="iterations",
                                      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.m: list[tf.Variable] = []
        self.v: list[tf.Variable] = []
        self._decay_flags: list[bool] = []
        self._built = False

    def build(self, variables: Mapping[str, tf.Variable]) -> None:
        """Creates the slots for ``variables`` ({Google name: variable}), in their order.

        Call under the strategy's scope, before the first training step.
        """
        if self._built:
            return
        agg = tf.VariableAggregation.ONLY_FIRST_REPLICA
        for name, var in variables.items():
            self.m.append(tf.Variable(tf.zeros(var.shape), name=f"{name}/adam_m",
                                      trainable=False, aggregation=agg))
            self.v.append(tf.Variable(tf.zeros(var.shape), name=f"{name}/adam_v",
                                      trainable=False, aggregation=agg))
            self._decay_flags.append(decays(name) and self.weight_decay > 0)
        self._built = True

    def learning_rate(self):
        return self.schedule(self.iterations)

    def apply(self, grads: Sequence[tf.Tensor], variables: Sequence[tf.Variable]):
        """One update of ``variables`` (the order given to ``build``) with ``grads``.

        Gradients must already be summed across replicas. Returns the learning rate used.
        """
        if not self._built:
            raise RuntimeError("AdamW.build(variables) must run before apply()")
        grads = [tf.convert_to_tensor(g) for g in grads]  # IndexedSlices -> dense
        if self.clip_norm:
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm)
        lr = self.learning_rate()
        b1, b2 = self.beta_1, self.beta_2
        for g, var, m, v, decay in zip(grads, variables, self.m, self.v, self._decay_flags):
            new_m = b1 * m + (1.0 - b1) * g
            new_v = b2 * v + (1.0 - b2) * tf.square(g)
            update = new_m / (tf.sqrt(new_v) + self.epsilon)
            if decay:
                update += self.weight_decay * var
            m.assign(new_m)
            v.assign(new_v)
            var.assign_sub(lr * update)
        self.iterations.assign_add(1)
        return lr
