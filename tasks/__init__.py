"""Data for runexp: corpora, vocabularies, tokenisers, BERT instances, records, seqio tasks.

A layer above the compiler's plan and below the runtime (docs/LAYERS.md): tasks read the specs
and the plan, never the runtime but its ``storage``. Light modules (no TensorFlow, no seqio)
and heavy ones (``seqio_tasks``, ``seqio_vocabulary``) are kept apart so the worker processes
import only what they need.

``register(output_root)`` makes a finished experiment's data readable by any seqio user
(t5x, notebooks): it registers every pretraining task and mixture of the experiment with its
cache, so ``seqio.get_mixture_or_task(name).get_dataset(split=..., sequence_length=None,
use_cached=True)`` returns the examples the experiment trained on.
"""


def register(output_root: str) -> list[str]:
    """Registers the seqio tasks and mixtures of the experiment at ``output_root`` (a local
    directory or gs://, as given to runexp; read from its ``plan.json``), each task with its
    cache in its preprocess stage directory. Returns the names registered.

    Imports seqio and TensorFlow (only when called)."""
    from runexp.tasks.cache import seqio_tasks

    return seqio_tasks.register_experiment(output_root)
