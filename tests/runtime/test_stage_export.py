"""export stage: the TF Hub-style encoder, the preprocessing model, the Google-layout
checkpoint (read by google-research/bert's own modeling code), config, vocab and README,
from a pretrain stage; tiny random-initialised models keep it fast (the numbers are compared,
not judged). The classifier of a fine-tuned export: test_export_classifier.py."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.support.export import export_ctx, google_bert_modeling, stage, write_pretrain_dir
from tests.support.runtime import TINY_MODEL, write_vocab_dir
from runexp.runtime.model import BertConfig
from runexp.runtime.stages import export

SEQ = 32  # the pretrain stage's max_seq_length in the plan
HUB_INPUTS = {"input_word_ids", "input_mask", "input_type_ids"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(export dir, summary, the exported model in memory, progress messages)."""
    root = tmp_path_factory.mktemp("export")
    vocab_dir = write_vocab_dir(str(root / "vocab"), TINY_MODEL["vocab_size"])
    pretrain_dir = str(root / "pretrain")
    model = write_pretrain_dir(pretrain_dir, TINY_MODEL, step=7)
    pretrain = stage("pretrain", {"model": dict(TINY_MODEL), "max_seq_length": SEQ},
                     {"vocab_dir": vocab_dir}, pretrain_dir)
    out, messages = str(root / "export"), []
    summary = export.run(export_ctx(TINY_MODEL, {"checkpoint_dir": pretrain_dir,
                                                 "vocab_dir": vocab_dir}, out, [pretrain],
                                    messages))
    return out, summary, model, messages


def _inputs(seed=0, batch=3, seq=9):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, TINY_MODEL["vocab_size"], [batch, seq]).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    types = np.zeros_like(ids)
    types[2, 4:] = 1
    return ids, mask, types


def test_files_summary_and_readme(exported):
    out, summary, _, messages = exported
    assert {"encoder", "preprocessing", "vocab.txt", "bert_config.json", "README.md",
            "bert_model.ckpt.index", "huggingface"} <= set(os.listdir(out))
    assert "classifier" not in os.listdir(out)
    assert summary.step == 7 and summary.parameters > 0
    assert summary.seq_length == SEQ and summary.vocab_type == "wordpiece"
    assert summary.do_lower_case is True
    assert "seq_length 32, the pretraining max_seq_length" in messages[-1]
    with open(os.path.join(out, "bert_config.json")) as f:
        assert json.load(f) == BertConfig.from_dict(TINY_MODEL).to_dict()
    with open(os.path.join(out, "README.md")) as f:
        readme = f.read()
    for text in ("`do_lower_case = True`", "WordPiece", "hub.KerasLayer(\"encoder\"",
                 "tf.saved_model.load(\"preprocessing\")", "--max_seq_length=32",
                 "pipeline(\"fill-mask\", model=\"huggingface\")",
                 "AutoModel.from_pretrained(\"huggingface\")", "hf upload", "`encoder/`",
                 "`huggingface/`", "`bert_model.ckpt.*`"):
        assert text in readme, text
    # The conversion recipes for transformers the export replaces (huggingface/ is tested
    # with transformers itself: test_export_huggingface.py).
    for text in ("convert_bert_original_tf_checkpoint_to_pytorch", "from_tf=True"):
        assert text not in readme, text


def test_encoder_answers_tf_hub_inputs_like_the_model(exported):
    out, _, model, _ = exported
    ids, mask, types = _inputs()
    layers, pooled = model.encoder.layer_outputs(ids, mask, types)
    layers = [x.numpy().reshape(ids.shape + (-1,)) for x in layers[1:]]

    encoder = tf.saved_model.load(os.path.join(out, "encoder"))
    outputs = encoder({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types})
    assert set(outputs) == {"pooled_output", "sequence_output", "encoder_outputs", "default"}
    assert outputs["sequence_output"].shape == [3, 9, TINY_MODEL["hidden_size"]]
    np.testing.assert_allclose(outputs["sequence_output"].numpy(), layers[-1], atol=1e-5)
    np.testing.assert_allclose(outputs["pooled_output"].numpy(), pooled.numpy(), atol=1e-5)
    assert len(outputs["encoder_outputs"]) == TINY_MODEL["num_hidden_layers"]
    for got, want in zip(outputs["encoder_outputs"], layers):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
    np.testing.assert_array_equal(outputs["encoder_outputs"][-1].numpy(),
                                  outputs["sequence_output"].numpy())
    np.testing.assert_array_equal(outputs["default"].numpy(), outputs["pooled_output"].numpy())
    # training=True runs dropout (TINY_MODEL's 0.1): different numbers, same shapes.
    dropped = encoder({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types},
                      training=True)
    assert not np.allclose(dropped["pooled_output"].numpy(), outputs["pooled_output"].numpy())

    serving = encoder.signatures["serving_default"]
    assert set(serving.structured_input_signature[1]) == HUB_INPUTS
    flat = serving(input_word_ids=tf.constant(ids), input_mask=tf.constant(mask),
                   input_type_ids=tf.constant(types))
    assert set(flat) == {"pooled_output", "sequence_output", "default", "encoder_outputs_0",
                         "encoder_outputs_1"}
    np.testing.assert_allclose(flat["sequence_output"].numpy(), layers[-1], atol=1e-5)
    np.testing.assert_allclose(flat["encoder_outputs_0"].numpy(), layers[0], atol=1e-5)

    # What TF Hub's BERT encoders carry: the vocabulary, the casing, reusable variables.
    with open(encoder.vocab_file.asset_path.numpy().decode(), "rb") as f, \
            open(os.path.join(out, "vocab.txt"), "rb") as g:
        assert f.read() == g.read()
    assert bool(encoder.do_lower_case.numpy()) is True
    assert not hasattr(encoder, "sp_model_file")
    assert len(encoder.trainable_variables) == len(model.encoder.trainable_variables)
    assert list(encoder.regularization_losses) == []


def test_preprocessing_feeds_the_encoder(exported):
    out, _, model, _ = exported
    preprocess = tf.saved_model.load(os.path.join(out, "preprocessing"))
    inputs = preprocess(tf.constant(["w5 W6 w7 unknown", "w8"]))
    assert set(inputs) == HUB_INPUTS and inputs["input_word_ids"].shape == [2, SEQ]
    np.testing.assert_array_equal(inputs["input_word_ids"].numpy()[:, :6],
                                  [[2, 5, 6, 7, 1, 3], [2, 8, 3, 0, 0, 0]])
    encoder = tf.saved_model.load(os.path.join(out, "encoder"))
    _, pooled = model.encoder(inputs["input_word_ids"], inputs["input_mask"],
                              inputs["input_type_ids"])
    np.testing.assert_allclose(encoder(inputs)["pooled_output"].numpy(), pooled.numpy(),
                               atol=1e-5)


def test_google_checkpoint_runs_in_google_research_bert(exported):
    """google-research/bert's modeling.BertModel, built from bert_config.json and initialised
    from bert_model.ckpt as run_classifier.py does (every variable found by name), computes
    what the exported encoder computes."""
    out, _, model, _ = exported
    prefix = os.path.join(out, "bert_model.ckpt")
    reader = tf.train.load_checkpoint(prefix)
    assert set(reader.get_variable_to_shape_map()) == set(model.google_variables())
    np.testing.assert_array_equal(
        reader.get_tensor("bert/encoder/layer_1/attention/self/query/kernel"),
        model.google_variables()["bert/encoder/layer_1/attention/self/query/kernel"].numpy())

    modeling = google_bert_modeling()
    tf1 = tf.compat.v1
    ids, mask, types = _inputs(seed=1)
    graph = tf.Graph()
    with graph.as_default():
        config = modeling.BertConfig.from_json_file(os.path.join(out, "bert_config.json"))
        placeholders = [tf1.placeholder(tf.int32, [None, None]) for _ in range(3)]
        bert = modeling.BertModel(config, is_training=False, input_ids=placeholders[0],
                                  input_mask=placeholders[1], token_type_ids=placeholders[2])
        variables = tf1.trainable_variables()
        assignment, initialized = modeling.get_assignment_map_from_checkpoint(variables, prefix)
        assert {v.name for v in variables} <= set(initialized)
        tf1.train.init_from_checkpoint(prefix, assignment)
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            sequence, pooled, layers = session.run(
                [bert.get_sequence_output(), bert.get_pooled_output(),
                 bert.get_all_encoder_layers()], dict(zip(placeholders, (ids, mask, types))))
    encoder = tf.saved_model.load(os.path.join(out, "encoder"))
    outputs = encoder({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types})
    np.testing.assert_allclose(outputs["sequence_output"].numpy(), sequence, atol=1e-5)
    np.testing.assert_allclose(outputs["pooled_output"].numpy(), pooled, atol=1e-5)
    for got, want in zip(outputs["encoder_outputs"], layers):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


def test_tf_hub_keras_layer_fine_tunes_the_encoder(exported):
    """hub.KerasLayer over both SavedModels, the encoder trainable (tensorflow_hub and tf_keras
    are in the test extra, not runexp dependencies: a failing import fails the test)."""
    import tensorflow_hub as hub
    import tf_keras as keras
    out, _, _, _ = exported
    text = keras.layers.Input(shape=(), dtype=tf.string)
    encoder = hub.KerasLayer(os.path.join(out, "encoder"), trainable=True)
    outputs = encoder(hub.KerasLayer(os.path.join(out, "preprocessing"))(text))
    classifier = keras.Model(text, keras.layers.Dense(2)(outputs["pooled_output"]))
    classifier.compile(optimizer="adam",
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [w.numpy().copy() for w in encoder.trainable_weights]
    classifier.fit(tf.constant(["w5 w6", "w7"]), np.array([0, 1]), epochs=1, verbose=0)
    assert any(not np.array_equal(b, w.numpy())
               for b, w in zip(before, encoder.trainable_weights))


def test_a_sentencepiece_vocab_is_exported_as_the_vocabulary(tmp_path):
    """An spm.model vocab (no vocab.txt): the SavedModels carry it as ``vocab_file`` and
    ``sp_model_file``, the preprocessing model gives runexp's ids, the README says how to
    tokenise for the consumers that read WordPiece only."""
    import io

    import sentencepiece as spm

    from runexp.tasks.vocabulary.tokenizer import load_tokenizer

    vocab_dir = tmp_path / "vocab"
    vocab_dir.mkdir()
    text = ["Return the value of the key.", "The logger writes records to every handler.",
            "Parse the header of the message and return its fields."] * 20
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=TINY_MODEL["vocab_size"],
        model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="[PAD]",
        unk_piece="[UNK]", control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        hard_vocab_limit=False, normalization_rule_name="nmt_nfkc_cf", minloglevel=2)
    (vocab_dir / "spm.model").write_bytes(model.getvalue())
    (vocab_dir / "report.json").write_text(json.dumps({"type": "sentencepiece",
                                                       "do_lower_case": True}))
    pretrain_dir = str(tmp_path / "pretrain")
    write_pretrain_dir(pretrain_dir, TINY_MODEL)
    out = str(tmp_path / "export")
    summary = export.run(export_ctx(
        TINY_MODEL, {"checkpoint_dir": pretrain_dir, "vocab_dir": str(vocab_dir)}, out,
        [stage("pretrain", {"max_seq_length": 16}, {}, pretrain_dir)]))
    assert summary.vocab_type == "sentencepiece" and summary.vocab_files == ["spm.model"]
    assert "vocab.txt" not in os.listdir(out)

    encoder = tf.saved_model.load(os.path.join(out, "encoder"))
    for asset in (encoder.vocab_file, encoder.sp_model_file):
        with open(asset.asset_path.numpy().decode(), "rb") as f:
            assert f.read() == model.getvalue()
    preprocess = tf.saved_model.load(os.path.join(out, "preprocessing"))
    tokenizer = load_tokenizer(str(vocab_dir))
    line = "RETURN the Records of every handler!"
    pieces = tokenizer.encode(line)
    assert len(pieces) > 14  # cut to the pretraining length, [CLS] and [SEP] kept
    ids = [tokenizer.cls_id, *pieces[:14], tokenizer.sep_id]
    assert preprocess(tf.constant([line]))["input_word_ids"].numpy()[0].tolist() == ids
    assert preprocess.tokenize(tf.constant([line])).to_list() == [pieces]

    with open(os.path.join(out, "README.md")) as f:
        readme = f.read()
    assert "SentencePiece (`spm.model`, text lower-cased before it)" in readme
    assert "--vocab_file" not in readme and "`[CLS]` 2, `[SEP]` 3" in readme
