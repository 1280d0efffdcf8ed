"""The real GPUs of this host, through NVML (pynvml, package nvidia-ml-py).

Enumerates GPUs, their MIG mode, the MIG profiles and placements the driver reports, existing
GPU instances with their MIG device UUIDs, per-process GPU memory and SM utilisation (per process
on GPUs without MIG, per MIG instance through GPM where the GPU has it); creates and destroys MIG
instances at explicit placements. It never changes MIG mode, compute mode or clocks.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from contextlib import contextmanager, suppress
from ctypes import byref, c_uint
from typing import Any, Iterator

import pynvml

from .. import mig
from ..model import Gpu, MigInstance, MigMode, MigProfile, Node
from .base import (DeviceBackend, DeviceError, DevicePermissionError, DeviceUnavailable, GpuLost, GpuProcess,
                   GpuUtilization)

_MIB = 1024 * 1024
log = logging.getLogger(__name__)
# each caller says how to use a simulated fleet instead (a command-line option, a config trait)
LIBRARY_NOT_FOUND = "NVML not available: the NVIDIA driver library (libnvidia-ml.so.1) was not found"
DRIVER_NOT_LOADED = "NVML not available: the NVIDIA kernel driver is not loaded"
_ABSENT = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument)
_UNSAMPLED = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NoPermission)
_REASONS = {
    pynvml.NVML_ERROR_IN_USE: "in use (processes are still running on it)",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES:
        "insufficient resources (the placement overlaps an existing instance or the GPU is full)",
}


class NvmlBackend(DeviceBackend):
    """This host's NVIDIA GPUs as the driver reports them."""

    name = "nvml"

    def __init__(self, *, node_name: str | None = None):
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            raise DeviceUnavailable(LIBRARY_NOT_FOUND) from None
        except pynvml.NVMLError_DriverNotLoaded:
            raise DeviceUnavailable(DRIVER_NOT_LOADED) from None
        except pynvml.NVMLError as exc:
            raise DeviceUnavailable(f"NVML not available: {exc}") from None
        self.node_name = node_name or socket.gethostname()
        self._can_change_mig = True
        self._profiles: dict[str, dict[int, MigProfile]] = {}
        self._catalogue_differences: dict[str, list[str]] = {}
        self._last_seen_us: dict[str, int] = {}  # GPU UUID -> newest process-utilisation sample read
        self._gpm_support: dict[str, bool] = {}
        self._gpm_samples: dict[tuple[str, str], Any] = {}  # (GPU, MIG UUID) -> its previous GPM sample
        self._open = True

    @property
    def can_change_mig(self) -> bool:
        """False once the driver refused a MIG change for lack of permission (MIG is then static)."""
        return self._can_change_mig

    def close(self) -> None:
        if self._open:
            self._open = False
            for sample in self._gpm_samples.values():
                with suppress(pynvml.NVMLError):
                    pynvml.nvmlGpmSampleFree(sample)
            self._gpm_samples.clear()
            pynvml.nvmlShutdown()

    # Enumeration

    def discover(self) -> list[Node]:
        with self._nvml("count GPUs"):
            count = pynvml.nvmlDeviceGetCount()
        gpus = [self._read_gpu(index) for index in range(count)]
        return [Node(name=self.node_name, cpu_milli=(os.cpu_count() or 1) * 1000,
                     memory_mib=_host_memory_mib(), gpus=gpus)]

    def mig_profiles(self, gpu_uuid: str) -> dict[int, MigProfile]:
        handle = self._handle(gpu_uuid)
        with self._nvml("read the MIG mode", gpu_uuid):
            enabled, _ = self._mig_state(handle)
        return dict(self._read_profiles(handle, gpu_uuid)) if enabled else {}

    def _read_gpu(self, index: int) -> Gpu:
        with self._nvml(f"read GPU {index}", f"index {index}"):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
        with self._nvml("read its properties", uuid):
            enabled, capable = self._mig_state(handle)
            gpu = Gpu(uuid=uuid, index=index, model=_model_name(pynvml.nvmlDeviceGetName(handle)),
                      memory_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB, node=self.node_name,
                      mig_capable=capable, mig_mode=MigMode.OFF)
        if enabled:
            gpu.mig_mode = MigMode.DYNAMIC if self._can_change_mig else MigMode.STATIC
            profiles = self._read_profiles(handle, uuid)
            with self._nvml("list its MIG instances", uuid):
                gpu.instances = self._instances(handle, profiles)
        return gpu

    @staticmethod
    def _mig_state(handle: Any) -> tuple[bool, bool]:
        """(MIG enabled now, MIG-capable); NotSupported means the GPU cannot do MIG."""
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError_NotSupported:
            return False, False
        return current == pynvml.NVML_DEVICE_MIG_ENABLE, True

    def _read_profiles(self, handle: Any, gpu_uuid: str) -> dict[int, MigProfile]:
        """The GPU-instance profiles the driver offers on this GPU, read once per GPU; where they
        differ from the catalogue (mig.py) the driver wins, and each difference is logged."""
        if gpu_uuid in self._profiles:
            return self._profiles[gpu_uuid]
        profiles: dict[int, MigProfile] = {}
        with self._nvml("read its MIG profiles", gpu_uuid):
            for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
                try:
                    info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
                except _ABSENT:
                    continue
                placements = _placements(handle, info.id)
                if not placements:
                    continue
                name = _profile_name(info, index)
                profiles[info.id] = MigProfile(
                    profile_id=info.id, name=name, compute_slices=info.sliceCount,
                    memory_slices=placements[0][1], memory_mib=info.memorySizeMB,
                    max_instances=info.instanceCount, starts=tuple(start for start, _ in placements),
                    sms=info.multiprocessorCount, media_extensions=name.endswith("+me"))
            model = _model_name(pynvml.nvmlDeviceGetName(handle))
        self._profiles[gpu_uuid] = profiles
        self._catalogue_differences[gpu_uuid] = differences = mig.catalogue_differences(model, profiles)
        for difference in differences:
            log.warning("GPU %s: the driver's MIG profiles win over the catalogue: %s", gpu_uuid, difference)
        return profiles

    def _instances(self, handle: Any, profiles: dict[int, MigProfile]) -> list[MigInstance]:
        """Existing GPU instances; one without a compute instance has no MIG device, so uuid ''."""
        devices: dict[int, tuple[int, str]] = {}
        for gi_id, ci_id, uuid, _ in _mig_devices(handle):
            if gi_id not in devices or ci_id < devices[gi_id][0]:
                devices[gi_id] = (ci_id, uuid)
        instances = []
        for profile in profiles.values():
            for gi in _gpu_instances(handle, profile):
                info = pynvml.nvmlGpuInstanceGetInfo(gi)
                ci_id, uuid = devices.get(info.id, (-1, ""))
                instances.append(MigInstance(uuid=uuid, profile_id=info.profileId, start=info.placement.start,
                                             size=info.placement.size, gi_id=info.id, ci_id=ci_id))
        return sorted(instances, key=lambda i: i.start)

    # MIG life cycle

    def create_mig_instance(self, gpu_uuid: str, profile_id: int, start: int) -> MigInstance:
        self._check_can_change("create a MIG instance", gpu_uuid)
        profile = self.mig_profiles(gpu_uuid).get(profile_id)
        if profile is None:
            raise DeviceError(f"GPU {gpu_uuid} offers no MIG profile id {profile_id} (is MIG enabled?)")
        handle = self._handle(gpu_uuid)
        action = f"create a {profile.name} instance at start {start}"
        with self._nvml(action, gpu_uuid, mig_change=True):
            placement = pynvml.c_nvmlGpuInstancePlacement_t(start, profile.memory_slices)
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, byref(placement))
            try:
                pynvml.nvmlGpuInstanceCreateComputeInstance(gi, _full_compute_profile(gi, profile.compute_slices))
                gi_id = pynvml.nvmlGpuInstanceGetInfo(gi).id
            except (pynvml.NVMLError, DeviceError):
                with suppress(pynvml.NVMLError):
                    pynvml.nvmlGpuInstanceDestroy(gi)
                raise
            for device_gi, ci_id, uuid, _ in _mig_devices(handle):
                if device_gi == gi_id:
                    return MigInstance(uuid=uuid, profile_id=profile_id, start=start,
                                       size=profile.memory_slices, gi_id=gi_id, ci_id=ci_id)
        raise DeviceError(f"created GPU instance {gi_id} on GPU {gpu_uuid}, but no MIG device appeared for it")

    def destroy_mig_instance(self, gpu_uuid: str, mig_uuid: str) -> None:
        self._check_can_change("destroy a MIG instance", gpu_uuid)
        handle = self._handle(gpu_uuid)
        with self._nvml(f"destroy MIG instance {mig_uuid}", gpu_uuid, mig_change=True):
            gi_id = next((gi for gi, _, uuid, _ in _mig_devices(handle) if uuid == mig_uuid), None)
            if gi_id is None:
                raise DeviceError(f"GPU {gpu_uuid} has no MIG instance {mig_uuid}")
            gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            for ci in _compute_instances(gi):
                pynvml.nvmlComputeInstanceDestroy(ci)
            pynvml.nvmlGpuInstanceDestroy(gi)

    # Processes

    def process_memory(self) -> list[GpuProcess]:
        """Compute processes per GPU, and per MIG device on MIG GPUs (host PIDs)."""
        with self._nvml("count GPUs"):
            count = pynvml.nvmlDeviceGetCount()
        processes: list[GpuProcess] = []
        for index in range(count):
            with self._nvml(f"read GPU {index}", f"index {index}"):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
            with self._nvml("list its processes", uuid):
                enabled, _ = self._mig_state(handle)
                if not enabled:
                    processes += [_process(p, uuid) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
                    continue
                for _, _, mig_uuid, mig_handle in _mig_devices(handle):
                    processes += [_process(p, uuid, mig_uuid)
                                  for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig_handle)]
        return processes

    # Utilisation

    def utilization(self, now: float) -> list[GpuUtilization]:
        """SM utilisation since the previous call: per process on GPUs without MIG
        (nvmlDeviceGetProcessUtilization; the device's rate where the driver attributes none), per
        MIG instance from two GPM samples where the GPU has GPM (Hopper and later). The first call
        only takes the GPM samples to compare with; devices the driver cannot sample are left out."""
        with self._nvml("count GPUs"):
            count = pynvml.nvmlDeviceGetCount()
        found: list[GpuUtilization] = []
        for index in range(count):
            with self._nvml(f"read GPU {index}", f"index {index}"):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
            with self._nvml("sample its utilisation", uuid):
                enabled, _ = self._mig_state(handle)
                if enabled:
                    found += self._mig_utilization(handle, uuid)
                else:
                    sample = self._gpu_utilization(handle, uuid)
                    if sample is not None:
                        found.append(sample)
        return found

    def _gpu_utilization(self, handle: Any, uuid: str) -> GpuUtilization | None:
        """Each process's mean SM utilisation over the samples newer than the last ones read."""
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, self._last_seen_us.get(uuid, 0))
        except pynvml.NVMLError_NotFound:  # no process used the GPU since the last samples read
            samples = []
        except _UNSAMPLED:
            rates = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
            return None if rates is None else GpuUtilization(uuid, sm_percent=float(rates.gpu))
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_SUCCESS:  # success with no sample: pynvml raises it as an error
                raise
            samples = []
        per_pid: dict[int, list[int]] = {}
        for sample in samples:
            per_pid.setdefault(sample.pid, []).append(sample.smUtil)
            self._last_seen_us[uuid] = max(self._last_seen_us.get(uuid, 0), sample.timeStamp)
        return GpuUtilization(uuid, processes={pid: sum(v) / len(v) for pid, v in per_pid.items()})

    def _mig_utilization(self, handle: Any, uuid: str) -> list[GpuUtilization]:
        """Each MIG instance's SM utilisation between its previous GPM sample and a new one."""
        if not self._has_gpm(handle, uuid):
            return []
        found = []
        devices = _mig_devices(handle)
        for gi_id, _, mig_uuid, _ in devices:
            sample = pynvml.nvmlGpmSampleAlloc()
            try:
                pynvml.nvmlGpmMigSampleGet(handle, gi_id, sample)
            except pynvml.NVMLError as exc:
                pynvml.nvmlGpmSampleFree(sample)
                if isinstance(exc, pynvml.NVMLError_NotFound):
                    continue  # destroyed since it was listed
                raise
            previous = self._gpm_samples.pop((uuid, mig_uuid), None)
            self._gpm_samples[(uuid, mig_uuid)] = sample
            if previous is None:
                continue  # no samples yet: the next call compares with this one
            try:
                value = _gpm_sm_util(previous, sample)
            finally:
                pynvml.nvmlGpmSampleFree(previous)
            if value is not None:
                found.append(GpuUtilization(uuid, mig_uuid, sm_percent=value))
        present = {(uuid, mig_uuid) for _, _, mig_uuid, _ in devices}
        for gone in [key for key in self._gpm_samples if key[0] == uuid and key not in present]:
            pynvml.nvmlGpmSampleFree(self._gpm_samples.pop(gone))  # its instance was destroyed
        return found

    def _has_gpm(self, handle: Any, uuid: str) -> bool:
        if uuid not in self._gpm_support:
            try:
                self._gpm_support[uuid] = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            except _UNSAMPLED:
                self._gpm_support[uuid] = False
            if not self._gpm_support[uuid]:
                log.info("GPU %s: no GPM, its MIG instances' utilisation cannot be sampled", uuid)
        return self._gpm_support[uuid]

    # Hardware report

    def describe(self) -> dict[str, Any]:
        """Everything enumerated, as a JSON-able dict (read-only), for a hardware report."""
        with self._nvml("read the driver version"):
            report: dict[str, Any] = {
                "backend": self.name, "node": self.node_name,
                "driver_version": _optional(pynvml.nvmlSystemGetDriverVersion),
                "nvml_version": _optional(pynvml.nvmlSystemGetNVMLVersion),
                "cuda_driver_version": _optional(pynvml.nvmlSystemGetCudaDriverVersion),
                "can_change_mig": self._can_change_mig, "gpus": [],
            }
        processes = self.process_memory()
        for gpu in self.discover()[0].gpus:
            handle = self._handle(gpu.uuid)
            with self._nvml("describe it", gpu.uuid):
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                mode = _optional(pynvml.nvmlDeviceGetMigMode, handle)
            profiles = self._read_profiles(handle, gpu.uuid) if gpu.mig_mode is not MigMode.OFF else {}
            report["gpus"].append({
                "index": gpu.index, "uuid": gpu.uuid, "name": gpu.model,
                "memory_mib": {"total": memory.total // _MIB, "used": memory.used // _MIB,
                               "free": memory.free // _MIB},
                "mig_capable": gpu.mig_capable,
                "mig_mode": {"current": mode[0], "pending": mode[1]} if mode else None,
                "mig_profiles": [{"profile_id": p.profile_id, "name": p.name, "compute_slices": p.compute_slices,
                                  "memory_slices": p.memory_slices, "memory_mib": p.memory_mib,
                                  "max_instances": p.max_instances, "starts": list(p.starts), "sms": p.sms}
                                 for p in profiles.values()],
                "catalogue_differences": self._catalogue_differences.get(gpu.uuid, []),
                "mig_instances": [{"uuid": i.uuid, "profile_id": i.profile_id, "start": i.start, "size": i.size,
                                   "gi_id": i.gi_id, "ci_id": i.ci_id} for i in gpu.instances],
                "processes": [{"pid": p.pid, "used_mib": p.used_mib, "mig_uuid": p.mig_uuid}
                              for p in processes if p.gpu_uuid == gpu.uuid],
            })
        return report

    # Helpers

    def _handle(self, gpu_uuid: str) -> Any:
        with self._nvml("find the GPU", gpu_uuid):
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            except pynvml.NVMLError_NotFound:
                raise DeviceError(f"no GPU {gpu_uuid} on {self.node_name}") from None

    def _check_can_change(self, action: str, gpu_uuid: str) -> None:
        if not self._can_change_mig:
            raise DevicePermissionError(
                f"cannot {action} on GPU {gpu_uuid}: MIG is static here (the driver refused an earlier "
                "change for lack of permission)")

    @contextmanager
    def _nvml(self, action: str, gpu: str | None = None, *, mig_change: bool = False) -> Iterator[None]:
        """Turn NVML errors into DeviceErrors that say what failed, and on which GPU."""
        where = f" on GPU {gpu}" if gpu else ""
        try:
            yield
        except pynvml.NVMLError_GpuIsLost:
            raise GpuLost(f"GPU {gpu} is lost (it fell off the bus or stopped answering) while trying to "
                          f"{action}; check the kernel log for Xid errors: the GPU needs a reset") from None
        except pynvml.NVMLError_NoPermission as exc:
            if mig_change:
                self._can_change_mig = False
                raise DevicePermissionError(
                    f"cannot {action}{where}: insufficient permissions. Creating and destroying MIG instances "
                    "needs root (or read access to /proc/driver/nvidia/capabilities/mig/config); MIG is "
                    "static from now on") from exc
            raise DevicePermissionError(f"cannot {action}{where}: insufficient permissions") from exc
        except pynvml.NVMLError_LibraryNotFound:
            raise DeviceUnavailable(LIBRARY_NOT_FOUND) from None
        except (pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_Uninitialized):
            raise DeviceUnavailable(DRIVER_NOT_LOADED) from None
        except pynvml.NVMLError as exc:
            reason = _REASONS.get(exc.value) or str(exc)
            raise DeviceError(f"cannot {action}{where}: {reason}") from exc


def _placements(handle: Any, profile_id: int) -> list[tuple[int, int]]:
    count = c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, byref(count))
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, placements, byref(count))
    return [(p.start, p.size) for p in placements[:count.value]]


def _gpu_instances(handle: Any, profile: MigProfile) -> list[Any]:
    instances = (pynvml.c_nvmlGpuInstance_t * profile.max_instances)()
    count = c_uint(0)
    pynvml.nvmlDeviceGetGpuInstances(handle, profile.profile_id, instances, byref(count))
    return list(instances[:count.value])


def _mig_devices(handle: Any) -> list[tuple[int, int, str, Any]]:
    """(GI id, CI id, MIG UUID, handle) of each MIG device on a GPU."""
    devices = []
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except pynvml.NVMLError_NotFound:
            continue
        devices.append((pynvml.nvmlDeviceGetGpuInstanceId(device), pynvml.nvmlDeviceGetComputeInstanceId(device),
                        pynvml.nvmlDeviceGetUUID(device), device))
    return devices


def _compute_profiles(gi: Any) -> Iterator[Any]:
    for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        try:
            yield pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except _ABSENT:
            continue


def _full_compute_profile(gi: Any, compute_slices: int) -> int:
    """The id of the compute-instance profile that spans the whole GPU instance."""
    for info in _compute_profiles(gi):
        if info.sliceCount == compute_slices:
            return info.id
    raise DeviceError(f"the driver offers no {compute_slices}-slice compute instance profile")


def _compute_instances(gi: Any) -> list[Any]:
    found = []
    for info in _compute_profiles(gi):
        instances = (pynvml.c_nvmlComputeInstance_t * max(info.instanceCount, 1))()
        count = c_uint(0)
        pynvml.nvmlGpuInstanceGetComputeInstances(gi, info.id, instances, byref(count))
        found += instances[:count.value]
    return found


def _gpm_sm_util(first: Any, second: Any) -> float | None:
    """SM utilisation (percent) between two GPM samples; None when the driver has no value."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    pynvml.nvmlGpmMetricsGet(request)
    metric = request.metrics[0]
    return float(metric.value) if metric.nvmlReturn == pynvml.NVML_SUCCESS else None


def _process(info: Any, gpu_uuid: str, mig_uuid: str | None = None) -> GpuProcess:
    used = None if info.usedGpuMemory is None else info.usedGpuMemory // _MIB
    return GpuProcess(pid=info.pid, gpu_uuid=gpu_uuid, used_mib=used, mig_uuid=mig_uuid)


def _profile_name(info: Any, index: int) -> str:
    raw = info.name.decode() if isinstance(info.name, bytes) else str(info.name)
    name = raw.removeprefix("MIG ").strip()
    if name:
        return name
    me = "+me" if index == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 else ""
    return f"{info.sliceCount}g.{math.ceil(info.memorySizeMB / 1024)}gb{me}"


def _model_name(name: str) -> str:
    return name.removeprefix("NVIDIA ").strip()


def _optional(fn: Any, *args: Any) -> Any:
    """A value the driver may not offer (None then)."""
    try:
        return fn(*args)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NoPermission):
        return None


def _host_memory_mib() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise DeviceError("cannot read MemTotal from /proc/meminfo")
