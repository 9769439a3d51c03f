"""Vocabularies and tokenisers: a vocab stage's directory (trained or adopted), WordPiece
as google-research/bert tokenises, SentencePiece, Chinese words for whole-word masking,
and the same vocabulary as a ``seqio.Vocabulary``.

Heavy (import TensorFlow, seqio or Beam when imported): seqio_vocabulary.
"""
