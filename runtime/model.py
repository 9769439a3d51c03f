"""BERT encoder and heads as plain tf.Modules whose variables carry Google's TF1 names.

Every variable maps one-to-one to a name in google-research/bert's released checkpoints
(``bert/encoder/layer_0/attention/self/query/kernel`` ...), so a Google checkpoint loads
without a conversion table and an export is readable by Google's own code.

Usage:
    config = BertConfig.from_dict(params["model"])
    model = BertPretrainer(config)              # encoder + MLM/NSP heads
    mlm_logits, nsp_logits = model(features, training=True)
    loss, stats = model.loss(features, training=True)
    model.google_variables()                    # {"bert/embeddings/word_embeddings": var, ...}

``features`` may be packed rows (tasks/instances/packing.py: ``instance_ids``, ``position_ids``, ...):
the same loss and gradients as their instances one a row (BertPretrainer), the same
variables; the exports serve one instance a row.

Activations are kept flat as [batch * seq, hidden] between layers so every dense layer is
one 2-D matmul; the query/key/value kernels are concatenated into one matmul per layer.
"""

from __future__ import annotations

import functools
import math
from typing import Mapping

import tensorflow as tf

from runexp.runtime.bert_config import BertConfig
from runexp.runtime.layers import (ACTIVATIONS, Dense, Dropout, Embeddings, LayerNorm,
                                   google_variable, matmul, matmul_dtype, normal_init,
                                   vocab_cross_entropy)

RECOMPUTE = ("none", "layers")


def is_packed(features: Mapping[str, tf.Tensor]) -> bool:
    """Whether a pretraining batch holds packed rows (several instances a row; their
    features: tasks/instances/packing.py)."""
    return "instance_ids" in features


def packed_inputs(features: Mapping[str, tf.Tensor]) -> dict | None:
    """The encoder's ``packing`` argument of a batch: None when it is not packed."""
    if not is_packed(features):
        return None
    return {k: features[k] for k in ("position_ids", "instance_ids",
                                     "next_sentence_positions")}


def _flat_positions(positions, seq_length):
    """Row positions [batch, n] -> indices [batch * n] into a flat [batch * seq, ...]."""
    positions = tf.cast(positions, tf.int32)
    offsets = tf.range(tf.shape(positions)[0])[:, tf.newaxis] * seq_length
    return tf.reshape(positions + offsets, [-1])


class TransformerLayer(tf.Module):
    """One post-LayerNorm transformer block, ``bert/encoder/layer_<i>``."""

    def __init__(self, config: BertConfig, scope: str, dropout: Dropout,
                 compute_dtype=tf.float32):
        super().__init__()
        self.dropout = dropout
        h, std = config.hidden_size, config.initializer_range
        self.config = config
        self.compute_dtype = compute_dtype
        dense = functools.partial(Dense, stddev=std, compute_dtype=compute_dtype)
        self.query = dense(f"{scope}/attention/self/query", h, h)
        self.key = dense(f"{scope}/attention/self/key", h, h)
        self.value = dense(f"{scope}/attention/self/value", h, h)
        self.attention_output = dense(f"{scope}/attention/output/dense", h, h)
        self.attention_norm = LayerNorm(f"{scope}/attention/output/LayerNorm", h)
        self.intermediate = dense(f"{scope}/intermediate/dense", h, config.intermediate_size)
        self.output = dense(f"{scope}/output/dense", config.intermediate_size, h)
        self.output_norm = LayerNorm(f"{scope}/output/LayerNorm", h)
        self.activation = ACTIVATIONS[config.hidden_act]

    def dropout_keys(self, training: bool):
        """The dropout keys of one call, in the order the call draws them (see
        ``Dropout.key``): attention probabilities, attention output, layer output."""
        c = self.config
        return [self.dropout.key(rate, training) for rate in
                (c.attention_probs_dropout_prob, c.hidden_dropout_prob, c.hidden_dropout_prob)]

    def recomputed(self, x, attention_bias, batch, seq_length, training: bool):
        """``__call__`` keeping only its input for the backward pass, which runs the layer
        again (``tf.recompute_grad``). Its dropout keys are drawn here, ahead, in the order
        ``__call__`` would draw them, so the masks (and the gradients) are those of
        ``__call__`` under XLA, and the recomputation draws the same masks again."""
        keys = self.dropout_keys(training)

        def layer(h):
            return self(h, attention_bias, batch, seq_length, training, keys=keys)

        return tf.recompute_grad(layer)(x)

    def __call__(self, x, attention_bias, batch, seq_length, training: bool, keys=None):
        """x: [batch * seq, hidden]; attention_bias: [batch, 1, 1, seq] (0 or -10000 by
        key), or [batch, 1, seq, seq] (by query and key: packed rows); keys: None (dropout
        draws from its generator), or ``dropout_keys``."""
        c = self.config
        keys = keys or [None, None, None]
        heads = c.num_attention_heads
        head_dim = c.hidden_size // heads
        # One matmul for query, key and value.
        kernel = tf.concat([self.query.kernel, self.key.kernel, self.value.kernel], axis=1)
        bias = tf.concat([self.query.bias, self.key.bias, self.value.bias], axis=0)
        qkv = tf.nn.bias_add(matmul(x, kernel, self.compute_dtype), bias)
        qkv = tf.reshape(qkv, [batch, seq_length, 3, heads, head_dim])
        qkv = tf.transpose(qkv, [2, 0, 3, 1, 4])  # [3, batch, heads, seq, head_dim]
        q, k, v = tf.unstack(qkv)  # not qkv[i]: StridedSliceGrad zero-fills the whole input
        q *= 1.0 / math.sqrt(head_dim)
        scores = matmul(q, k, self.compute_dtype, transpose_b=True) + attention_bias
        probs = self.dropout(tf.nn.softmax(scores), c.attention_probs_dropout_prob, training,
                             keys[0])
        context = matmul(probs, v, self.compute_dtype)  # [batch, heads, seq, head_dim]
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]),
                             [batch * seq_length, c.hidden_size])
        attended = self.dropout(self.attention_output(context), c.hidden_dropout_prob,
                                training, keys[1])
        x = self.attention_norm(attended + x)
        inner = self.activation(self.intermediate(x))
        out = self.dropout(self.output(inner), c.hidden_dropout_prob, training, keys[2])
        return self.output_norm(out + x)

    def named_variables(self) -> dict:
        out = {}
        for part in (self.query, self.key, self.value, self.attention_output,
                     self.attention_norm, self.intermediate, self.output, self.output_norm):
            out.update(part.named_variables())
        return out


class BertEncoder(tf.Module):
    """The ``bert/`` scope: embeddings, transformer layers and the [CLS] pooler."""

    def __init__(self, config: BertConfig, compute_dtype: str = "float32", seed: int = 0,
                 xla: bool = False, recompute: str = "none"):
        super().__init__()
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {RECOMPUTE}; got {recompute!r}")
        self.config = config
        self.recompute = recompute
        dtype = matmul_dtype(compute_dtype)
        self.dropout = Dropout(seed, xla=xla)
        self.embeddings = Embeddings(config, self.dropout)
        self.layers = [TransformerLayer(config, f"bert/encoder/layer_{i}", self.dropout, dtype)
                       for i in range(config.num_hidden_layers)]
        self.pooler = Dense("bert/pooler/dense", config.hidden_size, config.hidden_size,
                            config.initializer_range)

    def __call__(self, input_ids, input_mask, segment_ids, training: bool = False,
                 packing: Mapping[str, tf.Tensor] | None = None):
        """Encodes a batch.

        Args:
          input_ids, input_mask, segment_ids: int32 [batch, seq].
          training: applies dropout when True.
          packing: None (one instance a row), or a packed batch's ``position_ids``,
            ``instance_ids`` [batch, seq] and ``next_sentence_positions`` [batch, K]
            (``packed_inputs``).

        Returns:
          (sequence_output [batch * seq, hidden] flat, pooled_output [batch, hidden]; packed:
          [batch * K, hidden], the pooler at each instance's [CLS]).
        """
        layers, pooled = self.layer_outputs(input_ids, input_mask, segment_ids, training,
                                            packing)
        return layers[-1], pooled

    def layer_outputs(self, input_ids, input_mask, segment_ids, training: bool = False,
                      packing: Mapping[str, tf.Tensor] | None = None):
        """``__call__`` keeping every layer's output (the exported encoder's
        ``encoder_outputs``).

        A packed row (``packing``) holds up to K instances one after the other: positions
        restart at 0 with each, a token attends only to the tokens of its own instance
        (``instance_ids`` equal; padding, id 0, only to padding: its outputs are never
        read), and the pooler runs at each instance's [CLS]. Every instance's outputs are
        then those it has alone in a row of its own (up to float rounding).

        Returns:
          ([embeddings output, then each transformer layer's output], each [batch * seq,
          hidden] flat; the last is ``__call__``'s sequence_output), pooled_output.
        """
        batch, seq_length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        if packing is None:
            mask = tf.cast(input_mask, tf.float32)
            attention_bias = ((1.0 - mask) * -10000.0)[:, tf.newaxis, tf.newaxis, :]
            x = self.embeddings(input_ids, segment_ids, training)
        else:
            instances = packing["instance_ids"]
            same = tf.equal(instances[:, :, tf.newaxis], instances[:, tf.newaxis, :])
            attention_bias = ((1.0 - tf.cast(same, tf.float32)) * -10000.0)[:, tf.newaxis]
            x = self.embeddings(input_ids, segment_ids, training,
                                position_ids=packing["position_ids"])
        outputs = [x]
        for layer in self.layers:
            if self.recompute == "layers":
                x = layer.recomputed(x, attention_bias, batch, seq_length, training)
            else:
                x = layer(x, attention_bias, batch, seq_length, training)
            outputs.append(x)
        if packing is None:
            first_token = tf.reshape(x, [batch, seq_length, self.config.hidden_size])[:, 0]
        else:
            first_token = tf.gather(x, _flat_positions(packing["next_sentence_positions"],
                                                       seq_length))
        pooled = tf.tanh(self.pooler(first_token))
        return outputs, pooled

    def named_variables(self) -> dict:
        out = dict(self.embeddings.named_variables())
        for layer in self.layers:
            out.update(layer.named_variables())
        out.update(self.pooler.named_variables())
        return out


class PretrainingHeads(tf.Module):
    """The ``cls/`` scope: masked-LM head (decoder tied to the word embeddings) and NSP."""

    def __init__(self, config: BertConfig, word_embeddings: tf.Variable,
                 compute_dtype: str = "float32"):
        super().__init__()
        h, std = config.hidden_size, config.initializer_range
        self.config = config
        self.compute_dtype = matmul_dtype(compute_dtype)
        self._word_embeddings = word_embeddings
        self.transform = Dense("cls/predictions/transform/dense", h, h, std, self.compute_dtype)
        self.transform_norm = LayerNorm("cls/predictions/transform/LayerNorm", h)
        self.output_bias = google_variable("cls/predictions", "output_bias",
                                     tf.zeros([config.vocab_size]))
        self.nsp_weights = google_variable("cls/seq_relationship", "output_weights",
                                     normal_init([2, h], std))
        self.nsp_bias = google_variable("cls/seq_relationship", "output_bias", tf.zeros([2]))
        self.activation = ACTIVATIONS[config.hidden_act]

    def mlm_logits(self, sequence_output, positions, seq_length):
        """Logits [batch * predictions, vocab] at ``positions`` [batch, predictions]."""
        batch = tf.shape(positions)[0]
        offsets = tf.range(batch)[:, tf.newaxis] * seq_length
        flat_positions = tf.reshape(positions + offsets, [-1])
        x = tf.gather(sequence_output, flat_positions)
        x = self.transform_norm(self.activation(self.transform(x)))
        logits = matmul(x, self._word_embeddings, self.compute_dtype, transpose_b=True)
        return tf.nn.bias_add(logits, self.output_bias)

    def nsp_logits(self, pooled_output):
        return tf.nn.bias_add(tf.matmul(pooled_output, self.nsp_weights, transpose_b=True),
                              self.nsp_bias)

    def named_variables(self) -> dict:
        return {
            **self.transform.named_variables(),
            **self.transform_norm.named_variables(),
            "cls/predictions/output_bias": self.output_bias,
            "cls/seq_relationship/output_weights": self.nsp_weights,
            "cls/seq_relationship/output_bias": self.nsp_bias,
        }


class BertPretrainer(tf.Module):
    """Encoder + MLM/NSP heads; the model the pretrain and evaluate stages run.

    Args:
      config: the model's ``bert_config.json`` fields.
      compute_dtype: "float32"; "bfloat16" runs matmuls in bfloat16 (TPUs, CPUs with AMX);
        "mixed_float16" runs them in float16 (GPUs; the trainer then scales the loss).
        Variables, LayerNorm, softmax and losses stay float32.
      seed: seed of the dropout generator.
      xla: the model runs under XLA (jit_compile, TPUs): dropout draws ThreeFry bits.
      recompute: "none", or "layers": each transformer layer recomputes its activations in
        the backward pass (same gradients as "none" with ``xla``; same variables).

    Packed batches (``is_packed``: several instances a row, tasks/instances/packing.py) are an input
    format only: the same variables, and the same loss as the same instances one a row. The
    masked-LM loss is sum(weight * cross-entropy) / sum(weight) over every prediction of the
    batch (a row's predictions are its instances'); the next-sentence loss is the mean over
    the batch's instances (``next_sentence_weights`` 1 for a real instance, 0 for an empty
    slot), its logits from the pooler at each instance's [CLS]. The stat ``examples`` counts
    instances, not rows.
    """

    # The keys of loss_stats (the trainer sums them over steps, micro-batches, replicas).
    STAT_KEYS = ("mlm_loss_sum", "mlm_weight", "mlm_correct", "nsp_loss_sum", "nsp_correct",
                 "examples")

    def __init__(self, config: BertConfig, compute_dtype: str = "float32", seed: int = 0,
                 xla: bool = False, recompute: str = "none"):
        super().__init__()
        self.config = config
        self.encoder = BertEncoder(config, compute_dtype, seed, xla=xla, recompute=recompute)
        self.heads = PretrainingHeads(config, self.encoder.embeddings.word_embeddings,
                                      compute_dtype)

    def __call__(self, features: Mapping[str, tf.Tensor], training: bool = False):
        """Returns (mlm_logits [batch * predictions, vocab], nsp_logits [batch, 2]; packed:
        [batch * K, 2], one row per instance slot)."""
        sequence_output, pooled = self.encoder(
            features["input_ids"], features["input_mask"], features["segment_ids"], training,
            packing=packed_inputs(features))
        seq_length = tf.shape(features["input_ids"])[1]
        mlm = self.heads.mlm_logits(sequence_output, features["masked_lm_positions"],
                                    seq_length)
        return mlm, self.heads.nsp_logits(pooled)

    def loss(self, features: Mapping[str, tf.Tensor], training: bool = False):
        """BERT's pretraining loss and the sums metrics are built from.

        Returns:
          (loss, stats): loss = sum(w * ce) / sum(w) over masked positions + mean NSP
          cross-entropy. stats holds sums (mlm_loss_sum, mlm_weight, mlm_correct,
          nsp_loss_sum, nsp_correct, examples) so metrics add up exactly across steps and
          replicas.
        """
        stats = self.loss_stats(features, training=training)
        return self.objective(stats, self.loss_denominators(features)), stats

    def loss_stats(self, features: Mapping[str, tf.Tensor], training: bool = False) -> dict:
        """The sums of ``loss``'s stats for one (micro-)batch."""
        mlm_logits, nsp_logits = self(features, training=training)
        ids = tf.reshape(features["masked_lm_ids"], [-1])
        weights = tf.reshape(tf.cast(features["masked_lm_weights"], tf.float32), [-1])
        mlm_ce = vocab_cross_entropy(ids, mlm_logits)
        mlm_pred = tf.argmax(mlm_logits, axis=-1, output_type=tf.int32)
        nsp_labels = tf.reshape(features["next_sentence_labels"], [-1])
        nsp_ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels,
                                                                logits=nsp_logits)
        nsp_pred = tf.argmax(nsp_logits, axis=-1, output_type=tf.int32)
        nsp_hit = tf.cast(tf.equal(nsp_pred, nsp_labels), tf.float32)
        if is_packed(features):
            # Each instance slot weighted: 1 for an instance, 0 for an empty slot.
            nsp_weights = tf.reshape(tf.cast(features["next_sentence_weights"], tf.float32),
                                     [-1])
            nsp_loss_sum = tf.reduce_sum(nsp_weights * nsp_ce)
            nsp_correct = tf.reduce_sum(nsp_weights * nsp_hit)
            instances = tf.reduce_sum(nsp_weights)
        else:
            nsp_loss_sum, nsp_correct = tf.reduce_sum(nsp_ce), tf.reduce_sum(nsp_hit)
            instances = tf.cast(tf.shape(nsp_labels)[0], tf.float32)
        return {
            "mlm_loss_sum": tf.reduce_sum(weights * mlm_ce),
            "mlm_weight": tf.reduce_sum(weights),
            "mlm_correct": tf.reduce_sum(weights * tf.cast(tf.equal(mlm_pred, ids), tf.float32)),
            "nsp_loss_sum": nsp_loss_sum,
            "nsp_correct": nsp_correct,
            "examples": instances,
        }

    @staticmethod
    def loss_denominators(features: Mapping[str, tf.Tensor]) -> dict:
        """What ``objective`` divides by, from the inputs alone (no forward pass): summed over
        the whole global batch first, the per-replica and per-micro-batch losses add up to
        the global batch's loss exactly. ``examples``: the batch's instances (packed: the
        sum of ``next_sentence_weights``)."""
        if is_packed(features):
            instances = tf.reduce_sum(tf.cast(features["next_sentence_weights"], tf.float32))
        else:
            instances = tf.cast(tf.shape(features["next_sentence_labels"])[0], tf.float32)
        return {"mlm_weight": tf.reduce_sum(tf.cast(features["masked_lm_weights"], tf.float32)),
                "examples": instances}

    @staticmethod
    def objective(stats: Mapping[str, tf.Tensor], denominators: Mapping[str, tf.Tensor]):
        """The loss of a (part of a) batch whose totals are ``denominators``."""
        return (stats["mlm_loss_sum"] / tf.maximum(denominators["mlm_weight"], 1e-5)
                + stats["nsp_loss_sum"] / tf.maximum(denominators["examples"], 1.0))

    def google_variables(self) -> dict:
        """{Google TF1 checkpoint name: variable} for every variable of the model."""
        return {**self.encoder.named_variables(), **self.heads.named_variables()}


class BertClassifier(tf.Module):
    """Encoder + the classification head of google-research/bert's run_classifier.py.

    The head's variables are ``output_weights`` [num_labels, hidden] and ``output_bias``,
    as Google names them. A ``regression`` head has one output, the predicted score, trained
    with mean squared error on the float ``label_values`` (as Hugging Face's
    BertForSequenceClassification with num_labels=1); for it ``correct`` stays 0.
    """

    STAT_KEYS = ("loss_sum", "correct", "examples")

    def __init__(self, config: BertConfig, num_labels: int, compute_dtype: str = "float32",
                 seed: int = 0, xla: bool = False, recompute: str = "none",
                 regression: bool = False):
        super().__init__()
        if regression and num_labels != 1:
            raise ValueError(f"a regression head has one output, not {num_labels}")
        self.config = config
        self.num_labels = num_labels
        self.regression = regression
        self.encoder = BertEncoder(config, compute_dtype, seed, xla=xla, recompute=recompute)
        self.output_weights = google_variable("", "output_weights",
                                        normal_init([num_labels, config.hidden_size], 0.02))
        self.output_bias = google_variable("", "output_bias", tf.zeros([num_labels]))

    def __call__(self, features: Mapping[str, tf.Tensor], training: bool = False):
        """Returns logits [batch, num_labels] (a regression's scores: [batch, 1])."""
        _, pooled = self.encoder(features["input_ids"], features["input_mask"],
                                 features["segment_ids"], training)
        pooled = self.encoder.dropout(pooled, self.config.hidden_dropout_prob, training)
        return tf.nn.bias_add(tf.matmul(pooled, self.output_weights, transpose_b=True),
                              self.output_bias)

    def loss(self, features: Mapping[str, tf.Tensor], training: bool = False):
        """Returns (mean cross-entropy, or mean squared error, and the stats)."""
        stats = self.loss_stats(features, training=training)
        return self.objective(stats, self.loss_denominators(features)), stats

    def loss_stats(self, features: Mapping[str, tf.Tensor], training: bool = False) -> dict:
        logits = self(features, training=training)
        if self.regression:
            gold = tf.reshape(features["label_values"], [-1])
            error = tf.reshape(tf.cast(logits, tf.float32), [-1]) - gold
            return {"loss_sum": tf.reduce_sum(tf.square(error)), "correct": tf.zeros([]),
                    "examples": tf.cast(tf.shape(gold)[0], tf.float32)}
        labels = tf.reshape(features["label_ids"], [-1])
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        pred = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {
            "loss_sum": tf.reduce_sum(ce),
            "correct": tf.reduce_sum(tf.cast(tf.equal(pred, labels), tf.float32)),
            "examples": tf.cast(tf.shape(labels)[0], tf.float32),
        }

    @staticmethod
    def loss_denominators(features: Mapping[str, tf.Tensor]) -> dict:
        gold = features["label_ids"] if "label_ids" in features else features["label_values"]
        return {"examples": tf.cast(tf.shape(gold)[0], tf.float32)}

    @staticmethod
    def objective(stats: Mapping[str, tf.Tensor], denominators: Mapping[str, tf.Tensor]):
        return stats["loss_sum"] / tf.maximum(denominators["examples"], 1.0)

    def google_variables(self) -> dict:
        return {**self.encoder.named_variables(), "output_weights": self.output_weights,
                "output_bias": self.output_bias}


def count_parameters(variables: Mapping[str, tf.Variable]) -> int:
    """Total number of scalars in ``variables``."""
    return int(sum(v.shape.num_elements() for v in variables.values()))
