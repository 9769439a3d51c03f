"""The HTML report of an experiment's output root: one self-contained file.

What it shows, from the files the run left (nothing is recomputed but the curves' figures):
- the plan: experiment, accelerator, gin files and overrides, each stage with its key
  parameters and whether it is done (``plan.json``; a stage is done when its ``COMPLETED``
  holds the plan's fingerprint);
- time per stage, estimated (compiler/estimates.py, training stages) against actual
  (``MANIFEST.json`` ``seconds``), and money where the accelerator profile has a price;
- the metrics against their baselines (MANIFEST summaries of evaluate, pretrain, finetune);
- each training stage's curves (runexp.runtime.report.curves), drawn again from its logs
  with every reference known now, embedded as PNG data URIs;
- the data: corpus, vocab and preprocess counts, and the bad input the preprocess stages
  counted (``bad_input``);
- the artifacts of the export stage and how to load them, and the TensorBoard command.

Usage:
    report = collect("runexp_output/quickstart")      # local path or gs://
    html = render(report)

Reads through the storage layer on gs:// (runexp.runtime.storage.read_text: no TensorFlow);
local roots with plain file reads. A stage directory is found under the given root even when
the experiment was moved or copied since it ran (the plan's own paths are rebased onto it).
"""

from __future__ import annotations

from runexp.compiler.specs import FinetuneSpec, TrainSpec

import base64
import dataclasses
import datetime
import html
import json
import math
import os
from typing import Any, Callable, Optional

from runexp.compiler.plan import COMPLETED_FILE, MANIFEST_FILE, Plan, Stage
from runexp.runtime.report import curves

PLAN_FILE = "plan.json"
REPORT_FILE = "report.html"
STARTED_FILE = "STARTED.json"
_BOOKKEEPING = (STARTED_FILE, MANIFEST_FILE, COMPLETED_FILE)

DONE, OUT_OF_DATE, STARTED, NOT_STARTED = "done", "out of date", "started", "not started"
_STATUS_TEXT = {DONE: "done", OUT_OF_DATE: "not done: holds an earlier build",
                STARTED: "not done: started, not finished", NOT_STARTED: "not done"}

# The parameters shown for each kind, in this order (None values are left out).
KEY_PARAMS = {
    "corpus": ("source", "files", "finetune_classes", "heldout_fraction"),
    "vocab": ("vocab_size", "model_type", "vocab_path", "do_lower_case", "max_sentences"),
    "preprocess": ("task", "format", "max_seq_length", "max_predictions_per_seq",
                   "masked_lm_prob", "dupe_factor", "pair_objective", "dynamic_masking",
                   "whole_word_masking"),
    "pretrain": ("train_steps", "batch_size", "learning_rate", "warmup_steps", "optimizer",
                 "max_seq_length", "compute_dtype", "eval_every", "init_checkpoint",
                 "mixture_rates"),
    "evaluate": ("max_examples", "batch_size"),
    "finetune": ("task", "train_steps", "batch_size", "learning_rate", "warmup_steps",
                 "max_seq_length", "init_checkpoint"),
    "export": (),
}


class RootReader:
    """Reads files under an experiment root, local or gs://. ``text`` and ``data`` return
    None for a missing file; ``files`` lists a directory as [(relative path, size)]."""

    def __init__(self, root: str):
        self.root = root.rstrip("/") or "/"
        self.gcs = self.root.startswith("gs://")
        if self.gcs:
            from runexp.runtime import storage

            self._storage = storage

    def join(self, *parts: str) -> str:
        if self.gcs:
            return "/".join([parts[0].rstrip("/"), *parts[1:]])
        return os.path.join(*parts)

    def data(self, path: str) -> Optional[bytes]:
        if self.gcs:
            try:
                return self._storage.read_bytes(path)
            except (OSError, self._storage.StorageError):
                return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def text(self, path: str) -> Optional[str]:
        raw = self.data(path)
        return None if raw is None else raw.decode("utf-8", "replace")

    def files(self, directory: str) -> list[tuple[str, int]]:
        out = []
        if self.gcs:
            from runexp.runtime.storage import list_objects

            prefix = directory.rstrip("/") + "/"
            try:
                for uri, blob in list_objects(directory):
                    out.append((uri[len(prefix):], int(getattr(blob, "size", 0) or 0)))
            except (OSError, self._storage.StorageError):
                return []
            return sorted(out)
        for dirpath, _, names in os.walk(directory):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    size = os.path.getsize(path)
                except OSError:
                    continue
                out.append((os.path.relpath(path, directory).replace(os.sep, "/"), size))
        return sorted(out)


@dataclasses.dataclass
class StageReport:
    stage: Stage
    dir: str  # the stage directory under the root given
    status: str
    manifest: dict
    logs: Optional[curves.Logs] = None
    curves_png: Optional[bytes] = None
    curves_error: str = ""

    @property
    def summary(self) -> dict:
        return self.manifest.get("summary") or {}

    @property
    def done(self) -> bool:
        return self.status == DONE


@dataclasses.dataclass
class Report:
    root: str
    plan: Plan
    stages: list  # StageReport, in plan order
    estimates: dict  # stage id -> Estimate
    estimate_error: str = ""

    def by_kind(self, kind: str) -> list:
        return [s for s in self.stages if s.stage.kind == kind]

    def get(self, stage_id: str) -> Optional[StageReport]:
        return next((s for s in self.stages if s.stage.id == stage_id), None)


class NoExperiment(Exception):
    """The root holds no readable plan.json."""


def _rebase(path: str, plan_root: str, root: str) -> str:
    """A path of the plan, moved under ``root`` when the experiment is read from elsewhere."""
    plan_root = plan_root.rstrip("/")
    if path == plan_root:
        return root
    if plan_root and path.startswith(plan_root + "/"):
        rest = path[len(plan_root) + 1:]
        return f"{root}/{rest}" if root.startswith("gs://") else os.path.join(root, rest)
    return path


def _status(reader: RootReader, stage: Stage, directory: str) -> tuple[str, dict]:
    completed = reader.text(reader.join(directory, COMPLETED_FILE))
    manifest: dict = {}
    text = reader.text(reader.join(directory, MANIFEST_FILE))
    if text:
        try:
            manifest = json.loads(text)
        except ValueError:
            manifest = {}
    if completed is not None and manifest:
        if completed.strip() == stage.fingerprint or not stage.fingerprint:
            return DONE, manifest
        return OUT_OF_DATE, manifest
    if reader.text(reader.join(directory, STARTED_FILE)) is not None:
        return STARTED, {}
    return NOT_STARTED, {}


def collect(root: str, draw: bool = True) -> Report:
    """Everything the report shows, read from ``root``. Raises NoExperiment."""
    reader = RootReader(root)
    root = reader.root
    text = reader.text(reader.join(root, PLAN_FILE))
    if text is None:
        raise NoExperiment(f"{root} holds no runexp experiment (no {PLAN_FILE})")
    try:
        plan = Plan.from_json(text)
    except (ValueError, KeyError, TypeError) as e:
        raise NoExperiment(f"{reader.join(root, PLAN_FILE)} is not a plan runexp can read: {e}")
    stages = []
    for stage in plan.stages:
        directory = _rebase(stage.output_dir, plan.output_root, root)
        status, manifest = _status(reader, stage, directory)
        sr = StageReport(stage, directory, status, manifest)
        if stage.kind in curves.PANELS:
            sr.logs = curves.read_logs(directory, reader.text)
        stages.append(sr)
    estimates, error = {}, ""
    try:
        from runexp.compiler.estimates import estimates as plan_estimates

        estimates = plan_estimates(plan)
    except Exception as e:  # noqa: BLE001 - the report goes on without estimates
        error = f"{type(e).__name__}: {e}"
    report = Report(root, plan, stages, estimates, error)
    if draw:
        summaries = {s.stage.id: s.summary for s in stages if s.summary}
        for sr in stages:
            if sr.logs:
                try:
                    fig = curves.curves_figure(
                        sr.stage.kind, sr.logs, curves.references(plan, sr.stage, summaries),
                        title=curves.stage_title(plan, sr.stage, sr.logs),
                        total_steps=sr.stage.params.get("train_steps"))
                    sr.curves_png = curves.figure_png(fig)
                except Exception as e:  # noqa: BLE001 - the stage's own PNG, if any
                    sr.curves_error = f"{type(e).__name__}: {e}"
                    sr.curves_png = reader.data(reader.join(sr.dir, curves.CURVES_FILE))
    return report


# --- formatting -----------------------------------------------------------------------------

def _e(value: Any) -> str:
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


def _pct(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.1%}"


def _model(model: dict) -> str:
    from runexp.compiler.model_sizes import parameter_count

    try:
        n = parameter_count(model)
        size = f", {n / 1e6:.1f} M parameters" if n >= 1e5 else f", {n:,} parameters"
    except (KeyError, TypeError):
        size = ""
    return (f"{model.get('num_hidden_layers')} layers, hidden {model.get('hidden_size')}, "
            f"{model.get('num_attention_heads')} heads, vocab {model.get('vocab_size')}{size}")


def key_params(stage: Stage) -> list[tuple[str, str]]:
    p = stage.params
    names = KEY_PARAMS.get(stage.kind)
    if names is None:  # a kind this report does not know: its scalar params
        names = tuple(k for k, v in p.items() if isinstance(v, (str, int, float, bool)))[:8]
    out = [(k, _value(p[k])) for k in names if p.get(k) is not None]
    if stage.kind in ("pretrain", "finetune") and isinstance(p.get("model"), dict):
        out.insert(0, ("model", _model(p["model"])))
    if stage.kind == "corpus" and not out:
        out = [(k, _value(v)) for k, v in p.items() if isinstance(v, (str, int, float))][:4]
    return out


def _path(path: str) -> str:
    """A path, escaped, that may wrap after each / and . (long stage directories)."""
    return _e(path).replace("/", "/<wbr>").replace(".", ".<wbr>")


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def _status_badge(sr: StageReport, note: bool = True) -> str:
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
    return f"{badge}<div class='muted small'>{_e(detail)}</div>"


def _compare(value: Optional[float], baseline: Optional[float], higher_is_better=True,
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
    return f'<span class="{"good" if better else "bad"}" title="{verdict}">{_e(text)}</span>'


# --- sections -------------------------------------------------------------------------------

def _section_overview(r: Report) -> str:
    plan, done = r.plan, sum(s.done for s in r.stages)
    acc = plan.accelerator or {}
    seconds = sum(s.manifest.get("seconds", 0) or 0 for s in r.stages if s.done)
    rows = [
        ("output root", f"<code>{_e(r.root)}</code>"),
        ("stages", f"{done} of {len(r.stages)} done"
                   + ("" if done == len(r.stages) else
                      " — run the same command again to build the rest (training continues "
                      "from its latest checkpoint)")),
        ("accelerator", _e(f"{acc.get('name', '?')} ({acc.get('type', '?')}, "
                           f"{acc.get('replicas', '?')} replica(s))") if acc else "—"),
        ("time of the stages done", _e(duration(seconds))),
        ("gin files", "<br>".join(f"<code>{_e(f)}</code>" for f in plan.gin_files) or "—"),
        ("overrides", "<br>".join(f"<code>{_e(p)}</code>" for p in plan.gin_params) or "none"),
    ]
    if plan.warnings:
        rows.append(("plan warnings", "<br>".join(_e(w) for w in plan.warnings)))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _section_plan(r: Report) -> str:
    rows = []
    for sr in r.stages:
        params = "".join(f"<div><span class='k'>{_e(k)}</span> {_e(v)}</div>"
                         for k, v in key_params(sr.stage)) or "<span class='muted'>—</span>"
        deps = ", ".join(sr.stage.deps) or "—"
        kind = "" if sr.stage.kind == sr.stage.id else \
            f"<div class='muted'>{_e(sr.stage.kind)}</div>"
        rows.append(f"<tr id='stage-{_e(sr.stage.id)}'><td><b>{_e(sr.stage.id)}</b>{kind}</td>"
                    f"<td>{_status_badge(sr)}</td><td class='params'>{params}</td>"
                    f"<td>{_e(deps)}</td><td><code class='path'>{_path(sr.dir)}</code></td></tr>")
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
        if sr.done and sr.summary.get("resumed_from"):
            note = "resumed: the last attempt only"
        elif not sr.done:
            note = _STATUS_TEXT[sr.status]
            if sr.logs and sr.logs.last_step:
                note += f" (last logged step {sr.logs.last_step:,})"
        cost = ""
        if price:
            est_cost = (f"${est.usd:,.2f} (${est.usd_preemptible:,.2f} preemptible)"
                        if est is not None and est.usd is not None else "—")
            cost = (f"<td class='num'>{_e(est_cost)}</td>"
                    f"<td class='num'>{_e(_usd(act_s, price))}</td>")
        if est_s is not None and act_s is not None:
            est_total += est_s
            est_actual += act_s
        all_actual += act_s or 0.0
        rows.append(f"<tr><td>{_e(sr.stage.id)}</td><td class='num'>{_e(duration(est_s))}</td>"
                    f"<td class='num'>{_e(duration(act_s))}</td>"
                    f"<td class='num'>{_e(_ratio(act_s, est_s))}</td>{cost}"
                    f"<td class='muted'>{_e(note)}</td></tr>")
    cost_head = "<th>estimated cost</th><th>actual cost (on demand)</th>" if price else ""
    if est_total:
        cost = (f"<td></td><td class='num'>{_e(_usd(est_actual, price))}</td>" if price else "")
        rows.append(f"<tr class='total'><td>training stages (estimated and done)</td>"
                    f"<td class='num'>{_e(duration(est_total))}</td>"
                    f"<td class='num'>{_e(duration(est_actual))}</td>"
                    f"<td class='num'>{_e(_ratio(est_actual, est_total))}</td>{cost}"
                    f"<td></td></tr>")
    cost = (f"<td></td><td class='num'>{_e(_usd(all_actual, price))}</td>" if price else "")
    rows.append(f"<tr class='total'><td>all stages done</td><td class='num'>—</td>"
                f"<td class='num'>{_e(duration(all_actual))}</td><td></td>{cost}<td></td></tr>")
    notes = [
        "Estimates exist for training stages only: FLOPs per step at an assumed fraction of "
        f"the {_e(acc.get('name', 'accelerator'))}'s peak (compiler/estimates.py); they are "
        "meant to catch mistakes of 10×, not to be exact. Actual: each stage's "
        "<code>MANIFEST.json</code> <code>seconds</code>, set-up included."]
    if not price:
        notes.append(f"No price is known for the {_e(acc.get('name', 'accelerator'))} "
                     "profile, so no cost is shown.")
    if r.estimate_error:
        notes.append(f"Estimates could not be made: {_e(r.estimate_error)}")
    return ("<table><thead><tr><th>stage</th><th>estimated</th><th>actual</th>"
            f"<th>actual / estimated</th>{cost_head}<th></th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>"
            + "".join(f"<p class='note'>{n}</p>" for n in notes))


def _metric_rows(r: Report) -> list[tuple]:
    """(stage id, metric, value, baseline text, comparison html)."""
    rows = []
    chance = curves.nsp_chance(r.plan)
    for sr in r.stages:
        s, sid = sr.summary, sr.stage.id
        if sr.stage.kind == "evaluate" and sr.done:
            base = s.get("majority_token_accuracy")
            at = f" (step {s['step']:,}, {s.get('examples', '?'):,} examples)" \
                if isinstance(s.get("step"), int) and isinstance(s.get("examples"), int) else ""
            rows.append((sid, "held-out MLM accuracy" + at, _pct(s.get("mlm_accuracy")),
                         f"most frequent token: {_pct(base)}",
                         _compare(s.get("mlm_accuracy"), base)))
            if s.get("nsp_accuracy") is not None:
                rows.append((sid, "held-out NSP accuracy", _pct(s["nsp_accuracy"]),
                             f"chance: {_pct(chance)}" if chance else "—",
                             _compare(s["nsp_accuracy"], chance)))
            vocab = (sr.stage.params.get("model") or {}).get("vocab_size")
            if s.get("mlm_loss") is not None:
                uniform = math.log(vocab) if vocab else None
                rows.append((sid, "held-out MLM loss", f"{s['mlm_loss']:.3f}",
                             f"uniform guess: ln {vocab} = {uniform:.3f}" if uniform else "—",
                             _compare(s["mlm_loss"], uniform, higher_is_better=False,
                                      percent=False)))
            for task, ts in (s.get("tasks") or {}).items():
                tb = ts.get("majority_token_accuracy", base)
                rows.append((sid, f"held-out MLM accuracy, task {task}",
                             _pct(ts.get("mlm_accuracy")), f"most frequent token: {_pct(tb)}",
                             _compare(ts.get("mlm_accuracy"), tb)))
        elif sr.stage.kind == "pretrain" and sr.done:
            ev = next((e for e in r.by_kind("evaluate")
                       if e.stage.inputs.get("checkpoint_dir") == sr.stage.output_dir), None)
            base = ev.summary.get("majority_token_accuracy") if ev is not None else None
            if s.get("mlm_accuracy") is not None:
                rows.append((sid, "MLM accuracy, last training window",
                             _pct(s["mlm_accuracy"]),
                             f"most frequent token: {_pct(base)}" if base else "—",
                             _compare(s["mlm_accuracy"], base)))
            held = s.get("eval") or {}
            if held.get("mlm_accuracy") is not None:
                rows.append((sid, "MLM accuracy, last in-training held-out evaluation",
                             _pct(held["mlm_accuracy"]),
                             f"most frequent token: {_pct(base)}" if base else "—",
                             _compare(held["mlm_accuracy"], base)))
            if s.get("loss") is not None:
                vocab = (sr.stage.params.get("model") or {}).get("vocab_size")
                uniform = math.log(vocab) + math.log(2) if vocab else None
                rows.append((sid, "training loss (MLM + NSP), last window", f"{s['loss']:.3f}",
                             f"uniform guess: ln {vocab} + ln 2 = {uniform:.3f}"
                             if uniform else "—",
                             _compare(s["loss"], uniform, higher_is_better=False,
                                      percent=False)))
        elif sr.stage.kind == "finetune" and sr.done:
            sets = s.get("dev_sets") or ({"dev": s} if "accuracy" in s else {})
            for name, scores in sets.items():
                n = scores.get("examples")
                rows.append((sid, f"dev accuracy{'' if name == 'dev' else f', {name}'}"
                             + (f" ({n:,} examples)" if isinstance(n, int) else ""),
                             _pct(scores.get("accuracy")),
                             f"majority class: {_pct(scores.get('majority_baseline'))}",
                             _compare(scores.get("accuracy"), scores.get("majority_baseline"))))
    return rows


def _section_metrics(r: Report) -> str:
    rows = _metric_rows(r)
    if not rows:
        return "<p class='muted'>No metrics yet: the evaluate and finetune stages are not done.</p>"
    body = "".join(f"<tr><td>{_e(a)}</td><td>{_e(b)}</td><td class='num'><b>{_e(c)}</b></td>"
                   f"<td>{_e(d)}</td><td class='num'>{e}</td></tr>" for a, b, c, d, e in rows)
    missing = [s.stage.id for s in r.stages
               if s.stage.kind in ("evaluate", "finetune") and not s.done]
    note = (f"<p class='note'>Not done yet, so not scored: {_e(', '.join(missing))}.</p>"
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
        head = f"<h3>{_e(sr.stage.id)} {_status_badge(sr, note=False)}</h3>"
        if sr.curves_png:
            n_train = len(sr.logs.train) if sr.logs else 0
            n_eval = len(sr.logs.evals) if sr.logs else 0
            caption = (f"{n_train} training log records"
                       + (f", {n_eval} held-out evaluations" if n_eval else "")
                       + f" from <code>{_e(curves.TRAIN_LOG)}</code>"
                       + (f" and <code>{_e(curves.EVAL_LOG)}</code>" if n_eval else "")
                       + ". Training metrics are means over each log window.")
            if sr.curves_error:
                caption = (f"Could not be drawn again ({_e(sr.curves_error)}): the stage's own "
                           f"<code>{curves.CURVES_FILE}</code>.")
            parts.append(head + f"<figure>{_img(sr.curves_png, sr.stage.id + ' curves')}"
                         f"<figcaption>{caption}</figcaption></figure>")
        else:
            why = sr.curves_error or "no training log yet"
            parts.append(head + f"<p class='muted'>No curves: {_e(why)}.</p>")
    return "".join(parts) or "<p class='muted'>This experiment has no training stage.</p>"


def _section_data(r: Report) -> str:
    parts = []
    for sr in r.stages:
        s = sr.summary
        if sr.stage.kind == "corpus" and sr.done:
            bits = [f"{split}: {v.get('documents', '?'):,} documents, "
                    f"{v.get('sentences', '?'):,} sentences, {v.get('bytes', 0) / 1e6:.1f} MB"
                    for split, v in sorted(s.items(), key=lambda kv: kv[0] != "train")
                    if isinstance(v, dict) and "documents" in v]
            parts.append(f"<p><b>{_e(sr.stage.id)}</b>: {_e('; '.join(bits) or 'done')}</p>")
        elif sr.stage.kind == "vocab" and sr.done:
            bits = [f"{s.get('type', '?')} vocab of {s.get('vocab_size', '?'):,} tokens"
                    if isinstance(s.get("vocab_size"), int) else f"{s.get('type', '?')} vocab"]
            if s.get("unk_rate") is not None:
                bits.append(f"UNK rate {s['unk_rate']:.3%}")
            if s.get("pieces_per_word") is not None:
                bits.append(f"{s['pieces_per_word']:.2f} pieces per word")
            where = f" (measured on the {s['diagnostics_on']} text)" if s.get("diagnostics_on") \
                else ""
            parts.append(f"<p><b>{_e(sr.stage.id)}</b>: {_e(', '.join(bits) + where)}</p>")
        elif sr.stage.kind == "preprocess":
            if not sr.done:
                parts.append(f"<p><b>{_e(sr.stage.id)}</b>: {_status_badge(sr)}</p>")
                continue
            bits = [f"{split}: {v.get('instances', 0):,} instances from "
                    f"{v.get('documents', 0):,} documents, {v.get('tokens', 0):,} tokens"
                    for split, v in s.items() if isinstance(v, dict) and "instances" in v]
            if s.get("unk_rate") is not None:
                bits.append(f"UNK rate {s['unk_rate']:.3%}")
            parts.append(f"<p><b>{_e(sr.stage.id)}</b>: {_e('; '.join(bits))}</p>")
            parts.append(_bad_input(s.get("bad_input")))
    return "".join(parts) or "<p class='muted'>No data stage is done yet.</p>"


_BAD_INPUT_NAMES = {
    "non_utf8_lines": "lines not in UTF-8 (bad bytes replaced)",
    "giant_lines": "giant lines, over 1 MiB; 64 MiB for jsonl (skipped)",
    "empty_files": "empty files",
    "empty_documents": "documents without a token",
    "invalid_json_lines": "jsonl lines that are not a JSON object (skipped)",
    "missing_text_lines": "jsonl lines without a string in the text field (skipped)",
    "empty_text_lines": "jsonl lines whose text is only whitespace (skipped)",
}


def _bad_input(bad: Optional[dict]) -> str:
    if not isinstance(bad, dict):
        return "<p class='muted'>Bad input: not counted by this stage.</p>"
    rows, total = [], 0
    for kind, info in bad.items():
        info = info if isinstance(info, dict) else {"count": info}
        count = int(info.get("count") or 0)
        total += count
        samples = ", ".join(info.get("samples") or [])
        rows.append(f"<tr><td>{_e(_BAD_INPUT_NAMES.get(kind, kind.replace('_', ' ')))}</td>"
                    f"<td class='num {'bad' if count else ''}'>{count:,}</td>"
                    f"<td><code class='path'>{_e(samples) or '—'}</code></td></tr>")
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
            parts.append(f"<p><b>{_e(sr.stage.id)}</b>: {_status_badge(sr)}</p>")
            continue
        groups: dict[str, list] = {}
        for rel, size in reader.files(sr.dir):
            if rel not in _BOOKKEEPING:
                groups.setdefault(_artifact_group(rel), []).append(size)
        rows = "".join(
            f"<tr><td><code>{_e(name)}</code></td><td class='num'>{_e(_size(sum(sizes)))}</td>"
            f"<td>{_e(_artifact_note(name, len(sizes)))}</td></tr>"
            for name, sizes in sorted(groups.items()))
        parts.append(f"<p><b>{_e(sr.stage.id)}</b> in <code>{_e(sr.dir)}</code> "
                     f"(step {_e(sr.summary.get('step', '?'))}"
                     + (", the fine-tuned encoder" if sr.stage.inputs.get("finetune_dir")
                        else ", the pretrained encoder") + ")</p>"
                     f"<table class='compact'><thead><tr><th>file</th><th>size</th><th></th>"
                     f"</tr></thead><tbody>{rows}</tbody></table>")
        parts.append(_snippets(r, sr, reader))
    return "".join(parts)


def _artifact_group(rel: str) -> str:
    """A directory's files as one row ("encoder/"), a checkpoint's as "prefix.*"."""
    if "/" in rel:
        return rel.split("/", 1)[0] + "/"
    if ".ckpt." in rel:
        return rel[:rel.index(".ckpt.") + len(".ckpt")] + ".*"
    return rel


def _artifact_note(name: str, files: int) -> str:
    note = _ARTIFACT_NOTES.get(name.rstrip("/").split(".")[0], "")
    return f"{note} ({files} files)" if files > 1 and note else (note or (
        f"{files} files" if files > 1 else ""))


_ARTIFACT_NOTES = {
    "encoder": "TF Hub-style SavedModel of the encoder",
    "preprocessing": "SavedModel: text to the encoder's inputs",
    "classifier": "SavedModel of the fine-tuned classifier: text to labels",
    "README": "what each file is and how to load it",
    "saved_model": "TF SavedModel of the encoder (signature serving_default)",
    "bert_model": "checkpoint in google-research/bert's variable layout",
    "bert_config": "the model's shape, google-research/bert's format",
    "vocab": "BERT vocab, one token per line (ids = line numbers)",
    "spm": "the SentencePiece model the vocab was trained as",
}


def _snippets(r: Report, sr: StageReport, reader: RootReader) -> str:
    d = sr.dir
    join = reader.join
    has_spm = any(rel == "spm.model" for rel, _ in reader.files(d))
    finetunes, pretrains = r.by_kind("finetune"), r.by_kind("pretrain")
    seq = (FinetuneSpec.from_stage(finetunes[0].stage).max_seq_length if finetunes else
           TrainSpec.from_stage(pretrains[0].stage).max_seq_length if pretrains else 128)
    saved = f'''import tensorflow as tf
import tensorflow_text  # noqa: F401 - the ops of the preprocessing model

preprocess = tf.saved_model.load("{join(d, 'preprocessing')}")   # text -> encoder inputs
encoder = tf.saved_model.load("{join(d, 'encoder')}")
out = encoder(preprocess(tf.constant(["Return the value of the key."])))
out["pooled_output"]     # [1, hidden]: the [CLS] vector
out["sequence_output"]   # [1, seq, hidden]: one vector per token
out["encoder_outputs"]   # every layer's sequence output'''
    google = f'''# google-research/bert (TensorFlow 1.x), e.g. fine-tuning with run_classifier.py:
python run_classifier.py --task_name=... --data_dir=... --output_dir=... \\
  --do_train=true --do_eval=true --max_seq_length={seq} \\
  --vocab_file={join(d, 'vocab.txt')} \\
  --bert_config_file={join(d, 'bert_config.json')} \\
  --init_checkpoint={join(d, 'bert_model.ckpt')}

# its variables, from TensorFlow 2:
import tensorflow as tf
reader = tf.train.load_checkpoint("{join(d, 'bert_model.ckpt')}")
sorted(reader.get_variable_to_shape_map())   # bert/embeddings/word_embeddings, ...'''
    again = f'''# fine-tune it with runexp, as a released checkpoint (gin/runs/finetune.gin):
include 'runs/finetune.gin'
VOCAB = '{join(d, 'spm.model' if has_spm else 'vocab.txt')}'
INIT_CHECKPOINT = '{join(d, 'bert_model.ckpt')}'
# ... and the model size's gin file, OUTPUT_ROOT and FINETUNE_TASK'''
    spm_note = ("<p class='note'>This vocab was trained with SentencePiece: its "
                "<code>vocab.txt</code> lists the same pieces, but only the SentencePiece "
                "model (<code>spm.model</code>, which runexp's tokenizer loads) splits words "
                "exactly as in training.</p>") if has_spm else ""
    return ("<h3>Loading them</h3><p>The encoder and its preprocessing as SavedModels "
            "(TensorFlow 2; also <code>hub.KerasLayer</code>; the export's README.md has "
            "more):</p>"
            f"<pre>{_e(saved)}</pre><p>The checkpoint in Google's BERT layout, with "
            f"<code>bert_config.json</code> and <code>vocab.txt</code>:</p><pre>{_e(google)}"
            f"</pre>{spm_note}<pre>{_e(again)}</pre>")


def _section_tensorboard(r: Report) -> str:
    return ("<p>Every training stage also wrote TensorBoard summaries (its "
            "<code>tensorboard/</code> directory: the same scalars, and held-out ones under "
            "<code>eval/</code>). To browse them:</p>"
            f"<pre>pip install 'runexp[tensorboard]'\ntensorboard --logdir {_e(r.root)}</pre>")


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
        ("plan", "Plan: stages and key parameters", _section_plan(r)),
        ("time", "Time: estimated and actual", _section_time(r)),
        ("curves", "Training curves", _section_curves(r)),
        ("data", "Data and bad input", _section_data(r)),
        ("artifacts", "Artifacts", _section_artifacts(r, reader)),
        ("tensorboard", "TensorBoard", _section_tensorboard(r)),
    ]
    nav = "".join(f"<a href='#{sid}'>{_e(title)}</a>" for sid, title, _ in sections)
    body = "".join(f"<h2 id='{sid}'>{_e(title)}</h2>{content}"
                   for sid, title, content in sections)
    title = f"runexp report: {r.plan.experiment}"
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><div class='muted'>generated {_e(now)} from "
            f"<code>{_e(r.root)}</code></div><nav>{nav}</nav>{body}"
            f"<footer>runexp report · <code>runexp report {_e(r.root)}</code> writes it "
            f"again</footer></body></html>\n")


def build(root: str) -> str:
    """``collect`` then ``render``: the report of ``root`` as HTML. Raises NoExperiment."""
    return render(collect(root))


def write(root: str, html_text: str, out: Optional[str] = None,
          write_text: Optional[Callable[[str, str], None]] = None) -> str:
    """Writes the report (default ``<root>/report.html``); returns where."""
    root = root.rstrip("/") or "/"
    out = out or (f"{root}/{REPORT_FILE}" if root.startswith("gs://")
                  else os.path.join(root, REPORT_FILE))
    if out.startswith("gs://"):
        from runexp.runtime import storage

        (write_text or storage.write_text)(out, html_text)
        return out
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(html_text)
    os.replace(tmp, out)
    return out
