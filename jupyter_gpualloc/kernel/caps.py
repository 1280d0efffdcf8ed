"""A lease's environment in this process, and framework memory caps applied on import.

`apply_lease_env` puts a granted lease into `os.environ` (the variables come from the one
lease -> env function, `jupyter_gpualloc.lease_env.slice_env`, shared with the spawners and the
kernel provisioner). For a shared slice, `FrameworkCaps` then caps each framework's allocator:

- PyTorch: `torch.cuda.set_per_process_memory_fraction(f, 0)`, queued with `torch.cuda._lazy_call`
  so it runs when CUDA initialises;
- TensorFlow: a logical device with `memory_limit` (MiB) on each GPU, before TensorFlow starts;
- JAX: `XLA_PYTHON_CLIENT_MEM_FRACTION` and `XLA_PYTHON_CLIENT_PREALLOCATE=false`;
- CuPy: `CUPY_GPU_MEMORY_LIMIT` (bytes).

JAX and CuPy read their variables when they start, so for them the import hook only makes sure
the variables are in place. A framework imported before the grant gets its cap at once (if CUDA
is not yet initialised; otherwise the kernel needs a restart anyway).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, Callable, Mapping, MutableMapping

MIB = 1024 * 1024
# What apply_lease_env replaces: every variable a slice sets, except how to reach the service.
KEPT = ("GPUALLOC_URL",)


@dataclass(frozen=True)
class MemoryCap:
    """A shared slice's cap: its memory and its share of the GPU (device 0 once it is the only visible one)."""

    limit_mib: int
    fraction: float | None
    device: int = 0


def cap_from_env(env: Mapping[str, str]) -> MemoryCap | None:
    """The cap the environment describes (GPUALLOC_MEMORY_LIMIT_MIB / _FRACTION), or None."""
    limit = env.get("GPUALLOC_MEMORY_LIMIT_MIB")
    if not limit:
        return None
    fraction = env.get("GPUALLOC_MEMORY_FRACTION")
    return MemoryCap(int(limit), float(fraction) if fraction else None)


def slice_variables() -> tuple[str, ...]:
    """The variables a lease sets in a process (and a release takes back)."""
    from ..lease_env import SLICE_ENV_NAMES

    return tuple(name for name in SLICE_ENV_NAMES if name not in KEPT)


def apply_lease_env(lease: Mapping[str, Any], gpu_memory_mib: int | None,
                    environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Put a granted lease's variables into `environ` (os.environ), clearing a previous slice's.

    Returns the variables set. `gpu_memory_mib` is the GPU's total memory (for the fractions).
    """
    from ..lease_env import slice_env

    environ = os.environ if environ is None else environ
    env = slice_env(lease, gpu_memory_mib=gpu_memory_mib)
    for name in slice_variables():
        environ.pop(name, None)
    environ.update(env)
    return env


def clear_lease_env(environ: MutableMapping[str, str] | None = None) -> None:
    """Take a released slice out of `environ`: no cap variables, and no visible GPU."""
    from ..lease_env import slice_env

    environ = os.environ if environ is None else environ
    for name in slice_variables():
        environ.pop(name, None)
    environ.update(slice_env(None))


def restore_env(saved: Mapping[str, str], environ: MutableMapping[str, str] | None = None) -> None:
    """Put back slice variables saved earlier (e.g. the ones the process started with), and only those."""
    environ = os.environ if environ is None else environ
    for name in slice_variables():
        environ.pop(name, None)
    environ.update(saved)


# ------------------------------------------------------------------ appliers


def _cap_torch(torch: ModuleType, cap: MemoryCap) -> float | None:
    if cap.fraction is None:
        return None
    torch.cuda._lazy_call(partial(torch.cuda.set_per_process_memory_fraction, cap.fraction, cap.device))
    return cap.fraction


def _cap_tensorflow(tf: ModuleType, cap: MemoryCap) -> int:
    config = [tf.config.LogicalDeviceConfiguration(memory_limit=cap.limit_mib)]
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.set_logical_device_configuration(gpu, config)
    return cap.limit_mib


def _cap_jax(_jax: ModuleType, cap: MemoryCap) -> float | None:
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if cap.fraction is not None:
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{cap.fraction:g}")
    value = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    return float(value) if value else None


def _cap_cupy(_cupy: ModuleType, cap: MemoryCap) -> int:
    os.environ.setdefault("CUPY_GPU_MEMORY_LIMIT", str(cap.limit_mib * MIB))
    return int(os.environ["CUPY_GPU_MEMORY_LIMIT"])


# top-level module name -> applier; what an applier returns is recorded in FrameworkCaps.applied
APPLIERS: dict[str, Callable[[ModuleType, MemoryCap], Any]] = {
    "torch": _cap_torch,
    "tensorflow": _cap_tensorflow,
    "jax": _cap_jax,
    "cupy": _cap_cupy,
}
FRAMEWORK_NAMES = {"torch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX", "cupy": "CuPy"}


class FrameworkCaps:
    """Applies one memory cap to each framework: now if imported, else when it is imported."""

    def __init__(self, appliers: Mapping[str, Callable[[ModuleType, MemoryCap], Any]] | None = None):
        self.appliers = dict(APPLIERS if appliers is None else appliers)
        self.cap: MemoryCap | None = None
        self.applied: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self._finder: _PostImportFinder | None = None

    def install(self, cap: MemoryCap) -> None:
        """Cap every framework with `cap`: the imported ones now, the others on import."""
        self.uninstall()
        self.cap = cap
        for name in self.appliers:
            if name in sys.modules:
                self._apply(sys.modules[name])
        self._finder = _PostImportFinder(set(self.appliers) - set(sys.modules), self._apply)
        sys.meta_path.insert(0, self._finder)

    def uninstall(self) -> None:
        """Stop capping frameworks imported from now on (caps already applied stay)."""
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        self.cap = None
        self.applied.clear()
        self.errors.clear()

    @property
    def installed(self) -> bool:
        return self._finder is not None

    def _apply(self, module: ModuleType) -> None:
        name = module.__name__
        if self.cap is None or name not in self.appliers:
            return
        try:
            self.applied[name] = self.appliers[name](module, self.cap)
        except Exception as err:  # a cap that fails must never break the user's import
            self.errors[name] = f"{type(err).__name__}: {err}"
            print(f"gpu: could not cap {FRAMEWORK_NAMES.get(name, name)}'s memory: {err}", file=sys.stderr)

    def describe(self) -> str:
        """'PyTorch (fraction 0.3556)', ... for the frameworks capped so far; '' if none."""
        parts = []
        for name, value in self.applied.items():
            label = FRAMEWORK_NAMES.get(name, name)
            if name in ("torch", "jax") and value is not None:
                parts.append(f"{label} (fraction {value:g})")
            elif name == "tensorflow":
                parts.append(f"{label} ({value} MiB)")
            elif name == "cupy":
                parts.append(f"{label} ({value // MIB} MiB)")
            else:
                parts.append(label)
        return ", ".join(parts)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` right after one of `names` (top-level modules) is first imported."""

    def __init__(self, names: set[str], callback: Callable[[ModuleType], None]):
        self.names = names
        self.callback = callback
        self._finding: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname not in self.names or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _NotifyingLoader(spec.loader, self.callback)
        return spec


class _NotifyingLoader(importlib.abc.Loader):
    """Wraps a loader: the module gets its real loader back, and the callback runs after it executes."""

    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[ModuleType], None]):
        self.loader = loader
        self.callback = callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.callback(module)
