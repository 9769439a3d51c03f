"""Turns a GinConfig into values: macros expanded, types checked, provenance kept.

Usage:
    resolver = Resolver(config, collector)
    resolver.check_names()                        # unknown configurables/params/macros
    steps = resolver.get("train", "steps")        # typed value (or None after an error)
    resolver.provenance("train", "steps")         # Provenance(...) with the whole chain
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from runexp.compiler.errors import ErrorCollector, Location, did_you_mean
from runexp.compiler.loader import REQUIRED_MACRO, ConfigurableRef, GinConfig, MacroRef
from runexp.compiler.schema import CONFIGURABLES, REQUIRED, Param


@dataclasses.dataclass(frozen=True)
class Step:
    """One link of a value's history: `what = value` at `location`."""

    what: str
    value: Any
    location: Optional[Location]
    overridden: tuple = ()  # earlier assignments of the same name: (value, location)


@dataclasses.dataclass(frozen=True)
class Provenance:
    """How a parameter got its value: the binding, then each macro it went through."""

    name: str
    value: Any
    steps: tuple  # of Step, from the binding to the final literal

    @property
    def location(self) -> Optional[Location]:
        """Where the literal value was written (the last step with a location)."""
        for step in reversed(self.steps):
            if step.location is not None:
                return step.location
        return None

    def short(self) -> str:
        loc = self.location
        return str(loc) if loc else "default"

    def explain(self) -> str:
        lines = [f"{self.name} = {self.value!r}"]
        for step in self.steps:
            where = f"@ {step.location}" if step.location else "(runexp default)"
            lines.append(f"  {step.what} = {_show(step.value)}  {where}")
            for value, loc in step.overridden:
                lines.append(f"      overrides {_show(value)} @ {loc}")
        return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, MacroRef):
        return f"%{value.name}"
    if isinstance(value, ConfigurableRef):
        return f"@{value.name}" + ("()" if value.evaluate else "")
    return repr(value)


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "True or False",
               "str": "a string", "str_list": "a string or a list of strings", "dict": "a dict",
               "dict_list": "a list of dicts"}

# Marks a value whose error was already reported, so it is not reported twice.
_FAILED = object()


class Resolver:
    def __init__(self, config: GinConfig, collector: ErrorCollector):
        self.config = config
        self.collector = collector
        self._provenance: dict[tuple[str, str, str], Provenance] = {}
        self.used_macros: set[str] = set()

    # --- names -------------------------------------------------------------------------

    def check_names(self) -> None:
        """Reports bindings of unknown configurables or parameters, and unknown macros."""
        for (scope, name, param), assignments in self.config.bindings.items():
            loc = assignments[-1].location
            configurable = CONFIGURABLES.get(name)
            if configurable is None:
                self.collector.error(f"unknown configurable {name!r}", loc,
                                     hint=did_you_mean(name, CONFIGURABLES))
                continue
            if param not in configurable.params:
                self.collector.error(f"{name!r} has no parameter {param!r}", loc,
                                     hint=did_you_mean(param, configurable.params))
                continue
            if scope and not configurable.scoped:
                self.collector.error(
                    f"{name!r} cannot be scoped ({scope}/{name})", loc,
                    hint=f"only {', '.join(n for n, c in CONFIGURABLES.items() if c.scoped)} "
                         "take a scope (the task name)")
            elif scope and "/" in scope:
                # A task's name is its stage directory's: "a/b" would nest inside "a".
                self.collector.error(
                    f"task name {scope!r} has a '/': a task is named by one scope",
                    loc, hint=f"use {scope.replace('/', '_')}/{name}.{param} = ...")
        for key, assignments in list(self.config.bindings.items()) + [
                ((None, None, m), a) for m, a in self.config.macros.items()]:
            for a in assignments:
                for ref in _refs(a.value):
                    if isinstance(ref, MacroRef) and ref.name != REQUIRED_MACRO \
                            and ref.name not in self.config.macros:
                        self.collector.error(f"undefined macro %{ref.name}", a.location,
                                             hint=did_you_mean(ref.name, self.config.macros)
                                             or f"define it: {ref.name} = ...")
                    elif isinstance(ref, ConfigurableRef):
                        self.collector.error(
                            f"configurable references (@{ref.name}) are not supported here",
                            a.location, hint="runexp's gin surface takes plain values and macros")
        self._check_unused_macros()

    def _check_unused_macros(self) -> None:
        """A macro nothing refers to is a typo or a leftover: `TRAIN_STEP = 20` would
        otherwise be accepted while the plan trains the template's TRAIN_STEPS."""
        referenced = {ref.name
                      for assignments in [*self.config.bindings.values(),
                                          *self.config.macros.values()]
                      for a in assignments for ref in _refs(a.value)
                      if isinstance(ref, MacroRef)}
        for name, assignments in self.config.macros.items():
            if name not in referenced:
                self.collector.error(
                    f"macro {name} is set but nothing uses it", assignments[-1].location,
                    hint=did_you_mean(name, sorted(referenced)) or
                    "remove it, or refer to it as %" + name + " in a binding")

    def scopes(self, configurable: str) -> dict[str, Location]:
        """Scopes used with a scoped configurable: the registered task names, first location."""
        found: dict[str, Location] = {}
        for (scope, name, _), assignments in self.config.bindings.items():
            if name == configurable and scope:
                found.setdefault(scope, assignments[0].location)
        return found

    # --- values ------------------------------------------------------------------------

    def get(self, configurable: str, param: str, scope: str = "") -> Any:
        """The typed value of `configurable.param` (scoped binding, then unscoped, then default)."""
        key = (scope, configurable, param)
        if key in self._provenance:
            return self._provenance[key].value
        spec: Param = CONFIGURABLES[configurable].params[param]
        label = f"{scope + '/' if scope else ''}{configurable}.{param}"
        assignments = self.config.bindings.get((scope, configurable, param)) if scope else None
        if not assignments:
            assignments = self.config.bindings.get(("", configurable, param))
        if assignments:
            last = assignments[-1]
            shown = f"{scope + '/' if scope else ''}{configurable}.{param}" if \
                self.config.bindings.get((scope, configurable, param)) else f"{configurable}.{param}"
            steps = [Step(shown, last.value, last.location,
                          tuple((a.value, a.location) for a in assignments[:-1]))]
            raw, loc = self._expand(last.value, last.location, steps, label, set())
        elif spec.default is REQUIRED:
            self.collector.error(
                f"{label} is required but not set", None,
                hint=f"bind it in your experiment file: {label} = ...  ({spec.doc})")
            raw, loc, steps = _FAILED, None, []
        else:
            raw, loc, steps = spec.default, None, [Step(label, spec.default, None)]
        value = None if raw is _FAILED else self._check_type(raw, spec, label, loc)
        self._provenance[key] = Provenance(label, value, tuple(steps))
        return value

    def provenance(self, configurable: str, param: str, scope: str = "") -> Provenance:
        self.get(configurable, param, scope)
        return self._provenance[(scope, configurable, param)]

    def macro(self, name: str) -> Optional[Provenance]:
        """The provenance of a macro's value (for --explain), or None when undefined."""
        assignments = self.config.macros.get(name)
        if not assignments:
            return None
        last = assignments[-1]
        steps = [Step(name, last.value, last.location,
                      tuple((a.value, a.location) for a in assignments[:-1]))]
        value, _ = self._expand(last.value, last.location, steps, name, set())
        return Provenance(name, value, tuple(steps))

    def _expand(self, value: Any, location: Location, steps: list, label: str,
                seen: set) -> tuple[Any, Optional[Location]]:
        """Replaces %MACRO references (also inside lists and dicts), recording each step."""
        if isinstance(value, MacroRef):
            if value.name == REQUIRED_MACRO:
                macro = steps[-1].what if steps and steps[-1].what.isupper() else ""
                what = f"{macro} (used by {label})" if macro else label
                self.collector.error(
                    f"{what} is required but not set", location,
                    hint="%gin.REQUIRED here: set it in your experiment file or with "
                         "--gin_param (this line says where it is required)")
                return _FAILED, location
            self.used_macros.add(value.name)
            if value.name in seen:
                self.collector.error(f"macro %{value.name} refers to itself", location,
                                     hint="break the cycle of macro definitions")
                return _FAILED, location
            assignments = self.config.macros.get(value.name)
            if not assignments:
                return _FAILED, location  # reported by check_names
            last = assignments[-1]
            steps.append(Step(value.name, last.value, last.location,
                              tuple((a.value, a.location) for a in assignments[:-1])))
            return self._expand(last.value, last.location, steps, label, seen | {value.name})
        if isinstance(value, (list, tuple)):
            out = [self._expand(v, location, [], label, seen)[0] for v in value]
            return (out if isinstance(value, list) else tuple(out)), location
        if isinstance(value, dict):
            return {k: self._expand(v, location, [], label, seen)[0]
                    for k, v in value.items()}, location
        return value, location

    def check_value(self, value: Any, spec: Param, label: str,
                    location: Optional[Location]) -> Any:
        """``value`` checked against ``spec`` (type, choices, bounds) as a binding is: the
        value (an int made a float where a float is wanted), or None after reporting the
        problem as ``label`` at ``location``. For values inside another binding's value (a
        phase of train.phases)."""
        return self._check_type(value, spec, label, location)

    def _check_type(self, value: Any, spec: Param, label: str,
                    location: Optional[Location]) -> Any:
        def bad(expected: str, hint: str = "") -> None:
            self.collector.error(f"{label} must be {expected}, got {value!r}", location,
                                 hint=hint or spec.doc)

        if value is None:
            if spec.optional or spec.default is None:
                return None
            bad(_TYPE_WORDS[spec.type], hint=spec.doc)
            return None
        t = spec.type
        if t == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    bad("an integer", hint=f"write {int(value)} without the decimal point")
                else:
                    bad("an integer")
                return None
        elif t == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                bad("a number")
                return None
            value = float(value)
        elif t == "bool":
            if not isinstance(value, bool):
                bad("True or False")
                return None
        elif t == "str":
            if not isinstance(value, str):
                bad("a string", hint="quote it: '...'")
                return None
        elif t == "str_list":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                bad("a string or a list of strings")
                return None
            value = list(value)
        elif t == "dict":
            if not isinstance(value, dict):
                bad("a dict")
                return None
        elif t == "dict_list":
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, dict)
                                                               for v in value):
                bad("a list of dicts")
                return None
            value = [dict(v) for v in value]
        if spec.choices and value not in spec.choices:
            self.collector.error(f"{label} must be one of {', '.join(map(repr, spec.choices))}; "
                                 f"got {value!r}", location,
                                 hint=did_you_mean(str(value), map(str, spec.choices)))
            return None
        if spec.minimum is not None and isinstance(value, (int, float)) and value < spec.minimum:
            if spec.minimum == 1:
                self.collector.error(f"{label} must be positive, got {value!r}", location,
                                     hint=spec.doc)
            else:
                self.collector.error(f"{label} must be at least {spec.minimum}, got {value!r}",
                                     location, hint=spec.doc)
            return None
        if spec.maximum is not None and isinstance(value, (int, float)) and value > spec.maximum:
            self.collector.error(f"{label} must be at most {spec.maximum}, got {value!r}",
                                 location, hint=spec.doc)
            return None
        return value


def _refs(value: Any):
    if isinstance(value, (MacroRef, ConfigurableRef)):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _refs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _refs(v)
