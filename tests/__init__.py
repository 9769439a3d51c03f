"""runexp's tests: a package, so every test module and helper has one importable name
(``tests.compiler.test_cli``, ``tests.support.cli``) whatever directory pytest starts in, and a
child process reaches the same helpers with ``python -m tests....`` from the repository root.
The shared helpers are in ``tests.support``."""
