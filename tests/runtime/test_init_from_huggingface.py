"""init_checkpoint from a Hugging Face BERT directory: a BertForPreTraining built and saved by
transformers itself (hf_consumer.py, its own process; every parameter random, LayerNorm and
biases too) loads into runexp's model, which then computes what transformers computes
(encoder, pooler, heads, loss), trains from it in the pretrain stage with a first-step loss
equal to transformers' on the same batch, and exports it back unchanged to the bit. A
BertModel directory gives the encoder only (the heads start fresh, said in the log); a
config.json computing something else, or a tensor of another shape, is a clear error."""

import json
import os
import shutil

import numpy as np
import pytest
import seqio
import tensorflow as tf

from tests.support.export import export_ctx, stage
from tests.support.hf import max_diff, run_consumer, transformers_outputs
from tests.support.runtime import TINY_MODEL, TINY_PRED, TINY_SEQ, make_ctx, pretrain_params
from runexp.compiler.errors import UserError
from runexp.runtime import checkpoints, pretraining_data
from runexp.runtime.bert_config import BertConfig
from runexp.runtime.checkpoints import CHECKPOINT_SUBDIR
from runexp.runtime.model import BertPretrainer
from runexp.runtime.stages import export, pretrain

TOLERANCE = 1e-4
# TINY_MODEL without dropout: both sides compute the same deterministic function.
MODEL = {**TINY_MODEL, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
HEADS = ("cls/predictions/output_bias", "cls/predictions/transform/LayerNorm/beta",
         "cls/predictions/transform/LayerNorm/gamma", "cls/predictions/transform/dense/bias",
         "cls/predictions/transform/dense/kernel", "cls/seq_relationship/output_bias",
         "cls/seq_relationship/output_weights")


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """(BertForPreTraining directory, BertModel directory), saved by transformers."""
    root = tmp_path_factory.mktemp("hf_init")
    config = {name: MODEL[name] for name in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size", "hidden_dropout_prob", "attention_probs_dropout_prob",
        "max_position_embeddings", "type_vocab_size", "initializer_range")}
    config.update(hidden_act="gelu_new", layer_norm_eps=1e-12)  # runexp's "gelu"
    with open(root / "config.json", "w") as f:
        json.dump(config, f)
    run_consumer("random-bert", str(root / "bert"), str(root / "config.json"), 11)
    return str(root / "bert"), str(root / "bert-encoder")


def _held_out(pretrain_data, batch_size=8) -> dict:
    data_dir, _ = pretrain_data
    ds = pretraining_data.pretraining_dataset(
        data_dir, "validation", batch_size=batch_size, max_seq_length=TINY_SEQ,
        max_predictions_per_seq=TINY_PRED, training=False)
    return {k: v.numpy() for k, v in next(iter(ds)).items()}


def _hf_inputs(batch) -> dict:
    """The batch as transformers takes it: labels at the masked positions, -100 elsewhere."""
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    for row, (positions, ids, weights) in enumerate(zip(
            batch["masked_lm_positions"], batch["masked_lm_ids"], batch["masked_lm_weights"])):
        for position, token, weight in zip(positions, ids, weights):
            if weight > 0:
                labels[row, position] = token
    return {"input_ids": batch["input_ids"], "attention_mask": batch["input_mask"],
            "token_type_ids": batch["segment_ids"], "labels": labels,
            "next_sentence_label": batch["next_sentence_labels"].reshape(-1)}


def _gathered(logits, positions):
    """transformers' [batch, seq, vocab] logits at runexp's masked positions."""
    return np.concatenate([row[p] for row, p in zip(logits, positions)])


def _loaded(directory) -> tuple[BertPretrainer, checkpoints.LoadReport]:
    model = BertPretrainer(BertConfig.from_dict(MODEL))
    report = checkpoints.load_init_checkpoint(model.google_variables(), directory,
                                              model.config)
    return model, report


def test_runexp_computes_what_transformers_computes(hf_dirs, pretrain_data, tmp_path):
    full, _ = hf_dirs
    model, report = _loaded(full)
    assert report.source == "huggingface"
    assert set(report.loaded) == set(model.google_variables())
    assert report.missing == () and report.unused == ()

    batch = _held_out(pretrain_data)
    got, loading = transformers_outputs(full, _hf_inputs(batch), str(tmp_path), "AutoModel",
                                        "AutoModelForPreTraining")
    assert loading["AutoModelForPreTraining"]["missing_keys"] == []
    flat, pooled = model.encoder(batch["input_ids"], batch["input_mask"],
                                 batch["segment_ids"])
    mlm, nsp = model(batch)
    loss, _ = model.loss(batch)
    diffs = {
        "last_hidden_state": max_diff(got["AutoModel.last_hidden_state"],
                                      flat.numpy().reshape(*batch["input_ids"].shape, -1)),
        "pooler_output": max_diff(got["AutoModel.pooler_output"], pooled),
        "masked-LM logits": max_diff(_gathered(got["AutoModelForPreTraining.prediction_logits"],
                                               batch["masked_lm_positions"]), mlm),
        "next-sentence logits": max_diff(got["AutoModelForPreTraining.seq_relationship_logits"],
                                         nsp),
        "loss": max_diff(got["AutoModelForPreTraining.loss"], loss),
    }
    print("\nHugging Face -> runexp: max |diff| "
          + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert all(d < TOLERANCE for d in diffs.values()), diffs
    assert np.std(flat.numpy()) > 0.5 and np.std(mlm.numpy()) > 0.5  # not a trivial match


def test_first_training_step_loss_equals_transformers(hf_dirs, pretrain_data, tmp_path):
    """The pretrain stage started from the directory (dropout off): its logged loss of step
    1 is transformers' loss on the batch that step read."""
    full, _ = hf_dirs
    data_dir, vocab_dir = pretrain_data
    messages = []
    params = pretrain_params(model=dict(MODEL), init_checkpoint=full, train_steps=1,
                             log_every=1, steps_per_loop=1, checkpoint_every=1)
    summary = pretrain.run(make_ctx("pretrain", params, {"data_dir": data_dir,
                                                         "vocab_dir": vocab_dir},
                                    str(tmp_path / "pretrain"), messages)).to_dict()
    assert summary["init_checkpoint"]["source"] == "huggingface"
    assert summary["init_checkpoint"]["missing"] == []
    assert not any("start fresh" in m for m in messages)
    with open(tmp_path / "pretrain" / "train_log.jsonl") as f:
        logged = [json.loads(line) for line in f]
    first = next(r for r in logged if r.get("step") == 1 and "loss" in r)

    # The batch of step 1: the stage's stream (one host, its seed), first batch.
    ds = pretraining_data.pretraining_dataset(
        data_dir, "train", batch_size=params["batch_size"], max_seq_length=TINY_SEQ,
        max_predictions_per_seq=TINY_PRED, seed=params["seed"], training=True,
        shard_info=seqio.ShardInfo(0, 1))
    batch = {k: v.numpy() for k, v in next(iter(ds)).items()}
    model, _ = _loaded(full)
    runexp_loss = float(model.loss(batch)[0])
    # The batch is the one the stage read (its loss before the update is the logged one).
    assert abs(runexp_loss - first["loss"]) < 1e-5
    got, _ = transformers_outputs(full, _hf_inputs(batch), str(tmp_path / "hf"),
                                  "AutoModelForPreTraining")
    difference = abs(float(got["AutoModelForPreTraining.loss"]) - first["loss"])
    print(f"\nfirst-step loss: runexp {first['loss']:.6f}, transformers "
          f"{float(got['AutoModelForPreTraining.loss']):.6f}, |diff| {difference:.2e}")
    assert difference < TOLERANCE


def test_an_encoder_directory_gives_the_encoder_and_fresh_heads(hf_dirs, pretrain_data,
                                                                tmp_path):
    full, encoder_only = hf_dirs
    assert set(os.listdir(encoder_only)) >= {"config.json", "model.safetensors"}
    model, report = _loaded(encoder_only)
    assert report.missing == HEADS and report.unused == ()
    batch = _held_out(pretrain_data, batch_size=4)
    got, loading = transformers_outputs(encoder_only, _hf_inputs(batch), str(tmp_path),
                                        "AutoModel")
    assert loading["AutoModel"]["missing_keys"] == []
    flat, pooled = model.encoder(batch["input_ids"], batch["input_mask"],
                                 batch["segment_ids"])
    assert max_diff(got["AutoModel.last_hidden_state"],
                    flat.numpy().reshape(*batch["input_ids"].shape, -1)) < TOLERANCE
    assert max_diff(got["AutoModel.pooler_output"], pooled) < TOLERANCE

    data_dir, vocab_dir = pretrain_data
    messages = []
    params = pretrain_params(model=dict(MODEL), init_checkpoint=encoder_only, train_steps=1,
                             log_every=1, steps_per_loop=1, checkpoint_every=1)
    summary = pretrain.run(make_ctx("pretrain", params, {"data_dir": data_dir,
                                                         "vocab_dir": vocab_dir},
                                    str(tmp_path / "pretrain"), messages)).to_dict()
    assert summary["init_checkpoint"]["missing"] == list(HEADS)
    assert any(m == f"init_checkpoint {encoder_only} is a Hugging Face model without the "
               "masked-LM head and the next-sentence head: they start fresh"
               for m in messages), messages


def test_round_trip_through_the_export_is_exact(hf_dirs, pretrain_data, tmp_path):
    """transformers -> runexp -> export huggingface/ -> transformers: the same tensors, bit
    for bit, and the same outputs."""
    from safetensors.numpy import load_file

    full, _ = hf_dirs
    _, vocab_dir = pretrain_data
    model, _ = _loaded(full)
    stage_dir = str(tmp_path / "pretrain")
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model),
                               os.path.join(stage_dir, CHECKPOINT_SUBDIR), max_to_keep=1,
                               checkpoint_name="ckpt").save(checkpoint_number=1)
    out = str(tmp_path / "export")
    upstream = stage("pretrain", {"model": dict(MODEL), "max_seq_length": TINY_SEQ},
                     {"vocab_dir": vocab_dir}, stage_dir)
    export.run(export_ctx(MODEL, {"checkpoint_dir": stage_dir, "vocab_dir": vocab_dir}, out,
                          [upstream]))
    original, exported = load_file(os.path.join(full, "model.safetensors")), load_file(
        os.path.join(out, "huggingface", "model.safetensors"))
    assert set(exported) == set(original)
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)

    batch = _held_out(pretrain_data, batch_size=4)
    before, _ = transformers_outputs(full, _hf_inputs(batch), str(tmp_path / "before"),
                                     "AutoModelForPreTraining")
    after, loading = transformers_outputs(os.path.join(out, "huggingface"), _hf_inputs(batch),
                                          str(tmp_path / "after"), "AutoModelForPreTraining")
    assert loading["AutoModelForPreTraining"]["missing_keys"] == []
    assert loading["AutoModelForPreTraining"]["unexpected_keys"] == []
    for key, value in before.items():
        assert max_diff(after[key], value) == 0.0, key


def _edited_copy(directory, tmp_path, config=None, tensors=None) -> str:
    from safetensors.numpy import load_file, save_file

    copy = str(tmp_path / "edited")
    shutil.copytree(directory, copy)
    if config:
        with open(os.path.join(copy, "config.json")) as f:
            data = json.load(f)
        with open(os.path.join(copy, "config.json"), "w") as f:
            json.dump({**data, **config}, f)
    if tensors:
        path = os.path.join(copy, "model.safetensors")
        save_file({**load_file(path), **tensors}, path, metadata={"format": "pt"})
    return copy


@pytest.mark.parametrize("edit, expected", [
    ({"hidden_act": "gelu"}, "model.hidden_act = 'gelu_exact'"),
    ({"num_attention_heads": 4}, "num_attention_heads: checkpoint 4, model 2"),
    ({"layer_norm_eps": 1e-5}, "layer_norm_eps is 1e-05"),
    ({"position_embedding_type": "relative_key"}, "absolute position embeddings only"),
], ids=["erf-gelu", "heads", "epsilon", "positions"])
def test_a_config_that_computes_something_else_is_refused(hf_dirs, tmp_path, edit, expected):
    """What no tensor shape shows (the activation, heads, epsilon, positions) is read from
    config.json: loading would succeed and compute something else."""
    full, _ = hf_dirs
    with pytest.raises(UserError) as raised:
        _loaded(_edited_copy(full, tmp_path, config=edit))
    assert expected in str(raised.value)


def test_a_tensor_of_another_shape_is_named(hf_dirs, tmp_path):
    full, _ = hf_dirs
    copy = _edited_copy(full, tmp_path,
                        tensors={"bert.pooler.dense.bias": np.zeros([16], np.float32)})
    with pytest.raises(UserError) as raised:
        _loaded(copy)
    assert ("bert.pooler.dense.bias (bert/pooler/dense/bias): checkpoint [16] vs model [32]"
            in str(raised.value))


def test_a_directory_without_safetensors_says_how_to_save_one(hf_dirs, tmp_path):
    full, _ = hf_dirs
    copy = _edited_copy(full, tmp_path)
    os.remove(os.path.join(copy, "model.safetensors"))
    with pytest.raises(UserError) as raised:
        _loaded(copy)
    assert "without model.safetensors" in str(raised.value)
    assert "save_pretrained" in str(raised.value.problems[0].hint)


def test_older_savers_names_load_the_same(hf_dirs, tmp_path):
    """Checkpoints on the Hub written by older transformers: LayerNorm ``gamma``/``beta``,
    the tied decoder stored, the position_ids buffer. An untied decoder is refused."""
    from safetensors.numpy import load_file, save_file

    full, _ = hf_dirs
    tensors = load_file(os.path.join(full, "model.safetensors"))
    legacy = {name.replace("LayerNorm.weight", "LayerNorm.gamma")
              .replace("LayerNorm.bias", "LayerNorm.beta"): value
              for name, value in tensors.items()}
    legacy["cls.predictions.decoder.weight"] = tensors["bert.embeddings.word_embeddings.weight"]
    legacy["cls.predictions.decoder.bias"] = tensors["cls.predictions.bias"]
    legacy["bert.embeddings.position_ids"] = np.arange(MODEL["max_position_embeddings"])[None]
    copy = _edited_copy(full, tmp_path)
    save_file(legacy, os.path.join(copy, "model.safetensors"), metadata={"format": "pt"})
    model, report = _loaded(copy)
    reference, _ = _loaded(full)
    assert report.missing == () and report.unused == ()
    for name, var in reference.google_variables().items():
        np.testing.assert_array_equal(model.google_variables()[name].numpy(), var.numpy())

    legacy["cls.predictions.decoder.weight"] = legacy["cls.predictions.decoder.weight"] + 1.0
    save_file(legacy, os.path.join(copy, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="not tied"):
        _loaded(copy)


def test_the_finetune_stage_starts_from_an_encoder_directory(hf_dirs, tmp_path):
    from runexp.runtime.stages import finetune
    from tests.support.runtime import write_vocab_dir

    _, encoder_only = hf_dirs
    vocab_dir = write_vocab_dir(str(tmp_path / "vocab"), MODEL["vocab_size"])
    rng = np.random.default_rng(0)
    for name, n in (("train", 32), ("dev", 8)):
        with open(tmp_path / f"{name}.tsv", "w") as f:
            f.write("label\tsentence\n")
            for _ in range(n):
                label = int(rng.integers(0, 2))
                words = rng.integers(5, 30, 6) + 30 * label
                f.write(f"{'ab'[label]}\t{' '.join(f'w{w}' for w in words)}\n")
    params = {"task": "letters", "labels": None, "model": dict(MODEL), "batch_size": 8,
              "train_steps": 2, "warmup_steps": 1, "learning_rate": 1e-3,
              "max_seq_length": 16, "seed": 3, "text_fields": ["sentence"],
              "label_field": "label"}
    messages = []
    finetune.run(make_ctx("finetune", params, {
        "train_file": str(tmp_path / "train.tsv"), "dev_files": {"dev": str(tmp_path / "dev.tsv")},
        "vocab_dir": vocab_dir, "init_checkpoint": encoder_only}, str(tmp_path / "finetune"),
        messages)).to_dict()
    line = next(m for m in messages if m.startswith(f"init_checkpoint {encoder_only}"))
    assert f"{len(BertPretrainer(BertConfig.from_dict(MODEL)).encoder.named_variables())} " \
           "variables loaded" in line
    assert "output_bias, output_weights) starts fresh" in line
