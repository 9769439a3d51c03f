"""Records and the seqio cache: pretraining records in google-research/bert's format and
seqio's cache layout, ``tf.train.Example`` bytes without TensorFlow, random access to
records, ready-made examples, the real ``seqio.Task`` registrations, and what
``runexp inspect`` decodes.

Heavy (import TensorFlow, seqio or Beam when imported): example_sources, seqio_tasks.
"""
