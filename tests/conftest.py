"""Plugins for the whole suite: pytest-jupyter's server fixtures (used by tests/server) and the
store databases (tests/stores.py: SQLite and PostgreSQL); and how pytest-xdist's `--dist loadfile`
(`make test`) shares the tests out."""

from xdist.scheduler import LoadFileScheduling

pytest_plugins = ["pytest_jupyter.jupyter_server", "tests.stores"]


class ModulesAndKubernetes(LoadFileScheduling):
    """Each module's tests on one worker (its module fixtures start once), and every test of
    tests/k8s on one: the session's control plane then starts once, where three would run side by
    side on two cores for the rest of the run."""

    def _split_scope(self, nodeid: str) -> str:
        return "tests/k8s" if nodeid.startswith("tests/k8s/") else super()._split_scope(nodeid)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadfile":
        return ModulesAndKubernetes(config, log)
    return None
