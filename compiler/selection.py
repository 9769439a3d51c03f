"""Running part of a plan: ``--until=STAGE`` and ``--only=STAGE[,STAGE]``.

A name is a stage id (``preprocess.wiki``) or a kind (``preprocess``: every stage of it).
``--until`` runs the named stages and everything they need; ``--only`` runs exactly the
named stages, whose inputs must then be finished already. The other stages are marked
SKIP: the dry run shows them as skipped, the executor leaves them alone.

The workflow it is for: preprocess on a cheap CPU machine, train on a TPU:

    runexp --gin_file=exp.gin --until=preprocess      # CPU machine: vocab, preprocess
    runexp --gin_file=exp.gin                         # TPU VM: reuses them, trains on
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from runexp.compiler.errors import UserError, did_you_mean
from runexp.compiler.plan import Plan
from runexp.compiler.render import PARTICIPLES
from runexp.compiler.state import REUSE, SKIP, StageState


def _names(values: Sequence[str]) -> list[str]:
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


def _resolve(plan: Plan, names: list[str], flag: str) -> list[str]:
    ids = [s.id for s in plan.stages]
    kinds = sorted({s.kind for s in plan.stages})
    out: list[str] = []
    for name in names:
        matched = [s.id for s in plan.stages if name in (s.id, s.kind)]
        if not matched:
            raise UserError(f"{flag}: this plan has no stage {name!r} (stages: "
                            f"{', '.join(ids)})\n  hint: "
                            + (did_you_mean(name, ids + kinds) or
                               "name a stage id, or a kind for all its stages"))
        out.extend(m for m in matched if m not in out)
    return out


def _with_deps(plan: Plan, ids: list[str]) -> set[str]:
    by_id = {s.id: s for s in plan.stages}
    wanted, todo = set(), list(ids)
    while todo:
        sid = todo.pop()
        if sid not in wanted:
            wanted.add(sid)
            todo.extend(by_id[sid].deps)
    return wanted


def select(plan: Plan, states: dict[str, StageState], until: Sequence[str] = (),
           only: Sequence[str] = ()) -> dict[str, StageState]:
    """``states`` with the stages outside the selection marked SKIP.

    Raises:
      UserError: an unknown stage name, both flags given, or an ``--only`` stage whose
        input stage is neither selected nor finished.
    """
    until, only = _names(until), _names(only)
    if not until and not only:
        return states
    if until and only:
        raise UserError("--until and --only do not combine\n  hint: --until=STAGE runs STAGE "
                        "and what it needs; --only=A,B runs exactly A and B")
    if until:
        chosen = _with_deps(plan, _resolve(plan, until, "--until"))
        why = f"after --until={','.join(until)}"
    else:
        chosen = set(_resolve(plan, only, "--only"))
        why = f"not in --only={','.join(only)}"
        for stage in plan.stages:
            if stage.id not in chosen:
                continue
            for dep in stage.deps:
                if dep not in chosen and states[dep].action != REUSE:
                    raise UserError(
                        f"--only: stage {stage.id} reads {dep}, which is not finished (it "
                        f"would be {states[dep].action}d: {states[dep].reason})\n  hint: run "
                        f"it first (--until={dep}) or add it: --only={','.join(only)},{dep}")
    out = {}
    for stage in plan.stages:
        st = states[stage.id]
        if stage.id not in chosen and st.action != REUSE:
            st = dataclasses.replace(st, action=SKIP, reason=f"skipped ({why}); would be "
                                     f"{PARTICIPLES[st.action]}: {st.reason}", changes=())
        out[stage.id] = st
    return out
