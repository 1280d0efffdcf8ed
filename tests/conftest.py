"""Plugins for the whole suite: pytest-jupyter's server fixtures (used by tests/server) and the
store databases (tests/stores.py: SQLite and PostgreSQL)."""

pytest_plugins = ["pytest_jupyter.jupyter_server", "tests.stores"]
