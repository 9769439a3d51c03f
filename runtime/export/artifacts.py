"""What the export stage writes, one row each: what it is, how it is loaded, how it is
written.

``ARTIFACTS`` drives all three places that describe an export: the export stage
(runtime/stages/export.py) writes each row that applies, in order; the export's README.md
(runtime/export/readme.py) lists the rows and says how to load each; the report's artifacts
section (runtime/report/sections.py) names each file and shows how to load them. The
summary holds each keyed row's path (compiler/specs/export.py ``ExportSummary``).

A new export format is one class and one row. The class, in its own module that imports
runexp.runtime.export.artifact (heavy libraries imported inside ``write``: the report imports
this table without TensorFlow):

    class Onnx(Artifact):                            # runtime/export/onnx.py
        path, key = "model.onnx", "onnx"
        note = "the encoder as ONNX: onnxruntime reads it"

        def describe(self, facts):                     # the README's files table
            return "the encoder in ONNX"

        def readme(self, facts):                       # the README's section on loading it
            return "## ONNX\\n\\n```python\\nimport onnxruntime\\n...\\n```\\n"

        def snippets(self, where):                     # the report's
            return [Snippet("With onnxruntime:", f"... {where.at('model.onnx')} ...")]

        def write(self, job):
            import tf2onnx
            ...

and its row in ``ARTIFACTS`` below (before ``Readme()``, which is written last). The base
class and what its methods get (``ExportJob``, ``Where``, ``Snippet``) are
runtime/export/artifact.py's.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Optional

from runexp.runtime.bert_config import CONFIG_FILE, write_bert_config
from runexp.runtime.export import huggingface as huggingface_lib
from runexp.runtime.export import readme
from runexp.runtime.export.artifact import Artifact, ExportJob, Snippet, Where  # noqa: F401
from runexp.runtime.export.readme import ExportFacts, specials


class Encoder(Artifact):
    path, key = "encoder/", "encoder"
    note = "TF Hub-style SavedModel of the encoder"

    def describe(self, f):
        return ("TF Hub-style SavedModel of the " + ("fine-tuned" if f.finetuned else
                                                     "pretrained")
                + " encoder: `input_word_ids`, `input_mask`, `input_type_ids` (int32 [batch, "
                "seq]) in; `pooled_output`, `sequence_output`, `encoder_outputs` (every layer), "
                "`default` out")

    def readme(self, f):
        spm, lower = f.vocab_type == "sentencepiece", "True" if f.do_lower_case else "False"
        return f"""## TensorFlow 2 (`tf.saved_model.load`)

```python
import tensorflow as tf
import tensorflow_text  # noqa: F401 - registers the ops preprocessing/ and classifier/ use

preprocess = tf.saved_model.load("preprocessing")
encoder = tf.saved_model.load("encoder")
inputs = preprocess(tf.constant(["Return the value of the key."]))
outputs = encoder(inputs)                 # a dict; encoder(inputs, training=True) drops out
outputs["pooled_output"]                  # [1, {f.hidden}]
outputs["sequence_output"]                # [1, {f.seq_length}, {f.hidden}]
outputs["encoder_outputs"]                # per layer: {f.layers} x [1, {f.seq_length}, {f.hidden}]

# sentence pairs (google-research/bert's truncation: the longer side loses its last tokens)
a = preprocess.tokenize(tf.constant(["How old are you?"]))
b = preprocess.tokenize(tf.constant(["What is your age?"]))
inputs = preprocess.bert_pack_inputs([a, b])                # or seq_length=64

# the same through signatures (e.g. TF Serving): flat names, encoder_outputs_<i> per layer
encoder.signatures["serving_default"](**inputs)
preprocess.signatures["serving_default"](text=tf.constant(["..."]))

encoder.vocab_file.asset_path             # the vocabulary ({'spm.model' if spm else 'vocab.txt'})
encoder.do_lower_case                     # {lower}
```
"""

    def snippets(self, where):
        at = where.at
        return [Snippet("The encoder and its preprocessing as SavedModels (TensorFlow 2; also "
                        "`hub.KerasLayer`; the export's README.md has more):",
                        f'''import tensorflow as tf
import tensorflow_text  # noqa: F401 - the ops of the preprocessing model

preprocess = tf.saved_model.load("{at('preprocessing')}")   # text -> encoder inputs
encoder = tf.saved_model.load("{at('encoder')}")
out = encoder(preprocess(tf.constant(["Return the value of the key."])))
out["pooled_output"]     # [1, hidden]: the [CLS] vector
out["sequence_output"]   # [1, seq, hidden]: one vector per token
out["encoder_outputs"]   # every layer's sequence output''')]

    def write(self, job):
        from runexp.runtime.export import encoder as encoder_lib  # TensorFlow

        encoder_lib.save_encoder(job.model.encoder, job.path(self), job.vocab_path,
                                 job.facts.vocab_type == "sentencepiece",
                                 job.facts.do_lower_case)


class Preprocessing(Artifact):
    path, key = "preprocessing/", "preprocessing"
    note = "SavedModel: text to the encoder's inputs"

    def describe(self, f):
        return ("SavedModel: raw strings in, the encoder's inputs out "
                f"(seq_length {f.seq_length}); `tokenize`, `bert_pack_inputs` for sentence pairs")

    def readme(self, f):
        return """## TF Hub (`hub.KerasLayer`)

The SavedModels are TF Hub-style (reusable: `variables`, `trainable_variables`); with
Keras 3 `hub.KerasLayer` needs `tf_keras` (`pip install tensorflow-hub tf-keras`):

```python
import tensorflow as tf
import tensorflow_hub as hub
import tensorflow_text  # noqa: F401 - the preprocessing's ops
import tf_keras as keras

text = keras.layers.Input(shape=(), dtype=tf.string)
inputs = hub.KerasLayer("preprocessing")(text)
outputs = hub.KerasLayer("encoder", trainable=True)(inputs)
model = keras.Model(text, keras.layers.Dense(2)(outputs["pooled_output"]))
```
"""

    def write(self, job):
        from runexp.runtime.export import preprocessing as preprocessing_lib  # TensorFlow

        preprocessing_lib.save_preprocessing(job.vocab_dir, job.facts.seq_length,
                                             job.path(self))


class Classifier(Artifact):
    path, key = "classifier/", "classifier"
    note = "SavedModel of the fine-tuned classifier: text to labels"

    def present(self, f):
        return f.finetuned

    def describe(self, f):
        return ("SavedModel of the fine-tuned classifier: text in, `logits`, `probabilities`, "
                "`label_id`, `label` out")

    def readme(self, f):
        pair = f.text_fields is not None and len(f.text_fields) == 2
        call = ('classifier.signatures["classify_pair"](text_a=tf.constant(["..."]), '
                'text_b=tf.constant(["..."]))' if pair else
                'classifier.signatures["classify_text"](text=tf.constant(["..."]))')
        return f"""## The classifier

```python
classifier = tf.saved_model.load("classifier")
out = {call}
out["label"]              # [batch] label names (bytes): {', '.join(f.labels)}
out["probabilities"]      # [batch, {len(f.labels)}], in the order of classifier.labels
classifier.signatures["classify_ids"](**inputs)   # input_word_ids, input_mask, input_type_ids
```

`serving_default` is `{'classify_pair' if pair else 'classify_text'}`. Text is tokenised and
truncated exactly as the finetune stage encoded its examples, at {f.seq_length} tokens.
"""

    def write(self, job):
        from runexp.runtime.export import classifier as classifier_lib  # TensorFlow

        f = job.facts
        classifier_lib.save_classifier(job.model, job.vocab_dir, f.seq_length, list(f.labels),
                                       list(f.text_fields), job.path(self))


class GoogleCheckpoint(Artifact):
    path, said = "bert_model.ckpt.*", "bert_model.ckpt"
    note = "checkpoint in google-research/bert's variable layout"
    prefix = "bert_model.ckpt"

    def describe(self, f):
        return ("checkpoint in google-research/bert's variable layout ("
                + ("`bert/...`, and the classifier's `output_weights`, `output_bias`"
                   if f.finetuned else "`bert/...` encoder, `cls/...` pretraining heads") + ")")

    def readme(self, f):
        head = ("## google-research/bert (`bert_config.json` + `bert_model.ckpt` + "
                "vocabulary)\n\n")
        if f.vocab_type == "sentencepiece":
            return head + f"""`modeling.py` reads `bert_config.json` and `bert_model.ckpt` as they are
(e.g. `--bert_config_file=bert_config.json --init_checkpoint=bert_model.ckpt`), but its
tokenizer (`FullTokenizer`) reads WordPiece `vocab.txt` files only, and this vocabulary is
SentencePiece: tokenise with the `sentencepiece` library over `spm.model`
({'lower-casing the text first, ' if f.do_lower_case else ''}ids {specials(f)}), or with
`preprocessing/`, at most {f.seq_length} tokens.
"""
        return head + f"""```sh
python run_classifier.py --task_name=... --data_dir=... --output_dir=... \\
  --do_train=true --do_eval=true --max_seq_length={f.seq_length} \\
  --vocab_file=vocab.txt --do_lower_case={str(f.do_lower_case).lower()} \\
  --bert_config_file=bert_config.json --init_checkpoint=bert_model.ckpt
```
"""

    def snippets(self, where):
        at, spm = where.at, where.sentencepiece
        vocab_flag = (f"--spm_model_file={at('spm.model')}" if spm  # ALBERT's flag
                      else f"--vocab_file={at('vocab.txt')}")
        google = f'''# google-research/bert (TensorFlow 1.x), e.g. fine-tuning with run_classifier.py:
python run_classifier.py --task_name=... --data_dir=... --output_dir=... \\
  --do_train=true --do_eval=true --max_seq_length={where.seq_length} \\
  {vocab_flag} \\
  --bert_config_file={at(CONFIG_FILE)} \\
  --init_checkpoint={at(self.prefix)}

# its variables, from TensorFlow 2:
import tensorflow as tf
reader = tf.train.load_checkpoint("{at(self.prefix)}")
sorted(reader.get_variable_to_shape_map())   # bert/embeddings/word_embeddings, ...'''
        again = f'''# fine-tune it with runexp, as a released checkpoint (gin/runs/finetune.gin):
include 'runs/finetune.gin'
VOCAB = '{at('spm.model' if spm else 'vocab.txt')}'
INIT_CHECKPOINT = '{at(self.prefix)}'
# ... and the model size's gin file, OUTPUT_ROOT and FINETUNE_TASK'''
        out = [Snippet("The checkpoint in Google's BERT layout, with `bert_config.json` and "
                       "the vocabulary:", google)]
        if spm:
            out.append(Snippet("This vocabulary is a SentencePiece model (`spm.model`, "
                               "ALBERT-style): google-research/bert's own run_classifier.py "
                               "reads WordPiece vocab.txt files only; ALBERT's scripts take "
                               "`--spm_model_file`.", note=True))
        return out + [Snippet(code=again)]

    def write(self, job):
        from runexp.runtime import checkpoints  # TensorFlow

        checkpoints.save_google_checkpoint(job.model.google_variables(),
                                           os.path.join(job.out, self.prefix))


class BertConfigFile(Artifact):
    path, said = CONFIG_FILE, ""
    note = "the model's shape, google-research/bert's format"

    def write(self, job):
        write_bert_config(job.config, job.out)


class HuggingFace(Artifact):
    path, key = huggingface_lib.HUGGINGFACE_DIR + "/", "huggingface"
    note = ("a transformers BERT directory (config.json, model.safetensors, tokenizer files): "
            "AutoModel.from_pretrained reads it")

    def describe(self, f):
        return ("the same model for Hugging Face transformers ("
                + ("`BertForSequenceClassification`, with the label names"
                   if f.finetuned else "`BertForPreTraining`: encoder, masked-LM and "
                   "next-sentence heads") + "): "
                + ", ".join(f"`{name}`" for name in f.huggingface_files))

    def readme(self, f):
        return _huggingface_readme(f)

    def snippets(self, where):
        at = where.at(huggingface_lib.HUGGINGFACE_DIR)
        return [Snippet("For Hugging Face transformers (the same numbers as the SavedModels, "
                        "tested):", f'''# Hugging Face transformers (PyTorch); publish with `hf upload <you>/<model> DIR`
from transformers import AutoModel, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("{at}")
model = AutoModel.from_pretrained("{at}")
outputs = model(**tokenizer(["Return the value of the key."], return_tensors="pt"))''')]

    def write(self, job):
        f = job.facts
        return {"huggingface_files": huggingface_lib.save_huggingface(
            job.model, job.path(self), vocab_dir=job.vocab_dir, seq_length=f.seq_length,
            pad_token_id=(f.special_ids or {}).get("[PAD]"), labels=f.labels)}


class VocabFile(Artifact):
    """A file of the vocabulary, copied as the vocab stage wrote it (when it did)."""

    def __init__(self, path: str, note: str):
        self.path, self.note = path, note

    def present(self, f):
        return self.path in f.vocab_files

    def describe(self, f):
        if self.path != "vocab.txt":
            return "the SentencePiece model: the vocabulary"
        return "one token per line, id = line number" + (
            " (the SentencePiece pieces in WordPiece spelling: it lists the vocabulary, but "
            "only spm.model splits text as training did)" if f.vocab_type == "sentencepiece"
            else " (the WordPiece vocabulary)")

    def write(self, job):
        shutil.copyfile(os.path.join(job.vocab_dir, self.path), job.path(self))


class Readme(Artifact):
    path = "README.md"
    note = "what each file is and how to load it"

    def describe(self, f):
        return "this file"

    def write(self, job):
        with open(job.path(self), "w", encoding="utf-8") as out:
            out.write(readme.render(job.facts, ARTIFACTS))


def _huggingface_readme(f: ExportFacts) -> str:
    """How transformers loads ``huggingface/`` (the code tests/support/hf_consumer.py runs)
    and how to publish it."""
    tokenizer_files = "tokenizer.json" in f.huggingface_files
    example = "Return the value of the key."
    if f.finetuned:
        pair = f.text_fields is not None and len(f.text_fields) == 2
        classify = ('classify({"text": "How old are you?", "text_pair": "What is your age?"})'
                    if pair else f'classify("{example}")')
        code = f"""from transformers import AutoModelForSequenceClassification, pipeline

classify = pipeline("text-classification", model="huggingface")
# [{{'label': ..., 'score': ...}}], the labels: {', '.join(f.labels)}
print({classify})

model = AutoModelForSequenceClassification.from_pretrained("huggingface")
model.config.id2label                     # {{0: '{f.labels[0]}', ...}}"""
    else:
        code = f"""from transformers import AutoModel, AutoModelForPreTraining, AutoTokenizer, pipeline

fill = pipeline("fill-mask", model="huggingface")
print(fill("Return the [MASK] of the key."))

tokenizer = AutoTokenizer.from_pretrained("huggingface")
inputs = tokenizer(["{example}"], return_tensors="pt")
encoder = AutoModel.from_pretrained("huggingface")   # the heads are left out (reported unused)
outputs = encoder(**inputs)
outputs.last_hidden_state                 # [1, tokens, {f.hidden}]
outputs.pooler_output                     # [1, {f.hidden}]
pretraining = AutoModelForPreTraining.from_pretrained("huggingface")  # with both heads
pretraining(**inputs).prediction_logits   # masked-LM logits [1, tokens, vocab]"""
    lower = "True" if f.do_lower_case else "False"
    note = "" if tokenizer_files else (f"""
`huggingface/` holds no tokenizer files in this export: add them first with
`BertTokenizerFast("vocab.txt", do_lower_case={lower}).save_pretrained("huggingface")`.
""" if f.vocab_type != "sentencepiece" else f"""
`huggingface/` holds no tokenizer files in this export: tokenise with the `sentencepiece`
library over `spm.model` (ids {specials(f)}) and pass the ids to the models.
""")
    return f"""## Hugging Face transformers (`huggingface/`)

`huggingface/` is a transformers BERT directory: `config.json`, `model.safetensors` (the
weights, float32) and the tokenizer. It computes what runexp computes (the same GELU,
layer-norm epsilon and positions: `config.json` says so, and runexp's tests compare the
numbers). Fine-tune it like any BERT on the Hub; runexp starts from such a directory too
(`INIT_CHECKPOINT` = the directory).
{note}
```python
{code}
```

Publish it on the Hugging Face Hub (after `hf auth login`; huggingface_hub before 1.0 spells
the commands `huggingface-cli login` and `huggingface-cli upload`):

```sh
hf upload <your-name>/<model-name> huggingface .
```
"""


# In the README's order; README.md last (it lists what the rows before it wrote).
ARTIFACTS: tuple[Artifact, ...] = (
    Encoder(),
    Preprocessing(),
    Classifier(),
    GoogleCheckpoint(),
    BertConfigFile(),
    HuggingFace(),
    VocabFile("vocab.txt", "BERT vocab, one token per line (ids = line numbers)"),
    VocabFile("spm.model", "the SentencePiece model: the vocabulary (ALBERT-style; no "
                           "vocab.txt)"),
    Readme(),
)
VOCAB_FILES = tuple(a.path for a in ARTIFACTS if isinstance(a, VocabFile))


def group_of(rel: str) -> str:
    """The artifact path a file of an export belongs to: a directory's files are its
    ``dir/``, a checkpoint's ``prefix.ckpt.*``."""
    if "/" in rel:
        return rel.split("/", 1)[0] + "/"
    if ".ckpt." in rel:
        return rel[:rel.index(".ckpt.") + len(".ckpt")] + ".*"
    return rel


def artifact_at(path: str) -> Optional[Artifact]:
    """The row of an artifact path (``group_of``'s), or None for a file no row writes."""
    return next((a for a in ARTIFACTS if a.path == path), None)


def write_all(job: ExportJob) -> list[Artifact]:
    """Writes every artifact that applies to ``job.facts``, in order; returns them."""
    written = []
    for artifact in ARTIFACTS:
        if artifact.present(job.facts):
            learnt = artifact.write(job) or {}
            job.facts = dataclasses.replace(job.facts, **learnt)
            written.append(artifact)
    return written
