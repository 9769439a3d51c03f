"""What grows with a run stays bounded: on the output root of a simulated million-step run
(tests/runtime/long_run_files.py), ``runexp status``, a resume's log work, the curves and
``runexp report`` read what they need of the logs and keep a bounded number of records,
however long the log. Bytes read and records kept are asserted, never seconds (bench/
long_run.py times them, with peak memory, at 10^4 and 10^6 log records).

The one reader of the logs (runtime/log_reader.py) is checked here too: forward, backward,
cut lines, trimming and sampling, locally and on the loopback GCS server.
"""

import json
import os

import pytest

from runexp.runtime import log_reader
from tests.runtime.long_run_files import STAGE, simulate

STEPS, LOG_EVERY = 10 ** 6, 100  # 9,000 train records (2.6 MB), a stop every 50,000 steps


@pytest.fixture(scope="module")
def long_root(tmp_path_factory):
    return simulate(str(tmp_path_factory.mktemp("long")), steps=STEPS, log_every=LOG_EVERY)


@pytest.fixture
def reads(monkeypatch):
    """Bytes each log file was read for, through the one reader."""
    counted: dict = {}
    original = log_reader.LocalSource.read

    def read(self, start, end):
        data = original(self, start, end)
        counted[os.path.basename(self.path)] = counted.get(os.path.basename(self.path), 0) \
            + len(data)
        return data

    monkeypatch.setattr(log_reader.LocalSource, "read", read)
    return counted


def _log(root):
    return os.path.join(root, STAGE, log_reader.TRAIN_LOG)


def test_status_reads_one_block_of_a_long_log(long_root, reads):
    from runexp.compiler.cli import _reader
    from runexp.compiler.plan import Plan
    from runexp.runtime import status

    assert os.path.getsize(_log(long_root)) > 2 * log_reader.BLOCK
    read = _reader(long_root)
    report = status.status(Plan.from_json(read(f"{long_root}/plan.json")), read)
    (stage,) = report["stages"]
    assert stage["step"] == STEPS * 9 // 10 and stage["checkpoint_step"] == STEPS * 9 // 10
    assert stage["stop"]["deadline_seconds_left"] == 12.5
    assert reads == {log_reader.TRAIN_LOG: log_reader.TAIL_BLOCK}
    assert "stopped at the wall-time budget" in status.render(report)


def test_a_resume_reads_and_cuts_only_the_log_past_its_checkpoint(long_root, tmp_path, reads):
    import shutil

    from runexp.runtime import train_log

    work = tmp_path / "work"
    shutil.copytree(os.path.join(long_root, STAGE), work)
    size = os.path.getsize(work / log_reader.TRAIN_LOG)
    last = STEPS * 9 // 10
    train_log.trim_logs(str(work), last)  # nothing past the checkpoint: nothing cut
    assert os.path.getsize(work / log_reader.TRAIN_LOG) == size
    assert reads[log_reader.TRAIN_LOG] <= log_reader.TAIL_BLOCK
    reads.clear()
    # Killed 2,000 steps after it: those records (and a cut line) go, by truncation.
    with open(work / log_reader.TRAIN_LOG, "a") as f:
        for step in range(last + LOG_EVERY, last + 2001, LOG_EVERY):
            f.write(json.dumps({"step": step, "loss": 1.0}) + "\n")
        f.write('{"step": 902100, "lo')
    train_log.trim_logs(str(work), last)
    assert os.path.getsize(work / log_reader.TRAIN_LOG) == size
    assert reads[log_reader.TRAIN_LOG] <= log_reader.TAIL_BLOCK
    assert train_log.last_metrics(str(work))["step"] == last


def test_curves_of_a_long_run_keep_a_bounded_number_of_points(long_root, reads):
    from runexp.runtime.report import curves

    logs = curves.read_logs(os.path.join(long_root, STAGE))
    size = os.path.getsize(_log(long_root))
    assert reads[log_reader.TRAIN_LOG] == size  # one pass, block by block
    assert log_reader.CURVE_POINTS // 2 < len(logs.train) <= log_reader.CURVE_POINTS + 1
    assert len(logs.evals) == STEPS * 9 // 10 // 10000
    assert len(logs.events) == STEPS * 9 // 10 // 50000
    steps = [r["step"] for r in logs.train]
    assert steps == sorted(steps) and steps[-1] == STEPS * 9 // 10
    fig = curves.curves_figure("pretrain", logs, total_steps=STEPS)
    assert len(fig.axes[0].get_lines()[0].get_xdata()) == len(logs.train)


@pytest.mark.parametrize("n, limit", [(10, 8), (1000, 100), (4097, 2000), (7, 2000)])
def test_a_sample_is_evenly_strided_keeps_the_last_and_every_event(n, limit):
    records = [{"step": 10 * (i + 1), "loss": float(i)} for i in range(n)]
    events = [{"step": 10 * i, "event": "deadline_stop"} for i in range(1, n, 50)]
    lines = [json.dumps(r) for r in records]
    for i, e in reversed(list(enumerate(events))):
        lines.insert(50 * i + 1, json.dumps(e))
    kept, got_events = log_reader.sample(log_reader.TextSource("\n".join(lines) + "\n"),
                                         limit, block=512)
    assert got_events == events
    assert len(kept) <= limit + 1 and kept[-1] == records[-1]
    if n <= limit:
        assert kept == records
        return
    strided = kept[:-1] if kept[-1] != kept[-2] else kept
    stride = strided[1]["step"] - strided[0]["step"]
    assert strided == records[::stride // 10][:len(strided)]
    assert len(kept) > limit // 2  # as many as fit, at a stride of a power of two


def test_the_reader_skips_cut_lines_both_ways_and_at_any_block_size():
    records = [{"step": i, "loss": i / 3} for i in range(1, 300)]
    text = "".join(json.dumps(r) + "\n" for r in records[:150]) + '{"step": 15\n' + \
        "[1, 2]\n\n" + "".join(json.dumps(r) + "\n" for r in records[150:]) + '{"step": 3'
    for block in (1, 7, 64, 1 << 20):
        src = log_reader.TextSource(text)
        assert list(log_reader.forward(src, block)) == records
        assert list(log_reader.backward(src, block)) == records[::-1]
    assert list(log_reader.forward(None)) == [] and log_reader.last(None) is None


def test_trim_cuts_at_the_step(tmp_path):
    path = str(tmp_path / "log.jsonl")
    records = [{"step": s} for s in range(10, 101, 10)]
    for cut, kept in ((100, 10), (55, 5), (10, 1), (0, 0)):
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
            f.write('{"step": 1')
        log_reader.trim(path, cut, block=16)
        assert list(log_reader.forward(log_reader.source(path))) == records[:kept]
        with open(path, "rb") as f:
            data = f.read()
        assert data == b"" or data.endswith(b"\n")
    with open(path, "w") as f:  # a last record without its newline: kept, and ended
        f.write('{"step": 1}\n{"step": 2}')
    log_reader.trim(path, 5)
    with open(path) as f:
        assert f.read() == '{"step": 1}\n{"step": 2}\n'


def test_a_gs_log_is_read_by_ranges(gcs_prefix):
    from runexp.runtime import storage

    records = [{"step": i, "loss": 1.0 / i} for i in range(1, 2001)]
    uri = f"{gcs_prefix}/pretrain/{log_reader.TRAIN_LOG}"
    storage.write_text(uri, "".join(json.dumps(r) + "\n" for r in records))
    src = log_reader.source(uri)
    assert isinstance(src, log_reader.GcsSource)
    assert log_reader.last(src) == records[-1] and src.bytes_read <= log_reader.TAIL_BLOCK
    assert list(log_reader.forward(src, block=4096)) == records
    assert log_reader.source(f"{gcs_prefix}/nothing/{log_reader.TRAIN_LOG}") is None


def test_the_reader_and_its_light_users_need_no_tensorflow():
    import subprocess
    import sys

    code = ("import sys\n"
            "from runexp.runtime import log_reader, status\n"
            "from runexp.runtime.report import collect, curves\n"
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
