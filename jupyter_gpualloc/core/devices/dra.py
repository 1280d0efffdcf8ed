"""GPUs a node publishes through Kubernetes' Dynamic Resource Allocation, read from the ResourceSlices
of NVIDIA's DRA driver (`gpu.nvidia.com`, kubernetes-sigs/dra-driver-nvidia-gpu) and the claims
allocated from them. Plain JSON in, the core's vocabulary out; the watch that holds the objects is
service/cluster_watch.py.

What the driver publishes, per node (its pool, named after the node):
- a full GPU as device `gpu-<minor>` (`type` gpu, `uuid`, `productName`, capacity `memory`); with
  consumable shares it allows multiple allocations, each a `memory` capacity request;
- a static MIG device (one the MIG manager made) as `gpu-<minor>-mig-<profile>-<profileID>-<start>`
  (`type` mig, `profile`, `parentUUID`, capacity `memory` and one `memorySliceN` per memory slice);
- with DynamicMIG, every legal placement of every profile as such a device that consumes counters of
  its GPU's counter set: one `memory-slice-N` counter per memory slice it covers. The full GPU then
  consumes every counter. On Kubernetes >= 1.35 the counter sets are in a ResourceSlice of their own.

A GPU with dynamic partitions is a dynamic MIG GPU for the core: its instances are the partitions
allocated by a claim, and the core places new ones where they fragment least (the driver creates the
instance when the claim is prepared). The device a claim names is found again by `device_of`.
"""

from __future__ import annotations

import dataclasses
import re
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .. import mig
from ..model import MILLI_PER_GPU, Gpu, MigInstance, MigMode, MigProfile
from .base import DeviceError

DRIVER = "gpu.nvidia.com"
_DEVICE = re.compile(r"^gpu-(\d+)(?:-mig-([a-z0-9-]+)-(\d+)-(\d+))?$")
_MEMORY_SLICE_COUNTER = re.compile(r"^memory-slice-(\d+)$")
_MEMORY_SLICE_CAPACITY = re.compile(r"^memorySlice(\d+)$")
_NAMESPACE = uuidlib.UUID("6b1c4bd4-4f0e-4d43-9d6e-0c2f1b9f4a43")
MIB = 2 ** 20


@dataclass(frozen=True)
class DraDevice:
    """One published device, placed in the core's terms: the GPU it is on, and for a MIG device its
    profile and placement (`start`, `size` in memory slices). `dynamic`: a partition the driver
    creates on demand."""

    name: str
    gpu_uuid: str
    profile_id: int | None = None
    start: int = 0
    size: int = 0
    dynamic: bool = False
    memory_mib: int = 0


@dataclass
class DraPool:
    """What one node's pool says: its GPUs (in minor order), each MIG GPU's profiles, and every
    device by name."""

    gpus: list[Gpu] = field(default_factory=list)
    profiles: dict[str, dict[int, MigProfile]] = field(default_factory=dict)
    devices: dict[str, DraDevice] = field(default_factory=dict)

    def device_of(self, gpu_uuid: str, profile_id: int | None = None, start: int = 0) -> DraDevice | None:
        """The device that is this GPU whole (no profile), or this MIG placement on it."""
        return next((d for d in self.devices.values() if d.gpu_uuid == gpu_uuid and d.profile_id == profile_id
                     and (profile_id is None or d.start == start)), None)

    def named_by(self, mig_uuid: str) -> DraDevice | None:
        """The MIG device the core knows by `mig_uuid` (see mig_uuid), or None."""
        return next((d for d in self.devices.values() if d.profile_id is not None and self.mig_uuid(d) == mig_uuid),
                    None)

    def mig_uuid(self, device: DraDevice) -> str:
        """The MIG UUID the core knows a MIG device by: stable for its GPU and placement."""
        return dra_mig_uuid(device.gpu_uuid, device.name)


def dra_mig_uuid(gpu_uuid: str, device: str) -> str:
    """The core's UUID of MIG device `device` of GPU `gpu_uuid`: `MIG-<uuid>`, the same for every
    allocation of the same placement (the driver's own UUID exists only once it is prepared)."""
    return f"MIG-{uuidlib.uuid5(_NAMESPACE, f'{gpu_uuid}/{device}')}"


def pool_slices(slices: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The `gpu.nvidia.com` ResourceSlices by pool (a node's pool is named after it), each pool's
    newest generation only (the driver replaces every slice of a pool when it republishes)."""
    pools: dict[str, list[Mapping[str, Any]]] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        if spec.get("driver") == DRIVER and (spec.get("pool") or {}).get("name"):
            pools.setdefault(spec["pool"]["name"], []).append(obj)
    for name, members in pools.items():
        newest = max(int(m["spec"]["pool"].get("generation") or 0) for m in members)
        pools[name] = sorted((m for m in members if int(m["spec"]["pool"].get("generation") or 0) == newest),
                             key=lambda m: (m.get("metadata") or {}).get("name") or "")
    return pools


def allocations(claims: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """The `gpu.nvidia.com` devices the claims' allocations hold: pool -> device -> the claim's key
    (`claim:<namespace>/<name>`)."""
    held: dict[str, dict[str, str]] = {}
    for claim in claims:
        for pool, device, _ in allocated(claim):
            held.setdefault(pool, {})[device] = claim_key(claim)
    return held


def claim_key(claim: Mapping[str, Any]) -> str:
    metadata = claim.get("metadata") or {}
    return f"claim:{metadata.get('namespace')}/{metadata.get('name')}"


def allocated(claim: Mapping[str, Any]) -> list[tuple[str, str, int | None]]:
    """(pool, device, memory MiB it consumes of a shared device or None) for each `gpu.nvidia.com`
    device a claim's allocation holds."""
    results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])
    held = []
    for result in results:
        if result.get("driver") == DRIVER and result.get("pool") and result.get("device"):
            memory = (result.get("consumedCapacity") or {}).get("memory")
            held.append((result["pool"], result["device"], _mib(memory) if memory is not None else None))
    return held


def read_pool(node: str, slices: Iterable[Mapping[str, Any]], held: Mapping[str, str]) -> DraPool:
    """The GPUs of node `node` as its pool's slices publish them (`held`: device -> holder, the
    pool's allocated devices: a dynamic partition held is an instance of its GPU). DeviceError for
    a pool the core cannot use (a MIG model it does not know, a device it cannot place)."""
    counter_sets: dict[str, set[int]] = {}
    published: list[Mapping[str, Any]] = []
    for obj in slices:
        spec = obj.get("spec") or {}
        for counter_set in spec.get("sharedCounters") or []:
            counter_sets[counter_set.get("name", "")] = {
                int(m.group(1)) for name in counter_set.get("counters") or {}
                if (m := _MEMORY_SLICE_COUNTER.match(name))}
        published += spec.get("devices") or []
    by_minor: dict[int, dict[str, Any]] = {}
    for device in published:
        name = str(device.get("name") or "")
        match = _DEVICE.match(name)
        kind = _attribute(device, "type")
        if match is None or kind not in ("gpu", "mig"):
            continue  # a VFIO passthrough device, or one this reader does not know
        gpu = by_minor.setdefault(int(match.group(1)), {"full": None, "mig": []})
        if kind == "gpu":
            gpu["full"] = device
        else:
            gpu["mig"].append((device, int(match.group(3)), int(match.group(4))))
    pool = DraPool()
    for minor in sorted(by_minor):
        _read_gpu(pool, node, minor, by_minor[minor], counter_sets, held)
    return pool


def _read_gpu(pool: DraPool, node: str, minor: int, published: Mapping[str, Any],
              counter_sets: Mapping[str, set[int]], held: Mapping[str, str]) -> None:
    full, migs = published["full"], published["mig"]
    first = full if full is not None else migs[0][0]
    gpu_uuid = _attribute(full, "uuid") if full is not None else _attribute(first, "parentUUID")
    product = _attribute(first, "productName") or ""
    if not gpu_uuid:
        raise DeviceError(f"node {node}: device {first.get('name')} names no GPU UUID")
    catalogue = mig.lookup_model(product)
    model = catalogue.name if catalogue else re.sub(r"^NVIDIA[\s_-]+", "", product)
    memory_mib = _capacity_mib(full) if full is not None else (catalogue.memory_mib if catalogue else 0)
    if not migs:
        consumable = bool(full.get("allowMultipleAllocations")) \
            and bool(((full.get("capacity") or {}).get("memory") or {}).get("requestPolicy"))
        pool.gpus.append(Gpu(uuid=gpu_uuid, index=minor, model=model, memory_mib=memory_mib, node=node,
                             mig_capable=bool(catalogue and catalogue.mig_capable),
                             sharing="any" if consumable else "whole"))
        pool.devices[full["name"]] = DraDevice(full["name"], gpu_uuid, memory_mib=memory_mib)
        return
    if catalogue is None or not catalogue.mig_capable:
        raise DeviceError(f"node {node}: publishes MIG devices of {product or 'an unnamed GPU'}, "
                          "which is not a MIG-capable model this allocator knows")
    dynamic = any(device.get("consumesCounters") for device, _, _ in migs)
    profiles: dict[int, MigProfile] = {}
    starts: dict[int, set[int]] = {}
    for device, profile_id, start in migs:
        try:
            known = catalogue.profile(profile_id)
        except KeyError:
            raise DeviceError(f"node {node}: {catalogue.name} has no MIG profile id {profile_id} "
                              f"(device {device['name']})") from None
        size = len(_memory_slices(device, counter_sets)) or known.memory_slices
        starts.setdefault(profile_id, set()).add(start)
        profiles[profile_id] = dataclasses.replace(known, memory_mib=_capacity_mib(device) or known.memory_mib,
                                                   memory_slices=size)
        pool.devices[device["name"]] = DraDevice(device["name"], gpu_uuid, profile_id, start, size, dynamic,
                                                 profiles[profile_id].memory_mib)
    if dynamic:  # the starts are the placements published; a static GPU keeps its model's
        profiles = {pid: dataclasses.replace(p, starts=tuple(sorted(starts[pid]))) for pid, p in profiles.items()}
    instances = []
    for device in pool.devices.values():
        if device.gpu_uuid != gpu_uuid or device.profile_id is None or (dynamic and device.name not in held):
            continue
        instances.append(MigInstance(uuid=pool.mig_uuid(device), profile_id=device.profile_id,
                                     start=device.start, size=device.size))
    if full is not None:
        pool.devices[full["name"]] = DraDevice(full["name"], gpu_uuid, memory_mib=memory_mib)
        whole = max(profiles.values(), key=lambda p: (p.memory_slices, p.compute_slices))
        if dynamic and full["name"] in held:  # the GPU whole, held: as its largest partition
            instances.append(MigInstance(uuid=dra_mig_uuid(gpu_uuid, full["name"]), profile_id=whole.profile_id,
                                         start=0, size=whole.memory_slices))
    pool.gpus.append(Gpu(uuid=gpu_uuid, index=minor, model=catalogue.name, memory_mib=memory_mib, node=node,
                         mig_capable=True, mig_mode=MigMode.DYNAMIC if dynamic else MigMode.STATIC,
                         instances=sorted(instances, key=lambda i: i.start)))
    pool.profiles[gpu_uuid] = profiles


def held_by_claim(pool: DraPool, claim: Mapping[str, Any], node: str) -> tuple[int, tuple[int, ...], dict[str, int],
                                                                                tuple[str, ...]]:
    """What a claim's allocation holds of node `node`'s pool, as an outside holder holds it: whole
    GPUs, shares (milli of a GPU, a consumable-capacity request), MIG devices by profile name, and
    the UUIDs of the GPUs and MIG devices it names."""
    whole, shares, migs, named = 0, [], {}, []
    for pool_name, name, memory_mib in allocated(claim):
        device = pool.devices.get(name) if pool_name == node else None
        if device is None:
            continue
        gpu = next(g for g in pool.gpus if g.uuid == device.gpu_uuid)
        if device.profile_id is None and gpu.mig_mode is MigMode.DYNAMIC:  # the GPU whole, as its largest partition
            profile = max(pool.profiles[gpu.uuid].values(), key=lambda p: (p.memory_slices, p.compute_slices))
            migs[profile.name] = migs.get(profile.name, 0) + 1
            named.append(dra_mig_uuid(gpu.uuid, name))
        elif device.profile_id is not None:
            profile = pool.profiles[gpu.uuid][device.profile_id]
            migs[profile.name] = migs.get(profile.name, 0) + 1
            named.append(pool.mig_uuid(device))
        elif memory_mib is not None and gpu.sharing == "any" and gpu.memory_mib:
            shares.append(max(1, min(MILLI_PER_GPU, -(-memory_mib * MILLI_PER_GPU // gpu.memory_mib))))
            named.append(gpu.uuid)
        else:
            whole += 1
            named.append(gpu.uuid)
    return whole, tuple(shares), migs, tuple(named)


def _memory_slices(device: Mapping[str, Any], counter_sets: Mapping[str, set[int]]) -> set[int]:
    """The memory slices a MIG device covers: the counters it consumes (dynamic), else its
    `memorySliceN` capacities (static)."""
    covered = set()
    for consumption in device.get("consumesCounters") or []:
        covered |= {int(m.group(1)) for name in consumption.get("counters") or {}
                    if (m := _MEMORY_SLICE_COUNTER.match(name))}
    covered |= {int(m.group(1)) for name in device.get("capacity") or {} if (m := _MEMORY_SLICE_CAPACITY.match(name))}
    return covered


def _attribute(device: Mapping[str, Any] | None, name: str) -> Any:
    """An attribute's value, named plainly or qualified by the driver's domain."""
    if device is None:
        return None
    attributes = device.get("attributes") or {}
    value = attributes.get(name) or attributes.get(f"{DRIVER}/{name}") or {}
    return next((value[k] for k in ("string", "int", "bool", "version") if k in value), None)


def _capacity_mib(device: Mapping[str, Any]) -> int:
    memory = ((device.get("capacity") or {}).get("memory") or {}).get("value")
    return _mib(memory) if memory is not None else 0


def _mib(quantity: Any) -> int:
    from .kubernetes import parse_quantity  # one quantity parser; kubernetes.py imports this module
    try:
        return int(parse_quantity(quantity) / MIB)
    except ValueError:
        raise DeviceError(f"not a memory quantity: {quantity!r}") from None
