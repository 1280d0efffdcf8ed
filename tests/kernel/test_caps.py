"""A lease's environment, and framework memory caps applied by import hooks.

Each framework is imported in a fresh interpreter (so the hook sees its first import); a framework
that is not installed is skipped.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from jupyter_gpualloc.kernel.caps import FrameworkCaps, MemoryCap, apply_lease_env, cap_from_env, clear_lease_env

L4_MIB = 23034
SHARED = {"id": "lease-shared", "state": "granted",
          "slice": {"kind": "shared", "node": "node0", "gpu_uuids": ["GPU-L4-0"], "memory_mib": 8192,
                    "model": "L4", "visible_devices": "GPU-L4-0"}}
MIG = {"id": "lease-mig", "state": "granted",
       "slice": {"kind": "mig", "node": "node0", "gpu_uuids": ["GPU-A100"], "memory_mib": 4864,
                 "profile": "1g.5gb", "mig_uuid": "MIG-1234", "visible_devices": "MIG-1234"}}
FRACTION = round(8192 / L4_MIB, 4)


def test_a_shared_lease_sets_every_cap_variable():
    environ = {"GPUALLOC_URL": "http://service/", "PATH": "/bin"}
    env = apply_lease_env(SHARED, L4_MIB, environ)
    assert environ["CUDA_VISIBLE_DEVICES"] == "GPU-L4-0"
    assert environ["GPUALLOC_MEMORY_LIMIT_MIB"] == "8192"
    assert float(environ["GPUALLOC_MEMORY_FRACTION"]) == FRACTION
    assert environ["CUDA_DEVICE_MEMORY_LIMIT"] == "8192m"
    assert float(environ["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == FRACTION
    assert environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert environ["CUPY_GPU_MEMORY_LIMIT"] == str(8192 * 1024 * 1024)
    assert environ["GPUALLOC_URL"] == "http://service/" and environ["PATH"] == "/bin"
    assert cap_from_env(env) == MemoryCap(8192, FRACTION)


def test_a_mig_lease_replaces_a_shared_one_and_a_release_hides_the_gpu():
    environ: dict[str, str] = {}
    apply_lease_env(SHARED, L4_MIB, environ)
    apply_lease_env(MIG, None, environ)
    assert environ["CUDA_VISIBLE_DEVICES"] == "MIG-1234"
    assert not any(name in environ for name in ("GPUALLOC_MEMORY_LIMIT_MIB", "CUDA_DEVICE_MEMORY_LIMIT",
                                                "XLA_PYTHON_CLIENT_MEM_FRACTION", "CUPY_GPU_MEMORY_LIMIT"))
    assert cap_from_env(environ) is None
    clear_lease_env(environ)
    assert environ == {"CUDA_VISIBLE_DEVICES": ""}


HOOK_SCRIPT = """
import json, os, sys
from jupyter_gpualloc.kernel.caps import FrameworkCaps, apply_lease_env, cap_from_env
lease = json.loads(sys.argv[1])
apply_lease_env(lease, {gpu_mib})
caps = FrameworkCaps()
caps.install(cap_from_env(os.environ))
assert "{framework}" not in sys.modules
import {framework}
report = {{"applied": caps.applied, "errors": caps.errors, "loader_restored":
          type({framework}.__loader__).__name__ != "_NotifyingLoader"}}
if "{framework}" == "torch":
    report["queued"] = [[getattr(call, "func", call).__name__, list(getattr(call, "args", ()))]
                        for call, _ in torch.cuda._queued_calls]
    report["cuda_initialised"] = torch.cuda.is_initialized()
print(json.dumps(report))
"""


def run_hook(framework: str) -> dict:
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    script = HOOK_SCRIPT.format(framework=framework, gpu_mib=L4_MIB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "XLA_", "CUPY_", "GPUALLOC_"))}
    done = subprocess.run([sys.executable, "-c", script, json.dumps(SHARED)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_torch_gets_its_memory_fraction_when_cuda_initialises():
    report = run_hook("torch")
    assert report["applied"] == {"torch": FRACTION} and report["errors"] == {}
    assert ["set_per_process_memory_fraction", [FRACTION, 0]] in report["queued"]
    assert report["cuda_initialised"] is False  # the CPU build: the queued call waits for CUDA
    assert report["loader_restored"]


def test_tensorflow_gets_a_logical_device_memory_limit():
    report = run_hook("tensorflow")
    assert report["applied"] == {"tensorflow": 8192} and report["errors"] == {}


def test_jax_reads_its_fraction_and_does_not_preallocate():
    report = run_hook("jax")
    assert report["applied"] == {"jax": FRACTION} and report["errors"] == {}


def test_cupy_reads_its_memory_limit():
    report = run_hook("cupy")
    assert report["applied"] == {"cupy": 8192 * 1024 * 1024} and report["errors"] == {}


@pytest.fixture
def fake_frameworks(tmp_path, monkeypatch):
    """Two importable packages standing in for frameworks; removed from sys.modules afterwards."""
    for name in ("fakefw_ok", "fakefw_bad"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(textwrap.dedent(f"""
            NAME = {name!r}
            def data():
                import importlib.resources
                return importlib.resources.files(__name__).joinpath("data.txt").read_text()
        """))
        (tmp_path / name / "data.txt").write_text("payload")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("fakefw_ok", "fakefw_bad"):
        sys.modules.pop(name, None)


def test_hooks_fire_once_per_import_and_never_break_it(fake_frameworks, capsys):
    seen = []

    def record(module, cap):
        seen.append((module.__name__, cap.limit_mib))
        return cap.fraction

    def explode(module, cap):
        raise RuntimeError("no GPU here")

    caps = FrameworkCaps({"fakefw_ok": record, "fakefw_bad": explode})
    caps.install(MemoryCap(2048, 0.25))
    import fakefw_bad
    import fakefw_ok

    assert seen == [("fakefw_ok", 2048)]
    assert caps.applied == {"fakefw_ok": 0.25}
    assert caps.errors == {"fakefw_bad": "RuntimeError: no GPU here"}
    assert "gpu: could not cap fakefw_bad's memory: no GPU here" in capsys.readouterr().err
    assert fakefw_ok.data() == "payload" and fakefw_bad.NAME == "fakefw_bad"  # real loader, resources work
    caps.uninstall()
    assert not caps.installed and caps.applied == {}


def test_an_already_imported_framework_is_capped_at_once(fake_frameworks):
    import fakefw_ok

    caps = FrameworkCaps({"fakefw_ok": lambda module, cap: cap.limit_mib})
    caps.install(MemoryCap(1024, 0.5))
    assert caps.applied == {"fakefw_ok": 1024}
    assert fakefw_ok.NAME == "fakefw_ok"
    caps.uninstall()


def test_uninstalled_hooks_leave_imports_alone(fake_frameworks):
    caps = FrameworkCaps({"fakefw_ok": lambda module, cap: cap.limit_mib})
    caps.install(MemoryCap(1024, 0.5))
    caps.uninstall()
    import fakefw_ok  # noqa: F401

    assert caps.applied == {}
    assert not any(type(f).__name__ == "_PostImportFinder" for f in sys.meta_path)
