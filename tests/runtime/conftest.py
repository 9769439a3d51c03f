"""Fixtures of the runtime tests (defined in runtime_testlib, which the tests import by that
unique name: `from conftest import ...` would depend on which conftest pytest loaded first)."""

from runtime_testlib import pretrain_data, pretrained  # noqa: F401 - fixtures
