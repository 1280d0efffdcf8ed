"""A slice granted to this kernel from outside it (the sidebar's Request): it takes effect before the next cell.

The server extension opens a comm with target `COMM_TARGET` on the kernel's shell channel, naming
the lease (server/kernel_slices.py); a kernel handles it between cells, in order with them. The
kernel reads the lease from the service and makes it take effect as `%gpu status` would
(`KernelGpu.adopt`), then closes the comm with its answer on IOPub: whether the slice is in
effect (not when CUDA already runs in the kernel: it must restart), and the line `%gpu` would print.
"""

from __future__ import annotations

from typing import Any

COMM_TARGET = "jupyter_gpualloc.slice"


def register_comm_target(kernel: Any, kernel_gpu: Any) -> None:
    """Answer the server's comms in this kernel (none outside a kernel with a comm manager)."""
    manager = getattr(kernel, "comm_manager", None)
    if manager is not None:
        manager.register_target(COMM_TARGET, lambda comm, msg: answer(comm, msg, kernel_gpu))


def answer(comm: Any, msg: dict, kernel_gpu: Any) -> None:
    """Adopt the lease the comm names; close the comm with {"lease_id", "in_effect", "line"}."""
    from .status import error_line, is_reported

    lease_id = str((msg["content"].get("data") or {}).get("lease_id", ""))
    try:
        line = kernel_gpu.adopt(lease_id)
    except Exception as err:
        if not is_reported(err):
            raise
        line = error_line(err, kernel_gpu.service_url)
    comm.close({"lease_id": lease_id, "in_effect": bool(lease_id) and kernel_gpu.applied_id == lease_id,
                "line": line})
