"""What the export stage (runtime/stages/export.py) builds for each consumer.

- ``encoder.py``: the encoder as a TF Hub-style SavedModel (``input_word_ids``,
  ``input_mask``, ``input_type_ids`` in; ``pooled_output``, ``sequence_output``,
  ``encoder_outputs``, ``default`` out; the vocabulary as an asset).
- ``preprocessing.py``: raw strings to those inputs, tokenised in the graph with
  tensorflow_text exactly as runexp's own tokenizer (tasks/tokenizer.py) does, as a
  SavedModel shaped like TF Hub's BERT preprocessors (``__call__``, ``tokenize``,
  ``bert_pack_inputs``).
- ``classifier.py``: a fine-tuned classifier: strings (or ids) in, logits, probabilities and
  label names out.
- ``readme.py``: the export directory's README.md.

TensorFlow and tensorflow_text are imported here, so only the export stage imports this.
"""
