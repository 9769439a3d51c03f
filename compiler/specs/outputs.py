"""How a stage's summary is declared once: each key, its type and a one-line doc.

A summary is a frozen dataclass whose fields are made with `output(...)`, declared beside
the stage's spec (compiler/specs/<kind>.py) and named by its kind (`StageKind.summary`,
compiler/kinds.py). Everything else follows from it:

- a handler returns the record (or, for the handlers that build a dict, a dict the
  executor checks against the record: a key it does not declare is a programming error);
- the executor writes ``to_dict()`` into MANIFEST.json under "summary";
- status, the report, `runexp diff` and the console's "Results" read it back with
  ``read``, which is tolerant: a key it does not declare is ignored and a missing one is
  None, so manifests written before a key existed (or after one was retired) still render;
- docs/STAGES.md's summary tables (compiler/specs/docs.py, checked by a test).

No summary key is spelled as a string outside its declaration and its writer
(tests/test_declared_outputs.py).

Standard library only.

Usage:
    @dataclasses.dataclass(frozen=True)
    class VocabSummary(Summary):
        vocab_size: Optional[int] = output("tokens in the vocabulary")
        warning: Optional[str] = output("why the vocab looks wrong", optional=True)

    VocabSummary.read({"vocab_size": 8000, "retired": 1}).vocab_size   # 8000
    VocabSummary(vocab_size=8000).to_dict()                           # {"vocab_size": 8000}
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping, Optional


def output(doc: str, *, optional: bool = False, record: Optional[type] = None,
           each: Optional[type] = None, spread: Optional[type] = None,
           keys: Optional[tuple] = None, named: str = "name") -> Any:
    """A summary field (None unless set).

    Args:
      doc: one line: what it is.
      optional: written only when set (not None); otherwise written always, None as null.
      record: its value is a mapping read as this Summary.
      each: its value maps names (a split, a task, a dev set) to mappings read as this
        Summary.
      spread: its keys are written at the top level of the summary, not under the field's
        name, and the keys the other fields do not declare are read into it: a Summary
        type, or dict for a plain mapping.
      keys: for a spread mapping, the keys it holds (None: any); others are not read.
      named: what the names of ``each`` or of a spread mapping's keys are, for the docs
        (``dev_sets.<name>.examples``, ``<metric>``).
    """
    if spread is not None and spread is not dict:
        record = spread
    meta = {"doc": doc, "optional": optional, "record": record, "each": each,
            "spread": spread is not None, "keys": keys, "named": named}
    if spread is None:
        return dataclasses.field(default=None, metadata=meta)
    return dataclasses.field(default_factory=spread, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Key:
    """One declared key, as the docs and the tests see it."""

    name: str       # "dev_sets.<name>.examples" for a nested one
    type: str       # the annotation
    doc: str
    optional: bool


class Summary:
    """Base of every summary record: the tolerant reader, the writer and the checks."""

    @classmethod
    def _fields(cls) -> tuple:
        return dataclasses.fields(cls)

    @classmethod
    def _spread(cls):
        return next((f for f in cls._fields() if f.metadata["spread"]), None)

    @classmethod
    def _from_value(cls, value: Any) -> "Summary":
        """The record of a value that is not a mapping (a format older than the record):
        every field None unless a subclass knows better."""
        return cls()

    @classmethod
    def read(cls, data: Any) -> "Summary":
        """The record of ``data`` (a summary as MANIFEST.json holds it, or a handler's
        metrics.json): keys it does not declare are ignored, missing ones are None. A record
        of this class is returned as it is."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, Mapping):
            return cls._from_value(data) if data is not None else cls()
        values = {}
        spread = cls._spread()
        for f in cls._fields():
            if f is not spread and f.name in data:
                values[f.name] = _read(f, data[f.name])
        if spread is not None:
            names, allowed = {f.name for f in cls._fields()}, spread.metadata["keys"]
            rest = {k: v for k, v in data.items()
                    if k not in names and (allowed is None or k in allowed)}
            record = spread.metadata["record"]
            values[spread.name] = record.read(rest) if record else rest
        return cls(**values)

    def to_dict(self) -> dict:
        """The summary as MANIFEST.json holds it: fields in declaration order, a spread
        field's keys in its place, optional fields only when set."""
        out: dict = {}
        for f in self._fields():
            value = getattr(self, f.name)
            if f.metadata["spread"]:
                out.update(_plain(value))
            elif value is not None or not f.metadata["optional"]:
                out[f.name] = _plain(value)
        return out

    @classmethod
    def undeclared(cls, data: Mapping, where: str = "") -> list[str]:
        """The keys of ``data`` (a handler's summary) this record does not declare, dotted
        (``eval.accuracy``); nested records are checked too."""
        wrong = []
        spread = cls._spread()
        names = {f.name for f in cls._fields()}
        for key, value in data.items():
            f = next((f for f in cls._fields() if f.name == key and f is not spread), None)
            if f is None:
                continue
            if f.metadata["record"] and isinstance(value, Mapping):
                wrong += f.metadata["record"].undeclared(value, f"{where}{key}.")
            elif f.metadata["each"] and isinstance(value, Mapping):
                for name, item in value.items():
                    if isinstance(item, Mapping):
                        wrong += f.metadata["each"].undeclared(item, f"{where}{key}.{name}.")
        rest = {k: v for k, v in data.items() if k not in names}
        if spread is None:
            return wrong + [where + k for k in rest]
        record, allowed = spread.metadata["record"], spread.metadata["keys"]
        if record is not None:
            return wrong + record.undeclared(rest, where)
        return wrong + [where + k for k in rest if allowed is not None and k not in allowed]

    @classmethod
    def keys(cls, prefix: str = "", _shown: Optional[dict] = None) -> Iterator[Key]:
        """Every declared key, nested ones dotted (``dev_sets.<name>.examples``), in
        declaration order; a spread mapping's keys in its place, as ``<named>``; a record
        met a second time (a second split) by its first name only."""
        shown = {} if _shown is None else _shown
        for f in cls._fields():
            meta = f.metadata
            if meta["spread"] and meta["record"] is not None:
                yield from meta["record"].keys(prefix, shown)
                continue
            if meta["spread"]:
                listed = ", ".join(meta["keys"] or ())
                yield Key(f"{prefix}<{meta['named']}>", "any",
                          meta["doc"] + (f": {listed}" if listed else ""), True)
                continue
            record = meta["record"] or meta["each"]
            inner = f"{prefix}{f.name}." + (f"<{meta['named']}>." if meta["each"] else "")
            doc = meta["doc"]
            if record is not None and record in shown:
                doc += f" (keys as `{shown[record]}`)"
            yield Key(prefix + f.name, f.type if isinstance(f.type, str) else f.type.__name__,
                      doc, meta["optional"])
            if record is not None and record not in shown:
                shown[record] = prefix + f.name
                yield from record.keys(inner, shown)

    @classmethod
    def names(cls) -> set:
        """Every key name it declares, nested ones and a spread mapping's listed keys too
        (what tests/test_declared_outputs.py looks for)."""
        out = set()
        for f in cls._fields():
            meta = f.metadata
            if not meta["spread"]:
                out.add(f.name)
            out.update(meta["keys"] or ())
            for record in (meta["record"], meta["each"]):
                if record is not None:
                    out |= record.names()
        return out

    def entries(self, of: type) -> dict:
        """The fields holding an ``of`` record that are set, by name, in declaration order
        (a summary's splits)."""
        return {f.name: getattr(self, f.name) for f in self._fields()
                if f.metadata["record"] is of and getattr(self, f.name) is not None}


def _read(f, value: Any) -> Any:
    meta = f.metadata
    if meta["record"] is not None:
        return meta["record"].read(value) if value is not None else None
    if meta["each"] is not None:
        if not isinstance(value, Mapping):
            return None
        return {name: meta["each"].read(item) for name, item in value.items()}
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, Summary):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
