"""How a setting is declared once: its type, bounds, default, gin name and a one-line doc.

A spec is a frozen dataclass whose fields are made with `setting(...)`. Everything else is
derived from it: the gin parameters the compiler validates (`gin_params`), the params a stage
carries in the plan (the planner takes each field by name), what a handler parses
(`Spec.from_params(stage.params)`), and the parameter lists of docs/STAGES.md (checked by a
test). A nested spec field (`nested(MaskingSpec)`) is flattened: its fields are params of the
outer stage and gin parameters of the outer configurable.

Standard library only: the compiler, the runtime and tasks/ all import specs.

Usage:
    @dataclasses.dataclass(frozen=True)
    class EvaluateSpec(Spec):
        batch_size: int = setting(64, "evaluation batch size", minimum=1)

    EvaluateSpec.from_params({"batch_size": 32}).batch_size  # 32
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator, Mapping, Optional

REQUIRED = object()  # default meaning "must be bound in gin"

# How a field's annotation reads as a gin type.
_TYPES = {"int": "int", "float": "float", "bool": "bool", "str": "str", "dict": "dict",
          "list": "str_list", "tuple": "str_list"}


@dataclasses.dataclass(frozen=True)
class Param:
    """One gin parameter, as the compiler validates it.

    Attributes:
      type: one of "int", "float", "bool", "str", "str_list", "dict", "dict_list".
      default: value when unbound (REQUIRED: must be bound).
      optional: None is allowed.
      choices: allowed values, for enums.
      minimum: smallest allowed number (inclusive).
      maximum: largest allowed number (inclusive).
      doc: one line for `runexp --explain` and errors.
    """

    type: str
    default: Any = REQUIRED
    optional: bool = False
    choices: tuple = ()
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    doc: str = ""


def setting(default: Any, doc: str, *, gin: Optional[str] = "", minimum: Optional[float] = None,
            maximum: Optional[float] = None, choices: tuple = (), mixture: str = "",
            planned: bool = True, phase: bool = False, shown: bool = False) -> Any:
    """A spec field.

    Args:
      default: the one default (lists are given as tuples: specs are frozen).
      doc: one line: what it is, the usual value.
      gin: the gin parameter that sets it: "" for the field's own name on the spec's
        configurable, another name (`"steps"`), `"configurable.param"` for a value bound on
        another configurable, or None when the planner derives it (no gin parameter).
      minimum, maximum, choices: inclusive bounds and allowed values, checked by the compiler
        (with file and line) and again when a handler parses a plan.
      mixture: "same" when every task of a mixture must agree on it; "same_if_dynamic" when
        they must agree if they mask at training time. The text after ":" says why.
      planned: False for values the runtime adds (never in a plan or a fingerprint).
      phase: a pretraining phase may set it (`train.phases`, compiler/specs/phases.py): the
        phase's key is the gin parameter's name.
      shown: one of the stage's key params, shown (in declaration order) beside the stage in
        the report's stage table.
    """
    meta = {"doc": doc, "gin": gin, "minimum": minimum, "maximum": maximum,
            "choices": tuple(choices), "mixture": mixture, "planned": planned, "phase": phase,
            "shown": shown}
    if isinstance(default, (list, dict, set)):
        raise TypeError("spec defaults are immutable: give a tuple")
    return dataclasses.field(default=default, metadata=meta)


def nested(spec: type, doc: str, configurable: str = "") -> Any:
    """A field holding another spec, flattened into the outer one's params. Its settings are
    gin parameters of the outer spec's configurable, or of `configurable` when given (the
    finetune stage takes its task's fields from `classification_task`)."""
    return dataclasses.field(default_factory=spec, metadata={"nested": spec, "doc": doc,
                                                             "configurable": configurable})


def _type_of(annotation: str) -> tuple[str, bool]:
    """("int", optional) from an annotation such as "Optional[int]" or "tuple[str, ...]"."""
    text = annotation.replace(" ", "")
    optional = False
    match = re.fullmatch(r"Optional\[(.*)\]", text)
    if match:
        text, optional = match.group(1), True
    elif text.endswith("|None"):
        text, optional = text[:-5], True
    base = re.match(r"[A-Za-z_]+", text).group(0)
    return _TYPES[base], optional


@dataclasses.dataclass(frozen=True)
class Setting:
    """A leaf field of a (possibly nested) spec, as the derivations see it."""

    name: str            # the param name in the plan
    gin: Optional[str]   # the gin parameter name, "other.param", or None (derived)
    param: Param         # type, bounds, default, doc
    mixture: str
    planned: bool
    phase: bool = False
    shown: bool = False

    @property
    def settable(self) -> bool:
        """Bound on the spec's own configurable (not derived, not another's)."""
        return self.gin is not None and "." not in self.gin


class Spec:
    """Base of every spec: parsing, flattening and the derived gin parameters."""

    @classmethod
    def settings(cls) -> Iterator[Setting]:
        """Every leaf field, nested specs flattened, in declaration order."""
        for f in dataclasses.fields(cls):
            if "nested" in f.metadata:
                owner = f.metadata["configurable"]
                for s in f.metadata["nested"].settings():
                    yield dataclasses.replace(s, gin=f"{owner}.{s.gin}") if owner and \
                        s.settable else s
                continue
            meta = f.metadata
            kind, optional = _type_of(f.type if isinstance(f.type, str) else f.type.__name__)
            default = f.default
            if isinstance(default, tuple):
                default = list(default)
            optional = optional or default is None
            gin = f.name if meta["gin"] == "" else meta["gin"]
            yield Setting(f.name, gin, Param(kind, default, optional, meta["choices"],
                                             meta["minimum"], meta["maximum"], meta["doc"]),
                          meta["mixture"], meta["planned"], meta["phase"], meta["shown"])

    @classmethod
    def param_names(cls, planned_only: bool = True) -> list[str]:
        return [s.name for s in cls.settings() if s.planned or not planned_only]

    @classmethod
    def shown_params(cls) -> list[str]:
        """The key params a report shows beside the stage (`shown=True`), in declaration
        order."""
        return [s.name for s in cls.settings() if s.shown]

    @classmethod
    def choices(cls, name: str) -> tuple:
        """The allowed values of the setting ``name``."""
        return next(s.param.choices for s in cls.settings() if s.name == name)

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of the setting ``name``."""
        return next(s.param.default for s in cls.settings() if s.name == name)

    @classmethod
    def gin_params(cls) -> dict[str, Param]:
        """The gin parameters of the spec's configurable (its settable fields)."""
        return {s.gin: s.param for s in cls.settings() if s.settable and s.planned}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "Spec":
        """The spec of a stage's params. Missing keys take the defaults (plans made before
        a setting existed); a key the spec does not know is an error (a plan from a newer
        runexp, or a typo in a hand-edited plan)."""
        known = set(cls.param_names(planned_only=False))
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown params {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        return cls._build(params)

    @classmethod
    def pick(cls, params: Mapping[str, Any]) -> "Spec":
        """The spec of the settings in ``params`` that are its own (the others ignored):
        a nested spec read from its outer stage's params."""
        return cls._build(params)

    @classmethod
    def _build(cls, params: Mapping[str, Any]) -> "Spec":
        values = {}
        for f in dataclasses.fields(cls):
            if "nested" in f.metadata:
                values[f.name] = f.metadata["nested"]._build(params)
            elif f.name in params:
                value = params[f.name]
                values[f.name] = tuple(value) if isinstance(value, list) else value
        spec = cls(**values)
        spec._check_values()
        return spec

    def _check_values(self, skip: tuple = ()) -> None:
        """Choices and bounds, for plans edited by hand or made by another runexp (the
        compiler checks what gin binds, with file and line)."""
        for f in dataclasses.fields(self):
            if "nested" in f.metadata or f.name in skip:
                continue
            value, meta = getattr(self, f.name), f.metadata
            where = f"{type(self).__name__}.{f.name}"
            if value is None:
                continue
            if meta["choices"] and value not in meta["choices"]:
                raise ValueError(f"{where} must be one of {', '.join(map(repr, meta['choices']))}"
                                 f"; got {value!r}")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if meta["minimum"] is not None and value < meta["minimum"]:
                    raise ValueError(f"{where} must be at least {meta['minimum']:g}; got {value!r}")
                if meta["maximum"] is not None and value > meta["maximum"]:
                    raise ValueError(f"{where} must be at most {meta['maximum']:g}; got {value!r}")

    @classmethod
    def of(cls, **params: Any) -> "Spec":
        """``from_params`` of keyword arguments: ``PreprocessSpec.of(masked_lm_prob=0.2)``."""
        return cls.from_params(params)

    @classmethod
    def from_stage(cls, stage: Any) -> "Spec":
        """The spec of a plan Stage (or anything with `.params`, e.g. a StageContext)."""
        return cls.from_params(stage.params)

    def to_params(self) -> dict:
        """Flat params, as a plan carries them (lists, not tuples)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if "nested" in f.metadata:
                out.update(value.to_params())
            else:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out
