"""The tf.distribute strategy for a plan's accelerator dict.

- ``{"type": "cpu"}``: TF's default strategy (one device, no distribution overhead);
  ``{"type": "cpu", "replicas": n}``: MirroredStrategy over n logical CPUs (the CPU test
  profile: n = 8 runs the per-replica code of a v3-8; must be asked before TensorFlow runs
  anything, see ``split_cpu``).
- ``{"type": "gpu", "devices": [...]?}``: MirroredStrategy over the local GPUs (or the
  devices named).
- CPU or GPU with a TF_CONFIG naming several workers (runtime/cluster.py):
  MultiWorkerMirroredStrategy over every worker's devices.
- ``{"type": "tpu", "tpu"?: "<tpu name or grpc://address>", "zone"?, "project"?}``:
  TPUClusterResolver (see ``tpu_address``) -> connect -> initialise the TPU system ->
  TPUStrategy.

Usage:
    configure_threads()              # once, before TF runs its first op
    strategy = make_strategy(ctx.plan.accelerator or ctx.params.get("accelerator"))
    with strategy.scope(): model = ...
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import tensorflow as tf

from runexp.runtime import cluster


def configure_threads(intra_op: int | None = None, inter_op: int | None = None) -> bool:
    """Sets TF's thread pools: intra-op = cores, inter-op = 2 by default.

    Must run before TensorFlow executes anything; returns False (and changes nothing) when
    the runtime is already initialised, e.g. an earlier stage ran in this process.
    """
    cores = os.cpu_count() or 1
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op or cores)
        tf.config.threading.set_inter_op_parallelism_threads(inter_op or min(2, cores))
        return True
    except RuntimeError:
        return False


def split_cpu(replicas: int) -> list[str]:
    """Splits the CPU into at least ``replicas`` logical devices; returns the first
    ``replicas`` device names.

    Must run before TensorFlow executes its first op, unless the split was already made
    (then it is reused: several stages, or a 1-replica and an 8-replica run, can share one
    process).
    """
    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0]) or []
    if len(current) < replicas:
        try:
            tf.config.set_logical_device_configuration(
                cpus[0], [tf.config.LogicalDeviceConfiguration()] * replicas)
        except RuntimeError as e:
            raise RuntimeError(
                f"cannot split the CPU into {replicas} logical devices: TensorFlow already "
                f"started in this process with {max(len(current), 1)}; split it first "
                "(runexp.runtime.strategy.split_cpu) or run in a fresh process") from e
    return [f"/cpu:{i}" for i in range(replicas)]


# Plan accelerator keys saying where the TPU is (experiment.tpu, tpu_zone, gcp_project).
TPU_LOCATION = ("tpu", "zone", "project")


def tpu_address(accelerator: Mapping[str, Any]) -> str:
    """The TPU to connect to: the plan's ``tpu`` (a name or grpc:// address), else $TPU_NAME,
    else "local" (the TPU attached to this TPU VM). Never the profile's name (tpu_v3_8)."""
    return accelerator.get("tpu") or os.environ.get("TPU_NAME") or "local"


_multi_worker = None  # the process's MultiWorkerMirroredStrategy, once made


def make_strategy(accelerator: Mapping[str, Any] | None,
                  multi_worker: bool = True) -> tf.distribute.Strategy:
    """Returns the strategy the accelerator dict asks for (see the module docstring).

    ``multi_worker=False``: this machine's devices only, even in a multi-worker run (for
    stages only the chief runs, such as evaluation)."""
    global _multi_worker
    accelerator = dict(accelerator or {})
    kind = str(accelerator.get("type", "cpu")).lower()
    if kind in ("cpu", "gpu") and multi_worker and cluster.is_multi_worker():
        # Every worker's devices, gradients all-reduced across the cluster TF_CONFIG names;
        # one per process (TensorFlow sets up the cluster's collectives once).
        if _multi_worker is None:
            _multi_worker = tf.distribute.MultiWorkerMirroredStrategy()
        return _multi_worker
    if kind == "cpu":
        replicas = int(accelerator.get("replicas", 1))
        if replicas > 1:
            # Logical CPUs split before TF starts: runs the multi-replica code path (per-
            # replica batches, gradient all-reduce) on a machine without accelerators.
            return tf.distribute.MirroredStrategy(split_cpu(replicas))
        return tf.distribute.get_strategy()
    if kind == "gpu":
        gpus = tf.config.list_logical_devices("GPU")
        if not gpus:
            raise RuntimeError(
                f"accelerator {accelerator.get('name', 'gpu')!r} asks for GPUs but TensorFlow "
                "sees none (tf.config.list_logical_devices('GPU') is empty)")
        devices = accelerator.get("devices") or [d.name for d in gpus]
        return tf.distribute.MirroredStrategy(devices=list(devices))
    if kind == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=tpu_address(accelerator), zone=accelerator.get("zone"),
            project=accelerator.get("project"))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"accelerator type must be one of 'cpu', 'gpu', 'tpu'; got {kind!r}")


def is_tpu(accelerator: Mapping[str, Any] | None) -> bool:
    """Whether the accelerator dict names a TPU (every step is XLA-compiled there)."""
    return str((accelerator or {}).get("type", "cpu")).lower() == "tpu"


def accelerator_of(ctx) -> Mapping[str, Any]:
    """The accelerator dict for a stage: its own ``accelerator`` param (the profile, part of
    its fingerprint), else the plan's; with the plan's TPU location (which TPU to use does not
    change what is trained)."""
    plan_accelerator = dict(ctx.plan.accelerator or {})
    accelerator = dict(ctx.params.get("accelerator") or plan_accelerator)
    for key in TPU_LOCATION:
        if plan_accelerator.get(key) is not None:
            accelerator[key] = plan_accelerator[key]
    return accelerator
