"""Inside the user's kernel: the `%gpu` magic, the lease view and framework memory caps.

`%load_ext jupyter_gpualloc` (or `jupyter_gpualloc.kernel`) registers `%gpu` and `%%gpu job`. Loading imports no
framework (torch, tensorflow, jax, cupy) and no server code, and makes no network call, except in a
kernel launched with its slice, which follows its lease's notices from the start; otherwise the
service client is made on the first `%gpu`.
"""

from __future__ import annotations

from typing import Any

_LOADED: dict[int, Any] = {}


def load_ipython_extension(ipython: Any) -> None:
    """Register `%gpu` in this IPython shell (a kernel's, or a terminal's)."""
    from .granted import register_comm_target
    from .job_magics import GpuJobMagics
    from .magics import GpuMagics, KernelGpu

    if id(ipython) in _LOADED:
        return
    kernel_gpu = KernelGpu(in_kernel=getattr(ipython, "kernel", None) is not None)
    _LOADED[id(ipython)] = kernel_gpu
    ipython.register_magics(GpuMagics(ipython, kernel_gpu))
    ipython.register_magics(GpuJobMagics(ipython, kernel_gpu))
    kernel_gpu.follow_lease_from_launch()
    register_comm_target(getattr(ipython, "kernel", None), kernel_gpu)


def unload_ipython_extension(ipython: Any) -> None:
    """Stop heartbeats and framework caps (the lease itself stays with the kernel)."""
    kernel_gpu = _LOADED.pop(id(ipython), None)
    if kernel_gpu is not None:
        kernel_gpu.close()
