"""gs:// inputs at compile time: listed once, fingerprinted by what identifies each object.

A gs:// corpus glob, vocab file or checkpoint prefix is listed once per compile (one listing
of the key text before the first wildcard, matched with compiler/globs.py). Its fingerprint
is the digest of each matched object's URI, size, generation and crc32c, so overwriting,
adding or deleting an object changes the fingerprints of the stages that read it, and of
everything downstream. The listing itself goes into the plan (``Stage.input_objects``) and
from there into the stage's MANIFEST.json, so a later dry run can name the object that
changed (compiler/state.py), and the runtime reads exactly the listed versions
(runtime/gcs_mirror.py).

When the objects cannot be listed (offline, no credentials, no permission, no such bucket),
or ``RUNEXP_NO_INPUT_LISTING=1`` asks not to, the input keeps the fingerprint it had before
runexp listed inputs (``NOT_LISTED``) and the plan records why instead of a listing; the dry
run then says, for every stage that reads it, that a change there cannot be detected.
After a failure that means storage is unreachable, nothing else is tried in that compile.

The storage layer is imported only when a gs:// input is listed (google-cloud-storage then
loads; never TensorFlow).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Union

from runexp.compiler import globs
from runexp.compiler.fingerprint import digest
from runexp.runtime import storage
from runexp.runtime.storage import RetryBudgetExceeded
from runexp.runtime.storage.retry import error_label, is_transient

SKIP_ENV = "RUNEXP_NO_INPUT_LISTING"
OFFLINE = "offline"  # SKIP_ENV's value under `runexp --dry_run --offline`
# The fingerprint of a gs:// input that was not listed: the constant of earlier versions.
NOT_LISTED = "checked at run time"

# uri -> {"size", "generation", "crc32c"}; or why there is no listing.
Listing = Union[dict, str]

# Why a listing failed, when the same failure would stop the run itself: the preflight turns
# these into errors (compiler/preflight.py), the others stay notes.
NO_CREDENTIALS = "not listed: no Google credentials found"
PERMISSION_DENIED = "not listed: permission denied (storage.objects.list)"
# What the user can do about each of them.
_FIXES = {
    NO_CREDENTIALS: "run `gcloud auth application-default login` (or set "
                    "GOOGLE_APPLICATION_CREDENTIALS to a service account key file); to review "
                    "the plan without storage access, add --offline to the dry run",
    PERMISSION_DENIED: "grant these credentials roles/storage.objectViewer on the bucket, or "
                       "copy the data where they can read it",
}


def run_blocker(listing: Listing) -> Optional[str]:
    """What to do, when ``listing`` failed in a way that would fail the run too; else None."""
    return _FIXES.get(listing) if isinstance(listing, str) else None


def listing_digest(listing: Listing) -> str:
    if isinstance(listing, str):
        return NOT_LISTED
    return digest([[uri, o["size"], o["generation"], o["crc32c"]]
                   for uri, o in sorted(listing.items())])


class InputLister:
    """The listings of one compile, by input string (a glob, an object, a checkpoint prefix)."""

    def __init__(self):
        self.listings: dict[str, Listing] = {}
        skip = os.environ.get(SKIP_ENV, "")
        self._off: Optional[str] = None if skip in ("", "0") else \
            "not listed: planned --offline" if skip == OFFLINE else f"not listed: {SKIP_ENV}=1"

    def objects(self, uri: str) -> Listing:
        """The objects the glob or object name ``uri`` matches."""
        return self._list(uri, uri)

    def checkpoint(self, prefix: str) -> Listing:
        """A TensorFlow checkpoint's objects: ``<prefix>.index``, ``<prefix>.data-*``."""
        return self._list(prefix, globs.escape(prefix) + ".*")

    def directory(self, path: str) -> Listing:
        """The objects directly in a directory (a Hugging Face model's: config.json,
        model.safetensors, the tokenizer files)."""
        return self._list(path, globs.escape(path.rstrip("/")) + "/*")

    def exists(self, uri: str) -> Optional[bool]:
        """Whether the object ``uri`` exists; None when storage cannot be asked. Not part of
        the plan's listings."""
        if self._off is not None:
            return None
        found = self._fetch(globs.escape(uri))
        return bool(found) if isinstance(found, dict) else None

    def _list(self, key: str, pattern: str) -> Listing:
        if key in self.listings:
            return self.listings[key]
        if self._off is not None:
            listing: Listing = self._off
        else:
            listing = self._fetch(pattern)
        self.listings[key] = listing
        return listing

    def _fetch(self, pattern: str) -> Listing:
        base = storage.retry_policy()
        quick = dataclasses.replace(base, max_tries=min(base.max_tries, 2),
                                    timeout=min(base.timeout, 10.0),
                                    deadline=min(base.deadline, 20.0))
        try:
            found = storage.glob_objects(pattern, quick)
        except FileNotFoundError:
            return (f"not listed: bucket gs://{storage.split_gcs(pattern)[0]} does not exist "
                    "or is not visible to these credentials")
        except PermissionError:
            return PERMISSION_DENIED
        except ValueError as e:  # a wildcard in the bucket name
            return f"not listed: {e}"
        except Exception as e:  # noqa: BLE001 - offline, no credentials, retries ran out
            why, unreachable = _why(e)
            if unreachable:  # the next listing would fail the same way, slowly
                self._off = why
            return why
        return {o["uri"]: {"size": o["size"], "generation": o["generation"],
                           "crc32c": o["crc32c"]} for o in found}


def _why(exc: Exception) -> tuple[str, bool]:
    """Why nothing was listed, and whether storage is unreachable altogether. Never the
    exception's own text (it may carry URLs or account names)."""
    from google.auth import exceptions as auth_exceptions

    if isinstance(exc, auth_exceptions.DefaultCredentialsError):
        return NO_CREDENTIALS, True
    if isinstance(exc, (RetryBudgetExceeded, auth_exceptions.TransportError,
                        auth_exceptions.RefreshError)) or is_transient(exc):
        return f"not listed: cannot reach storage ({error_label(exc)})", True
    return f"not listed: listing failed ({error_label(exc)})", False
