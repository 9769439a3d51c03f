"""The parameter tables of docs/STAGES.md, made from the specs (a test keeps them equal).

    python -m runexp.compiler.specs.docs --write docs/STAGES.md   # refresh the tables
"""

from __future__ import annotations

import argparse
import re
import sys

from runexp.compiler.kinds import KINDS
from runexp.compiler.specs.base import REQUIRED
from runexp.compiler.specs.phases import PHASE_SETTINGS
from runexp.compiler.specs.source_formats import RECORD_FILES, SOURCE_FORMATS, TEXT_FILES

BEGIN = "<!-- params:{kind} (made by: python -m runexp.compiler.specs.docs) -->"
END = "<!-- /params -->"
PHASES = "phases"  # the table of what a pretraining phase may set (train.phases)
FORMATS = "formats"  # the table of source formats (compiler/specs/source_formats.py)


def _value(value) -> str:
    return "required" if value is REQUIRED else f"`{value!r}`"


def _type_and_bounds(p) -> tuple[str, str]:
    kind_text = p.type + (" or None" if p.optional else "")
    if p.choices:
        kind_text = " \\| ".join(repr(c) for c in p.choices)
    bounds = ", ".join(b for b in (
        f"≥ {p.minimum:g}" if p.minimum is not None else "",
        f"≤ {p.maximum:g}" if p.maximum is not None else "") if b)
    return kind_text, bounds


def params_table(kind: str) -> str:
    """A markdown table of the kind's params: name, type, default, gin parameter, doc."""
    spec, configurable = KINDS[kind].spec, KINDS[kind].configurable
    rows = ["| param | type | default | set by | what |", "| --- | --- | --- | --- | --- |"]
    for s in spec.settings():
        p = s.param
        kind_text, bounds = _type_and_bounds(p)
        if s.gin is None:
            source = "derived"
        elif not s.planned:
            source = "run time"
        elif "." in s.gin:
            source = f"`{s.gin}`"
        else:
            source = f"`{configurable}.{s.gin}`"
        if s.phase:
            source += f", a phase's `'{s.gin}'`"
        doc = p.doc + (f" ({bounds})" if bounds else "")
        rows.append(f"| `{s.name}` | {kind_text} | {_value(p.default)} | {source} | {doc} |")
    return "\n".join(rows)


def phases_table() -> str:
    """A markdown table of what a pretraining phase may set: key, the stage param it sets,
    type, the value when the phase leaves it out, doc."""
    rows = ["| key | sets | type | when left out | what |", "| --- | --- | --- | --- | --- |"]
    for key, (kind, s) in PHASE_SETTINGS.items():
        kind_text, bounds = _type_and_bounds(s.param)
        unset = f"`{KINDS[kind].configurable}.{s.gin}`"
        doc = s.param.doc + (f" ({bounds})" if bounds else "")
        rows.append(f"| `'{key}'` | {kind} `{s.name}` | {kind_text} | {unset} | {doc} |")
    return "\n".join(rows)


def formats_table() -> str:
    """A markdown table of the source formats: what each reads, the settings besides
    ``format`` it reads, and whether runexp makes its instances."""
    rows = ["| format | input | settings | instances |", "| --- | --- | --- | --- |"]
    for f in SOURCE_FORMATS.values():
        files = ("; `train_files`, `validation_files`" if f.reads in (TEXT_FILES, RECORD_FILES)
                 else "; read at run time")
        settings = ", ".join(f"`{s}`" for s in f.settings) or "none"
        made = "made by runexp" if f.makes_instances else "ready-made (`VOCAB` required)"
        rows.append(f"| `{f.name}` | {f.doc}{files} | {settings} | {made} |")
    return "\n".join(rows)


def refresh(text: str) -> str:
    """``text`` with every generated table replaced by the current one."""
    for kind in [*KINDS, PHASES, FORMATS]:
        if kind == FORMATS:
            table = formats_table()
        elif kind == PHASES:
            table = phases_table()
        else:
            table = params_table(kind)
        pattern = re.compile(re.escape(BEGIN.format(kind=kind)) + r"\n.*?" + re.escape(END),
                             re.S)
        text = pattern.sub(lambda _: f"{BEGIN.format(kind=kind)}\n{table}\n{END}", text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--write", metavar="FILE", help="refresh the tables in FILE")
    args = parser.parse_args(argv)
    if args.write:
        with open(args.write, encoding="utf-8") as f:
            text = f.read()
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(refresh(text))
        return 0
    for kind in KINDS:
        print(f"## {kind}\n\n{params_table(kind)}\n")
    print(f"## {PHASES} (train.phases)\n\n{phases_table()}\n")
    print(f"## {FORMATS} (bert_pretraining_task.format)\n\n{formats_table()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
