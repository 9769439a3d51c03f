"""export stage, huggingface/: what transformers itself makes of it, in a process of its own
that never imports runexp (hf_consumer.py), compared with runexp's own numbers on the same
held-out token ids (so this does not depend on the tokenizer files): every weight loads
(no missing, no unexpected beyond the heads an Auto class lacks) and the encoder, pooler,
masked-LM, next-sentence and classifier outputs agree within 1e-4. The comparison is shown
to fail on a wrong activation and on a kernel left untransposed. The pipelines and the
README's code run on a copy given a tokenizer when the export has none yet."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tests.support.export import export_ctx, stage, write_pretrain_dir
from tests.support.hf import max_diff, run_consumer, transformers_outputs
from tests.support.runtime import TINY_MODEL, TINY_PRED, TINY_SEQ, write_vocab_dir
from runexp.runtime import checkpoints, huggingface_config, huggingface_weights, layers
from runexp.runtime import pretraining_data
from runexp.runtime.bert_config import BertConfig
from runexp.runtime.model import BertClassifier, BertPretrainer
from runexp.runtime.stages import export, finetune

TOLERANCE = 1e-4
HF = "huggingface"
# The heads a pretraining export has that an Auto class lacks (transformers lists them as
# unexpected, as for any BertForPreTraining checkpoint on the Hub).
PRETRAINING_HEADS = {"cls.predictions.bias", "cls.predictions.transform.LayerNorm.bias",
                     "cls.predictions.transform.LayerNorm.weight",
                     "cls.predictions.transform.dense.bias",
                     "cls.predictions.transform.dense.weight", "cls.seq_relationship.bias",
                     "cls.seq_relationship.weight"}
NOT_IN_MASKED_LM = {"bert.pooler.dense.bias", "bert.pooler.dense.weight",
                    "cls.seq_relationship.bias", "cls.seq_relationship.weight"}


def _clean_load(info: dict, unexpected=()) -> None:
    assert info["missing_keys"] == [], info
    assert set(info["unexpected_keys"]) == set(unexpected), info
    assert info["mismatched_keys"] == [] and info["error_msgs"] == [], info


def _report(name: str, diffs: dict) -> None:
    print(f"\n{name}: max |diff| " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))


# --- pretraining export: the 120-step tiny model of the pretrained fixture -----------------

@pytest.fixture(scope="module")
def pretraining_export(pretrained, pretrain_data, tmp_path_factory):
    """(export dir, summary, the exported BertPretrainer, held-out batch as numpy)."""
    work_dir, _ = pretrained
    data_dir, vocab_dir = pretrain_data
    out = str(tmp_path_factory.mktemp("hf_export") / "export")
    upstream = stage("pretrain", {"model": dict(TINY_MODEL), "max_seq_length": TINY_SEQ},
                     {"vocab_dir": vocab_dir}, work_dir)
    summary = export.run(export_ctx(TINY_MODEL, {"checkpoint_dir": work_dir,
                                                 "vocab_dir": vocab_dir}, out, [upstream]))
    model = BertPretrainer(BertConfig.from_dict(TINY_MODEL))
    checkpoints.restore_model(model, work_dir)
    held_out = pretraining_data.pretraining_dataset(
        data_dir, "validation", batch_size=8, max_seq_length=TINY_SEQ,
        max_predictions_per_seq=TINY_PRED, training=False)
    batch = {k: v.numpy() for k, v in next(iter(held_out)).items()}
    return out, summary, model, batch


def _hf_inputs(batch) -> dict:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["input_mask"],
            "token_type_ids": batch["segment_ids"]}


def _runexp_pretraining_outputs(out, model, batch) -> dict:
    """The export's encoder SavedModel, and the heads of the exported model at every
    position."""
    ids, mask, types = batch["input_ids"], batch["input_mask"], batch["segment_ids"]
    encoder = tf.saved_model.load(os.path.join(out, "encoder"))
    encoded = encoder({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types})
    flat, pooled = model.encoder(ids, mask, types)
    batch_size, seq = ids.shape
    every_position = np.tile(np.arange(seq, dtype=np.int32), [batch_size, 1])
    mlm = model.heads.mlm_logits(flat, every_position, seq).numpy()
    return {"sequence": encoded["sequence_output"].numpy(),
            "pooled": encoded["pooled_output"].numpy(),
            "mlm": mlm.reshape(batch_size, seq, -1),
            "nsp": model.heads.nsp_logits(pooled).numpy()}


def test_files_and_config_say_what_runexp_computes(pretraining_export):
    out, summary, model, _ = pretraining_export
    hf_dir = os.path.join(out, HF)
    assert summary.artifacts[HF] == hf_dir
    assert {"config.json", "model.safetensors"} <= set(os.listdir(hf_dir))
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["BertForPreTraining"] and config["model_type"] == "bert"
    # runexp's "gelu" is google-research/bert's tanh approximation: transformers' gelu_new.
    assert config["hidden_act"] == "gelu_new"
    assert config["layer_norm_eps"] == layers._LAYER_NORM_EPSILON == 1e-12
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size",
                 "hidden_dropout_prob", "attention_probs_dropout_prob"):
        assert config[name] == TINY_MODEL[name], name
    assert config["pad_token_id"] == 0 and config["dtype"] == "float32"
    assert "id2label" not in config or len(config["id2label"]) == 2  # transformers' default

    from safetensors import safe_open

    with safe_open(os.path.join(hf_dir, "model.safetensors"), "np") as f:
        assert f.metadata() == {"format": "pt"}
        names = set(f.keys())
        # A square kernel: only its values tell the transpose.
        query = f.get_tensor("bert.encoder.layer.1.attention.self.query.weight")
    assert names == set(huggingface_weights.name_table(model.google_variables()).values())
    kernel = model.google_variables()["bert/encoder/layer_1/attention/self/query/kernel"]
    np.testing.assert_array_equal(query, kernel.numpy().T)
    with open(os.path.join(out, "README.md")) as f:
        readme = f.read()
    for gone in ("convert_bert_original_tf_checkpoint_to_pytorch", "from_tf=True",
                 "not run by its tests"):
        assert gone not in readme


def test_transformers_loads_every_weight_and_computes_the_same(pretraining_export, tmp_path):
    out, _, model, batch = pretraining_export
    got, loading = transformers_outputs(
        os.path.join(out, HF), _hf_inputs(batch), str(tmp_path),
        "AutoModel", "AutoModelForPreTraining", "AutoModelForMaskedLM")
    assert loading["AutoModelForPreTraining"]["class"] == "BertForPreTraining"
    _clean_load(loading["AutoModelForPreTraining"])
    _clean_load(loading["AutoModel"], PRETRAINING_HEADS)
    _clean_load(loading["AutoModelForMaskedLM"], NOT_IN_MASKED_LM)
    assert loading["AutoModel"]["hidden_act"] == "gelu_new"

    want = _runexp_pretraining_outputs(out, model, batch)
    diffs = {
        "last_hidden_state": max_diff(got["AutoModel.last_hidden_state"], want["sequence"]),
        "pooler_output": max_diff(got["AutoModel.pooler_output"], want["pooled"]),
        "masked-LM logits": max_diff(got["AutoModelForPreTraining.prediction_logits"],
                                     want["mlm"]),
        "masked-LM logits (AutoModelForMaskedLM)": max_diff(
            got["AutoModelForMaskedLM.logits"], want["mlm"]),
        "next-sentence logits": max_diff(
            got["AutoModelForPreTraining.seq_relationship_logits"], want["nsp"]),
    }
    _report("pretraining export", diffs)
    assert all(d < TOLERANCE for d in diffs.values()), diffs
    # Not a trivial agreement: the outputs are far from constant.
    assert np.std(want["sequence"]) > 0.5 and np.std(want["mlm"]) > 0.5


def _copy_hf_dir(out, tmp_path) -> str:
    copy = str(tmp_path / "copy")
    shutil.copytree(os.path.join(out, HF), copy)
    return copy


def test_the_comparison_fails_on_a_wrong_activation_or_an_untransposed_kernel(
        pretraining_export, tmp_path):
    """What the agreement above rests on: transformers' exact GELU in config.json, or one
    square kernel written as TF holds it, moves the outputs past the tolerance."""
    from safetensors.numpy import load_file, save_file

    out, _, model, batch = pretraining_export
    want = _runexp_pretraining_outputs(out, model, batch)
    wrong_act = _copy_hf_dir(out, tmp_path / "act")
    with open(os.path.join(wrong_act, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(wrong_act, "config.json"), "w") as f:
        json.dump({**config, "hidden_act": "gelu"}, f)
    untransposed = _copy_hf_dir(out, tmp_path / "kernel")
    path = os.path.join(untransposed, "model.safetensors")
    tensors = load_file(path)
    name = "bert.encoder.layer.0.intermediate.dense.weight"
    tensors[name] = np.ascontiguousarray(tensors[name].reshape(-1)[::-1].reshape(
        tensors[name].shape))  # same shape, other layout: what a wrong transpose does
    name = "bert.encoder.layer.0.attention.self.query.weight"
    tensors[name] = np.ascontiguousarray(tensors[name].T)
    save_file(tensors, path, metadata={"format": "pt"})
    diffs = {}
    for label, directory in (("wrong activation", wrong_act), ("untransposed", untransposed)):
        got, _ = transformers_outputs(directory, _hf_inputs(batch), str(tmp_path / label),
                                      "AutoModelForPreTraining")
        diffs[label] = max_diff(got["AutoModelForPreTraining.prediction_logits"], want["mlm"])
    _report("negative controls (masked-LM logits)", diffs)
    assert all(d > 3 * TOLERANCE for d in diffs.values()), diffs


def test_activations_match_transformers_by_name(tmp_path):
    """Every runexp hidden_act against the transformers function config.json names."""
    xs = np.linspace(-6, 6, 2001, dtype=np.float32)
    path = str(tmp_path / "activations.npz")
    names = sorted(set(huggingface_config.HUGGINGFACE_ACTIVATION.values()))
    run_consumer("activations", path, *names)
    theirs = np.load(path)
    for act, hf_name in huggingface_config.HUGGINGFACE_ACTIVATION.items():
        ours = layers.ACTIVATIONS[act](tf.constant(xs)).numpy()
        assert max_diff(ours, theirs[hf_name]) < 1e-5, act  # float32 rounding
    # The two GELUs differ by more than the export's tolerance: the name matters.
    assert max_diff(theirs["gelu"], theirs["gelu_new"]) > 1e-4


def test_fill_mask_pipeline_and_readme_code(pretraining_export, tmp_path):
    out, _, model, _ = pretraining_export
    copy = tmp_path / "export"
    copy.mkdir()
    shutil.copytree(os.path.join(out, HF), copy / HF)
    shutil.copy(os.path.join(out, "README.md"), copy / "README.md")
    result_path = str(tmp_path / "fill.json")
    run_consumer("pipelines", str(copy / HF), result_path, "--tokenizer-from-vocab",
                 os.path.join(out, "vocab.txt"), "--lower")
    with open(result_path) as f:
        result = json.load(f)
    # runexp's probabilities at the masked position of the same ids.
    vocab = open(os.path.join(out, "vocab.txt")).read().split()
    diffs = []
    for text, candidates in zip(result["texts"], result["fill-mask"]):
        words = text.lower().replace("[mask]", "[MASK]").split()
        ids = np.array([[2, *(vocab.index(w) for w in words), 3]], np.int32)
        position = words.index("[MASK]") + 1
        flat, _ = model.encoder(ids, np.ones_like(ids), np.zeros_like(ids))
        logits = model.heads.mlm_logits(flat, np.array([[position]], np.int32), ids.shape[1])
        probabilities = tf.nn.softmax(logits)[0].numpy()
        assert len(candidates) == 3
        for candidate in candidates:
            assert candidate["token_str"] == vocab[candidate["token"]]
            diffs.append(abs(candidate["score"] - probabilities[candidate["token"]]))
        assert candidates[0]["token"] == int(np.argmax(probabilities))
    _report("fill-mask pipeline", {"scores": max(diffs)})
    assert max(diffs) < TOLERANCE
    run_consumer("readme", str(copy))


# --- fine-tuned export: a short real finetune stage ------------------------------------------

GOOD, BAD = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "sad"]
FILLER = ["the", "movie", "was", "very", "plot", "acting", "and", "but"]


def _write_tsv(path, n, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        f.write("label\tsentence\n")
        for _ in range(n):
            mood = GOOD if rng.random() < 0.5 else BAD
            words = list(rng.choice(FILLER, int(rng.integers(1, 10)))) + list(rng.choice(mood, 2))
            rng.shuffle(words)
            f.write(f"{'pos' if mood is GOOD else 'neg'}\t{' '.join(words).capitalize()}.\n")


@pytest.fixture(scope="module")
def finetuned_export(tmp_path_factory):
    """(export dir, the exported BertClassifier, the dev texts)."""
    from runexp.compiler.plan import Plan
    from runexp.runtime.context import StageContext

    root = tmp_path_factory.mktemp("hf_finetuned")
    words = GOOD + BAD + FILLER + ["."]
    words += [f"x{i}" for i in range(TINY_MODEL["vocab_size"] - 5 - len(words))]
    vocab_dir = write_vocab_dir(str(root / "vocab"), TINY_MODEL["vocab_size"], words)
    pretrain_dir = str(root / "pretrain")
    write_pretrain_dir(pretrain_dir, TINY_MODEL)
    _write_tsv(root / "train.tsv", 160, seed=1)
    _write_tsv(root / "dev.tsv", 40, seed=2)
    params = {"task": "mood", "labels": None, "model": dict(TINY_MODEL), "batch_size": 16,
              "train_steps": 30, "warmup_steps": 4, "learning_rate": 2e-3,
              "max_seq_length": 16, "seed": 3, "text_fields": ["sentence"],
              "label_field": "label"}
    inputs = {"train_file": str(root / "train.tsv"), "dev_files": {"dev": str(root / "dev.tsv")},
              "vocab_dir": vocab_dir, "checkpoint_dir": pretrain_dir}
    tuned = stage("finetune", params, inputs, str(root / "finetune"))
    os.makedirs(tuned.output_dir)
    plan = Plan(experiment="test", output_root=str(root), stages=(tuned,),
                accelerator={"type": "cpu"})
    finetune.run(StageContext(stage=tuned, plan=plan, work_dir=tuned.output_dir,
                              progress=lambda _: None)).to_dict()
    out = str(root / "export")
    export.run(export_ctx(TINY_MODEL, {"checkpoint_dir": pretrain_dir, "vocab_dir": vocab_dir,
                                       "finetune_dir": tuned.output_dir}, out, [tuned]))
    model = BertClassifier(BertConfig.from_dict(TINY_MODEL), 2)
    checkpoints.restore_model(model, tuned.output_dir)
    with open(root / "dev.tsv") as f:
        texts = [line.split("\t")[1].strip() for line in f.readlines()[1:]]
    return out, model, texts


def test_finetuned_export_classifies_as_runexp(finetuned_export, tmp_path):
    out, _, texts = finetuned_export
    with open(os.path.join(out, HF, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    assert config["label2id"] == {"neg": 0, "pos": 1}
    assert config["problem_type"] == "single_label_classification"

    # The same ids on both sides: the export's preprocessing model packs the dev texts.
    preprocess = tf.saved_model.load(os.path.join(out, "preprocessing"))
    packed = {k: v.numpy() for k, v in preprocess(tf.constant(texts)).items()}
    classifier = tf.saved_model.load(os.path.join(out, "classifier"))
    want = classifier.signatures["classify_ids"](**{k: tf.constant(v)
                                                    for k, v in packed.items()})
    encoder = tf.saved_model.load(os.path.join(out, "encoder"))
    encoded = encoder(packed)
    got, loading = transformers_outputs(
        os.path.join(out, HF), {"input_ids": packed["input_word_ids"],
                                "attention_mask": packed["input_mask"],
                                "token_type_ids": packed["input_type_ids"]},
        str(tmp_path), "AutoModel", "AutoModelForSequenceClassification")
    _clean_load(loading["AutoModelForSequenceClassification"])
    _clean_load(loading["AutoModel"], {"classifier.bias", "classifier.weight"})
    assert loading["AutoModelForSequenceClassification"]["id2label"] == {"0": "neg",
                                                                        "1": "pos"}
    diffs = {
        "last_hidden_state": max_diff(got["AutoModel.last_hidden_state"],
                                      encoded["sequence_output"].numpy()),
        "pooler_output": max_diff(got["AutoModel.pooler_output"],
                                  encoded["pooled_output"].numpy()),
        "classifier logits": max_diff(got["AutoModelForSequenceClassification.logits"],
                                      want["logits"].numpy()),
    }
    _report("fine-tuned export", diffs)
    assert all(d < TOLERANCE for d in diffs.values()), diffs
    margins = want["logits"].numpy() @ [-1.0, 1.0]
    assert np.ptp(margins) > 1000 * TOLERANCE  # far from constant: a wrong head would show


def test_text_classification_pipeline_and_readme_code(finetuned_export, tmp_path):
    out, _, _ = finetuned_export
    copy = tmp_path / "export"
    copy.mkdir()
    shutil.copytree(os.path.join(out, HF), copy / HF)
    shutil.copy(os.path.join(out, "README.md"), copy / "README.md")
    result_path = str(tmp_path / "classify.json")
    run_consumer("pipelines", str(copy / HF), result_path, "--tokenizer-from-vocab",
                 os.path.join(out, "vocab.txt"), "--lower")
    with open(result_path) as f:
        result = json.load(f)
    classifier = tf.saved_model.load(os.path.join(out, "classifier"))
    want = classifier.signatures["classify_text"](text=tf.constant(result["texts"]))
    probabilities = want["probabilities"].numpy()
    diffs = []
    for row, scores in zip(probabilities, result["text-classification"]):
        assert {s["label"] for s in scores} == {"neg", "pos"}
        for s in scores:
            diffs.append(abs(s["score"] - row[["neg", "pos"].index(s["label"])]))
    _report("text-classification pipeline", {"scores": max(diffs)})
    assert max(diffs) < TOLERANCE
    run_consumer("readme", str(copy))
    # The README of a sentence-pair task, on the same model: its pair call runs too.
    from runexp.runtime.export import readme
    from runexp.runtime.export.artifacts import ARTIFACTS

    facts = readme.ExportFacts(
        step=1, parameters=1, layers=2, hidden=32, vocab_type="wordpiece", do_lower_case=True,
        seq_length=16, seq_length_source="", vocab_files=["vocab.txt"], labels=["neg", "pos"],
        text_fields=["first", "second"], huggingface_files=os.listdir(copy / HF))
    (copy / "README.md").write_text(readme.render(facts, ARTIFACTS))
    assert '"text_pair"' in (copy / "README.md").read_text()
    run_consumer("readme", str(copy))


def test_a_finetuned_export_loads_back_with_its_classifier(finetuned_export):
    """huggingface/ of a fine-tuned export as init_checkpoint: classifier.weight and .bias
    come back as runexp's output_weights and output_bias, every variable exact."""
    out, model, _ = finetuned_export
    loaded = BertClassifier(BertConfig.from_dict(TINY_MODEL), 2)
    report = checkpoints.load_init_checkpoint(loaded.google_variables(),
                                              os.path.join(out, HF), loaded.config)
    assert report.source == "huggingface" and report.missing == () and report.unused == ()
    for name, var in model.google_variables().items():
        np.testing.assert_array_equal(loaded.google_variables()[name].numpy(), var.numpy(),
                                      err_msg=name)
