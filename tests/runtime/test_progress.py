"""Progress lines and colour: plain and greppable when piped, colour only on a terminal."""

import io

from runexp.compiler import terminal
from runexp.runtime.progress import Meter


def test_piped_progress_prints_amount_rate_and_eta(monkeypatch):
    lines, now = [], [0.0]
    monkeypatch.setattr("runexp.runtime.progress.time.monotonic", lambda: now[0])
    meter = Meter("uploading", total=4 << 20, unit="B", say=lines.append, every_s=5.0,
                  live=False, detail=lambda: "2 files")
    now[0] = 10.0
    meter.advance(1 << 20)      # a line
    now[0] = 12.0
    meter.advance(0)            # too soon for another
    now[0] = 20.0
    meter.advance(1 << 20)      # a line
    now[0] = 30.0
    meter.close()
    assert lines[0] == ("uploading: 1.0 MiB of 4.0 MiB (25%), 102.4 KiB/s, ETA 0:00:30; "
                        "2 files")
    assert lines[1] == ("uploading: 2.0 MiB of 4.0 MiB (50%), 102.4 KiB/s, ETA 0:00:20; "
                        "2 files")
    assert len(lines) == 3
    assert lines[-1] == "uploading: 2.0 MiB in 30.0 s (68.3 KiB/s); 2 files"


def test_counts_without_a_total():
    lines = []
    with Meter("documents", unit="docs", say=lines.append, every_s=1e9, live=False) as m:
        for _ in range(1500):
            m.advance()
    assert len(lines) == 1 and lines[0].startswith("documents: 1,500 docs in ")


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert terminal.paint("ok", "green", io.StringIO()) == "ok"          # piped
    assert terminal.paint("ok", "green", Tty()) == "\033[32mok\033[0m"   # a terminal
    assert "\033[31;1merror:\033[0m" in terminal.highlight("x: error: y", Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert terminal.paint("ok", "green", Tty()) == "ok"
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert terminal.paint("ok", "green", Tty()) == "ok"
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert terminal.paint("ok", "bold", io.StringIO()) == "\033[1mok\033[0m"
