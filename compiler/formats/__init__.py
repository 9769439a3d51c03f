"""Readers and writers of the files runexp meets, in the standard library only: TFRecord
framing and CRCs, the protobuf wire format, a first look at tf.train.Example files, a
TensorFlow checkpoint's index, a Hugging Face model directory. The compiler reads them to
plan without TensorFlow; tasks/ and runtime/ use the same code, so each format has one
reader."""
