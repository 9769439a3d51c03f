"""The generated tables of docs/STAGES.md: each kind's params (its spec) and summary (its
summary record), the phases, the source formats and the bad-input kinds (a test keeps them
equal).

    python -m runexp.compiler.specs.docs --write docs/STAGES.md   # refresh the tables
"""

from __future__ import annotations

import argparse
import re
import sys

from runexp.compiler.kinds import KINDS
from runexp.compiler.specs.bad_input import BAD_INPUT_KINDS
from runexp.compiler.specs.base import REQUIRED
from runexp.compiler.specs.phases import PHASE_SETTINGS
from runexp.compiler.specs.source_formats import RECORD_FILES, SOURCE_FORMATS, TEXT_FILES

BEGIN = "<!-- params:{kind} (made by: python -m runexp.compiler.specs.docs) -->"
END = "<!-- /params -->"
PHASES = "phases"  # the table of what a pretraining phase may set (train.phases)
FORMATS = "formats"  # the table of source formats (compiler/specs/source_formats.py)
BAD_INPUT = "bad_input"  # the table of bad-input kinds (compiler/specs/bad_input.py)
SUMMARY_BEGIN = "<!-- summary:{kind} (made by: python -m runexp.compiler.specs.docs) -->"
SUMMARY_END = "<!-- /summary -->"


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


def _summary_type(annotation: str) -> str:
    match = re.fullmatch(r"Optional\[(.*)\]", annotation.replace(" ", ""))
    base = match.group(1) if match else annotation
    return base if base in ("int", "float", "str", "bool", "list", "any") else "object"


def summary_table(kind: str) -> str:
    """A markdown table of the kind's summary: key (nested ones dotted), type, whether it is
    always written, doc."""
    rows = ["| key | type | written | what |", "| --- | --- | --- | --- |"]
    for key in KINDS[kind].summary.keys():
        rows.append(f"| `{key.name}` | {_summary_type(key.type)} | "
                    f"{'when set' if key.optional else 'always'} | {key.doc} |")
    return "\n".join(rows)


def bad_input_table() -> str:
    """A markdown table of the bad-input kinds: the summary's key, which readers count it,
    what the report calls it, and what it means and what to do."""
    rows = ["| kind | counted by | the report's name | what it means, what to do |",
            "| --- | --- | --- | --- |"]
    for k in BAD_INPUT_KINDS.values():
        rows.append(f"| `{k.name}` | {k.counted} | {k.label} | {k.meaning} |")
    return "\n".join(rows)


def _tables():
    """(begin marker, end marker, table) of every generated table."""
    for kind in KINDS:
        yield BEGIN.format(kind=kind), END, params_table(kind)
        yield SUMMARY_BEGIN.format(kind=kind), SUMMARY_END, summary_table(kind)
    yield BEGIN.format(kind=PHASES), END, phases_table()
    yield BEGIN.format(kind=FORMATS), END, formats_table()
    yield BEGIN.format(kind=BAD_INPUT), END, bad_input_table()


def refresh(text: str) -> str:
    """``text`` with every generated table replaced by the current one."""
    for begin, end, table in _tables():
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
        text = pattern.sub(lambda _: f"{begin}\n{table}\n{end}", text)
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
        print(f"## {kind}\n\n{params_table(kind)}\n\nsummary:\n\n{summary_table(kind)}\n")
    print(f"## {PHASES} (train.phases)\n\n{phases_table()}\n")
    print(f"## {FORMATS} (bert_pretraining_task.format)\n\n{formats_table()}\n")
    print(f"## {BAD_INPUT} (the preprocess summary's)\n\n{bad_input_table()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
