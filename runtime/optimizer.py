"""Optimizers for BERT over plain tf.Variables: AdamW, LAMB and Amos, with warmup + decay.

- ``AdamW``: google-research/bert's ``AdamWeightDecayOptimizer``: Adam without bias
  correction, epsilon 1e-6, decoupled weight decay added to the update (not to the
  gradient), no decay on LayerNorm parameters and biases.
- ``Lamb``: You et al. 2019, "Large Batch Optimization for Deep Learning" (the BERT recipe
  of the paper, as TF Model Garden's and NVIDIA's BERT-LAMB do it): Adam moments with bias
  correction, decoupled weight decay, then a layer-wise trust ratio ||w|| / ||update||;
  LayerNorm parameters and biases get neither weight decay nor the trust ratio.
- ``Amos``: Tian & Parikh 2022, "Amos: An Adam-style Optimizer with Adaptive Weight Decay
  towards Model-Oriented Scale" (the optimizer jestimator pretrains BERT with): a per-
  variable learning rate from the expected scale ``eta`` of the variable's entries, an
  adaptive weight decay and a decay of both driven by a slot ``b``; ``weight_decay`` is
  not used (the decay is part of the method). See ``Amos`` for the update rule.

All three: gradients clipped to a global norm first (``clip_norm``, 0 = off); learning rate
warmed up linearly to its peak, then decayed linearly or polynomially to
``end_learning_rate`` at ``train_steps`` (``WarmupDecay``).

Usage:
    opt = optimizer_from_spec(TrainSpec.from_stage(stage).optimization, train_steps=1000,
                              hidden_size=768)
    opt.build(model.google_variables())     # slots exist before any tf.function runs
    opt.apply(grads, variables)             # in a train step; returns the learning rate

Slots and ``iterations`` are tracked attributes, so ``tf.train.Checkpoint(optimizer=opt)``
saves and restores them. ``apply`` takes an optional ``update_if`` boolean tensor: when
False every assignment keeps the old value (a mixed-float16 step whose gradients
overflowed) but ``iterations`` still advances, so the step count and the data position
stay in lock step.
"""

from __future__ import annotations

import math
import re
from typing import Mapping, Sequence

import tensorflow as tf

from runexp.compiler.specs import OptimizerSpec

OPTIMIZERS = OptimizerSpec.choices("optimizer")
DECAYS = OptimizerSpec.choices("decay")

# google-research/bert: exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"].
_NO_DECAY = re.compile(r"(LayerNorm|layer_norm|bias)")

_ONLY_FIRST = tf.VariableAggregation.ONLY_FIRST_REPLICA


def decays(name: str) -> bool:
    """Whether the variable with Google name ``name`` gets weight decay (and, for LAMB, the
    layer-wise trust ratio)."""
    return not _NO_DECAY.search(name)


class WarmupDecay:
    """Google BERT's schedule, with a polynomial option.

    ``peak * step / warmup`` while ``step < warmup``; afterwards
    ``(peak - end) * (1 - min(step, train_steps) / train_steps) ** power + end``, as
    ``tf.compat.v1.train.polynomial_decay`` with ``cycle=False`` (the decay counts from step 0,
    as google-research/bert's does). ``decay="linear"`` is power 1; ``decay_power`` applies
    to ``"polynomial"`` only. ``step`` counts from 0.
    """

    def __init__(self, peak: float, warmup_steps: int, train_steps: int,
                 decay: str = "linear", decay_power: float = 1.0,
                 end_learning_rate: float = 0.0):
        if decay not in DECAYS:
            raise ValueError(f"decay must be one of {DECAYS}; got {decay!r}")
        if decay == "polynomial" and not float(decay_power) > 0:
            raise ValueError(f"decay_power must be > 0; got {decay_power!r}")
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps or 0)
        self.train_steps = max(int(train_steps), 1)
        self.decay = decay
        self.power = 1.0 if decay == "linear" else float(decay_power)
        self.end = float(end_learning_rate or 0.0)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        frac = 1.0 - tf.minimum(step, self.train_steps) / self.train_steps
        shape = frac if self.power == 1.0 else tf.pow(frac, self.power)
        decayed = (self.peak - self.end) * shape + self.end
        if self.warmup_steps <= 0:
            return decayed
        warmup = self.peak * step / float(self.warmup_steps)
        return tf.where(step < self.warmup_steps, warmup, decayed)


class WarmupLinearDecay(WarmupDecay):
    """``WarmupDecay`` with a linear decay to 0 (Google BERT's default)."""

    def __init__(self, peak: float, warmup_steps: int, train_steps: int):
        super().__init__(peak, warmup_steps, train_steps)


class Optimizer(tf.Module):
    """Shared plumbing: ``iterations``, slots per variable, clipping, conditional updates.

    Subclasses implement ``_create_slots(name, var) -> list[tf.Variable]`` and
    ``_update(index, grad, var, lr)``, assigning through ``self._set``.
    """

    def __init__(self, schedule, clip_norm: float | None = 1.0):
        super().__init__()
        self.schedule = schedule
        self.clip_norm = float(clip_norm or 0.0)
        self.iterations = tf.Variable(0, dtype=tf.int64, name="iterations",
                                      aggregation=_ONLY_FIRST)
        self._names: list[str] = []
        self._built = False
        self._update_if = None

    def _slot(self, name: str, slot: str, shape) -> tf.Variable:
        return tf.Variable(tf.zeros(shape), name=f"{name}/{slot}", trainable=False,
                           aggregation=_ONLY_FIRST)

    def _create_slots(self, name: str, var: tf.Variable) -> None:
        raise NotImplementedError

    def _update(self, index: int, grad, var, lr) -> None:
        raise NotImplementedError

    def build(self, variables: Mapping[str, tf.Variable]) -> None:
        """Creates the slots for ``variables`` ({Google name: variable}), in their order.

        Call under the strategy's scope, before the first training step.
        """
        if self._built:
            return
        for name, var in variables.items():
            self._names.append(name)
            self._create_slots(name, var)
        self._built = True

    def learning_rate(self):
        return self.schedule(self.iterations)

    def _set(self, var: tf.Variable, value) -> None:
        if self._update_if is not None:
            value = tf.where(self._update_if, value, var)
        var.assign(value)

    def apply(self, grads: Sequence[tf.Tensor], variables: Sequence[tf.Variable],
              global_norm=None, update_if=None):
        """One update of ``variables`` (the order given to ``build``) with ``grads``.

        Args:
          grads: gradients, already summed across replicas (and micro-batches).
          variables: the variables, in ``build`` order.
          global_norm: the gradients' global norm if the caller has it (saves computing it
            again for clipping).
          update_if: optional scalar bool tensor; False keeps every variable and slot as it
            was (``iterations`` still advances).

        Returns:
          The learning rate used.
        """
        if not self._built:
            raise RuntimeError(f"{type(self).__name__}.build(variables) must run before "
                               "apply()")
        grads = [tf.convert_to_tensor(g) for g in grads]  # IndexedSlices -> dense
        if self.clip_norm > 0:
            grads, _ = tf.clip_by_global_norm(grads, self.clip_norm, use_norm=global_norm)
        lr = self.learning_rate()
        self._update_if = update_if
        try:
            for i, (g, var) in enumerate(zip(grads, variables)):
                self._update(i, g, var, lr)
        finally:
            self._update_if = None
        self.iterations.assign_add(1)
        return lr


class AdamMoments(Optimizer):
    """Adam's first and second moments per variable (slots ``<name>/<prefix>_m`` and
    ``_v``), with weight decay, betas and epsilon: what AdamW and LAMB share."""

    slot_prefix = ""  # "adam" or "lamb": the slot names Google's checkpoints use

    def __init__(self, schedule, weight_decay: float = 0.01, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-6,
                 clip_norm: float | None = 1.0):
        super().__init__(schedule, clip_norm)
        self.weight_decay = float(weight_decay or 0.0)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.m: list[tf.Variable] = []
        self.v: list[tf.Variable] = []

    def _create_slots(self, name, var):
        self.m.append(self._slot(name, f"{self.slot_prefix}_m", var.shape))
        self.v.append(self._slot(name, f"{self.slot_prefix}_v", var.shape))

    def _moments(self, i, g):
        """The moments of variable ``i`` after gradient ``g`` (not assigned yet)."""
        b1, b2 = self.beta_1, self.beta_2
        m, v = self.m[i], self.v[i]
        new_m = b1 * m + (1.0 - b1) * g
        new_v = b2 * v + (1.0 - b2) * tf.square(g)
        return new_m, new_v

    def _assign(self, i, new_m, new_v, var, new_var) -> None:
        self._set(self.m[i], new_m)
        self._set(self.v[i], new_v)
        self._set(var, new_var)


class AdamW(AdamMoments):
    """BERT's AdamWeightDecay with global-norm clipping; see the module docstring."""

    slot_prefix = "adam"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._decay_flags: list[bool] = []

    def _create_slots(self, name, var):
        super()._create_slots(name, var)
        self._decay_flags.append(decays(name) and self.weight_decay > 0)

    def _update(self, i, g, var, lr):
        new_m, new_v = self._moments(i, g)
        update = new_m / (tf.sqrt(new_v) + self.epsilon)
        if self._decay_flags[i]:
            update += self.weight_decay * var
        self._assign(i, new_m, new_v, var, var - lr * update)


class Lamb(AdamMoments):
    """LAMB (You et al. 2019, Algorithm 2) as BERT-LAMB implementations run it.

    Per variable w with gradient g at step t (from 1)::

        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        r = m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w
        ratio = ||w|| / ||r||    (1 when either norm is 0)
        w -= lr * ratio * r

    LayerNorm parameters and biases get no weight decay and ratio 1.
    """

    slot_prefix = "lamb"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._adapt: list[bool] = []

    def _create_slots(self, name, var):
        super()._create_slots(name, var)
        self._adapt.append(decays(name))

    def _update(self, i, g, var, lr):
        b1, b2 = self.beta_1, self.beta_2
        t = tf.cast(self.iterations + 1, tf.float32)
        new_m, new_v = self._moments(i, g)
        m_hat = new_m / (1.0 - tf.pow(b1, t))
        v_hat = new_v / (1.0 - tf.pow(b2, t))
        update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        if self._adapt[i]:
            if self.weight_decay > 0:
                update += self.weight_decay * var
            w_norm = tf.norm(var)
            u_norm = tf.norm(update)
            ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / tf.maximum(u_norm, 1e-30),
                             1.0)
            update *= ratio
        self._assign(i, new_m, new_v, var, var - lr * update)


def amos_eta(name: str, shape, hidden_size: int) -> float:
    """Amos's ``eta``: the expected scale of a variable's entries, by Google name.

    As jestimator sets it for BERT: LayerNorm gamma 1; biases and LayerNorm beta 0.5;
    embeddings sqrt(2 / hidden); the feed-forward output kernel (after the activation)
    sqrt(2 / fan_in); every other kernel or weight matrix sqrt(1 / hidden).
    """
    if name.endswith("LayerNorm/gamma"):
        return 1.0
    if name.endswith("bias") or name.endswith("LayerNorm/beta"):
        return 0.5
    if name.endswith("_embeddings"):
        return math.sqrt(2.0 / hidden_size)
    if re.search(r"layer_\d+/output/dense/kernel$", name):
        return math.sqrt(2.0 / shape[0])
    return math.sqrt(1.0 / hidden_size)


def amos_slot_shape(name: str, shape) -> list[int]:
    """Shape of Amos's ``v`` and ``b`` slots: reduced over a kernel's input axis and an
    embedding's hidden axis (jestimator's BERT setting); one scalar for other variables."""
    shape = list(shape)
    if name.endswith("/kernel") and len(shape) == 2:
        return [1, shape[1]]
    if name.endswith("_embeddings") and len(shape) == 2:
        return [shape[0], 1]
    return []


class Amos(Optimizer):
    """Amos (Tian & Parikh 2022, arXiv:2210.11693, Algorithm 1), with jestimator's momentum.

    With the global learning rate xi (the schedule), a variable w of expected scale eta
    (``amos_eta``), gradient g, step t (from 1), and slots v, b of a reduced shape
    (``amos_slot_shape``; means over the reduced axes are written <.>)::

        v = beta v + (1 - beta) <g^2>
        r = (1 - beta^t) / max(v, tiny)                       # 1 / v_hat
        gamma = xi^2 r <g^2> / sqrt(1 + zeta sqrt(xi) b)      # adaptive decay rate
        alpha = xi eta                                        # initial per-variable lr
        u = -(alpha sqrt(r) g + gamma w / 2) / (1 + zeta sqrt(alpha) b)
        b = b + gamma (1 + b)
        m = mu m + (1 - mu) u;  w += m                        # momentum mu (0 = off)

    ``weight_decay`` does not apply: the decay towards 0 is the gamma term. A fine-tune of a
    pretrained model would start ``b`` above 0 (jestimator's ``init_b``); not offered here.
    """

    def __init__(self, schedule, hidden_size: int, beta: float = 0.999, zeta: float = 0.25,
                 momentum: float = 0.9, clip_norm: float | None = 1.0,
                 epsilon: float = 2.0 ** -125):
        super().__init__(schedule, clip_norm)
        self.hidden_size = int(hidden_size)
        self.beta, self.zeta, self.momentum, self.epsilon = beta, zeta, momentum, epsilon
        self.v: list[tf.Variable] = []
        self.b: list[tf.Variable] = []
        self.m: list[tf.Variable] = []
        self._eta: list[float] = []
        self._reduce: list[list[int] | None] = []

    def _create_slots(self, name, var):
        shape = var.shape.as_list()
        slot = amos_slot_shape(name, shape)
        self.v.append(self._slot(name, "amos_v", slot))
        self.b.append(self._slot(name, "amos_b", slot))
        if self.momentum:
            self.m.append(self._slot(name, "amos_m", shape))
        self._eta.append(amos_eta(name, shape, self.hidden_size))
        self._reduce.append([a for a, n in enumerate(slot) if n == 1 and shape[a] != 1]
                            if slot else None)

    def _update(self, i, g, var, lr):
        t = tf.cast(self.iterations + 1, tf.float32)
        v, b = self.v[i], self.b[i]
        axes = self._reduce[i]
        g2 = (tf.reduce_mean(tf.square(g)) if axes is None
              else tf.reduce_mean(tf.square(g), axis=axes, keepdims=True))
        new_v = self.beta * v + (1.0 - self.beta) * g2
        r = (1.0 - tf.pow(self.beta, t)) / tf.maximum(new_v, self.epsilon)
        xi = lr
        gamma = tf.math.rsqrt(1.0 + self.zeta * tf.sqrt(xi) * b) * tf.square(xi) * r * g2
        alpha = xi * self._eta[i]
        update = -(alpha * tf.sqrt(r) * g + 0.5 * gamma * var) / (
            1.0 + self.zeta * tf.sqrt(alpha) * b)
        self._set(v, new_v)
        self._set(b, b + gamma * (1.0 + b))
        if self.momentum:
            m = self.m[i]
            update = self.momentum * m + (1.0 - self.momentum) * update
            self._set(m, update)
        self._set(var, var + update)


def make_optimizer(name: str, schedule, *, weight_decay: float, clip_norm: float | None,
                   hidden_size: int | None = None):
    """The optimizer ``name`` names ("adamw", "lamb" or "amos")."""
    name = (name or "adamw").lower()
    if name == "adamw":
        return AdamW(schedule, weight_decay=weight_decay, clip_norm=clip_norm)
    if name == "lamb":
        return Lamb(schedule, weight_decay=weight_decay, clip_norm=clip_norm)
    if name == "amos":
        if not hidden_size:
            raise ValueError("the amos optimizer needs the model's hidden_size")
        return Amos(schedule, hidden_size=hidden_size, clip_norm=clip_norm)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}; got {name!r}")


def schedule_from_spec(spec: OptimizerSpec, train_steps: int) -> WarmupDecay:
    """The learning-rate schedule of an OptimizerSpec."""
    return WarmupDecay(spec.learning_rate, spec.warmup_steps, train_steps, decay=spec.decay,
                       decay_power=float(spec.decay_power),
                       end_learning_rate=float(spec.end_learning_rate))


def optimizer_from_spec(spec: OptimizerSpec, train_steps: int, hidden_size: int):
    """The optimizer of an OptimizerSpec (TrainSpec.optimization, FinetuneSpec.optimization())."""
    return make_optimizer(spec.optimizer, schedule_from_spec(spec, train_steps),
                          weight_decay=float(spec.weight_decay), clip_norm=float(spec.clip_norm),
                          hidden_size=hidden_size)


class DynamicLossScale(tf.Module):
    """Loss scaling for float16 compute: multiply the loss by ``scale``; the caller divides
    the gradients by it. A step whose gradients are not finite is skipped and halves the
    scale; ``growth_steps`` finite steps in a row double it (Keras' defaults: 2**15, 2000).
    ``loss_scale`` and ``good_steps`` are checkpointed (Google's names for the same state).
    """

    def __init__(self, initial_scale: float = 2.0 ** 15, growth_steps: int = 2000):
        super().__init__()
        self.growth_steps = int(growth_steps)
        self.scale = tf.Variable(float(initial_scale), name="loss_scale", trainable=False,
                                 aggregation=_ONLY_FIRST)
        self.good_steps = tf.Variable(0, dtype=tf.int64, name="good_steps", trainable=False,
                                      aggregation=_ONLY_FIRST)

    def update(self, finite) -> None:
        """Adjusts the scale after a step whose gradients were ``finite`` (bool tensor)."""
        grow = finite & (self.good_steps + 1 >= self.growth_steps)
        new_scale = tf.where(grow, self.scale * 2.0,
                             tf.where(finite, self.scale, tf.maximum(self.scale / 2.0, 1.0)))
        new_good = tf.where(finite & ~grow, self.good_steps + 1, tf.zeros_like(self.good_steps))
        self.scale.assign(new_scale)
        self.good_steps.assign(new_good)
