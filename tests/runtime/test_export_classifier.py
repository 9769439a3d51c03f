"""export stage after fine-tuning: the classifier SavedModel predicts each dev set exactly
as the finetune stage scored it (same labels for every example, same accuracy, same
probabilities), from raw text, for a single-text task and a sentence-pair task. The
finetune stages are real ones, short (tiny encoder, random start, a few dozen steps)."""

import csv
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.support.export import export_ctx, stage, write_pretrain_dir
from tests.support.runtime import TINY_MODEL, write_vocab_dir
from runexp.runtime.stages import export, finetune
from runexp.compiler.formats.classification_files import load_examples
from runexp.tasks.vocabulary.tokenizer import load_tokenizer

GOOD, BAD = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "sad"]
FILLER = ["the", "movie", "was", "very", "plot", "acting", "and", "but"]
SEQ = 16  # the fine-tune's max_seq_length: longer texts are cut


def _write_tsv(path, n, seed, pairs):
    """Labelled texts of 3 to 17 words (some longer than SEQ tokens); for pairs the label
    says whether the two texts have the same mood."""
    rng = np.random.default_rng(seed)

    def text(mood):
        words = list(rng.choice(FILLER, int(rng.integers(1, 16)))) + list(rng.choice(mood, 2))
        rng.shuffle(words)
        return " ".join(words).capitalize() + rng.choice([".", "!", ""])

    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["label", "first", "second"] if pairs else ["label", "sentence"])
        for _ in range(n):
            a, b = (GOOD if rng.random() < 0.5 else BAD), (GOOD if rng.random() < 0.5 else BAD)
            if pairs:
                w.writerow(["same" if a is b else "different", text(a), text(b)])
            else:
                w.writerow(["pos" if a is GOOD else "neg", text(a)])


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """(root, vocab dir, pretrain dir): a WordPiece vocab of the task's words."""
    root = tmp_path_factory.mktemp("classifier")
    words = GOOD + BAD + FILLER + ["!", "."]
    words += [f"x{i}" for i in range(TINY_MODEL["vocab_size"] - 5 - len(words))]
    vocab_dir = write_vocab_dir(str(root / "vocab"), TINY_MODEL["vocab_size"], words)
    pretrain_dir = str(root / "pretrain")
    write_pretrain_dir(pretrain_dir, TINY_MODEL)
    return root, vocab_dir, pretrain_dir


def _finetune_and_export(upstream, name, pairs, train_steps):
    root, vocab_dir, pretrain_dir = upstream
    _write_tsv(root / f"{name}_train.tsv", 200, seed=1, pairs=pairs)
    _write_tsv(root / f"{name}_dev.tsv", 80, seed=2, pairs=pairs)
    fields = ["first", "second"] if pairs else ["sentence"]
    params = {"task": name, "labels": None, "model": dict(TINY_MODEL), "batch_size": 16,
              "train_steps": train_steps, "warmup_steps": 4, "learning_rate": 2e-3,
              "max_seq_length": SEQ, "seed": 3, "text_fields": fields, "label_field": "label"}
    inputs = {"train_file": str(root / f"{name}_train.tsv"),
              "dev_files": {"dev": str(root / f"{name}_dev.tsv")},
              "vocab_dir": vocab_dir, "checkpoint_dir": pretrain_dir}
    finetune_stage = stage("finetune", params, inputs, str(root / f"{name}_finetune"))
    scores = finetune.run(_ctx_of(finetune_stage)).to_dict()
    out = str(root / f"{name}_export")
    summary = export.run(export_ctx(
        TINY_MODEL, {"checkpoint_dir": pretrain_dir, "vocab_dir": vocab_dir,
                     "finetune_dir": finetune_stage.output_dir}, out, [finetune_stage]))
    return finetune_stage.output_dir, scores, out, summary


def _ctx_of(finetune_stage):
    from runexp.compiler.plan import Plan
    from runexp.runtime.context import StageContext

    os.makedirs(finetune_stage.output_dir, exist_ok=True)
    plan = Plan(experiment="test", output_root=os.path.dirname(finetune_stage.output_dir),
                stages=(finetune_stage,), accelerator={"type": "cpu"})
    return StageContext(stage=finetune_stage, plan=plan, work_dir=finetune_stage.output_dir,
                        progress=lambda _: None)


def _dev_predictions(finetune_dir):
    with open(os.path.join(finetune_dir, "predictions.dev.tsv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [r["prediction"] for r in rows], [float(r["probability"]) for r in rows]


@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pairs"])
def test_classifier_predicts_the_dev_set_as_the_finetune_stage(upstream, pairs):
    name = "pairs" if pairs else "single"
    finetune_dir, scores, out, summary = _finetune_and_export(
        upstream, name, pairs, train_steps=40 if pairs else 30)
    assert summary.artifacts["classifier"] == os.path.join(out, "classifier")
    assert summary.seq_length == SEQ  # the fine-tune's, not the pretraining's
    fields = ["first", "second"] if pairs else ["sentence"]
    dev = load_examples(str(upstream[0] / f"{name}_dev.tsv"), fields, "label")
    labels = ["different", "same"] if pairs else ["neg", "pos"]
    tokenizer = load_tokenizer(upstream[1])
    too_long = [t for t, _ in dev if sum(len(tokenizer.encode(x)) for x in t) + 1 + len(t) > SEQ]
    assert len(too_long) > 5  # truncation is exercised

    classifier = tf.saved_model.load(os.path.join(out, "classifier"))
    assert [x.decode() for x in classifier.labels.numpy()] == labels
    assert [x.decode() for x in classifier.text_fields.numpy()] == fields
    texts = [tf.constant([t[i] for t, _ in dev]) for i in range(len(fields))]
    if pairs:
        outputs = classifier.signatures["classify_pair"](text_a=texts[0], text_b=texts[1])
        assert set(classifier.signatures) == {"serving_default", "classify_text",
                                              "classify_pair", "classify_ids"}
    else:
        outputs = classifier.signatures["classify_text"](text=texts[0])
        assert set(classifier.signatures) == {"serving_default", "classify_text",
                                              "classify_ids"}
    assert set(outputs) == {"logits", "probabilities", "label_id", "label"}
    assert outputs["logits"].shape == [len(dev), 2]
    served = classifier.signatures["serving_default"](**(
        {"text_a": texts[0], "text_b": texts[1]} if pairs else {"text": texts[0]}))
    np.testing.assert_array_equal(served["label_id"].numpy(), outputs["label_id"].numpy())

    predicted = [x.decode() for x in outputs["label"].numpy()]
    want, want_probability = _dev_predictions(finetune_dir)
    assert predicted == want  # every example, not only the score
    accuracy = float(np.mean([p == label for p, (_, label) in zip(predicted, dev)]))
    assert accuracy == scores["accuracy"] == scores["dev_sets"]["dev"]["accuracy"]
    top = outputs["probabilities"].numpy().max(axis=1)
    np.testing.assert_allclose(top, want_probability, atol=6e-5)  # printed with 4 decimals
    np.testing.assert_array_equal(
        outputs["label_id"].numpy(), [labels.index(p) for p in predicted])

    # The ids-in signature, fed by the exported preprocessing model, agrees.
    preprocess = tf.saved_model.load(os.path.join(out, "preprocessing"))
    packed = preprocess.bert_pack_inputs([preprocess.tokenize(t) for t in texts])
    by_ids = classifier.signatures["classify_ids"](**packed)
    np.testing.assert_allclose(by_ids["logits"].numpy(), outputs["logits"].numpy(), atol=1e-6)
    with open(os.path.join(out, "README.md")) as f:
        readme = f.read()
    assert ("classify_pair" if pairs else "classify_text") in readme
    assert ", ".join(labels) in readme and "output_weights" in readme
