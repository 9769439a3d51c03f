"""Chinese text for tests, from what this machine has: the zh_CN translations of its system
programs (gettext catalogs, read with the standard library), about 45,000 messages.

``chinese_sentences(min_cjk=0.3)`` gives the translated messages that are mostly Chinese,
one line each, with printf-style placeholders and markup removed, deduplicated and sorted
(so the corpus is the same on every run).
"""

from __future__ import annotations

import gettext
import glob
import re

CATALOGS = "/usr/share/locale/zh_CN/LC_MESSAGES/*.mo"
_PLACEHOLDER = re.compile(r"%[-+ #0-9.*]*[a-zA-Z]|\{[^}]*\}|<[^>]*>|\\[nt]")
_CJK = re.compile(r"[\u4e00-\u9fff]")


def chinese_sentences(min_cjk: float = 0.3) -> list[str]:
    out = set()
    for path in sorted(glob.glob(CATALOGS)):
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except (OSError, gettext.error, UnicodeDecodeError):
            continue
        for key, text in catalog.items():
            if not key or not isinstance(text, str):
                continue  # the catalog's header
            for line in _PLACEHOLDER.sub(" ", text).splitlines():
                line = " ".join(line.split())
                if len(line) >= 6 and len(_CJK.findall(line)) >= min_cjk * len(line):
                    out.add(line)
    return sorted(out)
