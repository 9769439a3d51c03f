"""The export directory's README.md: what each file is and how each consumer loads it, with
this export's own vocabulary type, casing, sequence length and labels filled in."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence


@dataclasses.dataclass(frozen=True)
class ExportFacts:
    """What the README states about one export."""

    step: int
    parameters: int
    layers: int
    hidden: int
    vocab_type: str                  # "wordpiece" or "sentencepiece"
    do_lower_case: bool
    seq_length: int
    seq_length_source: str           # why this length, one phrase
    vocab_files: Sequence[str]       # copied next to the checkpoint
    labels: Optional[Sequence[str]] = None       # a fine-tuned export's label names
    text_fields: Optional[Sequence[str]] = None  # its task's text fields
    task: str = ""
    special_ids: Optional[dict] = None          # {"[CLS]": 2, ...}
    huggingface_files: Sequence[str] = ()       # written into huggingface/

    @property
    def finetuned(self) -> bool:
        return self.labels is not None


def _files_table(f: ExportFacts) -> str:
    spm = f.vocab_type == "sentencepiece"
    rows = [
        ("encoder/", "TF Hub-style SavedModel of the "
         + ("fine-tuned" if f.finetuned else "pretrained") + " encoder: `input_word_ids`, "
         "`input_mask`, `input_type_ids` (int32 [batch, seq]) in; `pooled_output`, "
         "`sequence_output`, `encoder_outputs` (every layer), `default` out"),
        ("preprocessing/", "SavedModel: raw strings in, the encoder's inputs out "
         f"(seq_length {f.seq_length}); `tokenize`, `bert_pack_inputs` for sentence pairs"),
    ]
    if f.finetuned:
        rows.append(("classifier/", "SavedModel of the fine-tuned classifier: text in, "
                     "`logits`, `probabilities`, `label_id`, `label` out"))
    rows += [
        ("bert_model.ckpt.*", "checkpoint in google-research/bert's variable layout ("
         + ("`bert/...`, and the classifier's `output_weights`, `output_bias`"
            if f.finetuned else "`bert/...` encoder, `cls/...` pretraining heads") + ")"),
        ("bert_config.json", "the model's shape, google-research/bert's format"),
        ("huggingface/", "the same model for Hugging Face transformers ("
         + ("`BertForSequenceClassification`, with the label names"
            if f.finetuned else "`BertForPreTraining`: encoder, masked-LM and next-sentence "
            "heads") + "): " + ", ".join(f"`{name}`" for name in f.huggingface_files)),
    ]
    if "vocab.txt" in f.vocab_files:
        rows.append(("vocab.txt", "one token per line, id = line number" + (
            " (the SentencePiece pieces in WordPiece spelling: it lists the vocabulary, "
            "but only spm.model splits text as training did)" if spm else
            " (the WordPiece vocabulary)")))
    if "spm.model" in f.vocab_files:
        rows.append(("spm.model", "the SentencePiece model: the vocabulary"))
    rows.append(("README.md", "this file"))
    return "\n".join(["| path | what |", "| --- | --- |"]
                     + [f"| `{path}` | {what} |" for path, what in rows])


def _specials(f: ExportFacts) -> str:
    ids = f.special_ids or {}
    return ", ".join(f"`{token}` {i}" for token, i in ids.items()) or "see spm.model"


def render(f: ExportFacts) -> str:
    """README.md's text."""
    spm = f.vocab_type == "sentencepiece"
    lower = "True" if f.do_lower_case else "False"
    vocab = ("SentencePiece (`spm.model`"
             + (", text lower-cased before it" if f.do_lower_case else ", cased") + ")"
             if spm else "WordPiece (`vocab.txt`, google-research/bert's tokenizer, "
             + ("uncased: lower-cased, accents stripped" if f.do_lower_case else "cased")
             + ")")
    what = (f"the encoder and classifier fine-tuned on {f.task or 'the task'} "
            f"(labels {', '.join(f.labels)}; text field(s) "
            f"{', '.join(f.text_fields or ())})" if f.finetuned
            else "the pretrained encoder")
    parts = [f"""# runexp export

This directory holds {what}, at training step {f.step}: {f.layers} layers, hidden size
{f.hidden}, {f.parameters:,} parameters.

- Vocabulary: {vocab}; `do_lower_case = {lower}`.
- Sequence length of `preprocessing/`{' and `classifier/`' if f.finetuned else ''}:
  {f.seq_length} ({f.seq_length_source}). The encoder itself takes any length up to
  `max_position_embeddings` in `bert_config.json`.

{_files_table(f)}

## TensorFlow 2 (`tf.saved_model.load`)

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
"""]
    if f.finetuned:
        pair = f.text_fields is not None and len(f.text_fields) == 2
        call = ('classifier.signatures["classify_pair"](text_a=tf.constant(["..."]), '
                'text_b=tf.constant(["..."]))' if pair else
                'classifier.signatures["classify_text"](text=tf.constant(["..."]))')
        parts.append(f"""## The classifier

```python
classifier = tf.saved_model.load("classifier")
out = {call}
out["label"]              # [batch] label names (bytes): {', '.join(f.labels)}
out["probabilities"]      # [batch, {len(f.labels)}], in the order of classifier.labels
classifier.signatures["classify_ids"](**inputs)   # input_word_ids, input_mask, input_type_ids
```

`serving_default` is `{'classify_pair' if pair else 'classify_text'}`. Text is tokenised and
truncated exactly as the finetune stage encoded its examples, at {f.seq_length} tokens.
""")
    parts.append("""## TF Hub (`hub.KerasLayer`)

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

## google-research/bert (`bert_config.json` + `bert_model.ckpt` + vocabulary)
""")
    if spm:
        parts.append(f"""`modeling.py` reads `bert_config.json` and `bert_model.ckpt` as they are
(e.g. `--bert_config_file=bert_config.json --init_checkpoint=bert_model.ckpt`), but its
tokenizer (`FullTokenizer`) reads WordPiece `vocab.txt` files only, and this vocabulary is
SentencePiece: tokenise with the `sentencepiece` library over `spm.model`
({'lower-casing the text first, ' if f.do_lower_case else ''}ids {_specials(f)}), or with
`preprocessing/`, at most {f.seq_length} tokens.
""")
    else:
        parts.append(f"""```sh
python run_classifier.py --task_name=... --data_dir=... --output_dir=... \\
  --do_train=true --do_eval=true --max_seq_length={f.seq_length} \\
  --vocab_file=vocab.txt --do_lower_case={str(f.do_lower_case).lower()} \\
  --bert_config_file=bert_config.json --init_checkpoint=bert_model.ckpt
```
""")
    parts.append(_huggingface_section(f))
    return "\n".join(parts)


def _huggingface_section(f: ExportFacts) -> str:
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
library over `spm.model` (ids {_specials(f)}) and pass the ids to the models.
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
