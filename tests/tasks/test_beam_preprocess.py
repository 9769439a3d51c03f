"""Scale-out preprocessing on Apache Beam (DirectRunner) writes what the local runner writes:
the same records, info and stats, the same bad-input report (tasks/instances/beam_preprocess.py)."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("apache_beam")

from runexp.compiler.errors import UserError  # noqa: E402
from runexp.compiler.plan import Plan, Stage  # noqa: E402
from runexp.runtime.context import StageContext  # noqa: E402
from runexp.runtime.stages import preprocess  # noqa: E402
from runexp.tasks.vocabulary import vocab_dir as vocab_files  # noqa: E402
from runexp.tasks.instances.beam_preprocess import run_beam_shard_jobs  # noqa: E402
from runexp.tasks.instances.pretraining_shards import (PretrainingConfig, plan_prebuilt_shard_jobs,  # noqa: E402
                                             plan_shard_jobs, run_shard_jobs)
from runexp.tasks.cache.records import iter_records  # noqa: E402
from runexp.tasks.sources.text_documents import sample_lines  # noqa: E402

WORDS = ("function value attribute asynchronous event loop widget window header message field "
         "logger record handler socket thread process queue lock timer").split()
DIRECT = {"runner": "DirectRunner", "direct_num_workers": 2}


def _documents(n):
    docs = []
    for d in range(n):
        docs.append([" ".join(WORDS[(d * 7 + s * 3 + k) % len(WORDS)] for k in range(4 + s % 9))
                     + "." for s in range(10 + d % 6)])
    return docs


def make_corpus(tmp_path, text_format):
    """Five train files of uneven sizes (one empty, one with a bad byte), a held-out one, and
    a small SentencePiece vocab."""
    docs = _documents(56)
    sizes = (14, 3, 0, 21, 10)
    start = 0
    for i, n in enumerate(sizes):
        part = docs[start:start + n]
        start += n
        if text_format == "jsonl":
            data = "".join(json.dumps({"text": " ".join(d)}) + "\n" for d in part).encode()
            if i == 1:
                data += b"not json\n"
        else:
            data = "\n".join("\n".join(d) + "\n" for d in part).encode()
            if i == 1:
                data += b"\nA line with \xff a bad byte.\n"
        (tmp_path / f"train-{i}.txt").write_bytes(data)
    held = docs[start:]
    if text_format == "jsonl":
        (tmp_path / "valid.txt").write_text("".join(json.dumps({"text": " ".join(d)}) + "\n"
                                                    for d in held))
    else:
        (tmp_path / "valid.txt").write_text("\n".join("\n".join(d) + "\n" for d in held))
    (tmp_path / "plain.txt").write_text("\n".join(" ".join(d) for d in docs))
    vocab_dir = tmp_path / "vocab"
    vocab_dir.mkdir()
    lines = sample_lines([str(tmp_path / "plain.txt")], 1000, seed=0)
    vocab_files.train_sentencepiece(lines, str(vocab_dir), vocab_size=60, do_lower_case=True)
    vocab_files.write_report(str(vocab_dir), "sentencepiece", True, ["value of the window."])
    return str(vocab_dir)


def run_stage(tmp_path, name, vocab_dir, text_format, **params):
    out = tmp_path / name
    out.mkdir()
    base = dict(task="t", format=text_format, max_seq_length=32, max_predictions_per_seq=5,
                dupe_factor=2, random_seed=3, num_shards=3, num_workers=2)
    base.update(params)
    train = sorted(str(p) for p in tmp_path.glob("train-*.txt"))
    stage = Stage(id=name, kind="preprocess", output_dir=str(out), params=base, inputs=dict(
        train_files=train, validation_files=[str(tmp_path / "valid.txt")], vocab_dir=vocab_dir))
    messages = []
    summary = preprocess.run(StageContext(stage, Plan("t", str(tmp_path), (stage,)), str(out),
                                          progress=messages.append))
    summary.pop("seconds")
    return out / "t", summary, messages


def records_digest(paths):
    """SHA-256 of a split's records in sorted order: what a reader gets, whatever the files."""
    h = hashlib.sha256()
    for record in sorted(iter_records(paths)):
        h.update(len(record).to_bytes(8, "little") + record)
    return h.hexdigest()


@pytest.mark.parametrize("text_format", ["sentence_lines", "jsonl"])
def test_beam_runner_writes_the_local_runners_cache(tmp_path, text_format):
    vocab_dir = make_corpus(tmp_path, text_format)
    local, local_summary, _ = run_stage(tmp_path, "local", vocab_dir, text_format)
    beam, beam_summary, messages = run_stage(tmp_path, "beam", vocab_dir, text_format,
                                             runner="beam", beam_options=DIRECT)
    names = sorted(os.listdir(local))
    assert sorted(os.listdir(beam)) == names
    for split in ("train", "validation"):
        shards = [n for n in names if n.startswith(f"{split}.tfrecord-")]
        assert len(shards) == 3
        assert records_digest([str(beam / n) for n in shards]) == \
            records_digest([str(local / n) for n in shards])
        assert json.loads((beam / f"stats.{split}.json").read_text()) == \
            json.loads((local / f"stats.{split}.json").read_text())
    for name in names:  # and file for file, byte for byte: same seeds, same shards
        assert (beam / name).read_bytes() == (local / name).read_bytes(), name
    assert beam_summary == local_summary
    assert local_summary["train"]["instances"] > 50
    bad = local_summary["bad_input"]
    kind = "invalid_json_lines" if text_format == "jsonl" else "non_utf8_lines"
    assert bad[kind]["count"] == 1 and bad["empty_files"]["count"] == 1
    assert any(m.startswith("Apache Beam DirectRunner: 6 range(s)") for m in messages)
    assert sum(m.startswith("[") and " read " in m for m in messages) == 6  # per range
    assert not os.path.exists(tmp_path / "beam" / ".preprocess-spill")


def test_shared_directory_path_and_kept_indexes_match_the_local_runner(tmp_path):
    """The path of a runner whose workers are elsewhere (Dataflow), forced here with a local
    shared directory: ranges, the index and the shards handed on through it. Also a kept
    split index (a first pretraining phase) and shards made from it (a later one)."""
    vocab_dir = make_corpus(tmp_path, "sentence_lines")
    config = PretrainingConfig.of(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2,
                                  random_seed=3)
    files = {"train": tuple(sorted(str(p) for p in tmp_path.glob("train-*.txt")))}
    outputs = {}
    for who in ("local", "beam"):
        out = tmp_path / who / "out"
        out.mkdir(parents=True)
        index = str(tmp_path / who / "split_index")
        jobs = plan_shard_jobs(files, vocab_dir, config, 2, str(out), index_dir=index)
        if who == "local":
            results = list(run_shard_jobs(jobs))
        else:
            results = list(run_beam_shard_jobs(
                jobs, {"runner": "DirectRunner", "direct_num_workers": 1}, 1,
                shared_dir=str(tmp_path / "shared")))
        assert sorted(os.listdir(os.path.join(index, "train"))) == sorted(
            ["tokens.bin", "offsets.bin", "documents.npy", "blocks.npy", "block_tokens.npy",
             "meta.json"])
        later = tmp_path / who / "later"
        later.mkdir()
        config2 = PretrainingConfig.of(max_seq_length=64, max_predictions_per_seq=10,
                                       dupe_factor=1, random_seed=3)
        jobs2 = plan_prebuilt_shard_jobs(index, vocab_dir, config2, 2, str(later))
        if who == "local":
            results2 = list(run_shard_jobs(jobs2))
        else:
            results2 = list(run_beam_shard_jobs(
                jobs2, {"runner": "DirectRunner", "direct_num_workers": 1}, 1,
                shared_dir=str(tmp_path / "shared2")))
        outputs[who] = (out, later, sorted((s, k, st.counts()) for s, k, st in results),
                        sorted((s, k, st.counts()) for s, k, st in results2))
    (out_a, later_a, res_a, res2_a), (out_b, later_b, res_b, res2_b) = outputs.values()
    assert res_a == res_b and res2_a == res2_b
    for a, b in ((out_a, out_b), (later_a, later_b)):
        assert sorted(os.listdir(a)) == sorted(os.listdir(b))
        for name in os.listdir(a):
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert not os.path.exists(tmp_path / "shared") and not os.path.exists(tmp_path / "shared2")


def test_a_remote_runner_is_refused_before_launching_when_the_corpus_is_local(tmp_path):
    vocab_dir = make_corpus(tmp_path, "sentence_lines")
    config = PretrainingConfig.of(max_seq_length=32, max_predictions_per_seq=5)
    jobs = plan_shard_jobs({"train": (str(tmp_path / "train-0.txt"),)}, vocab_dir, config, 2,
                           str(tmp_path))
    options = {"runner": "DataflowRunner", "project": "p", "region": "us-central1",
               "temp_location": "gs://bucket/tmp"}
    with pytest.raises(UserError, match="cannot read the corpus on this one.*\n  hint: copy "
                                        "the corpus to Cloud Storage"):
        list(run_beam_shard_jobs(jobs, options, 2))


def test_the_beam_module_imports_neither_tensorflow_nor_seqio():
    code = ("import sys\nimport runexp.tasks.instances.beam_preprocess\n"
            "heavy = [m for m in ('tensorflow', 'seqio') if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "import runexp.runtime.stages.preprocess, runexp.compiler.planner\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_workers_read_a_gcs_corpus_in_place_and_hand_on_through_gcs(tmp_path, gcs_prefix):
    """Dataflow's path, run here by DirectRunner against a GCS server on loopback: the workers
    read their byte ranges of the corpus from the object versions the plan listed
    (``gs://...#generation``, no copy on the launcher), get the vocabulary, ranges, index and
    shards through a gs:// shared directory; the records and stats are the local runner's on
    the same files kept locally. A version gone before launch is one clear error."""
    from runexp.runtime import storage
    from runexp.tasks.sources.input_files import pinned, split_pinned

    vocab_dir = make_corpus(tmp_path, "sentence_lines")
    local_files = sorted(tmp_path.glob("train-*.txt"))
    for path in local_files:
        storage.upload_file(str(path), f"{gcs_prefix}/corpus/{path.name}")
    listing = storage.glob_objects(f"{gcs_prefix}/corpus/train-*.txt")
    remote = tuple(pinned(o["uri"], o["generation"]) for o in listing)
    assert len(remote) == len(local_files) and all("#" in r for r in remote)
    config = PretrainingConfig.of(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2,
                                  random_seed=3)
    outputs = {}
    for who, files in (("local", tuple(map(str, local_files))), ("beam", remote)):
        out = tmp_path / who
        out.mkdir()
        jobs = plan_shard_jobs({"train": files}, vocab_dir, config, 3, str(out))
        if who == "local":
            results = list(run_shard_jobs(jobs))
        else:
            results = list(run_beam_shard_jobs(jobs, DIRECT, 2,
                                               shared_dir=f"{gcs_prefix}/shared"))
        stats = sorted((s, k, st.counts(), dict(st.issues.counts)) for s, k, st in results)
        # Bad input is reported at the same file (a path, or an object's version) and line.
        where = sorted((kind, split_pinned(path)[0].rsplit("/", 1)[-1], line)
                       for _, _, st in results for kind, found in st.issues.samples.items()
                       for path, line in found)
        outputs[who] = (out, stats, where)
    (out_a, stats_a, where_a), (out_b, stats_b, where_b) = outputs.values()
    assert stats_a == stats_b
    assert where_a == where_b and ("non_utf8_lines", "train-1.txt", 43) in where_a, where_a
    assert sum(st["instances"] for _, _, st, _ in stats_a) > 0
    assert sorted(os.listdir(out_a)) == sorted(os.listdir(out_b))
    for name in os.listdir(out_a):
        assert (out_a / name).read_bytes() == (out_b / name).read_bytes(), name
    assert storage.list(f"{gcs_prefix}/shared") == []  # the scratch is gone

    # The corpus changes after the plan listed it: refused at launch, naming the object.
    storage.upload_file(str(local_files[0]), f"{gcs_prefix}/corpus/{local_files[0].name}")
    (tmp_path / "again").mkdir()
    jobs = plan_shard_jobs({"train": remote}, vocab_dir, config, 3, str(tmp_path / "again"))
    with pytest.raises(storage.InputChangedError, match="train-0.txt changed after the plan"):
        list(run_beam_shard_jobs(jobs, DIRECT, 2, shared_dir=f"{gcs_prefix}/shared2"))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_beam_runner_writes_the_local_runners_packed_cache(tmp_path, dynamic):
    """Packed rows (tasks/instances/packing.py) are the same bytes whichever runner builds them."""
    vocab_dir = make_corpus(tmp_path, "sentence_lines")
    params = dict(packing=True, short_seq_prob=0.5, dynamic_masking=dynamic)
    local, local_summary, _ = run_stage(tmp_path, "local", vocab_dir, "sentence_lines",
                                        **params)
    beam, beam_summary, _ = run_stage(tmp_path, "beam", vocab_dir, "sentence_lines",
                                      runner="beam", beam_options=DIRECT, **params)
    names = sorted(os.listdir(local))
    assert sorted(os.listdir(beam)) == names
    for name in names:
        assert (beam / name).read_bytes() == (local / name).read_bytes(), name
    assert beam_summary == local_summary
    packing = local_summary["train"]["packing"]
    assert packing["rows"] < packing["instances"] == local_summary["train"]["instances"]
    info = json.loads((local / "info.train.json").read_text())["features"]
    assert info["instance_ids"]["shape"] == [32] and info["next_sentence_weights"]["shape"] == [3]
    assert "instance_ids" not in json.loads((local / "info.validation.json").read_text())[
        "features"]
