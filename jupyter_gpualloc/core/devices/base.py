"""The one interface every source of GPUs implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..model import MigInstance, MigProfile, Node


class DeviceError(RuntimeError):
    """A device operation failed; the message is meant for people."""


class DeviceUnavailable(DeviceError):
    """No GPUs can be reached at all (no driver, no library)."""


class DevicePermissionError(DeviceError):
    """The operation needs privileges this process lacks (e.g. creating MIG instances)."""


class GpuLost(DeviceError):
    """The GPU fell off the bus or stopped answering."""


@dataclass(frozen=True)
class GpuProcess:
    """A process using GPU memory, as the driver (or simulator) reports it.

    `used_mib` is None when the driver cannot tell how much memory the process holds.
    """

    pid: int
    gpu_uuid: str
    used_mib: int | None
    mig_uuid: str | None = None


@dataclass(frozen=True)
class GpuUtilization:
    """SM utilisation of one GPU or MIG device over the driver's last sampling period.

    `processes` maps each PID the driver attributed SM time to (0-100 each), and is None when the
    driver cannot attribute it per process (MIG instances; `sm_percent` of the whole device then).
    `sm_percent` is None when only per-process figures exist. A device absent from a backend's
    answer could not be sampled at all: its leases' idleness is left to activity.
    """

    gpu_uuid: str
    mig_uuid: str | None = None
    sm_percent: float | None = None
    processes: Mapping[int, float] | None = None


def slice_utilization(slice_: Mapping[str, Any], pids: set[int], samples: Iterable[GpuUtilization]) -> float | None:
    """SM utilisation (percent) that processes `pids` make of a slice (as REST API v1 writes it): on
    each of its devices their total (or, where the driver attributes none per process, the device's
    own figure unless the slice shares the GPU), averaged over its GPUs; None when none of its
    devices was sampled."""
    if slice_.get("mig_uuid"):
        devices = [u for u in samples if u.mig_uuid == slice_["mig_uuid"]]
    else:
        gpus = set(slice_.get("gpu_uuids") or ())
        devices = [u for u in samples if u.mig_uuid is None and u.gpu_uuid in gpus]
    values = []
    for device in devices:
        if device.processes is not None:
            values.append(min(100.0, sum(v for pid, v in device.processes.items() if pid in pids)))
        elif device.sm_percent is not None and slice_.get("kind") != "shared":
            values.append(device.sm_percent)
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class UnusableNode:
    """A node a backend found but cannot serve (e.g. a MIG model the catalogue lacks), and why."""

    name: str
    reason: str


class DeviceBackend(ABC):
    """Where GPUs come from: enumeration, MIG instance life cycle, per-process memory and utilisation."""

    name: str = "abstract"

    @abstractmethod
    def discover(self) -> list[Node]:
        """Every node with its GPUs, each GPU's MIG mode and its existing MIG instances."""

    @abstractmethod
    def mig_profiles(self, gpu_uuid: str) -> dict[int, MigProfile]:
        """The MIG profiles this GPU supports, by profile id (empty when MIG is off)."""

    @abstractmethod
    def create_mig_instance(self, gpu_uuid: str, profile_id: int, start: int) -> MigInstance:
        """Create a GPU instance (and its compute instance) at an explicit placement."""

    @abstractmethod
    def destroy_mig_instance(self, gpu_uuid: str, mig_uuid: str) -> None:
        """Destroy a MIG instance created earlier (its compute instance first)."""

    def restore_mig_instance(self, gpu_uuid: str, instance: MigInstance) -> bool:
        """Hold again, after a restart, an instance the core made that discover() no longer shows;
        False where such an instance is gone (default: on a device, something destroyed it). A
        backend whose instances exist only while a claim names them (DRA) keeps the lease's."""
        return False

    @abstractmethod
    def process_memory(self) -> list[GpuProcess]:
        """Each process currently holding GPU memory, with the GPU (or MIG device) it uses."""

    def utilization(self, now: float) -> list[GpuUtilization]:
        """SM utilisation of each GPU or MIG device the backend can sample (`now`: the caller's time,
        for backends that simulate it). Default: none can be sampled."""
        return []

    def unusable_nodes(self) -> list[UnusableNode]:
        """The nodes the last discover() found but left out, each with its reason."""
        return []

    @property
    def serves_running_processes(self) -> bool:
        """Whether a process already running can use a slice granted to it (its CUDA_VISIBLE_DEVICES
        set before CUDA starts). False on Kubernetes: the device plugin gives a pod its devices
        when the pod is created, so there only a server, whose pod is made for its slice, holds one."""
        return True

    @property
    def can_change_mig(self) -> bool:
        """Whether this backend may create and destroy MIG instances (dynamic MIG)."""
        return True

    def close(self) -> None:
        """Release whatever the backend holds open."""
