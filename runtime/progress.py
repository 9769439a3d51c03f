"""Progress of a long step (transfers, vocab training, shards, evaluation): done of total,
rate and ETA.

On a terminal, a live bar (rich) redrawn in place, in colour unless ``NO_COLOR`` is set;
piped or logged, a plain line at most every ``every_s`` seconds and one at the end, so logs
stay greppable and short. Either way the last line says what was done, how much, how fast.

Usage:
    with Meter("uploading checkpoint", total=size, unit="B", say=ctx.progress) as m:
        for chunk in chunks:
            m.advance(len(chunk))
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable, Optional

from runexp.compiler.terminal import colour_on


def _amount(value: float, unit: str) -> str:
    if unit == "B":
        for size, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if value >= size:
                return f"{value / size:.1f} {name}"
        return f"{value:.0f} B"
    return f"{value:,.0f}" + (f" {unit}" if unit else "")


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Meter:
    """Counts progress towards ``total`` (None: unknown) in ``unit`` ("B" for bytes)."""

    def __init__(self, what: str, total: Optional[float] = None, unit: str = "",
                 say: Callable[[str], None] = print, every_s: float = 15.0,
                 live: Optional[bool] = None, detail: Callable[[], str] = lambda: ""):
        self.what, self.total, self.unit, self.say = what, total, unit, say
        self.detail = detail  # more to say on each line (e.g. instances made so far)
        self.every_s = every_s
        self.done = 0.0
        self.start = time.monotonic()
        self._last_line = self.start
        self._live = colour_on(sys.stdout) if live is None else live
        self._bar = None
        if self._live:
            self._start_bar()

    def _start_bar(self) -> None:
        try:
            from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn,
                                       Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)
        except ImportError:  # rich is a dependency; a broken install only loses the bar
            self._live = False
            return
        amount = DownloadColumn() if self.unit == "B" else MofNCompleteColumn()
        columns = [TextColumn("    {task.description}"), BarColumn(), amount,
                   TextColumn("{task.fields[detail]}")]
        if self.unit == "B":
            columns.append(TransferSpeedColumn())
        columns.append(TimeRemainingColumn())
        self._bar = Progress(*columns, transient=True)
        self._task = self._bar.add_task(self.what, total=self.total, detail="")
        self._bar.start()

    @property
    def rate(self) -> float:
        return self.done / max(time.monotonic() - self.start, 1e-9)

    def line(self) -> str:
        """The plain progress line: what, how much of how much, rate, ETA."""
        rate = self.rate
        text = f"{self.what}: {_amount(self.done, self.unit)}"
        if self.total:
            text += f" of {_amount(self.total, self.unit)} ({self.done / self.total:.0%})"
        text += f", {_amount(rate, self.unit)}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f", ETA {_duration((self.total - self.done) / rate)}"
        more = self.detail()
        return text + (f"; {more}" if more else "")

    def advance(self, amount: float = 1.0) -> None:
        self.done += amount
        if self._bar is not None:
            self._bar.update(self._task, advance=amount, detail=self.detail())
            return
        now = time.monotonic()
        if now - self._last_line >= self.every_s:
            self._last_line = now
            self.say(self.line())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elapsed = time.monotonic() - self.start
        more = self.detail()
        self.say(f"{self.what}: {_amount(self.done, self.unit)} in {elapsed:.1f} s "
                 f"({_amount(self.rate, self.unit)}/s)" + (f"; {more}" if more else ""))

    def __enter__(self) -> "Meter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
