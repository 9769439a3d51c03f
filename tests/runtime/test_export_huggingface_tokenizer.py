"""transformers' AutoTokenizer over the files ``write_tokenizer_files`` writes gives the ids
runexp trained on.

The consumer runs in its own process, which imports transformers and not runexp; it prints
the ids of single sentences and of pairs (with [CLS]/[SEP] and token type ids) as JSON. One
process reads every vocab's directory (starting transformers once, not once a vocab).
runexp's ids are its own tokenizer's (tasks/vocabulary/tokenizer.py, what preprocessing uses). Text:
held-out lines (modules the vocabs were not trained on) of the stdlib docstring corpus and of
the Chinese corpus (tests/support/chinese_corpus.py), a few hundred each, and hand-written hard
cases.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from tests.support.chinese_corpus import chinese_sentences
from tests.support.spm_models import corpus_lines, train_albert_style

from runexp.runtime.export.huggingface_tokenizer import write_tokenizer_files
from runexp.tasks.vocabulary import vocab_dir
from runexp.tasks.vocabulary.tokenizer import load_tokenizer

HARD_LINES = [
    "Héllo, naïve café — Ångström's résumé at the Zürich Straße.",
    "Control\x00chars\x07 and\ttabs\r\nand\x1b escapes \ufffd replaced.",
    "Non-breaking\u00a0space, ideographic\u3000space, line\u2028separator, zero\u200bwidth.",
    "Form\x0cfeed, soft\u00adhyphen, private\ue000use, tag\U000E0041char.",
    "Greek ΟΔΟΣ. ΑΣ.Β, ligature ﬁnance, full-width Ｆｕｌｌ, Turkish İstanbul.",
    "A literal <s> and </s> and [unused0] in the text.",
    "y" * 150 + " is a word of 150 characters, " + "z" * 201 + " one of 201.",
    "   leading and trailing   whitespace   ",
    "",
    "€5 – £3 (x) \"quoted\" a-b. 中文字符 mixed with 日本語 and 한국어.",
]

# The consumer: transformers only (runexp must not be importable here, nor needed). Its
# argument: a JSON file {name: [tokenizer directory, lines]}; it prints {name: results}.
CONSUMER = r"""
import json, sys
from transformers import AutoTokenizer
out = {}
for name, (hf_dir, lines) in json.load(open(sys.argv[1], encoding="utf-8")).items():
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    single = tokenizer(lines)
    pairs = tokenizer(lines[:-1], lines[1:])
    out[name] = {
        "single": single["input_ids"], "single_types": single["token_type_ids"],
        "pairs": pairs["input_ids"], "pair_types": pairs["token_type_ids"],
        "special": [tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id,
                    tokenizer.sep_token_id, tokenizer.mask_token_id],
        "model_max_length": tokenizer.model_max_length,
        # A literal [MASK] is the mask token, as users of pipeline("fill-mask") write it.
        "literal_mask": tokenizer("the [MASK] of it")["input_ids"],
        "runexp_imported": any(m.startswith("runexp") for m in sys.modules)}
print(json.dumps(out))
"""
NAMES = ["wordpiece_uncased", "wordpiece_cased", "wordpiece_chinese", "sentencepiece_unigram",
         "sentencepiece_bpe_cased", "sentencepiece_albert"]


def _english(step_offset: int) -> list[str]:
    return corpus_lines(step=9, start=step_offset)


@pytest.fixture(scope="module")
def texts():
    """Train text and held-out lines: English (other stdlib modules), Chinese."""
    english_train = _english(0) + _english(3)
    english_held = [line for line in _english(5) if line.strip()][:400]
    chinese = chinese_sentences()
    random.Random(0).shuffle(chinese)
    return {"english": (english_train, english_held + HARD_LINES),
            "chinese": (chinese[400:], chinese[:400] + HARD_LINES)}


def _vocab(root, name, kind, lines, lower, **kwargs):
    out = str(root / name)
    os.makedirs(out)
    if kind == "albert":
        train_albert_style(lines, os.path.join(out, "spm.model"))
        kind = "sentencepiece"
    else:
        vocab_dir.train_vocab(kind, lines, out, vocab_size=kwargs.pop("size", 3000),
                              do_lower_case=lower, **kwargs)
    vocab_dir.write_report(out, kind, lower, lines[:50])
    return out


@pytest.fixture(scope="module")
def vocabs(texts, tmp_path_factory):
    """{name: (vocab dir, held-out lines)}."""
    root = tmp_path_factory.mktemp("vocabs")
    en, en_held = texts["english"]
    zh, zh_held = texts["chinese"]
    return {
        "wordpiece_uncased": (_vocab(root, "wp", "wordpiece", en, True), en_held),
        "wordpiece_cased": (_vocab(root, "wp_cased", "wordpiece", en, False), en_held),
        "wordpiece_chinese": (_vocab(root, "wp_zh", "wordpiece", zh, True, size=6000),
                              zh_held),
        "sentencepiece_unigram": (_vocab(root, "spm", "sentencepiece", en, True), en_held),
        "sentencepiece_bpe_cased": (_vocab(root, "bpe", "sentencepiece", en, False,
                                          model_type="bpe"), en_held),
        "sentencepiece_albert": (_vocab(root, "albert", "albert", en, True), en_held),
    }


@pytest.fixture(scope="module")
def consumed(vocabs, tmp_path_factory):
    """{name: (the files write_tokenizer_files wrote, their directory, what the consumer
    read there)}, every vocab's directory read by one consumer process."""
    root = tmp_path_factory.mktemp("hf_tokenizers")
    written, jobs = {}, {}
    for name in NAMES:
        vocab, lines = vocabs[name]
        hf_dir = str(root / name)
        written[name] = write_tokenizer_files(vocab, hf_dir, max_seq_length=96), hf_dir
        jobs[name] = [hf_dir, lines]
    (root / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", CONSUMER, str(root / "jobs.json")],
                          capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: (*written[name], got[name]) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_auto_tokenizer_gives_runexps_ids(name, vocabs, consumed):
    vocab, lines = vocabs[name]
    names, hf_dir, got = consumed[name]
    assert sorted(names) == sorted(os.listdir(hf_dir))
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(names)
    assert ("vocab.txt" in names) == name.startswith("wordpiece")

    ours = load_tokenizer(vocab)
    assert not got["runexp_imported"]
    assert got["special"] == [ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id]
    assert got["model_max_length"] == 96
    assert ours.mask_id in got["literal_mask"]

    encoded = [ours.encode(line) for line in lines]
    want = [[ours.cls_id, *ids, ours.sep_id] for ids in encoded]
    equal = sum(a == b for a, b in zip(want, got["single"]))
    want_pairs = [[ours.cls_id, *a, ours.sep_id, *b, ours.sep_id]
                  for a, b in zip(encoded[:-1], encoded[1:])]
    equal_pairs = sum(a == b for a, b in zip(want_pairs, got["pairs"]))
    print(f"{name}: {equal}/{len(lines)} lines, {equal_pairs}/{len(want_pairs)} pairs equal")
    differ = [(line, [ours.id_to_token(i) for i in ids])
              for line, ids, w in zip(lines, got["single"], want) if ids != w]
    assert not differ, differ[:3]
    assert equal_pairs == len(want_pairs)
    assert got["single_types"] == [[0] * len(w) for w in want]
    assert got["pair_types"] == [[0] * (len(a) + 2) + [1] * (len(b) + 1)
                                 for a, b in zip(encoded[:-1], encoded[1:])]


def test_albert_roles_are_the_special_tokens(vocabs, tmp_path):
    """ALBERT's <pad> and <unk> are the pad and unknown tokens of the config."""
    hf_dir = str(tmp_path / "hf")
    write_tokenizer_files(vocabs["sentencepiece_albert"][0], hf_dir, max_seq_length=64)
    with open(os.path.join(hf_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert (config["pad_token"], config["unk_token"], config["cls_token"], config["sep_token"],
            config["mask_token"]) == ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")
    assert config["do_lower_case"] is True
    with open(os.path.join(hf_dir, "tokenizer_notes.md"), encoding="utf-8") as f:
        assert "break such ties differently" in f.read()


def test_vocab_txt_is_read_alike_by_google_research_bert(vocabs, tmp_path):
    """The vocab.txt written beside tokenizer.json is the one runexp trained with."""
    bert_tokenization = pytest.importorskip("bert.tokenization")
    vocab, lines = vocabs["wordpiece_cased"]
    hf_dir = str(tmp_path / "hf")
    write_tokenizer_files(vocab, hf_dir, max_seq_length=64)
    bert_tokenization.FLAGS.mark_as_parsed()
    theirs = bert_tokenization.FullTokenizer(os.path.join(hf_dir, "vocab.txt"),
                                             do_lower_case=False)
    ours = load_tokenizer(vocab)
    assert all(theirs.convert_tokens_to_ids(theirs.tokenize(line)) == ours.encode(line)
               for line in lines)
