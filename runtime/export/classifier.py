"""A fine-tuned classifier as a SavedModel: text (or encoder inputs) in, scores and label
names out.

    clf = tf.saved_model.load("classifier")
    out = clf.signatures["classify_text"](text=tf.constant(["Return the value."]))
    out["label"]           # [batch] label names (bytes), the most probable
    out["label_id"]        # [batch] int32, its index in clf.labels
    out["probabilities"]   # [batch, num_labels] softmax of out["logits"]
    clf.signatures["classify_pair"](text_a=..., text_b=...)    # tasks with two text fields
    clf.signatures["classify_ids"](input_word_ids=..., input_mask=..., input_type_ids=...)
    clf.labels.numpy()     # the label names in id order; clf.text_fields: the task's fields

A regression (STS-B's kind: one output) returns ``score`` [batch] and ``logits`` [batch, 1]
instead of labels and probabilities.

``serving_default`` is ``classify_pair`` for a two-field task, else ``classify_text``. The
same functions are methods of the loaded object (``clf.classify_text(texts)``). Text is
tokenised and packed in the graph (preprocessing.py) exactly as the finetune stage encoded
its examples (tasks/sources/classification.py), at its ``max_seq_length``; ``clf.preprocessor`` holds
the vocabulary (``vocab_file``), ``do_lower_case`` and ``seq_length`` (the functions
``tokenize`` and ``bert_pack_inputs`` are the preprocessing model's).
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from runexp.runtime.export.encoder import ReusableModule
from runexp.runtime.export.preprocessing import TextEncoder
from runexp.runtime.model import BertClassifier

_IDS = tf.TensorSpec([None, None], tf.int32)
_STRINGS = tf.TensorSpec([None], tf.string)


class Classifier(ReusableModule):
    """The classifier SavedModel's root."""

    def __init__(self, model: BertClassifier, preprocessor: TextEncoder,
                 labels: Sequence[str], text_fields: Sequence[str]):
        super().__init__()
        if len(labels) != model.num_labels:
            raise ValueError(f"{len(labels)} label names for a {model.num_labels}-way "
                             "classifier")
        self.model = model
        self.preprocessor = preprocessor
        self._label_names = [str(label) for label in labels]
        self.labels = tf.Variable(self._label_names, trainable=False, name="labels")
        self.text_fields = tf.Variable([str(f) for f in text_fields], trainable=False,
                                       name="text_fields")
        self.set_reusable_attributes(model)
        if len(text_fields) == 2:  # a method of pair tasks only
            self.classify_pair = tf.function(self._classify_pair,
                                             input_signature=[_STRINGS, _STRINGS])

    @tf.function(input_signature=[_IDS, _IDS, _IDS])
    def classify_ids(self, input_word_ids, input_mask, input_type_ids):
        """Encoder inputs (int32 [batch, seq]) -> logits, probabilities, label_id, label."""
        logits = self.model({"input_ids": input_word_ids, "input_mask": input_mask,
                             "segment_ids": input_type_ids}, training=False)
        if self.model.regression:  # one output, the predicted score: no softmax, no label
            return {"logits": logits, "score": logits[:, 0]}
        probabilities = tf.nn.softmax(logits)
        # The finetune stage's prediction: the argmax of the probabilities.
        label_id = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {"logits": logits, "probabilities": probabilities, "label_id": label_id,
                "label": tf.gather(tf.constant(self._label_names), label_id)}

    @tf.function(input_signature=[_STRINGS])
    def classify_text(self, text):
        """[batch] single texts -> the outputs of ``classify_ids``."""
        return self.classify_ids(**self.preprocessor.pack_text([text]))

    def _classify_pair(self, text_a, text_b):
        """[batch] first and second texts -> the outputs of ``classify_ids``."""
        return self.classify_ids(**self.preprocessor.pack_text([text_a, text_b]))


def signatures_of(module: Classifier) -> dict:
    """The SavedModel's signatures: classify_text, classify_ids, and classify_pair for a
    two-field task; serving_default the one for the task's own examples."""
    out = {
        "classify_text": module.classify_text.get_concrete_function(),
        "classify_ids": module.classify_ids.get_concrete_function(),
    }
    pairs = hasattr(module, "classify_pair")
    if pairs:
        out["classify_pair"] = module.classify_pair.get_concrete_function()
    out["serving_default"] = out["classify_pair" if pairs else "classify_text"]
    return out


def save_classifier(model: BertClassifier, vocab_dir: str, seq_length: int,
                    labels: Sequence[str], text_fields: Sequence[str], path: str) -> Classifier:
    """Writes the classifier SavedModel to ``path``."""
    module = Classifier(model, TextEncoder(vocab_dir, seq_length), labels, text_fields)
    tf.saved_model.save(module, path, signatures=signatures_of(module))
    return module
