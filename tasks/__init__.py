"""Data for runexp: corpora, vocabularies, tokenisers, BERT instances, records, seqio tasks.

Light modules (no TensorFlow, no seqio) and heavy ones (``seqio_tasks``, ``seqio_vocabulary``)
are kept apart so the compiler and the worker processes import only what they need.
"""
