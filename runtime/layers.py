"""The building blocks of runexp's BERT (runtime/model.py): dense, layer norm, dropout
and embeddings as tf.Modules whose variables carry google-research/bert's names, and the
matmul that honours the compute dtype (float32, bfloat16, mixed_float16).
"""

from __future__ import annotations


import tensorflow as tf

from runexp.runtime.bert_config import HIDDEN_ACTS, BertConfig

_LAYER_NORM_EPSILON = 1e-12  # what google-research/bert's layer_norm uses


def _gelu(x):
    # google-research/bert's gelu is the tanh approximation.
    return tf.nn.gelu(x, approximate=True)


ACTIVATIONS = {
    "gelu": _gelu,
    "gelu_new": _gelu,
    "gelu_exact": lambda x: tf.nn.gelu(x, approximate=False),
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
    "linear": tf.identity,
}
assert set(ACTIVATIONS) == set(HIDDEN_ACTS), "bert_config.HIDDEN_ACTS is this table's keys"


# recompute param: "layers" keeps only each transformer layer's input for the backward pass
# and runs the layer again there (activation recomputation: less memory, more compute).
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


def matmul(a, b, compute_dtype, transpose_b: bool = False):
    """float32 matmul, or bfloat16 inputs with a float32 result (variables stay float32)."""
    if compute_dtype == tf.float32:
        return tf.matmul(a, b, transpose_b=transpose_b)
    out = tf.matmul(tf.cast(a, compute_dtype), tf.cast(b, compute_dtype),
                    transpose_b=transpose_b)
    return tf.cast(out, tf.float32)


@tf.function(jit_compile=True)
def vocab_cross_entropy(labels, logits):
    """sparse_softmax_cross_entropy_with_logits over the vocabulary, compiled by XLA (forward
    and backward): on CPU ~3x faster than TensorFlow's own kernel on [640, 30522] logits,
    ~15% of a tiny model's step."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def normal_init(shape, stddev):
    return tf.random.truncated_normal(shape, stddev=stddev)


def google_variable(scope: str, name: str, initial) -> tf.Variable:
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
        self.kernel = google_variable(scope, "kernel", normal_init([in_dim, out_dim], stddev))
        self.bias = google_variable(scope, "bias", tf.zeros([out_dim]))

    def __call__(self, x):
        return tf.nn.bias_add(matmul(x, self.kernel, self.compute_dtype), self.bias)

    def named_variables(self) -> dict:
        return {f"{self.scope}/kernel": self.kernel, f"{self.scope}/bias": self.bias}


class LayerNorm(tf.Module):
    """``<scope>/gamma`` and ``<scope>/beta`` over the last axis."""

    def __init__(self, scope: str, dim: int):
        super().__init__()
        self.scope = scope
        self.gamma = google_variable(scope, "gamma", tf.ones([dim]))
        self.beta = google_variable(scope, "beta", tf.zeros([dim]))

    def __call__(self, x):
        centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        return centered * (tf.math.rsqrt(variance + _LAYER_NORM_EPSILON) * self.gamma) + self.beta

    def named_variables(self) -> dict:
        return {f"{self.scope}/gamma": self.gamma, f"{self.scope}/beta": self.beta}


def _through_packed_bits(keep):
    """The boolean mask ``keep``, unchanged, rebuilt from a copy packed 8 elements a byte.

    Under XLA the dropout's compare and multiply fuse into their consumers (the forward
    product and the backward's), so what stays live for the backward pass is their operand:
    the 32-bit random words, 4 bytes an element. Packing takes a reduction, which XLA does not
    duplicate into consumers: the words die after the forward pass and the backward keeps the
    packed bytes, 1 bit an element. Only the attention probabilities' masks (rank 4; most of
    the dropout memory: heads * seq elements a token against 2 * hidden) are packed: packing
    the hidden-state masks (rank 2) changes how XLA fuses the residual add and LayerNorm that
    follow them, and the gradients' rounding in the last bit. Masks whose size is not static
    or not a multiple of 8 are returned as they are too."""
    size = keep.shape.num_elements()
    if keep.shape.rank != 4 or size is None or size % 8:
        return keep
    weights = tf.constant([1 << i for i in range(8)], tf.uint8)
    bits = tf.reshape(tf.cast(keep, tf.uint8), [size // 8, 8])
    packed = tf.reduce_sum(bits * weights, axis=1)  # distinct powers of 2: at most 255
    return tf.reshape(tf.bitwise.bitwise_and(packed[:, tf.newaxis], weights) > 0, keep.shape)


def _opaque_key(key, x):
    """``key`` plus a zero XLA cannot fold: the bits of x's first element ANDed with their
    complement. A recomputed layer (``tf.recompute_grad``) draws its masks again from the
    keys drawn ahead for its forward pass; without the dependence on x (which in the
    recomputation depends on the backward pass) XLA merges the two draws as a common
    subexpression and keeps every layer's mask from the forward pass to the backward."""
    if x.shape.num_elements() == 0:
        return key
    first = tf.stop_gradient(tf.reshape(x, [-1])[:1])
    bits = tf.bitcast(first, {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}[x.dtype.size])
    zero = tf.bitwise.bitwise_and(bits, tf.bitwise.invert(bits))
    return key + tf.cast(zero, key.dtype)


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
            elif self.xla:
                key = _opaque_key(key, x)
            words = tf.random.stateless_uniform(tf.shape(x), seed=key, minval=None,
                                                maxval=None, dtype=tf.uint32,
                                                alg="threefry" if self.xla else "philox")
            keep = words >= tf.constant(threshold, tf.uint32)
            if self.xla:
                keep = _through_packed_bits(keep)
            keep = tf.cast(keep, x.dtype)
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
        self.word_embeddings = google_variable(scope, "word_embeddings",
                                         normal_init([config.vocab_size, h], std))
        self.token_type_embeddings = google_variable(scope, "token_type_embeddings",
                                               normal_init([config.type_vocab_size, h], std))
        self.position_embeddings = google_variable(scope, "position_embeddings",
                                             normal_init([config.max_position_embeddings, h], std))
        self.layer_norm = LayerNorm(f"{scope}/LayerNorm", h)

    def __call__(self, input_ids, segment_ids, training: bool, position_ids=None):
        """Returns [batch * seq, hidden]. ``position_ids`` [batch, seq]: each token's
        position (a packed row's restart at 0 with each instance); None: 0 .. seq - 1."""
        seq_length = tf.shape(input_ids)[1]
        flat_ids = tf.reshape(input_ids, [-1])
        x = tf.gather(self.word_embeddings, flat_ids)
        x += tf.gather(self.token_type_embeddings, tf.reshape(segment_ids, [-1]))
        if position_ids is not None:
            x += tf.gather(self.position_embeddings, tf.reshape(position_ids, [-1]))
            return self.dropout(self.layer_norm(x), self.config.hidden_dropout_prob, training)
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
