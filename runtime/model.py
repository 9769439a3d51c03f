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

Activations are kept flat as [batch * seq, hidden] between layers so every dense layer is
one 2-D matmul; the query/key/value kernels are concatenated into one matmul per layer.
"""

from __future__ import annotations

import functools
import math
from typing import Mapping

import tensorflow as tf

from runexp.runtime.bert_config import HIDDEN_ACTS, BertConfig

_LAYER_NORM_EPSILON = 1e-12  # what google-research/bert's layer_norm uses


def _gelu(x):
    # google-research/bert's gelu is the tanh approximation.
    return tf.nn.gelu(x, approximate=True)


_ACTIVATIONS = {
    "gelu": _gelu,
    "gelu_new": _gelu,
    "gelu_exact": lambda x: tf.nn.gelu(x, approximate=False),
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
    "linear": tf.identity,
}
assert set(_ACTIVATIONS) == set(HIDDEN_ACTS), "bert_config.HIDDEN_ACTS is this table's keys"


# recompute param: "layers" keeps only each transformer layer's input for the backward pass
# and runs the layer again there (activation recomputation: less memory, more compute).
RECOMPUTE = ("none", "layers")

# compute_dtype param -> the dtype matmuls run in (variables, LayerNorm, softmax and losses
# stay float32 in every case).
COMPUTE_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16,
                  "mixed_float16": tf.float16}


def matmul_dtype(compute_dtype) -> tf.DType:
    """The matmul dtype of a ``compute_dtype`` name ("float32", "bfloat16",
    "mixed_float16"); a tf.DType passes through."""
    if isinstance(compute_dtype, tf.DType):
        return compute_dtype
    name = compute_dtype or "float32"
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}; "
                         f"got {name!r}")
    return COMPUTE_DTYPES[name]


def _matmul(a, b, compute_dtype, transpose_b: bool = False):
    """float32 matmul, or bfloat16 inputs with a float32 result (variables stay float32)."""
    if compute_dtype == tf.float32:
        return tf.matmul(a, b, transpose_b=transpose_b)
    out = tf.matmul(tf.cast(a, compute_dtype), tf.cast(b, compute_dtype),
                    transpose_b=transpose_b)
    return tf.cast(out, tf.float32)


@tf.function(jit_compile=True)
def _vocab_cross_entropy(labels, logits):
    """sparse_softmax_cross_entropy_with_logits over the vocabulary, compiled by XLA (forward
    and backward): on CPU ~3x faster than TensorFlow's own kernel on [640, 30522] logits,
    ~15% of a tiny model's step."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def _normal(shape, stddev):
    return tf.random.truncated_normal(shape, stddev=stddev)


def _variable(scope: str, name: str, initial) -> tf.Variable:
    # ONLY_FIRST_REPLICA: replicas assign identical values (gradients are all-reduced before
    # the update), so an assign in replica context takes the first replica's value.
    return tf.Variable(initial, name=f"{scope}/{name}" if scope else name,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


class Dense(tf.Module):
    """``<scope>/kernel`` [in, out] and ``<scope>/bias`` [out]."""

    def __init__(self, scope: str, in_dim: int, out_dim: int, stddev: float,
                 compute_dtype=tf.float32):
        super().__init__()
        self.scope = scope
        self.compute_dtype = compute_dtype
        self.kernel = _variable(scope, "kernel", _normal([in_dim, out_dim], stddev))
        self.bias = _variable(scope, "bias", tf.zeros([out_dim]))

    def __call__(self, x):
        return tf.nn.bias_add(_matmul(x, self.kernel, self.compute_dtype), self.bias)

    def named_variables(self) -> dict:
        return {f"{self.scope}/kernel": self.kernel, f"{self.scope}/bias": self.bias}


class LayerNorm(tf.Module):
    """``<scope>/gamma`` and ``<scope>/beta`` over the last axis."""

    def __init__(self, scope: str, dim: int):
        super().__init__()
        self.scope = scope
        self.gamma = _variable(scope, "gamma", tf.ones([dim]))
        self.beta = _variable(scope, "beta", tf.zeros([dim]))

    def __call__(self, x):
        centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        return centered * (tf.math.rsqrt(variance + _LAYER_NORM_EPSILON) * self.gamma) + self.beta

    def named_variables(self) -> dict:
        return {f"{self.scope}/gamma": self.gamma, f"{self.scope}/beta": self.beta}


class Dropout(tf.Module):
    """Inverted dropout drawing its masks from one seeded ``tf.random.Generator``.

    Outside XLA: about twice as fast on CPU as ``tf.nn.dropout``: two 16-bit draws per
    32-bit Philox word, compared as integers; the keep probability is exact to 1/65536.
    Under XLA (``xla=True``: jit_compile, TPUs), whose Philox is ~2x slower on CPU than its
    ThreeFry: each call takes a key from the generator and draws a 32-bit ThreeFry word per
    element (exact to 2**-32). The generator (Philox) state is the same in both modes and is
    tracked, so a resumed run continues the same dropout stream and checkpoints move
    between modes; the masks differ between the modes.
    """

    def __init__(self, seed: int = 0, xla: bool = False):
        super().__init__()
        self.generator = tf.random.Generator.from_seed(seed)
        self.xla = bool(xla)

    def key(self, rate: float, training: bool):
        """The ThreeFry key the next XLA-mode call with (rate, training) would draw (None
        when that call draws nothing): drawn ahead, outside a recomputed layer, so its
        recomputation in the backward pass draws the same mask again."""
        if not training or rate <= 0.0:
            return None
        return self.generator.uniform_full_int([2], dtype=tf.int64)

    def __call__(self, x, rate: float, training: bool, key=None):
        """``key``: None, or a [2] int64 tensor from ``key``: a stateless draw that changes
        no state (under ``xla`` the mask the call would draw without it; otherwise a Philox
        mask, not the 16-bit one)."""
        if not training or rate <= 0.0:
            return x
        if self.xla or key is not None:
            threshold = min(int(round(rate * 2 ** 32)), 2 ** 32 - 1)
            if key is None:
                key = self.key(rate, training)
            words = tf.random.stateless_uniform(tf.shape(x), seed=key, minval=None,
                                                maxval=None, dtype=tf.uint32,
                                                alg="threefry" if self.xla else "philox")
            keep = tf.cast(words >= tf.constant(threshold, tf.uint32), x.dtype)
            return x * (keep * (2 ** 32 / (2 ** 32 - threshold)))
        threshold = int(round(rate * 65536))
        n = tf.size(x)
        words = self.generator.uniform_full_int([(n + 1) // 2], dtype=tf.uint32)
        halves = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:n]
        keep = tf.cast(halves >= threshold, x.dtype) * (65536.0 / (65536 - threshold))
        return x * tf.reshape(keep, tf.shape(x))


class Embeddings(tf.Module):
    """Word, token-type and position embeddings, summed, normalised, dropped out."""

    def __init__(self, config: BertConfig, dropout: Dropout, scope: str = "bert/embeddings"):
        super().__init__()
        self.dropout = dropout
        h, std = config.hidden_size, config.initializer_range
        self.config = config
        self.scope = scope
        self.word_embeddings = _variable(scope, "word_embeddings",
                                         _normal([config.vocab_size, h], std))
        self.token_type_embeddings = _variable(scope, "token_type_embeddings",
                                               _normal([config.type_vocab_size, h], std))
        self.position_embeddings = _variable(scope, "position_embeddings",
                                             _normal([config.max_position_embeddings, h], std))
        self.layer_norm = LayerNorm(f"{scope}/LayerNorm", h)

    def __call__(self, input_ids, segment_ids, training: bool):
        """Returns [batch * seq, hidden]."""
        seq_length = tf.shape(input_ids)[1]
        flat_ids = tf.reshape(input_ids, [-1])
        x = tf.gather(self.word_embeddings, flat_ids)
        x += tf.gather(self.token_type_embeddings, tf.reshape(segment_ids, [-1]))
        positions = self.position_embeddings[:seq_length]
        batch = tf.shape(input_ids)[0]
        x = tf.reshape(x, [batch, seq_length, -1]) + positions[tf.newaxis]
        x = tf.reshape(x, [batch * seq_length, self.config.hidden_size])
        return self.dropout(self.layer_norm(x), self.config.hidden_dropout_prob, training)

    def named_variables(self) -> dict:
        return {
            f"{self.scope}/word_embeddings": self.word_embeddings,
            f"{self.scope}/token_type_embeddings": self.token_type_embeddings,
            f"{self.scope}/position_embeddings": self.position_embeddings,
            **self.layer_norm.named_variables(),
        }


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
        self.activation = _ACTIVATIONS[config.hidden_act]

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
        """x: [batch * seq, hidden]; attention_bias: [batch, 1, 1, seq] (0 or -10000);
        keys: None (dropout draws from its generator), or ``dropout_keys``."""
        c = self.config
        keys = keys or [None, None, None]
        heads = c.num_attention_heads
        head_dim = c.hidden_size // heads
        # One matmul for query, key and value.
        kernel = tf.concat([self.query.kernel, self.key.kernel, self.value.kernel], axis=1)
        bias = tf.concat([self.query.bias, self.key.bias, self.value.bias], axis=0)
        qkv = tf.nn.bias_add(_matmul(x, kernel, self.compute_dtype), bias)
        qkv = tf.reshape(qkv, [batch, seq_length, 3, heads, head_dim])
        qkv = tf.transpose(qkv, [2, 0, 3, 1, 4])  # [3, batch, heads, seq, head_dim]
        q, k, v = tf.unstack(qkv)  # not qkv[i]: StridedSliceGrad zero-fills the whole input
        q *= 1.0 / math.sqrt(head_dim)
        scores = _matmul(q, k, self.compute_dtype, transpose_b=True) + attention_bias
        probs = self.dropout(tf.nn.softmax(scores), c.attention_probs_dropout_prob, training,
                             keys[0])
        context = _matmul(probs, v, self.compute_dtype)  # [batch, heads, seq, head_dim]
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

    def __call__(self, input_ids, input_mask, segment_ids, training: bool = False):
        """Encodes a batch.

        Args:
          input_ids, input_mask, segment_ids: int32 [batch, seq].
          training: applies dropout when True.

        Returns:
          (sequence_output [batch * seq, hidden] flat, pooled_output [batch, hidden]).
        """
        layers, pooled = self.layer_outputs(input_ids, input_mask, segment_ids, training)
        return layers[-1], pooled

    def layer_outputs(self, input_ids, input_mask, segment_ids, training: bool = False):
        """``__call__`` keeping every layer's output (the exported encoder's
        ``encoder_outputs``).

        Returns:
          ([embeddings output, then each transformer layer's output], each [batch * seq,
          hidden] flat; the last is ``__call__``'s sequence_output), pooled_output.
        """
        batch, seq_length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        mask = tf.cast(input_mask, tf.float32)
        attention_bias = ((1.0 - mask) * -10000.0)[:, tf.newaxis, tf.newaxis, :]
        x = self.embeddings(input_ids, segment_ids, training)
        outputs = [x]
        for layer in self.layers:
            if self.recompute == "layers":
                x = layer.recomputed(x, attention_bias, batch, seq_length, training)
            else:
                x = layer(x, attention_bias, batch, seq_length, training)
            outputs.append(x)
        first_token = tf.reshape(x, [batch, seq_length, self.config.hidden_size])[:, 0]
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
        self.output_bias = _variable("cls/predictions", "output_bias",
                                     tf.zeros([config.vocab_size]))
        self.nsp_weights = _variable("cls/seq_relationship", "output_weights",
                                     _normal([2, h], std))
        self.nsp_bias = _variable("cls/seq_relationship", "output_bias", tf.zeros([2]))
        self.activation = _ACTIVATIONS[config.hidden_act]

    def mlm_logits(self, sequence_output, positions, seq_length):
        """Logits [batch * predictions, vocab] at ``positions`` [batch, predictions]."""
        batch = tf.shape(positions)[0]
        offsets = tf.range(batch)[:, tf.newaxis] * seq_length
        flat_positions = tf.reshape(positions + offsets, [-1])
        x = tf.gather(sequence_output, flat_positions)
        x = self.transform_norm(self.activation(self.transform(x)))
        logits = _matmul(x, self._word_embeddings, self.compute_dtype, transpose_b=True)
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
        """Returns (mlm_logits [batch * predictions, vocab], nsp_logits [batch, 2])."""
        sequence_output, pooled = self.encoder(
            features["input_ids"], features["input_mask"], features["segment_ids"], training)
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
        mlm_ce = _vocab_cross_entropy(ids, mlm_logits)
        mlm_pred = tf.argmax(mlm_logits, axis=-1, output_type=tf.int32)
        nsp_labels = tf.reshape(features["next_sentence_labels"], [-1])
        nsp_ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels,
                                                                logits=nsp_logits)
        nsp_pred = tf.argmax(nsp_logits, axis=-1, output_type=tf.int32)
        return {
            "mlm_loss_sum": tf.reduce_sum(weights * mlm_ce),
            "mlm_weight": tf.reduce_sum(weights),
            "mlm_correct": tf.reduce_sum(weights * tf.cast(tf.equal(mlm_pred, ids), tf.float32)),
            "nsp_loss_sum": tf.reduce_sum(nsp_ce),
            "nsp_correct": tf.reduce_sum(tf.cast(tf.equal(nsp_pred, nsp_labels), tf.float32)),
            "examples": tf.cast(tf.shape(nsp_labels)[0], tf.float32),
        }

    @staticmethod
    def loss_denominators(features: Mapping[str, tf.Tensor]) -> dict:
        """What ``objective`` divides by, from the inputs alone (no forward pass): summed over
        the whole global batch first, the per-replica and per-micro-batch losses add up to
        the global batch's loss exactly."""
        return {"mlm_weight": tf.reduce_sum(tf.cast(features["masked_lm_weights"], tf.float32)),
                "examples": tf.cast(tf.shape(features["next_sentence_labels"])[0], tf.float32)}

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
    as Google names them.
    """

    STAT_KEYS = ("loss_sum", "correct", "examples")

    def __init__(self, config: BertConfig, num_labels: int, compute_dtype: str = "float32",
                 seed: int = 0, xla: bool = False, recompute: str = "none"):
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.encoder = BertEncoder(config, compute_dtype, seed, xla=xla, recompute=recompute)
        self.output_weights = _variable("", "output_weights",
                                        _normal([num_labels, config.hidden_size], 0.02))
        self.output_bias = _variable("", "output_bias", tf.zeros([num_labels]))

    def __call__(self, features: Mapping[str, tf.Tensor], training: bool = False):
        """Returns logits [batch, num_labels]."""
        _, pooled = self.encoder(features["input_ids"], features["input_mask"],
                                 features["segment_ids"], training)
        pooled = self.encoder.dropout(pooled, self.config.hidden_dropout_prob, training)
        return tf.nn.bias_add(tf.matmul(pooled, self.output_weights, transpose_b=True),
                              self.output_bias)

    def loss(self, features: Mapping[str, tf.Tensor], training: bool = False):
        """Returns (mean cross-entropy, stats with loss_sum, correct, examples)."""
        stats = self.loss_stats(features, training=training)
        return self.objective(stats, self.loss_denominators(features)), stats

    def loss_stats(self, features: Mapping[str, tf.Tensor], training: bool = False) -> dict:
        logits = self(features, training=training)
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
        return {"examples": tf.cast(tf.shape(features["label_ids"])[0], tf.float32)}

    @staticmethod
    def objective(stats: Mapping[str, tf.Tensor], denominators: Mapping[str, tf.Tensor]):
        return stats["loss_sum"] / tf.maximum(denominators["examples"], 1.0)

    def google_variables(self) -> dict:
        return {**self.encoder.named_variables(), "output_weights": self.output_weights,
                "output_bias": self.output_bias}


def count_parameters(variables: Mapping[str, tf.Variable]) -> int:
    """Total number of scalars in ``variables``."""
    return int(sum(v.shape.num_elements() for v in variables.values()))
