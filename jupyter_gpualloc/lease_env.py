"""The environment a process gets from a lease: visible devices, memory caps and the service link.

One function, `slice_env`, shared by the spawners (a server's env), the kernel provisioner (a
kernel's env), the job runner and the kernel's `%gpu`. It reads the lease JSON of REST API v1 and
imports only the standard library, so every client of the service sits above it.
"""

from __future__ import annotations

from typing import Any, Mapping

MIB = 1024 * 1024
NO_DEVICES_FOR_CONTAINERS = "void"  # what the NVIDIA container runtime reads as "no GPU"
IN_A_POD_VARIABLE = "GPUALLOC_KERNEL_POD"  # "1" in a GPU kernel running in a pod of its own (Kubernetes)
# "1" in a kernel whose Jupyter server heartbeats it (the server extension's activity report keeps
# every kernel it runs alive): the kernel sends no heartbeat of its own
KEPT_ALIVE_VARIABLE = "GPUALLOC_KEPT_ALIVE_BY_SERVER"
# Why GPU slices are off in the kernel's server (no GPU and no fleet, no allocator): %gpu says it
OFF_VARIABLE = "GPUALLOC_OFF_REASON"

# Every variable slice_env may set, so a caller can clear stale ones before applying a new lease.
SLICE_ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GPUALLOC_URL", "GPUALLOC_LEASE_ID",
    "GPUALLOC_SLICE_KIND", "GPUALLOC_MEMORY_LIMIT_MIB", "GPUALLOC_MEMORY_FRACTION",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT", "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE", "CUPY_GPU_MEMORY_LIMIT",
)


def server_holder(server_name: str) -> str:
    """The holder of a single-user server's lease: 'server', or 'server:<name>' for a named server."""
    return f"server:{server_name}" if server_name else "server"


def memory_fraction(slice_: Mapping[str, Any], gpu_memory_mib: int | None = None) -> float:
    """The share of its GPU a slice may use: memory_mib / the GPU's memory (else milli / 1000)."""
    if gpu_memory_mib:
        return min(1.0, slice_["memory_mib"] / gpu_memory_mib)
    return min(1.0, slice_.get("milli", 1000) / 1000)


def slice_env(lease: Mapping[str, Any] | None, *, service_url: str | None = None,
              gpu_memory_mib: int | None = None, mps: bool = False, containers: bool = False,
              visible_devices: bool = True) -> dict[str, str]:
    """Environment variables for a process holding `lease` (a granted lease's JSON), or no GPU.

    - `CUDA_VISIBLE_DEVICES`: the MIG UUID or the GPU UUIDs (empty without a lease, so no GPU is
      used without one); `NVIDIA_VISIBLE_DEVICES` too when `containers`; neither when
      `visible_devices` is False (a device plugin chooses the device).
    - Shared slices: `GPUALLOC_MEMORY_LIMIT_MIB`, `GPUALLOC_MEMORY_FRACTION` (PyTorch),
      `CUDA_DEVICE_MEMORY_LIMIT` (HAMi-core), `XLA_PYTHON_CLIENT_MEM_FRACTION` and
      `XLA_PYTHON_CLIENT_PREALLOCATE=false` (JAX), `CUPY_GPU_MEMORY_LIMIT` (bytes) and, with
      `mps` (an MPS daemon serves the GPU), `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`.
      `gpu_memory_mib` is the GPU's total memory, for the fractions.
    - `GPUALLOC_URL` (the service as this process reaches it) and `GPUALLOC_LEASE_ID`.
    """
    env: dict[str, str] = {}
    if service_url:
        env["GPUALLOC_URL"] = service_url
    slice_ = (lease or {}).get("slice")
    if lease is not None and (lease.get("state") != "granted" or not slice_):
        raise ValueError(f"lease {lease.get('id')} is {lease.get('state')}, not granted: it has no slice")
    if not slice_:
        if visible_devices:
            env["CUDA_VISIBLE_DEVICES"] = ""
            if containers:
                env["NVIDIA_VISIBLE_DEVICES"] = NO_DEVICES_FOR_CONTAINERS
        return env
    env["GPUALLOC_LEASE_ID"] = str(lease["id"])
    env["GPUALLOC_SLICE_KIND"] = slice_["kind"]
    if visible_devices:
        devices = slice_.get("mig_uuid") or ",".join(slice_["gpu_uuids"])
        env["CUDA_VISIBLE_DEVICES"] = devices
        if containers:
            env["NVIDIA_VISIBLE_DEVICES"] = devices
    if slice_["kind"] == "shared":
        mib = int(slice_["memory_mib"])
        fraction = memory_fraction(slice_, gpu_memory_mib)
        text = f"{fraction:.4f}".rstrip("0").rstrip(".")
        env["GPUALLOC_MEMORY_LIMIT_MIB"] = str(mib)
        env["GPUALLOC_MEMORY_FRACTION"] = text
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{mib}m"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = text
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env["CUPY_GPU_MEMORY_LIMIT"] = str(mib * MIB)
        if mps:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib}M"
    return env
