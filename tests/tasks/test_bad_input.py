"""Bad input is counted and reported with file:line samples: never a crash, never silent."""

import os

from runexp.tasks.instances.pretraining_shards import PretrainingConfig, ShardStats, build_shard
from runexp.tasks.sources.text_documents import iter_documents, iter_located_documents
from runexp.tasks.sources.text_files import MAX_SAMPLES, InputIssues


def write_bad_files(tmp_path, giant_chars=1_100_000):
    good = tmp_path / "a_good.txt"
    good.write_text("The first sentence is here.\nThe second one follows it.\n\n"
                    "Another document starts.\nIt has two lines.\n")
    bad = tmp_path / "b_bad.txt"
    bad.write_bytes(b"".join([
        b"Valid line one.\n",                                  # 1
        b"Broken \xff\xfe bytes in the middle.\n",             # 2: non-UTF-8
        b"x" * giant_chars + b"\n",                            # 3: giant line
        b"After the giant line.\n",                            # 4
        b"\n",                                                 # 5
        b"\x00\x01\x02\n",                                     # 6: a document of no tokens
        b"\n",                                                 # 7
        b"Last \xc3 document \xe2\x82 with truncated sequences.\n",  # 8: non-UTF-8
        b"y" * giant_chars,                                    # 9: giant, no newline at EOF
    ]))
    (tmp_path / "c_empty.txt").write_bytes(b"")
    (tmp_path / "d_blank.txt").write_bytes(b"\n \n\t\n")
    return [str(good), str(bad), str(tmp_path / "c_empty.txt"), str(tmp_path / "d_blank.txt")]


def test_reader_counts_and_locates_bad_input(tmp_path):
    files = write_bad_files(tmp_path)
    issues = InputIssues()
    docs = list(iter_located_documents(files, issues))
    bad = files[1]
    assert [(os.path.basename(p), line) for p, line, _ in docs] == [
        ("a_good.txt", 1), ("a_good.txt", 4), ("b_bad.txt", 1), ("b_bad.txt", 6),
        ("b_bad.txt", 8)]
    assert docs[2][2] == ["Valid line one.", "Broken \ufffd\ufffd bytes in the middle.",
                          "After the giant line."]
    assert issues.counts == {"non_utf8_lines": 2, "giant_lines": 2, "empty_files": 2,
                             "empty_documents": 0}
    assert issues.samples["non_utf8_lines"] == [(bad, 2), (bad, 8)]
    assert issues.samples["giant_lines"] == [(bad, 3), (bad, 9)]
    assert issues.samples["empty_files"] == [(files[2], 0), (files[3], 0)]
    summary = issues.summary()
    assert summary["giant_lines"] == {"count": 2, "samples": [f"{bad}:3", f"{bad}:9"]}
    assert any("2 non utf8 lines" in line and f"{bad}:2" in line for line in issues.describe())
    # The plain iterator sees the same documents.
    assert list(iter_documents(files)) == [d for _, _, d in docs]


def test_samples_are_capped_and_merge_in_file_order(tmp_path):
    a, b = InputIssues(), InputIssues()
    for i in range(8):
        a.note("giant_lines", "z.txt", i)
        b.note("giant_lines", "a.txt", 100 + i)
    assert len(a.samples["giant_lines"]) == MAX_SAMPLES
    a.add(b)
    assert a.counts["giant_lines"] == 16
    assert a.samples["giant_lines"] == [("a.txt", 100 + i) for i in range(5)]


def test_shards_count_each_issue_once_and_empty_documents(tmp_path, wordpiece_dir):
    files = write_bad_files(tmp_path)
    config = PretrainingConfig.of(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
    total = ShardStats()
    for shard in range(3):
        _, stats = build_shard(files, wordpiece_dir, config, "train", shard, 3)
        total.add(stats)
    counts = total.issues.counts
    assert counts == {"non_utf8_lines": 2, "giant_lines": 2, "empty_files": 2,
                      "empty_documents": 1}
    assert total.issues.samples["empty_documents"] == [(files[1], 6)]
    assert total.documents == 4  # five documents, one of them without a token
