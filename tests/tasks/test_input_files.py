"""Corpus files read in place on Cloud Storage (tasks/sources/input_files.py), against a GCS server
on loopback: the readers see the same lines, at any byte-range cut, as from a local copy."""

import random

import pytest

from runexp.runtime import storage
from runexp.tasks.sources import input_files
from runexp.tasks.sources.text_files import ReadCounter, iter_segment_lines
from runexp.tasks.sources.text_formats import Paragraphs


def _text(seed: int) -> bytes:
    rng = random.Random(seed)
    lines = []
    for _ in range(400):
        n = rng.choice([0, 0, 1, 5, 40, 300, 2000])  # blank lines and long ones
        lines.append(" ".join("wörd%d" % rng.randrange(50) for _ in range(n // 6 + (n > 0))))
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def corpus(gcs_prefix, tmp_path):
    data = _text(0)
    local = tmp_path / "part.txt"
    local.write_bytes(data)
    storage.upload_file(str(local), f"{gcs_prefix}/part.txt")
    [obj] = storage.glob_objects(f"{gcs_prefix}/part.txt")
    return str(local), input_files.pinned(obj["uri"], obj["generation"]), len(data)


def test_a_version_reads_the_same_lines_as_a_local_copy_at_any_cut(corpus, monkeypatch):
    local, remote, size = corpus
    # Small requests, so that reads ahead, reads past a range's end and seeks all happen.
    monkeypatch.setattr(input_files, "READ_AHEAD", 777)
    assert input_files.size(remote) == size == input_files.size(local)
    rng = random.Random(1)
    cuts = sorted({0, size, *(rng.randrange(size) for _ in range(9))})
    for start, end in zip(cuts, cuts[1:]):
        counts = []
        fetched = input_files.FetchStats.bytes
        for path in (local, remote):
            counter = ReadCounter()
            lines = list(iter_segment_lines(path, start, end, counter))
            counts.append(counter.bytes)
            if path == local:
                want = lines
        assert lines == want, (start, end)
        assert counts[0] == counts[1]  # the readers' own reads, whatever the requests
        # Fetched: what the reader read, and nothing more (read-ahead stops at the range's
        # end; past it, requests are the reader's own small reads).
        assert input_files.FetchStats.bytes - fetched == counts[1], (start, end)
    whole = [line for s, e in zip(cuts, cuts[1:]) for _, line in iter_segment_lines(remote, s, e)]
    assert whole == [line for _, line in iter_segment_lines(local)]
    events = [list(Paragraphs(p, 0, size // 2)) for p in (local, remote)]
    assert events[0] == events[1] and events[0]


def test_an_overwritten_object_is_refused_by_version(corpus, gcs_prefix):
    local, remote, _ = corpus
    storage.upload_file(local, f"{gcs_prefix}/part.txt")  # a new generation, same bytes
    with pytest.raises(storage.InputChangedError, match="part.txt changed after the plan "
                                                        "listed it"):
        input_files.size(remote)
    with pytest.raises(storage.InputChangedError):
        list(iter_segment_lines(remote, 0, 100))


def test_pinned_names_round_trip_and_local_paths_pass_through():
    assert input_files.split_pinned("gs://b/k/x.txt#123") == ("gs://b/k/x.txt", 123)
    assert input_files.split_pinned("gs://b/k#x.txt") == ("gs://b/k#x.txt", None)
    assert input_files.split_pinned("/data/x.txt#5") == ("/data/x.txt#5", None)
    assert input_files.pinned("gs://b/x", None) == "gs://b/x"
