"""Preflight: cheap checks of where a plan reads and writes, before anything runs.

On gs:// (through the storage layer; google-cloud-storage loads only then): the output
bucket exists, objects can be created and deleted under the root (a probe object, deleted at
once), the bucket's location suits the TPU's zone, the TPU's service account is granted
access when that can be read, no binding makes the bucket public; every gs:// input outside
the output root matches at least one object (by the listing the plan was compiled from,
compiler/gcs_inputs.py, when it has one). No credentials is an error saying how to
authenticate; unreachable storage, or a dry run with `--offline`, skips the checks with a
note. A local root gets a probe file created and removed in it (or its nearest existing
parent).

Each finding starts with "ok:", "WARNING:", "error:" or "skipped:"; errors stop a run.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

from runexp.compiler import gcs_inputs, globs, uris
from runexp.compiler.plan import Plan
from runexp.runtime import storage


def zone_region(zone: Optional[str]) -> Optional[str]:
    """'us-central1-f' -> 'us-central1'."""
    if not zone:
        return None
    return zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone


def _local_root(root: str) -> list[str]:
    """Tries what it claims: a probe file created and removed in the root, or in its nearest
    existing parent (permission bits alone lie: read-only mounts, full disks, ACLs)."""
    import tempfile

    parent = root
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return [f"error: OUTPUT_ROOT {root}: {parent} is a file, not a directory: choose "
                "another OUTPUT_ROOT"]
    try:
        fd, probe = tempfile.mkstemp(prefix=".runexp-probe-", dir=parent)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        # The root the user wrote comes first; the parent tried is the reason's detail.
        where = "" if parent == root else f" (creating a file in {parent}, its nearest " \
            "existing parent, failed)"
        return [f"error: OUTPUT_ROOT {root} is not writable: {_why_not_writable(e)}{where}: "
                "choose another OUTPUT_ROOT, or fix the permissions or free space there"]
    return [f"ok: can write under {parent}" + ("" if parent == root else f" (creates {root})")]


def _why_not_writable(e: OSError) -> str:
    """The OS's reason in a user's words (a pseudo file system such as /proc answers
    'No such file or directory' for a directory that exists)."""
    import errno

    return {errno.ENOENT: "the file system there does not accept new files",
            errno.EROFS: "read-only file system",
            errno.EACCES: "permission denied", errno.EPERM: "permission denied",
            errno.ENOSPC: "no space left on the device",
            errno.EDQUOT: "disk quota exceeded"}.get(e.errno, e.strerror or str(e))


def _gcs_inputs(plan: Plan) -> list[str]:
    """gs:// inputs that are not stage outputs: files, globs and checkpoint prefixes."""
    root = plan.output_root.rstrip("/") + "/"
    return sorted({value for stage in plan.stages for value in uris.strings_in(stage.inputs)
                   if uris.is_gcs(value) and not value.startswith(root)})


def _check_inputs(storage, inputs: Iterable[str], listed: Optional[dict] = None) -> list[str]:
    """Each input matches at least one object: from the plan's listing of it when it has one
    (compiler/gcs_inputs.py, listed while compiling), else by asking storage."""
    findings = []
    for uri in inputs:
        listing = (listed or {}).get(uri)
        if isinstance(listing, dict):
            findings.append(f"ok: {uri} exists" if listing else
                            f"error: {uri} matches no object: check the path, or copy the "
                            "data there")
            continue
        fix = gcs_inputs.run_blocker(listing)
        if fix:  # the run would fail reading it the same way: say so now, with the fix
            findings.append(f"error: cannot list {uri} ({listing[len('not listed: '):]}): "
                            f"{fix}")
            continue
        try:
            if any(c in uri for c in "*?["):
                ok = bool(storage.glob(uri))
            else:  # an object, or a checkpoint prefix (<prefix>.index, <prefix>.data-*)
                ok = storage.exists(uri) or bool(storage.glob(globs.escape(uri) + ".*"))
        except Exception as exc:  # noqa: BLE001 - permissions, network: say so, go on
            findings.append(f"WARNING: cannot list {uri} ({type(exc).__name__}); not checked")
            continue
        findings.append(f"ok: {uri} exists" if ok else
                        f"error: {uri} matches no object: check the path, or copy the data there")
    return findings


def preflight(plan: Plan, offline: bool = False) -> list[str]:
    """The findings for `plan` (see the module docstring); ``offline`` (`--offline` dry
    runs): storage is not asked, and the plan says so."""
    if not uris.is_gcs(plan.output_root):
        findings = _local_root(plan.output_root)
        inputs = _gcs_inputs(plan)
        if inputs and not offline:  # a local root reading gs:// inputs: they must exist too

            listed = {k: v for stage in plan.stages
                      for k, v in (stage.input_objects or {}).items()}
            findings += _check_inputs(storage, inputs, listed)
        return findings
    if offline:
        return ["skipped: offline planning (--offline): the bucket, access and gs:// inputs "
                "were not checked"]

    accel = plan.accelerator or {}
    findings = storage.preflight(plan.output_root, region=zone_region(accel.get("zone")),
                                 service_account=accel.get("service_account"))
    if any(f.startswith("skipped:") for f in findings[:1]):
        return findings  # offline or no credentials: the inputs cannot be checked either
    listed = {k: v for stage in plan.stages for k, v in (stage.input_objects or {}).items()}
    return findings + _check_inputs(storage, _gcs_inputs(plan), listed)


def errors(findings: Iterable[str]) -> list[str]:
    return [f for f in findings if f.startswith("error:")]
