"""A Hugging Face user, in its own process: transformers (PyTorch) and nothing of runexp.

The tests run it with the virtualenv's python and compare what it writes with runexp's own
numbers, so what is tested is what transformers itself makes of a directory (run as
``python -m tests.support.hf_consumer ARGS`` with tests.support.child_env()):

    hf_consumer outputs DIR INPUTS.npz OUT_DIR AutoModel AutoModelForPreTraining ...
        loads DIR with each Auto class (output_loading_info=True), runs it on the inputs
        (input_ids, attention_mask, token_type_ids; labels and next_sentence_label for the
        pretraining loss), writes OUT_DIR/<class>.<output>.npy and OUT_DIR/loading.json
    hf_consumer pipelines DIR OUT.json [--tokenizer-from-vocab VOCAB --lower]
        fill-mask or text-classification (config.json's architecture says which) on a few
        texts; --tokenizer-from-vocab saves BertTokenizerFast(VOCAB) into DIR first when DIR
        has no tokenizer (a copy the test owns: the export's own files come from runexp)
    hf_consumer readme EXPORT_DIR
        runs the python blocks of the README's Hugging Face section in EXPORT_DIR
    hf_consumer tokenize DIR LINES.json OUT.json
        AutoTokenizer's ids of each line (no special tokens added), and its special ids
    hf_consumer activations OUT.npz NAME...
        transformers' ACT2FN[NAME] over [-6, 6] (2001 points), float32
    hf_consumer random-bert OUT_DIR CONFIG.json SEED
        a BertForPreTraining of transformers' own, every parameter random (LayerNorm and
        biases too, so a swapped or transposed tensor shows), saved with save_pretrained;
        and OUT_DIR-encoder: its BertModel alone (AutoModel.save_pretrained)
"""

import json
import os
import re
import sys

import numpy as np
import torch
import transformers

OUTPUTS = {  # what each Auto class returns that runexp computes too
    "AutoModel": ("last_hidden_state", "pooler_output"),
    "AutoModelForPreTraining": ("prediction_logits", "seq_relationship_logits", "loss"),
    "AutoModelForMaskedLM": ("logits",),
    "AutoModelForSequenceClassification": ("logits",),
}


def _tensors(path):
    data = np.load(path)
    return {k: torch.from_numpy(data[k].astype(np.int64)) for k in data.files}


def outputs(model_dir, inputs_path, out_dir, *classes):
    os.makedirs(out_dir, exist_ok=True)
    inputs = _tensors(inputs_path)
    features = {k: inputs[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    loading = {}
    for name in classes:
        model, info = getattr(transformers, name).from_pretrained(
            model_dir, output_loading_info=True)
        model.eval()  # dropout off
        loading[name] = {"class": type(model).__name__,
                         **{k: sorted(map(str, v)) for k, v in info.items()},
                         "hidden_act": model.config.hidden_act,
                         "id2label": {str(k): v for k, v in model.config.id2label.items()}}
        extra = {}
        if name == "AutoModelForPreTraining" and "labels" in inputs:
            extra = {"labels": inputs["labels"],
                     "next_sentence_label": inputs["next_sentence_label"]}
        with torch.no_grad():
            result = model(**features, **extra)
        for field in OUTPUTS[name]:
            value = getattr(result, field, None)
            if value is not None:
                np.save(os.path.join(out_dir, f"{name}.{field}.npy"), value.numpy())
    with open(os.path.join(out_dir, "loading.json"), "w") as f:
        json.dump(loading, f, indent=1)


def pipelines(model_dir, out_path, *options):
    if "--tokenizer-from-vocab" in options and not os.path.exists(
            os.path.join(model_dir, "tokenizer_config.json")):
        vocab = options[options.index("--tokenizer-from-vocab") + 1]
        transformers.BertTokenizerFast(vocab, do_lower_case="--lower" in options) \
            .save_pretrained(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        architecture = json.load(f)["architectures"][0]
    if architecture == "BertForSequenceClassification":
        classify = transformers.pipeline("text-classification", model=model_dir)
        texts = ["The movie was good.", "The plot was awful and sad"]
        result = {"texts": texts, "text-classification": classify(texts, top_k=None)}
    else:
        fill = transformers.pipeline("fill-mask", model=model_dir)
        mask = fill.tokenizer.mask_token
        texts = [f"w5 w6 {mask} w8", f"{mask} w9 w10"]
        result = {"texts": texts, "fill-mask": [fill(t, top_k=3) for t in texts]}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1, default=float)


def readme(export_dir):
    with open(os.path.join(export_dir, "README.md")) as f:
        text = f.read()
    section = text[text.index("## Hugging Face transformers"):]
    section = section[:section.find("\n## ", 4)] if "\n## " in section[4:] else section
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks, "no python in the README's Hugging Face section"
    os.chdir(export_dir)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


def tokenize(model_dir, lines_path, out_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    with open(lines_path, encoding="utf-8") as f:
        lines = json.load(f)
    ids = tokenizer(lines, add_special_tokens=False)["input_ids"]
    with open(out_path, "w") as f:
        json.dump({"ids": ids, "class": type(tokenizer).__name__,
                   "cls_sep": [tokenizer.cls_token_id, tokenizer.sep_token_id]}, f)


def activations(out_path, *names):
    from transformers.activations import ACT2FN

    xs = torch.linspace(-6, 6, 2001, dtype=torch.float32)
    np.savez(out_path, **{name: ACT2FN[name](xs).numpy() for name in names})


def random_bert(out_dir, config_path, seed):
    with open(config_path) as f:
        config = transformers.BertConfig(**json.load(f))
    torch.manual_seed(int(seed))
    model = transformers.BertForPreTraining(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(out_dir)
    model.bert.save_pretrained(out_dir + "-encoder")


if __name__ == "__main__":
    torch.set_num_threads(1)
    command, *args = sys.argv[1:]
    {"outputs": outputs, "pipelines": pipelines, "readme": readme, "tokenize": tokenize,
     "activations": activations, "random-bert": random_bert}[command](*args)
    leaked = sorted(m for m in sys.modules if m == "runexp" or m.startswith("runexp."))
    assert not leaked, f"the consumer imported runexp: {leaked}"
