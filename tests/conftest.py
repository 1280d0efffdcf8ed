"""Plugins for the whole suite: pytest-jupyter's server fixtures (used by tests/server)."""

pytest_plugins = ["pytest_jupyter.jupyter_server"]
