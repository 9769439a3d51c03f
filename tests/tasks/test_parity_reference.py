"""Parity with the reference peer, google-research/bert as published in bert-tensorflow 1.0.4.

(a) Tokenisation: our WordPiece gives the same pieces and ids as ``bert.tokenization.
    FullTokenizer`` on every line of a real corpus (the stdlib corpus slice, ~300 KB) and on
    hand-written hard cases, lower-cased and cased.
(b) Pretraining data: ``python -m bert.create_pretraining_data`` and our preprocess stage run
    on the same corpus, vocab and flags; both outputs are parsed with the reference feature
    spec and their statistics compared.

Tolerances in (b) are sampling error, measured rather than assumed. Instances are not
independent: the target length (short with ``short_seq_prob``) is drawn once per document and
pass, and a long document given a short target yields hundreds of short instances. On the
slice's 45 whole modules the mean tokens per instance moves by ~5 tokens (4%) from one seed to
the next, ten times an i.i.d. standard error; so the corpus here is the same text cut into
documents of at most 8 consecutive sentences (~500 documents), where it moves by ~0.7.
Our side is run with ``SEEDS`` = 10 seeds (the stage's own TFRecords for seed 12345, the same
shard code in-process for nine more), and each of the peer's statistics must fall inside the
99.9% prediction interval of ours: ``|peer - mean| <= t * sd * sqrt(1 + 1/10)``
with t = 4.78 (Student, 9 degrees of freedom), where sd is the spread over our seeds but never
less than the i.i.d. standard error of that statistic (ten seeds estimate a spread only to
about +-25%, and clustering can only add variance). Everything is seeded, so the test is
deterministic; a chance failure of one statistic would have probability 0.001 for a random
choice of seeds. That makes the bands about: instances +-4%, tokens per instance +-3.6
(of ~97), segment A +-1.9, 80/10/10 shares +-0.007/0.005/0.005, random-next share +-0.03,
short and full shares +-0.05/0.035, masked fraction +-0.0002. Absolute checks of the nominal
rates follow.

The one systematic effect the issue names is checked on both sides: a one-sentence chunk
always takes a random next segment, so the random-next share is above 0.5 in the peer too
(0.60 on this corpus of short documents, where every document's last sentence is often a
chunk of its own).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

try:
    from bert import tokenization as bert_tokenization
except ImportError:  # pragma: no cover - depends on the environment
    bert_tokenization = None

pytestmark = pytest.mark.skipif(
    bert_tokenization is None,
    reason="the reference peer is not importable: pip install bert-tensorflow==1.0.4 "
           "(google-research/bert's published package)")

from runexp.compiler.plan import Plan, Stage  # noqa: E402
from runexp.runtime.context import StageContext  # noqa: E402
from runexp.runtime.stages import preprocess  # noqa: E402
from runexp.tasks.vocabulary import vocab_dir  # noqa: E402
from runexp.tasks.sources.text_documents import iter_documents, sample_lines  # noqa: E402
from runexp.tasks.vocabulary.wordpiece import WordPieceTokenizer, load_vocab  # noqa: E402

MAX_LEN, MAX_PRED, DUPE = 128, 20, 5
SEEDS = 10
DOC_SENTENCES = 8
T_LIMIT = 4.78  # Student t, 9 degrees of freedom, two-sided p = 0.001

HARD_LINES = [
    "Héllo, naïve café — Ångström's résumé at the Zürich Straße.",
    "中文字符 mixed with 日本語のテキスト and 한국어 text.",
    "Control\x00chars\x07 and\ttabs\r\nand\x1b escapes \ufffd replaced.",
    "Non-breaking\u00a0space, ideographic\u3000space, line\u2028separator, zero\u200bwidth.",
    "¿Qué pasa? «quoted» “smart quotes” ‘single’ (parens) [brackets] {braces} <angle>.",
    "Symbols: $5.00, 100%, a^b, `code`, ~home, a|b, x_y, #tag, @user, \\path, 3.14159.",
    "Greek αβγ Δ, Cyrillic Привет мир, Turkish İstanbul ı, ligature ﬁnance, full-width Ｆｕｌｌ.",
    "Emoji 🙂 and math ∑ ∞ ≤ ≥ ± × ÷ and arrows → ← ↔.",
    "x" * 250 + " after a word of 250 characters, " + "y" * 200 + " is exactly 200.",
    "Combining: e\u0301 o\u0308 A\u030a, precomposed: é ö Å; Vietnamese: Tiếng Việt.",
    "   leading and trailing whitespace   ",
    "",
    "UPPER lower MiXeD CamelCase snake_case kebab-case dotted.name.path e.g. i.e. etc.",
    "don't won't it's they're O'Neil rock'n'roll -- em—dash en–dash ellipsis…",
]


def corpus_lines(small_corpus):
    lines = []
    for name in ("train.txt", "heldout.txt"):
        for doc in iter_documents([os.path.join(small_corpus, name)]):
            lines.extend(doc)
    return lines


@pytest.fixture(scope="module")
def cased_vocab(small_corpus, tmp_path_factory):
    """A cased 3000-token vocab.txt, trained as the vocab stage trains one."""
    out = str(tmp_path_factory.mktemp("cased"))
    lines = sample_lines([os.path.join(small_corpus, "train.txt")], 50_000, seed=0)
    vocab_dir.train_vocab("wordpiece", lines, out, vocab_size=3000, do_lower_case=False)
    return os.path.join(out, "vocab.txt")


@pytest.mark.parametrize("cased", [False, True])
def test_tokenisation_identical_to_full_tokenizer(small_corpus, wordpiece_dir, cased_vocab,
                                                  cased):
    vocab_file = cased_vocab if cased else os.path.join(wordpiece_dir, "vocab.txt")
    lower = not cased
    # The module reads an absl flag (--preserve_unused_tokens, default False) that its
    # scripts parse in main(); outside them, take the defaults as parsed.
    bert_tokenization.FLAGS.mark_as_parsed()
    theirs = bert_tokenization.FullTokenizer(vocab_file=vocab_file, do_lower_case=lower)
    ours = WordPieceTokenizer(load_vocab(vocab_file), do_lower_case=lower)
    vocab = load_vocab(vocab_file)
    lines = corpus_lines(small_corpus) + HARD_LINES
    assert len(lines) > 2000
    mismatches = []
    pieces = unks = 0
    for line in lines:
        want = theirs.tokenize(line)
        got = ours.tokenize(line)
        if got != want or ours.encode(line) != theirs.convert_tokens_to_ids(want):
            mismatches.append((line, got, want))
        pieces += len(want)
        unks += want.count("[UNK]")
        assert [vocab[t] for t in got] == ours.encode(line)
    assert not mismatches, mismatches[:3]
    assert pieces > 50_000 and unks > 0  # real text, and the [UNK] path was exercised
    # The preprocess hot path (many lines per call, caches cold then warm) gives the same ids.
    want = [theirs.convert_tokens_to_ids(theirs.tokenize(line)) for line in lines]
    for fresh in (WordPieceTokenizer(load_vocab(vocab_file), do_lower_case=lower), ours):
        for start in range(0, len(lines), 1000):
            ids, counts = fresh.encode_lines(lines[start:start + 1000])
            chunk = want[start:start + 1000]
            assert counts.tolist() == [len(x) for x in chunk]
            assert ids.tolist() == [i for x in chunk for i in x]


# --- (b) pretraining data statistics -------------------------------------------------------

def parse_records(files):
    import tensorflow as tf
    spec = {
        "input_ids": tf.io.FixedLenFeature([MAX_LEN], tf.int64),
        "input_mask": tf.io.FixedLenFeature([MAX_LEN], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([MAX_LEN], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([MAX_PRED], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([MAX_PRED], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([MAX_PRED], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    ds = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec))
    batches = list(ds.batch(4096).as_numpy_iterator())
    return {k: np.concatenate([b[k] for b in batches]) for k in spec}


def statistics(r, mask_id):
    """The compared statistics of one output (dict of feature arrays): name -> (value, its
    standard error were the items independent; 0 where not a plain mean)."""
    length = r["input_mask"].sum(axis=1)
    weights = r["masked_lm_weights"] > 0
    now = np.take_along_axis(r["input_ids"], r["masked_lm_positions"], axis=1)[weights]
    label = r["masked_lm_ids"][weights]

    def mean(x):
        x = np.asarray(x, dtype=float)
        return x.mean(), x.std() / np.sqrt(len(x))

    return {
        "instances": (float(len(length)), 0.0),
        "tokens per instance": mean(length),
        "tokens in segment A": mean((r["input_mask"] - r["segment_ids"]).sum(axis=1) - 2),
        "masked fraction": (weights.sum() / length.sum(), 0.0),
        "[MASK] share": mean(now == mask_id),
        "kept share": mean(now == label),
        "random-replacement share": mean((now != mask_id) & (now != label)),
        "random-next share": mean(r["next_sentence_labels"][:, 0]),
        "short (< 64 tokens) share": mean(length < MAX_LEN // 2),
        "full (128 tokens) share": mean(length == MAX_LEN),
    }


@pytest.fixture(scope="module")
def parity_corpus(small_corpus, tmp_path_factory):
    """The ~300 KB stdlib text with each module cut into documents of at most
    ``DOC_SENTENCES`` consecutive sentences: real text in its real order, but ~10x more
    documents, so the per-document draws (short targets) average out and the checks on
    lengths are tight."""
    path = tmp_path_factory.mktemp("parity_corpus") / "train.txt"
    docs = []
    for doc in iter_documents([os.path.join(small_corpus, "train.txt")]):
        for i in range(0, len(doc), DOC_SENTENCES):
            docs.append("".join(line + "\n" for line in doc[i:i + DOC_SENTENCES]))
    path.write_text("\n".join(docs), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def both_outputs(parity_corpus, wordpiece_dir, tmp_path_factory):
    """(the peer's records, our stage's records, our statistics over more seeds)."""
    from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, ShardStats,
                                                 iter_shard_batches)
    from runexp.tasks.vocabulary.tokenizer import load_tokenizer
    out = tmp_path_factory.mktemp("parity")
    corpus = parity_corpus
    peer_file = str(out / "peer.tfrecord")
    flags = [f"--input_file={corpus}", f"--output_file={peer_file}",
             f"--vocab_file={os.path.join(wordpiece_dir, 'vocab.txt')}", "--do_lower_case=True",
             f"--max_seq_length={MAX_LEN}", f"--max_predictions_per_seq={MAX_PRED}",
             "--masked_lm_prob=0.15", f"--dupe_factor={DUPE}", "--short_seq_prob=0.1",
             "--random_seed=12345"]
    proc = subprocess.run([sys.executable, "-m", "bert.create_pretraining_data", *flags],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    ours_dir = out / "ours"
    ours_dir.mkdir()
    params = dict(
        task="parity", max_seq_length=MAX_LEN, max_predictions_per_seq=MAX_PRED,
        masked_lm_prob=0.15, dupe_factor=DUPE, short_seq_prob=0.1, random_next_prob=0.5,
        mask_token_prob=0.8, random_token_prob=0.1, whole_word_masking=False,
        pair_objective="nsp", random_seed=12345, do_lower_case=True, num_shards=1,
        num_workers=1)
    stage = Stage(id="preprocess.parity", kind="preprocess", output_dir=str(ours_dir),
                  params=params, inputs=dict(train_files=[corpus], validation_files=[],
                                             vocab_dir=wordpiece_dir))
    preprocess.run(StageContext(stage, Plan("t", str(out), (stage,)), str(ours_dir),
                                progress=lambda m: None))
    ours = parse_records(sorted(str(p) for p in ours_dir.rglob("train.tfrecord-*")))
    peer = parse_records([peer_file])
    mask_id = load_tokenizer(wordpiece_dir).mask_id
    seeds = [statistics(ours, mask_id)]
    for seed in range(1, SEEDS):
        config = PretrainingConfig.from_params({**params, "random_seed": seed})
        batches = list(iter_shard_batches([corpus], wordpiece_dir, config, "train", 0, 1,
                                          ShardStats()))
        seeds.append(statistics({k: np.concatenate([b[k] for b in batches])
                                 for k in batches[0]}, mask_id))
    return peer, ours, seeds, mask_id


def test_pretraining_statistics_match_the_peer(both_outputs):
    peer, ours, seeds, mask_id = both_outputs
    theirs = statistics(peer, mask_id)
    assert theirs["instances"][0] > 3000
    report, failed = [], []
    for name, (value, _) in theirs.items():
        runs = np.array([s[name][0] for s in seeds])
        mean, sd = runs.mean(), runs.std(ddof=1)
        # Ten seeds estimate a spread only to +-25%; clustering can only widen the i.i.d.
        # standard error, so that is the floor.
        scale = max(sd, np.mean([s[name][1] for s in seeds]))
        t = abs(value - mean) / (scale * np.sqrt(1 + 1 / len(runs)))
        report.append(f"{name:28s} peer {value:10.4f}  ours {mean:10.4f} ± {scale:.4f}  "
                      f"t {t:.2f}")
        if t > T_LIMIT:
            failed.append(name)
    print("\n" + "\n".join(report))
    assert not failed, "\n".join(report)
    # Absolute sanity on top: the reference's nominal rates, with the systematic effect of
    # one-sentence chunks (always a random next segment) present on both sides.
    for side in (theirs, seeds[0]):
        stat = {k: v[0] for k, v in side.items()}
        assert abs(stat["masked fraction"] - 0.15) < 0.01
        assert abs(stat["[MASK] share"] - 0.8) < 0.01
        assert abs(stat["kept share"] - 0.1) < 0.01
        assert stat["random-next share"] > 0.5 + 3 * np.sqrt(0.25 / stat["instances"])


def test_same_layout_invariants_as_the_peer(both_outputs):
    """What the reference guarantees for every record holds for ours too."""
    for r in both_outputs[:2]:
        n = r["input_mask"].sum(axis=1)
        m = (r["masked_lm_weights"] > 0).sum(axis=1)
        assert (m == np.minimum(MAX_PRED, np.maximum(1, np.round(n * 0.15)))).all()
        pos = np.arange(MAX_LEN)[None, :]
        assert ((r["input_mask"] == 1) == (pos < n[:, None])).all()
        assert (r["segment_ids"][pos >= n[:, None]] == 0).all()
        assert (r["input_ids"][pos >= n[:, None]] == 0).all()
        assert (r["masked_lm_positions"][r["masked_lm_weights"] == 0] == 0).all()
        assert n.max() == MAX_LEN and n.min() >= 5
