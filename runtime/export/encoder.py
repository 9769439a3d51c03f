"""The encoder as a TF Hub-style SavedModel (the interface of TF Hub's BERT encoders).

    encoder = tf.saved_model.load("encoder")       # or hub.KerasLayer("encoder")
    out = encoder({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types})
    out["pooled_output"]       # [batch, hidden]: the [CLS] vector through the pooler
    out["sequence_output"]     # [batch, seq, hidden]
    out["encoder_outputs"]     # one [batch, seq, hidden] per transformer layer, the last
                               # is sequence_output
    out["default"]             # pooled_output
    encoder(inputs, training=True)                 # with dropout, for fine-tuning

Inputs are int32 [batch, seq]. The ``serving_default`` signature takes the same three
names and returns ``pooled_output``, ``sequence_output``, ``default`` and
``encoder_outputs_<i>`` for layer i (0-based; a signature cannot return a list).

Saved with it, as TF Hub's BERT encoders do: ``vocab_file`` (asset: vocab.txt, or spm.model
for a SentencePiece vocab, then also ``sp_model_file``), ``do_lower_case`` (non-trainable
variable), and ``variables``, ``trainable_variables``, ``regularization_losses`` (the
reusable-SavedModel attributes ``hub.KerasLayer(..., trainable=True)`` fine-tunes through).
"""

from __future__ import annotations

import tensorflow as tf

from runexp.runtime.model import BertEncoder

INPUT_NAMES = ("input_word_ids", "input_mask", "input_type_ids")
_IDS = tf.TensorSpec([None, None], tf.int32)


class ReusableModule(tf.Module):
    """A tf.Module whose ``variables``, ``trainable_variables`` and ``regularization_losses``
    are saved as plain attributes, which TF Hub's reusable SavedModels have (tf.Module's own
    are properties, computed and not saved)."""

    variables = None
    trainable_variables = None
    regularization_losses = None

    def set_reusable_attributes(self, module: tf.Module) -> None:
        self.variables = list(module.variables)
        self.trainable_variables = list(module.trainable_variables)
        self.regularization_losses = []


def set_vocab_attributes(module: tf.Module, vocab_path: str, sentencepiece: bool,
                         do_lower_case: bool) -> None:
    """``vocab_file`` (asset), ``sp_model_file`` (SentencePiece), ``do_lower_case``."""
    module.vocab_file = tf.saved_model.Asset(vocab_path)
    if sentencepiece:
        module.sp_model_file = module.vocab_file
    module.do_lower_case = tf.Variable(bool(do_lower_case), trainable=False,
                                       name="do_lower_case")


def encode(encoder: BertEncoder, inputs, training: bool = False) -> dict:
    """TF Hub's encoder outputs from the three int32 [batch, seq] inputs."""
    ids = inputs["input_word_ids"]
    flat, pooled = encoder.layer_outputs(ids, inputs["input_mask"], inputs["input_type_ids"],
                                         training=training)
    shape = [tf.shape(ids)[0], tf.shape(ids)[1], encoder.config.hidden_size]
    layers = [tf.reshape(x, shape) for x in flat]  # [embeddings, layer 0, layer 1, ...]
    return {"pooled_output": pooled, "sequence_output": layers[-1],
            "encoder_outputs": layers[1:], "default": pooled}


class HubEncoder(ReusableModule):
    """The encoder SavedModel's root."""

    def __init__(self, encoder: BertEncoder, vocab_path: str, sentencepiece: bool,
                 do_lower_case: bool):
        super().__init__()
        self.encoder = encoder
        set_vocab_attributes(self, vocab_path, sentencepiece, do_lower_case)
        self.set_reusable_attributes(encoder)

    @tf.function
    def __call__(self, inputs, training=False):
        return encode(self.encoder, inputs, training=training)


def signature_outputs(outputs: dict) -> dict:
    """A signature's flat outputs: ``encoder_outputs`` as ``encoder_outputs_<i>``."""
    flat = {k: v for k, v in outputs.items() if k != "encoder_outputs"}
    flat.update({f"encoder_outputs_{i}": x for i, x in enumerate(outputs["encoder_outputs"])})
    return flat


def save_encoder(encoder: BertEncoder, path: str, vocab_path: str, sentencepiece: bool,
                 do_lower_case: bool) -> HubEncoder:
    """Writes the encoder SavedModel to ``path``."""
    module = HubEncoder(encoder, vocab_path, sentencepiece, do_lower_case)
    spec = {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in INPUT_NAMES}
    for training in (False, True):
        module.__call__.get_concrete_function(spec, training=training)
    serve = tf.function(
        lambda input_word_ids, input_mask, input_type_ids: signature_outputs(module(
            {"input_word_ids": input_word_ids, "input_mask": input_mask,
             "input_type_ids": input_type_ids}, training=False))
    ).get_concrete_function(*(spec[name] for name in INPUT_NAMES))
    tf.saved_model.save(module, path, signatures={"serving_default": serve})
    return module
