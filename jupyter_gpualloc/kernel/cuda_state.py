"""Whether this process already has a CUDA context, and how much GPU memory it holds.

Once CUDA is initialised, changing `CUDA_VISIBLE_DEVICES` has no effect in the process, so a new
slice needs a kernel restart. Detection only looks at modules that are already imported (it never
imports a framework): one detector per framework module name, in `DETECTORS`, plus the generic
sign that the CUDA driver library is mapped into the process (CuPy and TensorFlow load it only
when they first talk to the GPU).
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Callable, Mapping

Detector = Callable[[ModuleType], bool]

DRIVER_LIBRARY = "libcuda.so"
DRIVER_NAME = "the CUDA driver"


def _torch_initialised(torch: ModuleType) -> bool:
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_initialized())


def _jax_initialised(xla_bridge: ModuleType) -> bool:
    backends = getattr(xla_bridge, "_backends", None) or {}
    return any(name in ("cuda", "gpu", "rocm") for name in backends)


# module name in sys.modules -> (framework name for people, detector)
DETECTORS: dict[str, tuple[str, Detector]] = {
    "torch": ("torch", _torch_initialised),
    "jax._src.xla_bridge": ("jax", _jax_initialised),
}


def register_detector(module_name: str, framework: str, detector: Detector) -> None:
    """Add a check that runs when `module_name` is imported: True if it holds a CUDA context."""
    DETECTORS[module_name] = (framework, detector)


def driver_loaded(maps_path: str = "/proc/self/maps") -> bool:
    """Whether the CUDA driver library is mapped into this process (Linux; False elsewhere)."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as maps:
            return any(DRIVER_LIBRARY in line for line in maps)
    except OSError:
        return False


def cuda_initialised_by(modules: Mapping[str, ModuleType] | None = None,
                        maps_path: str = "/proc/self/maps") -> list[str]:
    """Who holds a CUDA context in this process: framework names (or the driver); empty if none.

    A detector that fails counts as "initialised": a wrong restart hint is cheaper than a slice
    that silently does not apply.
    """
    modules = sys.modules if modules is None else modules
    found = []
    for module_name, (framework, detector) in DETECTORS.items():
        module = modules.get(module_name)
        if module is None:
            continue
        try:
            initialised = detector(module)
        except Exception:  # a framework's private API changed: assume the worst
            initialised = True
        if initialised:
            found.append(framework)
    if not found and driver_loaded(maps_path):
        found.append(DRIVER_NAME)
    return found


def memory_used_mib() -> int | None:
    """GPU memory this process holds, in MiB; None when it cannot be measured.

    PyTorch's reserved memory when torch has initialised CUDA, else the driver's per-process
    count through NVML (host PIDs: inside a container whose PIDs differ, nothing matches).
    """
    torch = sys.modules.get("torch")
    try:
        if torch is not None and _torch_initialised(torch):
            return int(torch.cuda.memory_reserved() // (1024 * 1024))
    except Exception:
        return None
    if not driver_loaded():
        return None
    from ..core.devices.base import DeviceError
    from ..core.devices.nvml import NvmlBackend

    try:
        backend = NvmlBackend()
    except DeviceError:
        return None
    try:
        mine = [p.used_mib for p in backend.process_memory() if p.pid == os.getpid() and p.used_mib is not None]
    except DeviceError:
        return None
    finally:
        backend.close()
    return sum(mine) if mine else None
