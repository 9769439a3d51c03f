"""The argument parser of every `runexp` command: a bad flag is a user error (exit 1, one
line naming the command), not argparse's exit 2, which means "work pending" here."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from runexp.compiler.exit_codes import EXIT_USER_ERROR


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, failing as runexp's user errors do; ``hint`` follows the message."""

    def __init__(self, *args, hint: Optional[str] = None, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.hint = hint

    def error(self, message: str) -> None:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}" + (f"\n  hint: {self.hint}" if self.hint
                                                   else ""), file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
