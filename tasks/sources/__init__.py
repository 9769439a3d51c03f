"""Where the text comes from: corpus files in their text formats, the quickstart's standard-
library corpus, sentence splitting, documents read through seqio, and classification
files for fine-tuning.

Heavy (import TensorFlow, seqio or Beam when imported): seqio_sources.
"""
