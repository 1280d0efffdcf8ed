"""A fake libnvidia-ml: pynvml's real Python functions run against it, the C library is replaced.

pynvml looks C functions up with `getattr(pynvml.nvmlLib, name)`; `install()` puts a `FakeNvml`
there (with an empty function cache), so pynvml skips loading the real library. Each fake C
function receives the ctypes arguments pynvml builds (byref pointers, structs, char buffers),
fills them and returns an NVML return code, from a small dict-driven device model.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1024 * 1024
_CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}  # compute-instance profile index (= id) -> slices


@dataclass
class FakeProfile:
    index: int
    id: int
    slices: int
    memory_slices: int
    instance_count: int
    sms: int
    memory_mb: int
    name: str
    starts: tuple[int, ...]


@dataclass
class FakeGpuInstance:
    gi_id: int
    profile: FakeProfile
    start: int
    compute_instances: dict[int, str] = field(default_factory=dict)  # CI id -> MIG device UUID
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    sm_percent: float = 0.0  # what GPM reports between two samples taken while it is set


@dataclass
class FakeGpu:
    name: str
    uuid: str
    memory_mib: int
    profiles: list[FakeProfile] = field(default_factory=list)
    mig_enabled: bool = False
    instances: list[FakeGpuInstance] = field(default_factory=list)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    lost: bool = False
    utilization_samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, timestamp µs, SM %)
    process_utilization: bool = True  # whether the driver attributes SM time per process
    gpu_percent: int = 0  # nvmlDeviceGetUtilizationRates' gpu field
    gpm: bool = False  # Hopper and later: per-MIG-instance metrics

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)

    @property
    def compute_slices(self) -> int:
        """The GPU's compute slices: those of its whole-GPU profile (7 on A100, 4 on A30)."""
        return max(p.slices for p in self.profiles)


def a100_40gb_profiles() -> list[FakeProfile]:
    """What `nvidia-smi mig -lgip` shows on an A100-SXM4-40GB."""
    rows = [(0, 19, 1, 1, 7, 14, 4864, "1g.5gb", tuple(range(7))),
            (7, 20, 1, 1, 1, 14, 4864, "1g.5gb+me", tuple(range(7))),
            (9, 15, 1, 2, 4, 14, 9856, "1g.10gb", (0, 2, 4, 6)),
            (1, 14, 2, 2, 3, 28, 9856, "2g.10gb", (0, 2, 4)),
            (2, 9, 3, 4, 2, 42, 19968, "3g.20gb", (0, 4)),
            (3, 5, 4, 4, 1, 56, 19968, "4g.20gb", (0,)),
            (4, 0, 7, 8, 1, 98, 40192, "7g.40gb", (0,))]
    return [FakeProfile(i, pid, s, m, n, sms, mb, f"MIG {name}", starts)
            for i, pid, s, m, n, sms, mb, name, starts in rows]


def a30_profiles() -> list[FakeProfile]:
    """An A30's profiles: 4 memory and 4 compute slices, ids of its own (5 is 2g.12gb here), and
    memory sizes a driver might report (they need not match the catalogue)."""
    rows = [(0, 14, 1, 1, 4, 14, 5836, "1g.6gb", (0, 1, 2, 3)),
            (7, 21, 1, 1, 1, 14, 5836, "1g.6gb+me", (0, 1, 2, 3)),
            (1, 5, 2, 2, 2, 28, 11904, "2g.12gb", (0, 2)),
            (8, 6, 2, 2, 1, 28, 11904, "2g.12gb+me", (0, 2)),
            (3, 0, 4, 4, 1, 56, 24000, "4g.24gb", (0,))]
    return [FakeProfile(i, pid, s, m, n, sms, mb, f"MIG {name}", starts)
            for i, pid, s, m, n, sms, mb, name, starts in rows]


class FakeNvml:
    """The device model plus the fake C functions; `errors` forces a return code per C function."""

    def __init__(self, gpus: list[FakeGpu], driver_version: str = "550.54.15"):
        self.gpus = gpus
        self.driver_version = driver_version
        self.errors: dict[str, int] = {}
        self.calls: list[str] = []
        self._keys: dict[Any, int] = {}
        self._by_handle: dict[int, Any] = {}
        self._mig_serial = 0
        self.gpm_samples: dict[int, tuple[int, int, float] | None] = {}  # live sample -> (GPU, GI, SM %)
        self._gpm_serial = 0
        for gpu in gpus:
            for gi in gpu.instances:
                for ci_id in gi.compute_instances:
                    gi.compute_instances[ci_id] = self._new_mig_uuid()

    @property
    def lib(self) -> SimpleNamespace:
        """The object pynvml takes for the loaded C library."""
        names = [n for n in dir(type(self)) if n.startswith("nvml")]
        return SimpleNamespace(**{n: self._c_function(n) for n in names})

    def _c_function(self, name: str) -> Any:
        impl = getattr(self, name)

        def c_function(*args: Any) -> Any:  # a plain function: pynvml may set `restype` on it
            self.calls.append(name)
            if name in self.errors:
                return self.errors[name]
            return impl(*args)

        c_function.__name__ = name
        return c_function

    # handles: opaque pointers whose value is a key into a registry

    def _handle_value(self, key: Any) -> int:
        if key not in self._keys:
            self._keys[key] = 0x1000 + 0x10 * len(self._keys)
            self._by_handle[self._keys[key]] = key
        return self._keys[key]

    def _put_handle(self, ref: Any, key: Any) -> None:
        ctypes.c_void_p.from_buffer(ref._obj).value = self._handle_value(key)

    def _key(self, handle: Any) -> Any:
        return self._by_handle.get(ctypes.cast(handle, ctypes.c_void_p).value)

    def _gpu(self, handle: Any) -> tuple[FakeGpu | None, int]:
        """The physical GPU behind a GPU (or MIG device) handle and a return code for using it."""
        key = self._key(handle)
        if key is None or key[0] not in ("gpu", "mig"):
            return None, pynvml.NVML_ERROR_INVALID_ARGUMENT
        gpu = self.gpus[key[1]]
        return gpu, pynvml.NVML_ERROR_GPU_IS_LOST if gpu.lost else pynvml.NVML_SUCCESS

    def _gpu_instance(self, handle: Any) -> FakeGpuInstance | None:
        key = self._key(handle)
        if key is None or key[0] != "gi":
            return None
        return next((gi for gi in self.gpus[key[1]].instances if gi.gi_id == key[2]), None)

    def _mig_devices(self, gpu_index: int) -> list[tuple[FakeGpuInstance, int]]:
        gpu = self.gpus[gpu_index]
        return [(gi, ci) for gi in sorted(gpu.instances, key=lambda g: g.gi_id) for ci in sorted(gi.compute_instances)]

    def _new_mig_uuid(self) -> str:
        self._mig_serial += 1
        return f"MIG-5a1e0000-0000-4000-8000-{self._mig_serial:012x}"

    # system

    def nvmlInitWithFlags(self, flags: int) -> int:
        return pynvml.NVML_SUCCESS

    def nvmlShutdown(self) -> int:
        return pynvml.NVML_SUCCESS

    def nvmlErrorString(self, code: int) -> bytes:
        return f"fake NVML error {code}".encode()

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.driver_version.encode()
        return pynvml.NVML_SUCCESS

    def nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> int:
        buf.value = f"12.{self.driver_version}".encode()
        return pynvml.NVML_SUCCESS

    def nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        ref._obj.value = 12040
        return pynvml.NVML_SUCCESS

    # devices

    def nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        ref._obj.value = len(self.gpus)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        if not 0 <= index.value < len(self.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        self._put_handle(ref, ("gpu", index.value))
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetHandleByUUID(self, uuid: Any, ref: Any) -> int:
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid.encode() == uuid.value:
                self._put_handle(ref, ("gpu", index))
                return pynvml.NVML_SUCCESS
        return pynvml.NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        gpu, rc = self._gpu(handle)
        if rc == pynvml.NVML_SUCCESS:
            buf.value = gpu.name.encode()
        return rc

    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        gpu, rc = self._gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        key = self._key(handle)
        if key[0] == "mig":
            gi = next(g for g in gpu.instances if g.gi_id == key[2])
            buf.value = gi.compute_instances[key[3]].encode()
        else:
            buf.value = gpu.uuid.encode()
        return rc

    def nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> int:
        gpu, rc = self._gpu(handle)
        if rc == pynvml.NVML_SUCCESS:
            used = sum(b or 0 for _, b in gpu.processes) + sum(b or 0 for gi in gpu.instances for _, b in gi.processes)
            ref._obj.total = gpu.memory_mib * MIB
            ref._obj.used = used
            ref._obj.free = gpu.memory_mib * MIB - used
        return rc

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu, rc = self._gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        if not gpu.mig_capable:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        current._obj.value = pending._obj.value = int(gpu.mig_enabled)
        return rc

    # MIG: GPU instances

    def _mig_gpu(self, handle: Any) -> tuple[FakeGpu | None, int]:
        gpu, rc = self._gpu(handle)
        if rc == pynvml.NVML_SUCCESS and not (gpu.mig_capable and gpu.mig_enabled):
            rc = pynvml.NVML_ERROR_NOT_SUPPORTED
        return gpu, rc

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, index: int, ref: Any) -> int:
        gpu, rc = self._mig_gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        if not 0 <= index < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        profile = next((p for p in gpu.profiles if p.index == index), None)
        if profile is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        info = ref._obj
        info.id, info.sliceCount, info.instanceCount = profile.id, profile.slices, profile.instance_count
        info.multiprocessorCount, info.memorySizeMB = profile.sms, profile.memory_mb
        info.name = profile.name.encode()
        return rc

    def _profile(self, gpu: FakeGpu, profile_id: int) -> FakeProfile | None:
        return next((p for p in gpu.profiles if p.id == profile_id), None)

    def nvmlDeviceGetGpuInstancePossiblePlacements_v2(self, handle: Any, profile_id: int, placements: Any,
                                                      count_ref: Any) -> int:
        gpu, rc = self._mig_gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        profile = self._profile(gpu, profile_id)
        if profile is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        count_ref._obj.value = len(profile.starts)
        if placements is not None:
            for n, start in enumerate(profile.starts):
                placements[n].start, placements[n].size = start, profile.memory_slices
        return rc

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, instances: Any, count_ref: Any) -> int:
        gpu, rc = self._mig_gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        index = self.gpus.index(gpu)
        found = [gi for gi in gpu.instances if gi.profile.id == profile_id]
        if len(found) > len(instances):
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for n, gi in enumerate(found):
            offset = n * ctypes.sizeof(ctypes.c_void_p)
            ctypes.c_void_p.from_buffer(instances, offset).value = self._handle_value(("gi", index, gi.gi_id))
        count_ref._obj.value = len(found)
        return rc

    def nvmlGpuInstanceGetInfo(self, handle: Any, ref: Any) -> int:
        gi = self._gpu_instance(handle)
        if gi is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        info = ref._obj
        info.id, info.profileId = gi.gi_id, gi.profile.id
        info.placement.start, info.placement.size = gi.start, gi.profile.memory_slices
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int, ref: Any) -> int:
        gpu, rc = self._mig_gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        if not any(gi.gi_id == gi_id for gi in gpu.instances):
            return pynvml.NVML_ERROR_NOT_FOUND
        self._put_handle(ref, ("gi", self.gpus.index(gpu), gi_id))
        return rc

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement_ref: Any,
                                                 ref: Any) -> int:
        gpu, rc = self._mig_gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        profile = self._profile(gpu, profile_id)
        placement = placement_ref._obj
        if profile is None or placement.start not in profile.starts or placement.size != profile.memory_slices:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        wanted = set(range(placement.start, placement.start + profile.memory_slices))
        occupied = {s for gi in gpu.instances for s in range(gi.start, gi.start + gi.profile.memory_slices)}
        compute = sum(gi.profile.slices for gi in gpu.instances) + profile.slices
        same = sum(gi.profile.id == profile_id for gi in gpu.instances)
        if wanted & occupied or compute > gpu.compute_slices or same >= profile.instance_count:
            return pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
        used = {gi.gi_id for gi in gpu.instances}
        gi_id = next(i for i in range(1, 64) if i not in used)
        gpu.instances.append(FakeGpuInstance(gi_id, profile, placement.start))
        self._put_handle(ref, ("gi", self.gpus.index(gpu), gi_id))
        return rc

    def nvmlGpuInstanceDestroy(self, handle: Any) -> int:
        gi = self._gpu_instance(handle)
        if gi is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if gi.compute_instances:
            return pynvml.NVML_ERROR_IN_USE
        self.gpus[self._key(handle)[1]].instances.remove(gi)
        return pynvml.NVML_SUCCESS

    # MIG: compute instances and MIG devices

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, handle: Any, index: int, engine: int, ref: Any) -> int:
        gi = self._gpu_instance(handle)
        if gi is None or index >= pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        slices = _CI_SLICES.get(index)
        if slices is None or slices > gi.profile.slices:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        info = ref._obj
        info.id, info.sliceCount, info.instanceCount = index, slices, gi.profile.slices // slices
        info.multiprocessorCount = gi.profile.sms * slices // gi.profile.slices
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceCreateComputeInstance(self, handle: Any, ci_profile_id: int, ref: Any) -> int:
        gi = self._gpu_instance(handle)
        if gi is None or _CI_SLICES.get(ci_profile_id) is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        if _CI_SLICES[ci_profile_id] != gi.profile.slices or gi.compute_instances:
            return pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
        gi.compute_instances[0] = self._new_mig_uuid()
        self._put_handle(ref, ("ci", self._key(handle)[1], gi.gi_id, 0))
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstances(self, handle: Any, ci_profile_id: int, instances: Any,
                                           count_ref: Any) -> int:
        gi = self._gpu_instance(handle)
        if gi is None:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        found = sorted(gi.compute_instances) if _CI_SLICES.get(ci_profile_id) == gi.profile.slices else []
        for n, ci_id in enumerate(found):
            offset = n * ctypes.sizeof(ctypes.c_void_p)
            key = ("ci", self._key(handle)[1], gi.gi_id, ci_id)
            ctypes.c_void_p.from_buffer(instances, offset).value = self._handle_value(key)
        count_ref._obj.value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlComputeInstanceDestroy(self, handle: Any) -> int:
        key = self._key(handle)
        if key is None or key[0] != "ci":
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        gi = next(g for g in self.gpus[key[1]].instances if g.gi_id == key[2])
        if gi.processes:
            return pynvml.NVML_ERROR_IN_USE
        del gi.compute_instances[key[3]]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, ref: Any) -> int:
        gpu, rc = self._mig_gpu(handle)
        if rc == pynvml.NVML_SUCCESS:
            ref._obj.value = gpu.compute_slices
        return rc

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, ref: Any) -> int:
        gpu, rc = self._mig_gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        gpu_index = self.gpus.index(gpu)
        devices = self._mig_devices(gpu_index)
        if index.value >= len(devices):
            return pynvml.NVML_ERROR_NOT_FOUND
        gi, ci = devices[index.value]
        self._put_handle(ref, ("mig", gpu_index, gi.gi_id, ci))
        return rc

    def nvmlDeviceGetGpuInstanceId(self, handle: Any, ref: Any) -> int:
        key = self._key(handle)
        if key is None or key[0] != "mig":
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        ref._obj.value = key[2]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, handle: Any, ref: Any) -> int:
        key = self._key(handle)
        if key is None or key[0] != "mig":
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        ref._obj.value = key[3]
        return pynvml.NVML_SUCCESS

    # processes

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count_ref: Any, infos: Any) -> int:
        gpu, rc = self._gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        key = self._key(handle)
        if key[0] == "mig":
            gi = next(g for g in gpu.instances if g.gi_id == key[2])
            found = [(pid, used, gi.gi_id, key[3]) for pid, used in gi.processes]
        elif gpu.mig_enabled:
            return pynvml.NVML_ERROR_NO_PERMISSION  # aggregate view of a MIG GPU needs privileges
        else:
            found = [(pid, used, 0xFFFFFFFF, 0xFFFFFFFF) for pid, used in gpu.processes]
        if not found:
            count_ref._obj.value = 0
            return pynvml.NVML_SUCCESS
        if infos is None or count_ref._obj.value < len(found):
            count_ref._obj.value = len(found)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for n, (pid, used, gi_id, ci_id) in enumerate(found):
            infos[n].pid = pid
            infos[n].usedGpuMemory = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
            infos[n].gpuInstanceId, infos[n].computeInstanceId = gi_id, ci_id
        count_ref._obj.value = len(found)
        return pynvml.NVML_SUCCESS

    # utilisation

    def nvmlDeviceGetProcessUtilization(self, handle: Any, samples: Any, count_ref: Any, last_seen: Any) -> int:
        gpu, rc = self._gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        if self._key(handle)[0] == "mig" or gpu.mig_enabled or not gpu.process_utilization:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        found = [s for s in gpu.utilization_samples if s[1] > last_seen.value]
        if not found:
            return pynvml.NVML_ERROR_NOT_FOUND
        if samples is None or count_ref._obj.value < len(found):
            count_ref._obj.value = len(found)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for n, (pid, stamp, sm) in enumerate(found):
            samples[n].pid, samples[n].timeStamp, samples[n].smUtil = pid, stamp, sm
        count_ref._obj.value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle: Any, ref: Any) -> int:
        gpu, rc = self._gpu(handle)
        if rc == pynvml.NVML_SUCCESS:
            ref._obj.gpu, ref._obj.memory = gpu.gpu_percent, 0
        return rc

    def nvmlGpmQueryDeviceSupport(self, handle: Any, ref: Any) -> int:
        gpu, rc = self._gpu(handle)
        if rc == pynvml.NVML_SUCCESS:
            ref._obj.isSupportedDevice = int(gpu.gpm)
        return rc

    def nvmlGpmSampleAlloc(self, ref: Any) -> int:
        self._gpm_serial += 1
        key = ("gpm", self._gpm_serial)
        self._put_handle(ref, key)
        self.gpm_samples[self._handle_value(key)] = None
        return pynvml.NVML_SUCCESS

    def nvmlGpmSampleFree(self, sample: Any) -> int:
        value = ctypes.cast(sample, ctypes.c_void_p).value
        if value not in self.gpm_samples:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        del self.gpm_samples[value]
        return pynvml.NVML_SUCCESS

    def nvmlGpmMigSampleGet(self, handle: Any, gi_id: int, sample: Any) -> int:
        gpu, rc = self._mig_gpu(handle)
        if rc != pynvml.NVML_SUCCESS:
            return rc
        if not gpu.gpm:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        gi = next((g for g in gpu.instances if g.gi_id == gi_id), None)
        value = ctypes.cast(sample, ctypes.c_void_p).value
        if gi is None:
            return pynvml.NVML_ERROR_NOT_FOUND
        if value not in self.gpm_samples:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        self.gpm_samples[value] = (self.gpus.index(gpu), gi_id, gi.sm_percent)
        return pynvml.NVML_SUCCESS

    def nvmlGpmMetricsGet(self, ref: Any) -> int:
        request = ref._obj
        first = self.gpm_samples.get(ctypes.cast(request.sample1, ctypes.c_void_p).value)
        second = self.gpm_samples.get(ctypes.cast(request.sample2, ctypes.c_void_p).value)
        if first is None or second is None or first[:2] != second[:2]:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        for n in range(request.numMetrics):
            metric = request.metrics[n]
            if metric.metricId == pynvml.NVML_GPM_METRIC_SM_UTIL:
                metric.value, metric.nvmlReturn = second[2], pynvml.NVML_SUCCESS
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return pynvml.NVML_SUCCESS


def gpu_host() -> FakeNvml:
    """One A100-SXM4-40GB with MIG on (2g.10gb@0, 3g.20gb@4, and a 1g.5gb@2 GI without compute
    instance), one L4 without MIG, each with a process."""
    profiles = a100_40gb_profiles()
    by_name = {p.name.removeprefix("MIG "): p for p in profiles}
    a100 = FakeGpu(
        name="NVIDIA A100-SXM4-40GB", uuid="GPU-0a100000-1111-2222-3333-444444444444", memory_mib=40960,
        profiles=profiles, mig_enabled=True, instances=[
            FakeGpuInstance(3, by_name["2g.10gb"], 0, {0: ""}, processes=[(4242, 1536 * MIB)]),
            FakeGpuInstance(2, by_name["3g.20gb"], 4, {0: ""}),
            FakeGpuInstance(9, by_name["1g.5gb"], 2),
        ])
    l4 = FakeGpu(name="NVIDIA L4", uuid="GPU-0b140000-5555-6666-7777-888888888888", memory_mib=23034,
                 processes=[(5151, 2048 * MIB), (5252, None)])
    return FakeNvml([a100, l4])


def install(monkeypatch: Any, fake: FakeNvml) -> FakeNvml:
    """Make pynvml call `fake` instead of libnvidia-ml.so.1 (undone by monkeypatch)."""
    monkeypatch.setattr(pynvml, "nvmlLib", fake.lib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    return fake
