"""What a run shows a person afterwards: training curves and an HTML report.

- ``curves``: a training stage's curves (loss, accuracies, learning rate, examples/s,
  held-out metrics) drawn from its ``train_log.jsonl`` / ``eval_log.jsonl`` as one PNG;
  the pretrain and finetune handlers draw ``curves.png`` into their stage directory.
- ``report``: the self-contained HTML report of an experiment's output root.
- ``command``: ``runexp report OUTPUT_ROOT [--out FILE]``.

None of these modules imports TensorFlow: the report runs anywhere the plan can be read.
matplotlib is imported only to draw, always with its Agg backend (no display needed).
"""
