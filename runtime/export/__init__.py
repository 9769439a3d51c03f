"""What the export stage (runtime/stages/export.py) builds for each consumer.

- ``encoder.py``: the encoder as a TF Hub-style SavedModel (``input_word_ids``,
  ``input_mask``, ``input_type_ids`` in; ``pooled_output``, ``sequence_output``,
  ``encoder_outputs``, ``default`` out; the vocabulary as an asset).
- ``preprocessing.py``: raw strings to those inputs, tokenised in the graph with
  tensorflow_text exactly as runexp's own tokenizer (tasks/vocabulary/tokenizer.py) does, as a
  SavedModel shaped like TF Hub's BERT preprocessors (``__call__``, ``tokenize``,
  ``bert_pack_inputs``).
- ``classifier.py``: a fine-tuned classifier: strings (or ids) in, logits, probabilities and
  label names out.
- ``huggingface.py``: a transformers BERT directory (config, safetensors weights, tokenizer).
- ``readme.py``: the export directory's README.md.
- ``artifacts.py``: the table of what the export writes (what each artifact is, how it is
  loaded, how it is written), which the export stage, the README and the report read; it
  imports none of the TensorFlow modules above until an artifact is written.
  ``artifact.py``: the base of a row (``Artifact``) and what its methods are given.

encoder.py, preprocessing.py and classifier.py import TensorFlow and tensorflow_text, so only
the export stage imports them.
"""
