"""BERT pretraining instances from tokenised documents: the split index read once, the
instance plan, masked-LM masking (static, and dynamic in TensorFlow), packing several
instances a row, and the shards, built locally or by an Apache Beam pipeline.

Heavy (import TensorFlow, seqio or Beam when imported): beam_preprocess, dynamic_masking.
"""
