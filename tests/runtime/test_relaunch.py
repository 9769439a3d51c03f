"""run_with_relaunch: a preempted command is started again; anything else ends it."""

import sys

import pytest

from runexp.runtime.relaunch import EXIT_PREEMPTED, backoff_seconds, run_with_relaunch

# Exits 75 (preempted) while the counter file holds fewer than N launches, then 0.
CHILD = """
import sys
path, preemptions = sys.argv[1], int(sys.argv[2])
with open(path, "a") as f:
    f.write("x")
with open(path) as f:
    launches = len(f.read())
sys.exit(75 if launches <= preemptions else int(sys.argv[3]))
"""


def _run(tmp_path, preemptions: int, final: int, max_attempts: int):
    counter = tmp_path / "launches"
    lines = []
    code = run_with_relaunch([sys.executable, "-c", CHILD, str(counter), str(preemptions),
                              str(final)], max_attempts=max_attempts, backoff_s=0.01,
                             say=lines.append)
    return code, len(counter.read_text()), lines


def test_relaunches_while_preempted_then_returns_the_final_code(tmp_path):
    code, launches, lines = _run(tmp_path, preemptions=2, final=0, max_attempts=5)
    assert (code, launches) == (0, 3)
    assert len(lines) == 2  # one line per relaunch
    assert lines[0].startswith("runexp: attempt 1/5 was preempted (exit 75); relaunching in "
                               "0.01 s (attempt 2/5): ")
    assert "attempt 2/5 was preempted" in lines[1] and "0.02 s (attempt 3/5)" in lines[1]


def test_gives_up_after_max_attempts(tmp_path):
    code, launches, lines = _run(tmp_path, preemptions=10, final=0, max_attempts=3)
    assert (code, launches) == (EXIT_PREEMPTED, 3)
    assert "no attempts left" in lines[-1]


@pytest.mark.parametrize("final", [1, 3, 124])
def test_other_exit_codes_are_not_relaunched(tmp_path, final):
    code, launches, lines = _run(tmp_path, preemptions=0, final=final, max_attempts=5)
    assert (code, launches, lines) == (final, 1, [])


def test_backoff_doubles_and_is_capped():
    assert [backoff_seconds(5, n) for n in (1, 2, 3)] == [5, 10, 20]
    assert backoff_seconds(100, 10) == 600


def test_the_backoff_starts_again_after_an_attempt_that_ran_long(tmp_path, monkeypatch):
    from runexp.runtime import relaunch

    # Every attempt counts as long: a days-long run's twentieth preemption waits as long as
    # its first.
    monkeypatch.setattr(relaunch, "BACKOFF_RESET_S", 0.0)
    code, launches, lines = _run(tmp_path, preemptions=4, final=0, max_attempts=10)
    assert (code, launches) == (0, 5)
    assert all("relaunching in 0.01 s" in line for line in lines), lines
