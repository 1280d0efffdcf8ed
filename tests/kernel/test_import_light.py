"""Loading the extension imports no framework, no server code and no HTTP client."""

import json
import subprocess
import sys

HEAVY = ("torch", "tensorflow", "jax", "cupy", "tornado", "jupyter_server", "jupyterhub", "sqlalchemy",
         "ipywidgets", "pynvml", "jupyter_gpualloc.service", "jupyter_gpualloc.client",
         "jupyter_gpualloc.core.scheduler", "jupyter_gpualloc.core.devices")

SCRIPT = """
import json, sys
import jupyter_gpualloc
after_package = sorted(sys.modules)
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "jupyter_gpualloc")
print(json.dumps({"package": after_package, "loaded": sorted(sys.modules),
                  "magic": "gpu" in shell.magics_manager.magics["line"]}))
"""


def test_loading_the_extension_stays_light():
    env = {"PATH": "/usr/bin:/bin", "GPUALLOC_URL": "http://127.0.0.1:9/", "GPUALLOC_TOKEN": "t",
           "GPUALLOC_MEMORY_LIMIT_MIB": "8192", "GPUALLOC_MEMORY_FRACTION": "0.35"}  # hooks installed too
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["magic"]
    assert not any(m.startswith("jupyter_gpualloc.") for m in report["package"])
    heavy = [m for m in report["loaded"] if m in HEAVY or m.split(".")[0] in HEAVY]
    assert heavy == []
