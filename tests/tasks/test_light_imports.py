"""Light task modules never import TensorFlow or seqio (workers and the compiler use them)."""

import subprocess
import sys

LIGHT = ["stdlib_corpus", "sentences", "wordpiece", "tokenizer", "vocab_dir", "wordpiece_trainer", "text_files",
         "masking", "document_store", "pretraining_instances", "pretraining_shards", "example_proto", "records",
         "classification", "inspect", "chinese_words"]


def test_light_modules_do_not_import_tensorflow_or_seqio():
    code = ("import sys\n"
            + "".join(f"import runexp.tasks.{m}\n" for m in LIGHT)
            + "from runexp.tasks import register\n"
            + "import runexp.runtime.stages.corpus, runexp.runtime.stages.vocab, "
              "runexp.runtime.stages.preprocess\n"
            + "heavy = [m for m in ('tensorflow', 'seqio') if m in sys.modules]\n"
            + "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)
