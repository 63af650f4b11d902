"""The project's tests, a package so that each tier imports its shared helpers as
`tests.helpers.*` (tests/conftest.py marks each test with its tier: see docs/design.md#tests)."""
