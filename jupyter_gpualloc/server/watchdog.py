"""The memory-cap watchdog: every few seconds, each GPU process's memory, mapped to this server's kernels.

A process is mapped to a kernel when it is the kernel's process or one of its descendants. A
process over its kernel's shared-slice cap, or using a GPU (or MIG device) its kernel holds no
lease on, is reported at once (`watchdog.over_cap`, `watchdog.unleased_gpu`); if it is still
in violation `grace` seconds later the watchdog acts: `report` (events only), `interrupt` the
kernel, or `shutdown` the kernel (its lease is then released). Time is passed in.

Each round it also reads the SM utilisation the backend can sample and reports, for every lease
of this server whose GPU (or MIG instance) was sampled, the share its holder's processes use (a
kernel's process tree; for the server's own leases, every process under this server) to the
scheduler, which decides GPU idleness (`idle_signal = "gpu" | "both"`) and efficiency from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping

import psutil
from traitlets import Bool, Float, Unicode, validate
from traitlets.config import LoggingConfigurable

from ..client import GpuAllocError
from ..core.devices.base import DeviceBackend, DeviceError, GpuProcess, slice_utilization
from .events import GpuAllocEvents

ACTIONS = ("report", "interrupt", "shutdown")


def cap_mechanisms(lease: Mapping[str, Any] | None, *, watchdog: bool = True,
                   env: Mapping[str, str] | None = None) -> list[str]:
    """The memory caps in force for a lease, strongest first.

    Shared slices: `mps` when an MPS daemon is configured for this server, `hami-core` when its
    library is preloaded, `framework` (PyTorch/JAX/CuPy caps applied in the kernel) always;
    MIG slices are isolated by the hardware (`mig`); whole GPUs need no cap. The `watchdog`
    comes last whenever it runs.
    """
    env = os.environ if env is None else env
    slice_ = (lease or {}).get("slice") or {}
    kind = slice_.get("kind")
    found = []
    if kind == "shared":
        if env.get("CUDA_MPS_PIPE_DIRECTORY") or env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
            found.append("mps")
        if "libvgpu.so" in env.get("LD_PRELOAD", ""):
            found.append("hami-core")
        found.append("framework")
    elif kind == "mig":
        found.append("mig")
    if watchdog:
        found.append("watchdog")
    return found


def process_tree_map(kernel_pids: Mapping[str, int]) -> dict[int, str]:
    """PID -> kernel id, for each kernel's process and all its descendants."""
    owners: dict[int, str] = {}
    for kernel_id, pid in kernel_pids.items():
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for process in tree:
            owners[process.pid] = kernel_id
    return owners


@dataclass
class Violation:
    """A process of a kernel breaking a rule, since `since`; `acted_at` when last acted upon."""

    kind: str  # "over_cap" or "unleased_gpu"
    pid: int
    kernel_id: str
    lease_id: str | None
    gpu_uuid: str
    mig_uuid: str | None
    used_mib: int | None
    cap_mib: int | None
    since: float
    acted_at: float | None = None


def classify(process: GpuProcess, slices: Iterable[Mapping[str, Any]]) -> tuple[str | None, Mapping | None]:
    """(violation kind or None, the slice the process uses or None) against the slices it may use."""
    for slice_ in slices:
        if process.mig_uuid:
            uses = slice_.get("mig_uuid") == process.mig_uuid
        else:
            uses = not slice_.get("mig_uuid") and process.gpu_uuid in slice_.get("gpu_uuids", ())
        if uses:
            over = (slice_.get("kind") == "shared" and process.used_mib is not None
                    and process.used_mib > int(slice_["memory_mib"]))
            return ("over_cap" if over else None), slice_
    return "unleased_gpu", None


class Watchdog(LoggingConfigurable):
    """Reads GPU processes from the device backend: warns, then acts, on kernels breaking their caps, and
    reports each lease's GPU utilisation to the scheduler."""

    enabled = Bool(True, help="Whether the watchdog runs.").tag(config=True)
    interval = Float(5.0, help="Seconds between two reads of every GPU process's memory.").tag(config=True)
    grace = Float(
        30.0, help="Seconds between the warning about a violation and the action, if it lasts that long.",
    ).tag(config=True)
    action = Unicode(
        "report", help="""What to do about a kernel whose process stays over its shared slice's cap or on a GPU
        it holds no lease on: report (events and log only), interrupt (the running cell) or shutdown
        (the kernel; its slice is released).""",
    ).tag(config=True)

    report_utilization = Bool(
        True, help="""Whether each round reports every lease's GPU SM utilisation (where the device backend
        can sample it: NVML per process, or per MIG instance through GPM) to the scheduler, for
        idle_signal = "gpu" or "both" and the efficiency report.""",
    ).tag(config=True)

    @validate("action")
    def _check_action(self, proposal) -> str:
        if proposal["value"] not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}")
        return proposal["value"]

    def __init__(self, backend: DeviceBackend, kernel_manager: Any, lease_of: Callable[[str], dict | None],
                 events: GpuAllocEvents, shared_slices: Callable[[], list[dict]] = list,
                 server_leases: Callable[[], list[dict]] = list,
                 send_utilization: Callable[[str, float], Awaitable[Any]] | None = None, **kwargs: Any):
        """`lease_of(kernel_id)`: the kernel's granted lease; `shared_slices()`: slices every kernel may
        use (the server's own lease, whose env kernels inherit); `server_leases()`: the server's own
        granted leases; `send_utilization(lease_id, sm_percent)`: tells the scheduler (None: nobody)."""
        super().__init__(**kwargs)
        self.backend = backend
        self.kernel_manager = kernel_manager
        self.lease_of = lease_of
        self.events = events
        self.shared_slices = shared_slices
        self.server_leases = server_leases
        self.send_utilization = send_utilization
        self.violations: dict[tuple[int, str], Violation] = {}

    def kernel_pids(self) -> dict[str, int]:
        """Kernel id -> the PID of its process, for this server's running local kernels."""
        pids = {}
        for kernel_id in self.kernel_manager.list_kernel_ids():
            provisioner = getattr(self.kernel_manager.get_kernel(kernel_id), "provisioner", None)
            pid = getattr(provisioner, "pid", None)
            if pid:
                pids[kernel_id] = pid
        return pids

    def scan(self, now: float) -> tuple[list[Violation], list[Violation]]:
        """Read the processes: (violations new this round, violations due for action)."""
        owners = process_tree_map(self.kernel_pids())
        seen, new, due = set(), [], []
        for process in self.backend.process_memory():
            kernel_id = owners.get(process.pid)
            if kernel_id is None:
                continue
            lease = self.lease_of(kernel_id)
            slices = ([lease["slice"]] if lease and lease.get("slice") else []) + list(self.shared_slices())
            kind, slice_ = classify(process, slices)
            if kind is None:
                continue
            key = (process.pid, kind)
            seen.add(key)
            violation = self.violations.get(key)
            if violation is None:
                violation = self.violations[key] = Violation(
                    kind, process.pid, kernel_id, lease["id"] if lease else None, process.gpu_uuid,
                    process.mig_uuid, process.used_mib, int(slice_["memory_mib"]) if slice_ else None, now)
                new.append(violation)
            violation.used_mib = process.used_mib
            if now - (violation.acted_at or violation.since) >= self.grace:
                due.append(violation)
        for key in set(self.violations) - seen:
            del self.violations[key]
        return new, due

    def lease_utilization(self, now: float) -> dict[str, float]:
        """Lease id -> the SM utilisation its holder makes of its slice, for each lease of this server
        whose devices the backend sampled."""
        samples = self.backend.utilization(now)
        if not samples:
            return {}
        holders: list[tuple[dict | None, set[int]]] = []
        owners = process_tree_map(self.kernel_pids())
        for kernel_id in set(owners.values()):
            holders.append((self.lease_of(kernel_id), {pid for pid, k in owners.items() if k == kernel_id}))
        server_tree = set(process_tree_map({"server": os.getpid()}))
        holders += [(lease, server_tree) for lease in self.server_leases()]
        found = {}
        for lease, pids in holders:
            if lease and lease.get("slice"):
                value = slice_utilization(lease["slice"], pids, samples)
                if value is not None:
                    found[lease["id"]] = value
        return found

    async def report(self, now: float) -> None:
        """Send each sampled lease's utilisation to the scheduler (a lease that just ended is skipped)."""
        if self.send_utilization is None or not self.report_utilization:
            return
        try:
            found = self.lease_utilization(now)
        except DeviceError as err:
            self.log.warning("watchdog: cannot sample GPU utilisation: %s", err)
            return
        for lease_id, sm_percent in found.items():
            try:
                await self.send_utilization(lease_id, round(sm_percent, 2))
            except GpuAllocError as err:
                self.log.debug("watchdog: utilisation of lease %s not recorded: %s", lease_id, err)

    async def check(self, now: float) -> None:
        """One round: warn about new violations, act on lasting ones, report utilisation."""
        await self.report(now)
        new, due = self.scan(now)
        for v in new:
            message = self._describe(v)
            self.log.warning("watchdog: %s", message)
            self.events.emit(f"watchdog.{v.kind}", **self._fields(v), action=self.action,
                             act_at=now + self.grace, message=message)
        for v in due:
            v.acted_at = now
            message = f"{self._describe(v)} for {now - v.since:.0f} s: action {self.action}."
            self.log.warning("watchdog: %s", message)
            if self.action == "interrupt" and v.kernel_id in self.kernel_manager:
                await self.kernel_manager.interrupt_kernel(v.kernel_id)
            elif self.action == "shutdown" and v.kernel_id in self.kernel_manager:
                await self.kernel_manager.shutdown_kernel(v.kernel_id)
            self.events.emit("watchdog.action", **self._fields(v), action=self.action, message=message)

    @staticmethod
    def _fields(v: Violation) -> dict[str, Any]:
        return {"pid": v.pid, "kernel_id": v.kernel_id, "lease_id": v.lease_id, "gpu_uuid": v.gpu_uuid,
                "mig_uuid": v.mig_uuid, "used_mib": v.used_mib, "cap_mib": v.cap_mib}

    @staticmethod
    def _describe(v: Violation) -> str:
        if v.kind == "over_cap":
            return (f"process {v.pid} of kernel {v.kernel_id} holds {v.used_mib} MiB, over its slice's cap "
                    f"of {v.cap_mib} MiB")
        device = v.mig_uuid or v.gpu_uuid
        return f"process {v.pid} of kernel {v.kernel_id} uses {device}, on which it holds no lease"
