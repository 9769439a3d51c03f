"""The errors of the storage layer (runtime/storage/), shared by its modules."""

from __future__ import annotations


class StorageError(Exception):
    """A storage operation failed; ``uri`` says where."""

    def __init__(self, message: str, uri: str):
        super().__init__(message)
        self.uri = uri


class RetryBudgetExceeded(StorageError):
    """Transient errors went on for longer than the retry policy allows."""


class IntegrityError(StorageError):
    """A transferred file's size or checksum differs from the server's record."""


class OutsideRootError(StorageError):
    """A path or key would put output outside the experiment's output root."""


class InputChangedError(StorageError):
    """An input object is no longer the version the plan listed (overwritten or deleted
    since): what was fingerprinted would not be what is read."""
