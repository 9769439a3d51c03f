"""The task modules that tests/test_layers.py finds light (no heavy library imported, directly
or through ours) really import neither TensorFlow nor seqio: the preprocess workers and the
vocab and corpus stages use them. The list is computed, not kept by hand."""

import subprocess
import sys

from tests.test_layers import heavy_modules, modules

ENTRY_POINTS = ("runexp.runtime.stages.corpus", "runexp.runtime.stages.vocab",
                "runexp.runtime.stages.preprocess")


def test_light_task_modules_do_not_import_tensorflow_or_seqio():
    known = modules()
    heavy = heavy_modules(known)
    light = sorted(m for m in known if m.startswith("runexp.tasks.") and m not in heavy)
    assert "runexp.tasks.instances.pretraining_shards" in light and "runexp.tasks.cache.seqio_tasks" in heavy
    assert not heavy & set(ENTRY_POINTS)
    code = ("import sys\n" + "".join(f"import {m}\n" for m in light + list(ENTRY_POINTS))
            + "from runexp.tasks import register\n"
            + "heavy = [m for m in ('tensorflow', 'seqio') if m in sys.modules]\n"
            + "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)
