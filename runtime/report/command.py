"""`runexp report OUTPUT_ROOT [--out FILE]`: the experiment's HTML report.

Writes one self-contained HTML file (images inline), by default ``OUTPUT_ROOT/report.html``:
the plan, estimated and actual time per stage, metrics against their baselines, training
curves, bad input, the exported artifacts and how to load them (runtime/report/report.py).
A gs:// root is read (and, by default, written) through runexp's storage layer.

Exit codes (compiler/exit_codes.py): 0 written; 1 no experiment at OUTPUT_ROOT (no
plan.json), a bad flag, or the report could not be written. Never imports TensorFlow.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from runexp.compiler.arguments import ArgumentParser
from runexp.compiler.exit_codes import EXIT_OK, EXIT_USER_ERROR
from runexp.runtime.report import report


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="runexp report", allow_abbrev=False,
                description="Write a self-contained HTML report of the experiment in "
                            "OUTPUT_ROOT: plan, estimated vs actual time, metrics against "
                            "baselines, training curves, bad input, artifacts.")
    p.add_argument("output_root", help="the experiment's OUTPUT_ROOT (local path or gs://)")
    p.add_argument("--out", metavar="FILE",
                   help="where to write the HTML (default: OUTPUT_ROOT/report.html)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))

    root = args.output_root
    try:
        text = report.build(root)
    except report.NoExperiment as e:
        print(f"error: {e}\n  hint: give the OUTPUT_ROOT of an experiment that has been run "
              "(the directory that holds plan.json), e.g. runexp report "
              "runexp_output/quickstart", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        where = report.write(root, text, args.out)
    except Exception as e:  # noqa: BLE001 - OSError, StorageError: said plainly
        print(f"error: the report could not be written to "
              f"{args.out or root.rstrip('/') + '/' + report.REPORT_FILE}: "
              f"{type(e).__name__}: {e}\n  hint: give a writable file with --out FILE",
              file=sys.stderr)
        return EXIT_USER_ERROR
    print(f"report written: {where}")
    if not where.startswith("gs://"):
        import os

        print(f"  open it in a browser: file://{os.path.abspath(where)}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
