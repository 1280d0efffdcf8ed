"""The import rules of docs/architecture.md, checked on the source: the core imports no tornado,
Jupyter or HTTP code, and no part of the package imports a part that sits above it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_gpualloc"

# Each part of the package, lowest first: a part may import only the parts of lower layers.
LAYERS = [
    {"core"},  # every decision; plain Python
    # a lease's environment (CUDA_VISIBLE_DEVICES, caps); where a job's files lie; how a user's files are
    # opened; a holder's wait in the queue and its keepalive; standard library only; what pods ask of a
    # cluster's GPUs (traitlets config)
    {"lease_env", "job_folder", "user_files", "holder", "kube"},
    {"client"},  # the one client of the REST API
    {"holder_lease"},  # one holder's lease from request to end, through that client
    {"jobs", "hub"},  # the job runner; the JupyterHub side
    {"kernel", "service"},  # inside the user's kernel; the core behind HTTP
    {"server"},  # the jupyter_server extension (embedded mode hosts the service)
    {"cli", "__init__"},  # the command line; the package's IPython extension entry point
]
LAYER = {part: level for level, parts in enumerate(LAYERS) for part in parts}

# Web servers, Jupyter and HTTP clients: none of them may be imported by the core.
FORBIDDEN_IN_CORE = {"tornado", "jupyter_server", "jupyterhub", "jupyter_client", "jupyter_events", "ipykernel",
                     "IPython", "notebook", "nbclient", "prometheus_client", "aiohttp", "requests", "httpx",
                     "urllib3", "http.client", "http.server", "urllib.request", "kubernetes_asyncio"}
# A device backend may use its device's own client library, imported only when it reads the device.
DEVICE_CLIENTS = {"kubernetes_asyncio": "core/devices/kubernetes.py"}


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every module `path` imports, anywhere in it (absolute names), with its line."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [(f"{module}.{alias.name}" if not node.module else module, node.lineno) for alias in node.names]
    return found


def forbidden_in_core(module: str) -> str | None:
    """The entry of FORBIDDEN_IN_CORE that `module` is, or is part of."""
    return next((f for f in FORBIDDEN_IN_CORE if module == f or module.startswith(f + ".")), None)


def part_of(module: str) -> str | None:
    """'jupyter_gpualloc.server.app' -> 'server'; None outside the package."""
    parts = module.split(".")
    if parts[0] != PACKAGE.name:
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_part_of_the_package_has_a_layer():
    parts = {part_of(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)) for p in sources()}
    assert parts <= set(LAYER), f"give these a layer in LAYERS (and docs/architecture.md): {parts - set(LAYER)}"


def test_no_part_imports_a_part_above_it():
    upward = []
    for path in sources():
        here = part_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for module, line in imports_of(path):
            there = part_of(module)
            if there is not None and there != here and LAYER[there] >= LAYER[here]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({here}) imports {module} ({there})")
    assert upward == []


def test_the_core_imports_no_web_jupyter_or_http_code():
    found = []
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        where = str(path.relative_to(PACKAGE)).replace("\\", "/")
        for module, line in imports_of(path):
            name = forbidden_in_core(module)
            if name is not None and DEVICE_CLIENTS.get(name) != where:
                found.append(f"{where}:{line} imports {module}")
    assert found == []


def test_the_holder_grammar_imports_only_the_standard_library():
    modules = {m.split(".")[0] for m, _ in imports_of(PACKAGE / "core" / "holders.py")}
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}


@pytest.mark.parametrize("entry", ["jupyter_gpualloc.core.wiring", "jupyter_gpualloc.core.openb",
                                   "jupyter_gpualloc.core.devices"])
def test_importing_the_core_loads_no_web_jupyter_or_http_code(entry):
    """The same rule as the process sees it: what importing the core puts in sys.modules."""
    script = (f"import json, sys; import {entry}; "
              "print(json.dumps(sorted(m for m in sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                       text=True).stdout)
    assert [m for m in loaded if forbidden_in_core(m)] == []
