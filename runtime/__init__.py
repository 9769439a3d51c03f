"""runexp's TensorFlow runtime: the executor, the stage handlers, the model, the trainer, the
exports, status and the report. It may import everything below it (docs/LAYERS.md):
``runexp.tasks``, the compiler's plan and base, and its own ``storage/``, which is a layer of
its own below the compiler (local paths and gs://, no TensorFlow).
"""
