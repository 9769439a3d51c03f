"""Formatting for the HTML report: escaping, durations, values, badges, comparisons."""

from __future__ import annotations

import base64
import html
import math
from typing import Any, Optional

from runexp.compiler.kinds import KINDS
from runexp.compiler.plan import Stage
from runexp.runtime.report.collect import DONE, NOT_STARTED, OUT_OF_DATE, STARTED, StageReport
from runexp.compiler.model_sizes import parameter_count



def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def duration(seconds: Optional[float]) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    if seconds < 48 * 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
    return f"{seconds / 86400:.1f} days"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-3 or abs(v) >= 1e5 else f"{v:g}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_value(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(_value(x) for x in v)
    return str(v)


def pct(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.1%}"


def _model(model: dict) -> str:
    try:
        n = parameter_count(model)
        size = f", {n / 1e6:.1f} M parameters" if n >= 1e5 else f", {n:,} parameters"
    except (KeyError, TypeError):
        size = ""
    return (f"{model.get('num_hidden_layers')} layers, hidden {model.get('hidden_size')}, "
            f"{model.get('num_attention_heads')} heads, vocab {model.get('vocab_size')}{size}")


def key_params(stage: Stage) -> list[tuple[str, str]]:
    """The params the stage table shows: those its kind declares with `setting(...,
    shown=True)` (compiler/specs/), set ones only, after the model of a training stage; a
    kind this report does not know shows its first scalar params."""
    p = stage.params
    kind = KINDS.get(stage.kind)
    if kind is None:
        names = [k for k, v in p.items() if isinstance(v, (str, int, float, bool))][:8]
    else:
        names = kind.spec.shown_params()
    out = [(k, _value(p[k])) for k in names if p.get(k) is not None]
    if kind is not None and kind.trains and isinstance(p.get("model"), dict):
        out.insert(0, ("model", _model(p["model"])))
    return out


def path_html(path: str) -> str:
    """A path, escaped, that may wrap after each / and . (long stage directories)."""
    return esc(path).replace("/", "/<wbr>").replace(".", ".<wbr>")


def img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}">'


def status_badge(sr: StageReport, note: bool = True) -> str:
    """"done" / "not done" / "out of date", and (``note``) what is known of an unfinished
    stage on a second line."""
    label = {DONE: "done", OUT_OF_DATE: "out of date"}.get(sr.status, "not done")
    badge = f'<span class="badge {"ok" if sr.done else "todo"}">{label}</span>'
    if not note or sr.done:
        return badge
    detail = {OUT_OF_DATE: "holds a build from other inputs or settings",
              STARTED: "started, not finished", NOT_STARTED: "not started"}[sr.status]
    if sr.logs and sr.logs.last_step:
        total = sr.stage.params.get("train_steps")
        detail += f"; last logged step {sr.logs.last_step:,}" + (f" of {total:,}" if total
                                                                 else "")
    return f"{badge}<div class='muted small'>{esc(detail)}</div>"


def compare(value: Optional[float], baseline: Optional[float], higher_is_better=True,
             percent=True) -> str:
    """The value against its baseline, as a coloured cell's content."""
    if value is None or baseline is None:
        return "—"
    diff = value - baseline
    better = diff > 1e-9 if higher_is_better else diff < -1e-9
    if percent:
        text = f"{diff * 100:+.1f} points"
        if baseline > 0 and value > 0:
            text += f" ({value / baseline:.1f}×)"
    else:
        text = f"{diff:+.3g}"
    verdict = "better than the baseline" if better else "no better than the baseline"
    return f'<span class="{"good" if better else "bad"}" title="{verdict}">{esc(text)}</span>'
