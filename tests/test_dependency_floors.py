"""What pyproject.toml declares against what the package imports: every third-party module the package
imports comes from a declared dependency, and the hub side imports on the lowest JupyterHub it allows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from .test_import_rules import PACKAGE, imports_of, sources

PYPROJECT = PACKAGE.parent / "pyproject.toml"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """The distributions [project].dependencies names."""
    requirements = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    return {normalized(re.match(r"[A-Za-z0-9_.\-]+", r).group(0)) for r in requirements}


def test_every_third_party_module_the_package_imports_is_a_declared_dependency():
    distributions = packages_distributions()
    undeclared = {}
    for path in sources():
        for module, line in imports_of(path):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in ("__future__", PACKAGE.name):
                continue
            names = {normalized(d) for d in distributions.get(top, [top])}
            if not names & declared():
                undeclared[top] = f"{path.relative_to(PACKAGE.parent)}:{line}"
    assert not undeclared, f"imported but not in pyproject.toml's dependencies: {undeclared}"


def test_the_hub_side_imports_where_jupyterhub_has_no_spawnexception():
    """JupyterHub 5 (which pyproject allows) has no jupyterhub.spawner.SpawnException (6.0 added it):
    with it taken away, the hub side still imports, and its refusals are HTTPErrors JupyterHub 5 shows."""
    code = textwrap.dedent("""
        import jupyterhub.spawner
        del jupyterhub.spawner.SpawnException
        import jupyter_gpualloc.hub.kube, jupyter_gpualloc.hub.local
        from jupyter_gpualloc.hub.mixin import capacity_error
        from tornado import web
        error = capacity_error("No 3g.40gb slice became free (100% in use)")
        assert isinstance(error, web.HTTPError), type(error).__mro__
        print(error.status_code, error.reason, error.jupyterhub_message, str(error), sep=" | ")
    """)
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("503 | capacity | No 3g.40gb slice became free (100% in use) | "
                                   "HTTP 503: capacity (No 3g.40gb slice became free (100% in use))")
