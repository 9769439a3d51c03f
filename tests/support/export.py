"""Helpers of the export tests: cheap upstream stage directories, and export contexts in a
plan whose stages depend on each other as the planner makes them."""

from __future__ import annotations

import os

import tensorflow as tf

from runexp.compiler.plan import Plan, Stage
from runexp.runtime.bert_config import BertConfig
from runexp.runtime.checkpoints import CHECKPOINT_SUBDIR
from runexp.runtime.context import StageContext
from runexp.runtime.model import BertPretrainer


def write_pretrain_dir(stage_dir: str, model: dict, step: int = 7, seed: int = 0):
    """A pretrain stage directory holding a freshly initialised BertPretrainer's training
    checkpoint (the trainer's layout: ``checkpoints/ckpt-<step>``); returns the model."""
    tf.random.set_seed(seed)
    pretrainer = BertPretrainer(BertConfig.from_dict(model))
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=pretrainer), os.path.join(stage_dir, CHECKPOINT_SUBDIR),
        max_to_keep=1, checkpoint_name="ckpt")
    manager.save(checkpoint_number=step)
    return pretrainer


def stage(kind: str, params: dict, inputs: dict, output_dir: str, deps=()) -> Stage:
    return Stage(id=kind, kind=kind, params=params, inputs=inputs, output_dir=output_dir,
                 deps=tuple(deps))


def export_ctx(model: dict, inputs: dict, work_dir: str, upstream=(), messages=None):
    """The export stage's context in a plan with ``upstream`` stages it depends on."""
    os.makedirs(work_dir, exist_ok=True)
    export = stage("export", {"model": dict(model)}, inputs, work_dir,
                   deps=[s.id for s in upstream])
    plan = Plan(experiment="test", output_root=os.path.dirname(work_dir),
                stages=(*upstream, export), accelerator={"type": "cpu"})
    sink = messages.append if messages is not None else (lambda _: None)
    return StageContext(stage=export, plan=plan, work_dir=work_dir, progress=sink)


def google_bert_modeling():
    """google-research/bert's ``modeling`` module (bert-tensorflow 1.0.4), runnable on
    TensorFlow 2: it is TF1 code (``tf.compat.v1``) whose two layer helpers TF2 no longer
    has, ``tf.contrib.layers.layer_norm`` and ``tf.layers.dense`` (gone with Keras 3). They
    are supplied here with the variables and math of the TF1 originals (``LayerNorm/beta``,
    ``LayerNorm/gamma``, epsilon 1e-12; ``dense/kernel``, ``dense/bias``); everything else is
    Google's code. A private copy of the module is loaded: ``bert.modeling`` itself is left
    alone."""
    import importlib.util
    import sys
    import types

    import bert

    tf1 = tf.compat.v1

    def layer_norm(inputs, begin_norm_axis=-1, begin_params_axis=-1, scope=None):
        del begin_norm_axis, begin_params_axis  # the last axis, as modeling.py asks
        with tf1.variable_scope(scope, default_name="LayerNorm"):
            dim = inputs.shape[-1]
            beta = tf1.get_variable("beta", [dim], initializer=tf1.zeros_initializer())
            gamma = tf1.get_variable("gamma", [dim], initializer=tf1.ones_initializer())
            mean, variance = tf.nn.moments(inputs, [-1], keepdims=True)
            return tf.nn.batch_normalization(inputs, mean, variance, beta, gamma, 1e-12)

    def dense(inputs, units, activation=None, name=None, kernel_initializer=None):
        with tf1.variable_scope(name, default_name="dense"):
            kernel = tf1.get_variable("kernel", [inputs.shape[-1], units],
                                      initializer=kernel_initializer)
            bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
            out = tf.nn.bias_add(tf.matmul(inputs, kernel), bias)
            return activation(out) if activation is not None else out

    class _TF1(types.ModuleType):
        """tensorflow.compat.v1 with ``layers.dense``."""

        def __getattr__(self, name):
            return getattr(tf1, name)

    contrib = types.ModuleType("tensorflow.contrib")
    contrib.layers = types.ModuleType("tensorflow.contrib.layers")
    contrib.layers.layer_norm = layer_norm
    saved = {name: sys.modules.get(name)
             for name in ("tensorflow.contrib", "tensorflow.contrib.layers")}
    sys.modules.update({"tensorflow.contrib": contrib,
                        "tensorflow.contrib.layers": contrib.layers})
    try:
        path = os.path.join(os.path.dirname(bert.__file__), "modeling.py")
        spec = importlib.util.spec_from_file_location("runexp_tests_google_bert_modeling", path)
        modeling = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modeling)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    shim = _TF1("tensorflow.compat.v1 (with layers.dense)")
    shim.layers = types.SimpleNamespace(dense=dense)
    modeling.tf = shim
    return modeling
