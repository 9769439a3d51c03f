"""Fixtures of the runtime tests (defined in tests.support.runtime, with the helpers they use)."""

from tests.support.runtime import pretrain_data, pretrained  # noqa: F401 - fixtures
