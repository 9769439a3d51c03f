"""The sections of the HTML report, and the page that holds them (``render``)."""

from __future__ import annotations

import datetime
import html
import math
import re
from typing import Optional

from runexp.compiler.specs import FinetuneSpec, TrainSpec
from runexp.compiler.specs.bad_input import BAD_INPUT_KINDS
from runexp.compiler.specs.task_kinds import ACCURACY
from runexp.runtime.export import artifacts
from runexp.runtime.report import curves
from runexp.runtime.report.collect import (BOOKKEEPING, STATUS_TEXT, Report, RootReader,
                                           StageReport)
from runexp.runtime.report.format import (compare, duration, esc, img, key_params, path_html,
                                          pct, status_badge)
from runexp.runtime.report.ablations import section_ablation
from runexp.runtime.report.sweeps import section_sweeps



def _section_overview(r: Report) -> str:
    plan, done = r.plan, sum(s.done for s in r.stages)
    acc = plan.accelerator or {}
    seconds = sum(s.manifest.get("seconds", 0) or 0 for s in r.stages if s.done)
    rows = [
        ("output root", f"<code>{esc(r.root)}</code>"),
        ("stages", f"{done} of {len(r.stages)} done"
                   + ("" if done == len(r.stages) else
                      " — run the same command again to build the rest (training continues "
                      "from its latest checkpoint)")),
        ("accelerator", esc(f"{acc.get('name', '?')} ({acc.get('type', '?')}, "
                           f"{acc.get('replicas', '?')} replica(s))") if acc else "—"),
        ("time of the stages done", esc(duration(seconds))),
        ("gin files", "<br>".join(f"<code>{esc(f)}</code>" for f in plan.gin_files) or "—"),
        ("overrides", "<br>".join(f"<code>{esc(p)}</code>" for p in plan.gin_params) or "none"),
    ]
    if plan.warnings:
        rows.append(("plan warnings", "<br>".join(esc(w) for w in plan.warnings)))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _section_plan(r: Report) -> str:
    rows = []
    for sr in r.stages:
        params = "".join(f"<div><span class='k'>{esc(k)}</span> {esc(v)}</div>"
                         for k, v in key_params(sr.stage)) or "<span class='muted'>—</span>"
        deps = ", ".join(sr.stage.deps) or "—"
        kind = "" if sr.stage.kind == sr.stage.id else \
            f"<div class='muted'>{esc(sr.stage.kind)}</div>"
        rows.append(f"<tr id='stage-{esc(sr.stage.id)}'><td><b>{esc(sr.stage.id)}</b>{kind}</td>"
                    f"<td>{status_badge(sr)}</td><td class='params'>{params}</td>"
                    f"<td>{esc(deps)}</td><td><code class='path'>{path_html(sr.dir)}</code></td></tr>")
    return ("<table><thead><tr><th>stage</th><th>status</th><th>key parameters</th>"
            "<th>reads</th><th>directory</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")


def _ratio(actual: Optional[float], estimated: Optional[float]) -> str:
    return f"{actual / estimated:.2g}×" if actual and estimated else "—"


def _usd(seconds: Optional[float], price: float) -> str:
    return f"${seconds / 3600 * price:,.2f}" if seconds else "—"


def _section_time(r: Report) -> str:
    acc = r.plan.accelerator or {}
    price = acc.get("usd_per_hour") or 0.0
    rows, est_total, est_actual, all_actual = [], 0.0, 0.0, 0.0
    for sr in r.stages:
        est = r.estimates.get(sr.stage.id)
        est_s = est.hours * 3600 if est is not None and est.hours is not None else None
        act_s = sr.manifest.get("seconds") if sr.done else None
        note = ""
        if sr.done and sr.stage.kind == "pretrain" and sr.outputs.resumed_from:
            note = "resumed: the last attempt only"
        elif not sr.done:
            note = STATUS_TEXT[sr.status]
            if sr.logs and sr.logs.last_step:
                note += f" (last logged step {sr.logs.last_step:,})"
        cost = ""
        if price:
            est_cost = (f"${est.usd:,.2f} (${est.usd_preemptible:,.2f} preemptible)"
                        if est is not None and est.usd is not None else "—")
            cost = (f"<td class='num'>{esc(est_cost)}</td>"
                    f"<td class='num'>{esc(_usd(act_s, price))}</td>")
        if est_s is not None and act_s is not None:
            est_total += est_s
            est_actual += act_s
        all_actual += act_s or 0.0
        rows.append(f"<tr><td>{esc(sr.stage.id)}</td><td class='num'>{esc(duration(est_s))}</td>"
                    f"<td class='num'>{esc(duration(act_s))}</td>"
                    f"<td class='num'>{esc(_ratio(act_s, est_s))}</td>{cost}"
                    f"<td class='muted'>{esc(note)}</td></tr>")
    cost_head = "<th>estimated cost</th><th>actual cost (on demand)</th>" if price else ""
    if est_total:
        cost = (f"<td></td><td class='num'>{esc(_usd(est_actual, price))}</td>" if price else "")
        rows.append(f"<tr class='total'><td>training stages (estimated and done)</td>"
                    f"<td class='num'>{esc(duration(est_total))}</td>"
                    f"<td class='num'>{esc(duration(est_actual))}</td>"
                    f"<td class='num'>{esc(_ratio(est_actual, est_total))}</td>{cost}"
                    f"<td></td></tr>")
    cost = (f"<td></td><td class='num'>{esc(_usd(all_actual, price))}</td>" if price else "")
    rows.append(f"<tr class='total'><td>all stages done</td><td class='num'>—</td>"
                f"<td class='num'>{esc(duration(all_actual))}</td><td></td>{cost}<td></td></tr>")
    notes = [
        "Estimates exist for training stages only: FLOPs per step at an assumed fraction of "
        f"the {esc(acc.get('name', 'accelerator'))}'s peak (compiler/estimates.py); they are "
        "meant to catch mistakes of 10×, not to be exact. Actual: each stage's "
        "<code>MANIFEST.json</code> <code>seconds</code>, set-up included."]
    if not price:
        notes.append(f"No price is known for the {esc(acc.get('name', 'accelerator'))} "
                     "profile, so no cost is shown.")
    if r.estimate_error:
        notes.append(f"Estimates could not be made: {esc(r.estimate_error)}")
    return ("<table><thead><tr><th>stage</th><th>estimated</th><th>actual</th>"
            f"<th>actual / estimated</th>{cost_head}<th></th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>"
            + "".join(f"<p class='note'>{n}</p>" for n in notes))


def _evaluate_rows(r: Report, sr: StageReport) -> list[tuple]:
    s, sid, chance = sr.outputs, sr.stage.id, curves.nsp_chance(r.plan)
    base = s.majority_token_accuracy
    at = f" (step {s.step:,}, {s.examples:,} examples)" \
        if isinstance(s.step, int) and isinstance(s.examples, int) else ""
    rows = [(sid, "held-out MLM accuracy" + at, pct(s.mlm_accuracy),
             f"most frequent token: {pct(base)}", compare(s.mlm_accuracy, base))]
    if s.nsp_accuracy is not None:
        rows.append((sid, "held-out NSP accuracy", pct(s.nsp_accuracy),
                     f"chance: {pct(chance)}" if chance else "—", compare(s.nsp_accuracy, chance)))
    vocab = (sr.stage.params.get("model") or {}).get("vocab_size")
    if s.mlm_loss is not None:
        uniform = math.log(vocab) if vocab else None
        rows.append((sid, "held-out MLM loss", f"{s.mlm_loss:.3f}",
                     f"uniform guess: ln {vocab} = {uniform:.3f}" if uniform else "—",
                     compare(s.mlm_loss, uniform, higher_is_better=False, percent=False)))
    for task, ts in (s.tasks or {}).items():
        tb = base if ts.majority_token_accuracy is None else ts.majority_token_accuracy
        rows.append((sid, f"held-out MLM accuracy, task {task}", pct(ts.mlm_accuracy),
                     f"most frequent token: {pct(tb)}", compare(ts.mlm_accuracy, tb)))
    return rows


def _pretrain_rows(r: Report, sr: StageReport) -> list[tuple]:
    s, sid, rows = sr.outputs, sr.stage.id, []
    ev = next((e for e in r.by_kind("evaluate")
               if e.stage.inputs.get("checkpoint_dir") == sr.stage.output_dir), None)
    base = ev.outputs.majority_token_accuracy if ev is not None else None
    against = f"most frequent token: {pct(base)}" if base else "—"
    if s.mlm_accuracy is not None:
        rows.append((sid, "MLM accuracy, last training window", pct(s.mlm_accuracy), against,
                     compare(s.mlm_accuracy, base)))
    if s.eval is not None and s.eval.mlm_accuracy is not None:
        rows.append((sid, "MLM accuracy, last in-training held-out evaluation",
                     pct(s.eval.mlm_accuracy), against, compare(s.eval.mlm_accuracy, base)))
    if s.loss is not None:
        vocab = (sr.stage.params.get("model") or {}).get("vocab_size")
        uniform = math.log(vocab) + math.log(2) if vocab else None
        rows.append((sid, "training loss (MLM + NSP), last window", f"{s.loss:.3f}",
                     f"uniform guess: ln {vocab} + ln 2 = {uniform:.3f}" if uniform else "—",
                     compare(s.loss, uniform, higher_is_better=False, percent=False)))
    return rows


def _finetune_rows(r: Report, sr: StageReport) -> list[tuple]:
    rows = []
    for name, scores in sr.outputs.dev_scores().items():
        n, accuracy = scores.examples, scores.values.get(ACCURACY)
        rows.append((sr.stage.id, f"dev accuracy{'' if name == 'dev' else f', {name}'}"
                     + (f" ({n:,} examples)" if isinstance(n, int) else ""), pct(accuracy),
                     f"majority class: {pct(scores.majority_baseline)}",
                     compare(accuracy, scores.majority_baseline)))
    return rows


# The kinds whose summaries the results table scores, and how.
_METRIC_ROWS = {"evaluate": _evaluate_rows, "pretrain": _pretrain_rows,
                "finetune": _finetune_rows}


def _metric_rows(r: Report) -> list[tuple]:
    """(stage id, metric, value, baseline text, comparison html)."""
    return [row for sr in r.stages if sr.done and sr.stage.kind in _METRIC_ROWS
            for row in _METRIC_ROWS[sr.stage.kind](r, sr)]


def _section_metrics(r: Report) -> str:
    rows = _metric_rows(r)
    if not rows:
        return "<p class='muted'>No metrics yet: the evaluate and finetune stages are not done.</p>"
    body = "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td><td class='num'><b>{esc(c)}</b></td>"
                   f"<td>{esc(d)}</td><td class='num'>{e}</td></tr>" for a, b, c, d, e in rows)
    missing = [s.stage.id for s in r.stages
               if s.stage.kind in ("evaluate", "finetune") and not s.done]
    note = (f"<p class='note'>Not done yet, so not scored: {esc(', '.join(missing))}.</p>"
            if missing else "")
    return ("<table><thead><tr><th>stage</th><th>metric</th><th>value</th><th>baseline</th>"
            "<th>against the baseline</th></tr></thead><tbody>" + body + "</tbody></table>"
            + note + "<p class='note'>Baselines: the most frequent masked token of the train "
            "split (evaluate stage), the more frequent next-sentence label (chance), the "
            "majority class of the training set, scored on the dev set (finetune stage), and "
            "the loss of a uniform guess over the vocabulary.</p>")


def _section_curves(r: Report) -> str:
    parts = []
    for sr in r.stages:
        if sr.stage.kind not in curves.PANELS:
            continue
        head = f"<h3>{esc(sr.stage.id)} {status_badge(sr, note=False)}</h3>"
        if sr.curves_png:
            n_train = len(sr.logs.train) if sr.logs else 0
            n_eval = len(sr.logs.evals) if sr.logs else 0
            caption = (f"{n_train} training log records"
                       + (f", {n_eval} held-out evaluations" if n_eval else "")
                       + f" from <code>{esc(curves.TRAIN_LOG)}</code>"
                       + (f" and <code>{esc(curves.EVAL_LOG)}</code>" if n_eval else "")
                       + ". Training metrics are means over each log window.")
            if sr.curves_error:
                caption = (f"Could not be drawn again ({esc(sr.curves_error)}): the stage's own "
                           f"<code>{curves.CURVES_FILE}</code>.")
            parts.append(head + f"<figure>{img(sr.curves_png, sr.stage.id + ' curves')}"
                         f"<figcaption>{caption}</figcaption></figure>")
        else:
            why = sr.curves_error or "no training log yet"
            parts.append(head + f"<p class='muted'>No curves: {esc(why)}.</p>")
    return "".join(parts) or "<p class='muted'>This experiment has no training stage.</p>"


def _section_data(r: Report) -> str:
    parts = []
    for sr in r.stages:
        s = sr.outputs
        if sr.stage.kind == "corpus" and sr.done:
            bits = [f"{split}: {_or(v.documents):,} documents, {_or(v.sentences):,} sentences, "
                    f"{(v.bytes or 0) / 1e6:.1f} MB"
                    for split, v in s.splits().items() if v.documents is not None]
            parts.append(f"<p><b>{esc(sr.stage.id)}</b>: {esc('; '.join(bits) or 'done')}</p>")
        elif sr.stage.kind == "vocab" and sr.done:
            bits = [f"{_or(s.type)} vocab of {s.vocab_size:,} tokens"
                    if isinstance(s.vocab_size, int) else f"{_or(s.type)} vocab"]
            if s.unk_rate is not None:
                bits.append(f"UNK rate {s.unk_rate:.3%}")
            if s.pieces_per_word is not None:
                bits.append(f"{s.pieces_per_word:.2f} pieces per word")
            where = f" (measured on the {s.diagnostics_on} text)" if s.diagnostics_on else ""
            parts.append(f"<p><b>{esc(sr.stage.id)}</b>: {esc(', '.join(bits) + where)}</p>")
        elif sr.stage.kind == "preprocess":
            if not sr.done:
                parts.append(f"<p><b>{esc(sr.stage.id)}</b>: {status_badge(sr)}</p>")
                continue
            bits = [f"{split}: {v.instances:,} instances from {v.documents or 0:,} documents, "
                    f"{v.tokens or 0:,} tokens"
                    for split, v in s.splits().items() if v.instances is not None]
            if s.unk_rate is not None:
                bits.append(f"UNK rate {s.unk_rate:.3%}")
            parts.append(f"<p><b>{esc(sr.stage.id)}</b>: {esc('; '.join(bits))}</p>")
            parts.append(_bad_input(s.bad_input))
    return "".join(parts) or "<p class='muted'>No data stage is done yet.</p>"


def _or(value, unknown="?"):
    return unknown if value is None else value


def _bad_input(bad: Optional[dict]) -> str:
    """The preprocess stage's bad-input counts (compiler/specs/bad_input.py names them)."""
    if bad is None:
        return "<p class='muted'>Bad input: not counted by this stage.</p>"
    rows, total = [], 0
    for kind, issue in bad.items():
        count = int(issue.count or 0)
        total += count
        samples = ", ".join(issue.samples or [])
        known = BAD_INPUT_KINDS.get(kind)
        rows.append(f"<tr><td>{esc(known.label if known else kind.replace('_', ' '))}</td>"
                    f"<td class='num {'bad' if count else ''}'>{count:,}</td>"
                    f"<td><code class='path'>{esc(samples) or '—'}</code></td></tr>")
    verdict = ("<span class='good'>none: every line was read as is</span>" if not total else
               f"<span class='bad'>{total:,} skipped or repaired</span> (never fatal)")
    return (f"<p>Bad input: {verdict}</p><table class='compact'><thead><tr><th>kind</th>"
            "<th>count</th><th>samples (file:line)</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _section_artifacts(r: Report, reader: RootReader) -> str:
    exports = r.by_kind("export")
    if not exports:
        return "<p class='muted'>This experiment has no export stage.</p>"
    parts = []
    for sr in exports:
        if not sr.done:
            parts.append(f"<p><b>{esc(sr.stage.id)}</b>: {status_badge(sr)}</p>")
            continue
        groups: dict[str, list] = {}
        for rel, size in reader.files(sr.dir):
            if rel not in BOOKKEEPING:
                groups.setdefault(artifacts.group_of(rel), []).append(size)
        rows = "".join(
            f"<tr><td><code>{esc(name)}</code></td><td class='num'>{esc(_size(sum(sizes)))}</td>"
            f"<td>{esc(_artifact_note(name, len(sizes)))}</td></tr>"
            for name, sizes in sorted(groups.items()))
        s = sr.outputs
        parts.append(f"<p><b>{esc(sr.stage.id)}</b> in <code>{esc(sr.dir)}</code> "
                     f"(step {esc(_or(s.step))}"
                     + (", the fine-tuned encoder" if sr.stage.inputs.get("finetune_dir")
                        else f", the fine-tuned encoder of the sweep's point "
                             f"{esc(_or(s.point))}"
                        if sr.stage.inputs.get("sweep_dir")
                        else ", the pretrained encoder") + ")</p>"
                     f"<table class='compact'><thead><tr><th>file</th><th>size</th><th></th>"
                     f"</tr></thead><tbody>{rows}</tbody></table>")
        parts.append(_snippets(r, sr, set(groups), reader))
    return "".join(parts)


def _artifact_note(name: str, files: int) -> str:
    artifact = artifacts.artifact_at(name)
    note = artifact.note if artifact is not None else ""
    return f"{note} ({files} files)" if files > 1 and note else (note or (
        f"{files} files" if files > 1 else ""))


def _snippets(r: Report, sr: StageReport, present: set, reader: RootReader) -> str:
    """How to load the export's artifacts (runtime/export/artifacts.py), with its paths."""
    finetunes, pretrains = r.by_kind("finetune"), r.by_kind("pretrain")
    seq = (FinetuneSpec.from_stage(finetunes[0].stage).max_seq_length if finetunes else
           TrainSpec.from_stage(pretrains[-1].stage).max_seq_length if pretrains else 128)
    where = artifacts.Where(at=lambda path: reader.join(sr.dir, path), seq_length=seq,
                            sentencepiece="spm.model" in present)
    return "<h3>Loading them</h3>" + "".join(
        _snippet(snippet) for artifact in artifacts.ARTIFACTS if artifact.path in present
        for snippet in artifact.snippets(where))


def _snippet(snippet: artifacts.Snippet) -> str:
    """A snippet's text (`code` in backticks) and code."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(snippet.text, quote=False))
    return ((f"<p class='note'>{text}</p>" if snippet.note else f"<p>{text}</p>" if text
             else "") + (f"<pre>{esc(snippet.code)}</pre>" if snippet.code else ""))


def _section_tensorboard(r: Report) -> str:
    return ("<p>Every training stage also wrote TensorBoard summaries (its "
            "<code>tensorboard/</code> directory: the same scalars, and held-out ones under "
            "<code>eval/</code>). To browse them:</p>"
            f"<pre>pip install 'runexp[tensorboard]'\ntensorboard --logdir {esc(r.root)}</pre>")


_CSS = """
body { font: 15px/1.45 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #222; max-width: 1560px; margin: 0 auto; padding: 1.5em 2em 4em; }
h1 { font-size: 1.7em; margin-bottom: 0.1em; }
h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 2px solid #e4e4e4; padding-bottom: .2em; }
h3 { font-size: 1.08em; margin: 1.4em 0 .5em; }
nav { margin: .6em 0 1.2em; color: #666; }
nav a { margin-right: 1em; color: #1f5fa8; text-decoration: none; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { text-align: left; vertical-align: top; padding: .35em .8em;
         border-bottom: 1px solid #e8e8e8; }
thead th { background: #f5f6f8; font-weight: 600; border-bottom: 2px solid #dcdcdc; }
table.kv th { background: none; color: #555; font-weight: 600; white-space: nowrap; }
table.compact td, table.compact th { padding: .2em .8em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.total td { font-weight: 600; border-top: 2px solid #dcdcdc; }
td.params { min-width: 22em; }
.k { color: #666; }
.small { font-size: .85em; }
.muted { color: #777; }
.note { color: #555; font-size: .92em; max-width: 72em; }
.good { color: #1a7f37; font-weight: 600; }
.bad { color: #b42318; font-weight: 600; }
.badge { display: inline-block; border-radius: 1em; padding: .05em .7em; font-size: .85em;
         font-weight: 600; white-space: nowrap; }
.badge.ok { background: #dcf5e3; color: #1a7f37; }
.badge.todo { background: #fdecc8; color: #8a5300; }
code { font: .9em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
code.path { color: #444; }
pre { background: #f6f8fa; border: 1px solid #e4e6ea; border-radius: 6px; padding: .8em 1em;
      overflow-x: auto; font: .86em/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
figure { margin: .5em 0 1.5em; }
figure img { max-width: 100%; height: auto; border: 1px solid #e4e4e4; border-radius: 4px; }
figcaption { color: #666; font-size: .9em; margin-top: .3em; }
footer { margin-top: 3em; color: #888; font-size: .85em; }
"""


def render(r: Report) -> str:
    """The report as one HTML document (images inline: it can be mailed or archived)."""
    reader = RootReader(r.root)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sections = [
        ("overview", "Overview", _section_overview(r)),
        ("metrics", "Results against baselines", _section_metrics(r)),
        *([("sweeps", "Sweeps: the grid, the selection", section_sweeps(r, reader))]
          if r.by_kind("sweep") else []),
        *([("ablation", "Ablation: the points compared", section_ablation(r, reader))]
          if r.plan.ablation else []),
        ("plan", "Plan: stages and key parameters", _section_plan(r)),
        ("time", "Time: estimated and actual", _section_time(r)),
        ("curves", "Training curves", _section_curves(r)),
        ("data", "Data and bad input", _section_data(r)),
        ("artifacts", "Artifacts", _section_artifacts(r, reader)),
        ("tensorboard", "TensorBoard", _section_tensorboard(r)),
    ]
    nav = "".join(f"<a href='#{sid}'>{esc(title)}</a>" for sid, title, _ in sections)
    body = "".join(f"<h2 id='{sid}'>{esc(title)}</h2>{content}"
                   for sid, title, content in sections)
    title = f"runexp report: {r.plan.experiment}"
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{esc(title)}</h1><div class='muted'>generated {esc(now)} from "
            f"<code>{esc(r.root)}</code></div><nav>{nav}</nav>{body}"
            f"<footer>runexp report · <code>runexp report {esc(r.root)}</code> writes it "
            f"again</footer></body></html>\n")
