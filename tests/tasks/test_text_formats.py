"""Text formats beyond sentence-per-line: ``paragraphs`` (running text, hard-wrapped or not)
and ``jsonl`` (a JSON object a document) give the sentences, documents and instances of the
equivalent sentence_lines corpus, however the preprocess stage cuts the files into ranges;
bad JSON lines are counted with their file:line; the vocab learns text, not JSON."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from runexp.compiler.plan import Plan, Stage
from runexp.runtime.context import StageContext
from runexp.runtime.stages import vocab as runtime_vocab
from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, ShardStats, cached_tokenizer,
                                             plan_shard_jobs, run_shard_jobs)
from runexp.tasks.sources.sentence_split import (MAX_RUN_CHARS, ends_before, split_line,
                                         split_paragraph, split_text)
from runexp.tasks.instances.split_index import RangeJob, build_split_index, plan_ranges, tokenize_range
from runexp.tasks.sources.text_documents import iter_documents, iter_located_documents, sample_lines
from runexp.tasks.sources.text_files import InputIssues
from runexp.tasks.sources.text_formats import input_issues


# --- the splitter ----------------------------------------------------------------------------

def test_english_sentences_keep_abbreviations_decimals_and_initials_together():
    text = ("Dr. Smith paid 3.14 dollars, e.g. for tea in the U.S. market. Then he left! "
            "Did J. R. R. Tolkien write it? Yes. See Fig. 3 and No. 5 of vol. 2. "
            "He said no. Visit example.com. It is 5 p.m. today.")
    assert split_line(text) == [
        "Dr. Smith paid 3.14 dollars, e.g. for tea in the U.S. market.", "Then he left!",
        "Did J. R. R. Tolkien write it?", "Yes.", "See Fig. 3 and No. 5 of vol. 2.",
        "He said no.", "Visit example.com.", "It is 5 p.m. today."]
    # Quotes and brackets closing a sentence stay with it; a lower-case word goes on.
    assert split_line('He said "Stop." Then (all of them.) Left. and more') == [
        'He said "Stop."', "Then (all of them.)", "Left. and more"]


def test_cjk_arabic_and_devanagari_sentences():
    assert split_line("我爱北京。天安门很大！你呢？") == ["我爱北京。", "天安门很大！", "你呢？"]
    assert split_line("他说：「你好！」然后走了。好吧") == ["他说：「你好！」", "然后走了。", "好吧"]
    assert split_line("Hello!你好") == ["Hello!", "你好"]
    assert split_line("هل أنت بخير؟ نعم.") == ["هل أنت بخير؟", "نعم."]
    assert split_line("یہ کتاب ہے۔ وہ قلم ہے۔") == ["یہ کتاب ہے۔", "وہ قلم ہے۔"]
    assert split_line("मैं घर जा रहा हूँ। तुम कहाँ हो?") == ["मैं घर जा रहा हूँ।", "तुम कहाँ हो?"]


def test_hard_wrapped_paragraphs_are_joined_then_split():
    assert split_paragraph(["It was a hard-wrapped", "paragraph. Dr.", "Who wrote it", "",
                            "on two lines? Yes."]) == [
        "It was a hard-wrapped paragraph.", "Dr. Who wrote it on two lines?", "Yes."]
    # CJK lines join without a space; Latin ones with one.
    assert split_paragraph(["北京是中国", "的首都。上海", "很大。", "Python", "是语言。"]) == [
        "北京是中国的首都。", "上海很大。", "Python 是语言。"]
    # jsonl text: every line break ends a paragraph.
    assert split_text("Title\nFirst one. Second\nthird.\n\n") == [
        "Title", "First one.", "Second", "third."]


def test_wrapping_anywhere_gives_the_sentences_of_the_unwrapped_text():
    """A cut is decided by the characters around it: so any wrap of a paragraph, and any
    line a reader starts at after a sentence end, gives the same sentences."""
    text = ("The U.S. Army, e.g. in 1945, moved 3.5 tons. It did! Was it? Yes: Dr. No "
            "said so, cf. p. 4. Mr. and Mrs. Smith left at 5 p.m. on Jan. 3. Then what… "
            "Nothing. She wrote \"Go.\" He went (quickly.) The end.")
    want = split_line(text)
    words = text.split(" ")
    rng = random.Random(0)
    for _ in range(300):
        lines, line = [], []
        for w in words:
            line.append(w)
            if rng.random() < 0.3:
                lines.append(" ".join(line))
                line = []
        lines.append(" ".join(line))
        lines = [l for l in lines if l]
        assert split_paragraph(lines) == want
        # ends_before says whether a sentence ends between two lines.
        for a, b in zip(lines, lines[1:]):
            assert ends_before(a, b) == (split_line(f"{a} {b}") == split_line(a) + split_line(b))


def test_a_run_without_sentence_ends_is_cut_at_a_line_end():
    lines = [f"item number {i} of a long list without any full stop" for i in range(200)]
    sentences = split_paragraph(lines)
    assert " ".join(sentences) == " ".join(lines)
    assert all(len(s) < MAX_RUN_CHARS + 60 for s in sentences) and len(sentences) > 3
    assert all(len(s) >= MAX_RUN_CHARS for s in sentences[:-1])


# --- corpora in three formats, the same documents ------------------------------------------

CHINESE = ["我爱北京。", "天安门很大！", "你呢？", "北京是中国的首都，也是一座很古老的城市。",
           "上海在东边。"]
HAND_MADE = [
    ["Dr. Smith paid 3.14 dollars, e.g. for tea in the U.S. market.", "Then he left!",
     "Did J. R. R. Tolkien write it?", "Yes."],
    ["هل أنت بخير؟", "نعم."],
    ["मैं घर जा रहा हूँ।", "तुम कहाँ हो?"],
]


def long_run_document():
    """A list with no full stop, longer than MAX_RUN_CHARS, then a sentence: the run is
    cut at the end of the line where it reaches MAX_RUN_CHARS."""
    lines = [f"entry {i} of the inventory with several more words in it" for i in range(90)]
    sentences, carry = [], ""
    for line in lines:
        carry = f"{carry} {line}" if carry else line
        if len(carry) >= MAX_RUN_CHARS:
            sentences.append(carry)
            carry = ""
    return lines + ["Done with it. The end."], sentences + [carry + " Done with it.",
                                                           "The end."]


def clean_documents(small_corpus):
    """Documents of up to 8 of the small corpus's sentences whose ends are plain (a sentence
    the splitter keeps whole, ending where the next one starts), plus hand-made ones."""
    docs = []
    for doc in iter_documents([os.path.join(small_corpus, "train.txt")]):
        kept = []
        for s in doc:
            s = " ".join(s.split())
            if s[0].isupper() and split_line(s) == [s] and ends_before(s, "X"):
                kept.append(s)
        docs.extend(kept[i:i + 8] for i in range(0, len(kept), 8))
    rng = random.Random(1)
    for i in range(0, len(docs), 40):
        docs.insert(i, rng.sample(CHINESE, 4))
    docs[5:5] = HAND_MADE
    return docs


def wrap(doc, rng):
    """A document's text hard-wrapped at a random width (CJK: cut between characters)."""
    if all(s in CHINESE for s in doc):
        text, lines = "".join(doc), []
        while text:
            n = rng.randint(3, 12)
            lines.append(text[:n])
            text = text[n:]
        return lines
    width, lines, line = rng.randint(20, 90), [], ""
    for word in " ".join(doc).split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line]


@pytest.fixture(scope="module")
def corpora(small_corpus, tmp_path_factory):
    """The same documents as sentence_lines, paragraphs (hard-wrapped, with a list longer
    than MAX_RUN_CHARS) and jsonl (text in "body", with bad lines), in three files each."""
    out = tmp_path_factory.mktemp("formats")
    docs = clean_documents(small_corpus)
    run_lines, run_sentences = long_run_document()
    rng = random.Random(2)
    parts = [docs[:len(docs) // 5], docs[len(docs) // 5:len(docs) // 2], docs[len(docs) // 2:]]
    files = {"sentence_lines": [], "paragraphs": [], "jsonl": []}
    bad_lines = {}
    for k, part in enumerate(parts):
        base = out / f"part{k}"
        paragraphs = ["\n".join(wrap(d, rng)) for d in part]
        lines = ["\n".join(d) for d in part]
        if k == 1:  # the long list, in the middle of a file
            paragraphs.insert(len(part) // 2, "\n".join(run_lines))
            lines.insert(len(part) // 2, "\n".join(run_sentences))
        base.with_suffix(".txt").write_text("\n\n".join(lines) + "\n", encoding="utf-8")
        # Several blank lines between some documents; no newline at the very end.
        base.with_suffix(".para").write_text(
            "".join(p + ("\n\n\n" if i % 7 == 3 else "\n\n") for i, p in enumerate(paragraphs))
            .rstrip("\n"), encoding="utf-8")
        jsonl = []
        for i, d in enumerate(part):
            # A line break between sentences is a paragraph break: the same sentences.
            sep = "\n" if i % 3 == 0 else " "
            body = ("" if all(s in CHINESE for s in d) else sep).join(d)
            jsonl.append(json.dumps({"text": "NOT THIS", "body": body}, ensure_ascii=i % 2 == 0))
        if k == 1:
            jsonl.insert(len(part) // 2,
                         json.dumps({"body": "\n".join(run_sentences)}))
        if k == 2:
            bad = ["this is not json", "[1, 2, 3]", '{"text": "no body"}', '{"body": 5}',
                   '{"body": "  \\n "}', ""]
            for j, line in enumerate(bad):
                jsonl.insert(10 + 7 * j, line)
            bad_lines = {line: 11 + 7 * j for j, line in enumerate(bad)}
        base.with_suffix(".jsonl").write_text("\n".join(jsonl) + "\n", encoding="utf-8")
        for fmt, ext in (("sentence_lines", ".txt"), ("paragraphs", ".para"), ("jsonl", ".jsonl")):
            files[fmt].append(str(base.with_suffix(ext)))
    files["bad_lines"] = {line: (files["jsonl"][2], n) for line, n in bad_lines.items()}
    return files


def source(fmt):
    return dict(text_format=fmt, text_field="body") if fmt == "jsonl" else dict(text_format=fmt)


def test_the_readers_give_the_documents_of_the_sentence_lines_corpus(corpora):
    want = list(iter_documents(corpora["sentence_lines"]))
    assert len(want) > 300 and sum(map(len, want)) > 2000
    for fmt in ("paragraphs", "jsonl"):
        assert list(iter_documents(corpora[fmt], **source(fmt))) == want, fmt
    # The vocab's sample: the same sentences, so the same sample.
    assert sample_lines(corpora["jsonl"], 500, 7, "jsonl", "body") == \
        sample_lines(corpora["sentence_lines"], 500, 7)


def test_jsonl_bad_lines_are_counted_with_file_and_line(corpora):
    issues = input_issues("jsonl")
    docs = list(iter_located_documents(corpora["jsonl"], issues, text_format="jsonl",
                                       text_field="body"))
    assert len(docs) == len(list(iter_documents(corpora["sentence_lines"])))
    bad = corpora["bad_lines"]
    assert issues.counts == {"non_utf8_lines": 0, "giant_lines": 0, "empty_files": 0,
                             "empty_documents": 0, "invalid_json_lines": 2,
                             "missing_text_lines": 2, "empty_text_lines": 1}
    assert issues.samples["invalid_json_lines"] == [bad["this is not json"], bad["[1, 2, 3]"]]
    assert issues.samples["missing_text_lines"] == [bad['{"text": "no body"}'],
                                                    bad['{"body": 5}']]
    assert issues.samples["empty_text_lines"] == [bad['{"body": "  \\n "}']]
    # Every document's first line is its JSON line.
    path, line, doc = docs[-1]
    with open(path, encoding="utf-8") as f:
        assert json.loads(f.read().splitlines()[line - 1])["body"].startswith(doc[0])
    # The warnings say what each kind means and what to do.
    described = "\n".join(issues.describe())
    assert f"2 invalid json lines (e.g. {bad['this is not json'][0]}:" in described
    assert "set text_field" in described and "one object" in described


def test_text_field_takes_a_key_or_a_dotted_path(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"meta": {"body": "One. Two."}, "text": "no"}\n'
                    '{"meta.body": "Three.", "meta": {"body": "not this"}}\n'
                    '{"meta": "flat"}\n', encoding="utf-8")
    issues = InputIssues()
    docs = list(iter_located_documents([str(path)], issues, text_format="jsonl",
                                       text_field="meta.body"))
    assert [(line, doc) for _, line, doc in docs] == [(1, ["One.", "Two."]), (2, ["Three."])]
    assert issues.counts["missing_text_lines"] == 1
    assert issues.samples["missing_text_lines"] == [(str(path), 3)]
    assert list(iter_documents([str(path)], "jsonl")) == [["no"]]


def test_bad_bytes_are_repaired_and_giant_lines_end_a_sentence(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_bytes(b'\xef\xbb\xbf{"text": "First."}\n{"text": "Bad \\ud800 escape."}\n'
                      b'{"text": "Raw \xff byte."}\n')
    issues = input_issues("jsonl")
    docs = list(iter_located_documents([str(jsonl)], issues, text_format="jsonl"))
    assert [d for _, _, d in docs] == [["First."], ["Bad \ufffd escape."], ["Raw \ufffd byte."]]
    assert issues.samples["non_utf8_lines"] == [(str(jsonl), 2), (str(jsonl), 3)]
    assert issues.total() == 2
    para = tmp_path / "docs.txt"
    para.write_bytes(b"One sentence goes\n" + b"x" * ((1 << 20) + 1) +
                     b"\non here. Next \xff one\nends.\n\n\n")
    issues = InputIssues()
    docs = list(iter_located_documents([str(para)], issues, text_format="paragraphs"))
    assert docs == [(str(para), 1, ["One sentence goes", "on here.", "Next \ufffd one ends."])]
    assert issues.samples["giant_lines"] == [(str(para), 2)]
    assert issues.samples["non_utf8_lines"] == [(str(para), 3)]


def index_of(files, vocab_dir, num_ranges, out_dir, fmt):
    """The split index of ``files`` read in ``num_ranges`` byte ranges."""
    os.makedirs(out_dir)
    sizes = [os.path.getsize(p) for p in files]
    kw = source(fmt)
    jobs = [RangeJob(tuple(files), vocab_dir, out_dir, k, segments, kw["text_format"],
                     kw.get("text_field", "text"))
            for k, segments in enumerate(plan_ranges(sizes, num_ranges))]
    results = [tokenize_range(j) for j in jobs]
    meta = build_split_index(jobs, results, cached_tokenizer(vocab_dir).vocab_size)
    arrays = [np.load(os.path.join(out_dir, "documents.npy")),
              np.fromfile(os.path.join(out_dir, "tokens.bin"), np.dtype(meta["dtype"])),
              np.fromfile(os.path.join(out_dir, "offsets.bin"), np.int64)]
    return meta, arrays, sum(r.bytes_read for r in results)


def test_ranges_cut_anywhere_give_the_index_of_the_sentence_lines_corpus(corpora, spm_dir,
                                                                          tmp_path):
    """Ranges cut hard-wrapped sentences, the long list and JSON lines anywhere: a range
    reads on to the next sentence end and the next range starts there; documents are
    stitched across range ends. The index (documents, sentences, tokens) is the one of
    the sentence_lines corpus, at any range count."""
    _, want, _ = index_of(corpora["sentence_lines"], spm_dir, 1, str(tmp_path / "want"),
                          "sentence_lines")
    assert len(want[0]) > 300
    for fmt in ("paragraphs", "jsonl"):
        size = sum(os.path.getsize(p) for p in corpora[fmt])
        for num_ranges in (1, 2, 3, 7, 16, 64, 300):
            meta, got, read = index_of(corpora[fmt], spm_dir, num_ranges,
                                       str(tmp_path / f"{fmt}{num_ranges}"), fmt)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b, err_msg=f"{fmt} {num_ranges}")
            counts = meta["issues"]["counts"]
            if fmt == "jsonl":  # counted once, wherever the cuts are
                assert (counts["invalid_json_lines"], counts["missing_text_lines"],
                        counts["empty_text_lines"]) == (2, 2, 1), num_ranges
                assert [tuple(s) for s in meta["issues"]["samples"]["invalid_json_lines"]] \
                    == [corpora["bad_lines"]["this is not json"],
                        corpora["bad_lines"]["[1, 2, 3]"]]
            assert sum(counts.values()) == (5 if fmt == "jsonl" else 0)
            # Reading on past a range's end costs ~1 KB per cut here (the lines around a cut
            # are read by both sides; the long list,
            # ~5 KB without a sentence end, is read again by the ranges cutting it).
            assert size <= read <= size + num_ranges * 1_500 + 12_000, (fmt, num_ranges)


def run_jobs(files, vocab_dir, cfg, num_shards, work_dir):
    os.makedirs(work_dir)
    jobs = plan_shard_jobs({"train": files, "validation": files[:1]}, vocab_dir, cfg,
                           num_shards, work_dir)
    totals = {"train": ShardStats(), "validation": ShardStats()}
    for split, _, stats in run_shard_jobs(jobs, map):
        totals[split].add(stats)
    return [open(j.out_path, "rb").read() for j in jobs], totals


@pytest.mark.parametrize("num_shards", [1, 5])
def test_preprocessing_gives_the_instances_of_the_sentence_lines_corpus(corpora, wordpiece_dir,
                                                                        tmp_path, num_shards):
    """The preprocess stage's code path (plan_shard_jobs, run_shard_jobs: ranges in
    parallel-ready jobs, stitching, shards): byte-identical records."""
    def cfg(fmt):
        extra = {"text_field": "body"} if fmt == "jsonl" else {}
        return PretrainingConfig.of(max_seq_length=64, max_predictions_per_seq=10,
                                    dupe_factor=2, random_seed=5, format=fmt, **extra)

    want, want_totals = run_jobs(corpora["sentence_lines"], wordpiece_dir,
                                 cfg("sentence_lines"), num_shards, str(tmp_path / "lines"))
    assert want_totals["train"].instances > 1000
    for fmt in ("paragraphs", "jsonl"):
        got, totals = run_jobs(corpora[fmt], wordpiece_dir, cfg(fmt), num_shards,
                               str(tmp_path / fmt))
        assert got == want, fmt
        for split in ("train", "validation"):
            assert totals[split].counts() | {"input_bytes": 0} == \
                want_totals[split].counts() | {"input_bytes": 0}
        summary = totals["train"].issues.summary()
        if fmt == "jsonl":
            assert summary["missing_text_lines"]["count"] == 2
            assert summary["missing_text_lines"]["samples"][0] == \
                "{}:{}".format(*corpora["bad_lines"]['{"text": "no body"}'])
        else:
            assert "missing_text_lines" not in summary  # summaries of other formats as before


def run_vocab(tmp_path, name, inputs):
    out = tmp_path / name
    out.mkdir()
    stage = Stage(id=name, kind="vocab", output_dir=str(out),
                  params=dict(vocab_path=None, vocab_size=600, do_lower_case=True,
                              model_type="unigram", max_sentences=20_000, seed=0),
                  inputs=inputs)
    messages = []
    summary = runtime_vocab.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)),
                                             str(out), progress=messages.append))
    return (out / "vocab.txt").read_text(encoding="utf-8"), summary, messages


def test_the_vocab_is_trained_on_the_text_not_on_json(corpora, tmp_path):
    """A jsonl task's vocab is the vocab of its text: the one of the equivalent
    sentence_lines corpus, with no piece of JSON syntax; a mixture of formats reads each
    task's files in its own format."""
    lines = corpora["sentence_lines"]
    want, _, _ = run_vocab(tmp_path, "lines", {"train_files": lines[1:],
                                               "heldout_files": lines[:1]})
    got, summary, messages = run_vocab(tmp_path, "jsonl", {"sources": {"news": {
        "format": "jsonl", "text_field": "body", "train_files": corpora["jsonl"][1:],
        "heldout_files": corpora["jsonl"][:1]}}})
    # Pieces raw JSON lines would give ('{"', '":', ...): none.
    assert not [p for p in got.splitlines() if any(j in p for j in ('{"', '":', '",', '"}'))]
    assert got == want
    assert summary.diagnostics_on == "heldout" and summary.unk_rate < 0.05
    assert any("sentences of news (jsonl): 2 files" in m for m in messages)
    # A mixture: the union of its tasks' text, each in its format.
    want, _, _ = run_vocab(tmp_path, "lines_all", {"train_files": lines})
    got, summary, messages = run_vocab(tmp_path, "mixed", {"sources": {
        "a": {"format": "paragraphs", "train_files": corpora["paragraphs"][:1],
              "heldout_files": []},
        "b": {"format": "jsonl", "text_field": "body", "train_files": corpora["jsonl"][1:],
              "heldout_files": []}}})
    assert got == want
    assert summary.diagnostics_on == "train sample"
    assert any("a (paragraphs): 1 file, b (jsonl): 2 files" in m for m in messages)


def test_new_modules_are_light():
    code = ("import sys\nimport runexp.tasks.sources.sentence_split, runexp.tasks.sources.text_formats\n"
            "import runexp.compiler.stages.vocab\n"
            "heavy = [m for m in ('tensorflow', 'seqio', 'numpy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_text_format_is_one_row_and_one_reader_class():
    """The formats' table names each text format's reader; the compiler reads the table
    without importing the readers."""
    from runexp.compiler.specs.source_formats import SOURCE_FORMATS, TEXT_FORMATS
    from runexp.tasks.sources.text_formats import TextReader, reader_class

    assert TEXT_FORMATS == ("sentence_lines", "paragraphs", "jsonl")
    for name, row in SOURCE_FORMATS.items():
        assert bool(row.reader) == row.reads_text_files, name
        if row.reads_text_files:
            assert issubclass(reader_class(name), TextReader), name
        else:
            with pytest.raises(ValueError, match="not a text format"):
                reader_class(name)
    code = ("import sys\nimport runexp.compiler.specs.source_formats, runexp.compiler.planner\n"
            "assert 'runexp.tasks.sources.text_formats' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)
