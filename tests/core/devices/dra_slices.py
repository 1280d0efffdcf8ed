"""ResourceSlices as NVIDIA's DRA driver's kubelet plugin publishes them (kubernetes-sigs/dra-driver-nvidia-gpu,
cmd/gpu-kubelet-plugin: partitions.go, deviceinfo.go, mig.go, driver.go, consumable_shares.go), made
for a node from the MIG catalogue, for the tests of core/devices/dra.py and of the cluster (tests/k8s).

- DynamicMIG on Kubernetes >= 1.35 (`dynamic_mig`): G+1 slices in one pool named after the node: the
  first holds one counter set per GPU (`gpu-<minor>-counter-set`: the GPU's capacities as counters,
  plus `memory-slice-<i>` of value 1 per memory slice); then one slice per GPU with its devices in
  name order: the full GPU `gpu-<minor>`, consuming every counter, and each legal placement of each
  profile, `gpu-<minor>-mig-<profile without dots>-<profile id>-<start>`, consuming its capacities
  and the memory slices it covers.
- Full GPUs without MIG (`full_gpus`): one slice, device `gpu-<minor>` with capacity `memory`; with
  consumable shares (`--consumable-shares=memory`) it allows multiple allocations and its memory
  is requested in 1Mi steps.
"""

from __future__ import annotations

import re
import uuid

from jupyter_gpualloc.core import mig

DRIVER = "gpu.nvidia.com"
_PRODUCTS = {"H100 80GB HBM3": ("NVIDIA H100 80GB HBM3", "Hopper", "9.0"),
             "A100-SXM4-40GB": ("NVIDIA A100-SXM4-40GB", "Ampere", "8.0"),
             "A100-SXM4-80GB": ("NVIDIA A100-SXM4-80GB", "Ampere", "8.0"),
             "L4": ("NVIDIA L4", "Ada Lovelace", "8.9")}


def gpu_uuid(node: str, minor: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.{minor}')}"


def _common(node: str, minor: int, model: str) -> dict:
    product, architecture, capability = _PRODUCTS[model]
    return {"productName": {"string": product}, "brand": {"string": "Nvidia"},
            "architecture": {"string": architecture}, "cudaComputeCapability": {"version": f"{capability}.0"},
            "driverVersion": {"version": "580.82.7"}, "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + minor:02x}:00.0"}}


def _mig_capacities(profile: mig.MigProfile) -> dict:
    """What the driver announces of a profile (CommonCapacitiesMig): engines and memory (bytes)."""
    c = profile.compute_slices
    return {"multiprocessors": profile.sms or 16 * c, "copyEngines": c, "decoders": c, "encoders": 0,
            "jpegEngines": c, "ofaEngines": 1 if c == 7 else 0, "memory": profile.memory_mib * 2**20}


def _counter_name(capacity: str) -> str:
    return re.sub(r"([a-z])([A-Z])", r"\1-\2", capacity).lower()


def _value(n: int) -> dict:
    return {"value": str(n)}


def _slice(node: str, generation: int, count: int, **spec) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{node}-{DRIVER}-"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": count}, **spec}}


def dynamic_mig(node: str, model: str, gpus: int, generation: int = 1) -> list[dict]:
    """The slices of a node whose `gpus` GPUs of `model` run DynamicMIG (split counters, k8s >= 1.35)."""
    catalogue = mig.lookup_model(model)
    counter_sets, device_slices = [], []
    for minor in range(gpus):
        parent = gpu_uuid(node, minor)
        counter_set = f"gpu-{minor}-counter-set"
        most = {name: max(_mig_capacities(p)[name] for p in catalogue.profiles.values())
                for name in _mig_capacities(next(iter(catalogue.profiles.values())))}
        slices = range(catalogue.geometry.memory_slices)
        all_counters = {**{_counter_name(k): _value(v) for k, v in most.items()},
                        **{f"memory-slice-{i}": _value(1) for i in slices}}
        counter_sets.append({"name": counter_set, "counters": all_counters})
        attributes = _common(node, minor, model)
        devices = [{"name": f"gpu-{minor}",
                    "attributes": {"type": {"string": "gpu"}, "uuid": {"string": parent}, **attributes},
                    "capacity": {k: _value(v) for k, v in most.items()},
                    "consumesCounters": [{"counterSet": counter_set, "counters": all_counters}]}]
        for profile in catalogue.profiles.values():
            for start in profile.starts:
                capacities = _mig_capacities(profile)
                name = f"gpu-{minor}-mig-{re.sub('[^a-z0-9-]', '-', profile.name.replace('.', ''))}" \
                       f"-{profile.profile_id}-{start}"
                devices.append({
                    "name": name,
                    "attributes": {"type": {"string": "mig"}, "parentUUID": {"string": parent},
                                   "profile": {"string": profile.name}, **attributes},
                    "capacity": {k: _value(v) for k, v in capacities.items()},
                    "consumesCounters": [{"counterSet": counter_set, "counters": {
                        **{_counter_name(k): _value(v) for k, v in capacities.items()},
                        **{f"memory-slice-{i}": _value(1) for i in range(start, start + profile.memory_slices)}}}]})
        device_slices.append(sorted(devices, key=lambda d: d["name"]))
    count = gpus + 1
    return [_slice(node, generation, count, sharedCounters=counter_sets),
            *(_slice(node, generation, count, devices=devices) for devices in device_slices)]


def full_gpus(node: str, model: str, gpus: int, consumable: bool = False, generation: int = 1) -> list[dict]:
    """The slice of a node whose `gpus` GPUs of `model` are given whole (or, `consumable`, by memory)."""
    memory = mig.lookup_model(model).memory_mib * 2**20
    devices = []
    for minor in range(gpus):
        capacity: dict = {"memory": _value(memory)}
        device = {"name": f"gpu-{minor}", "attributes": {"type": {"string": "gpu"},
                                                          "uuid": {"string": gpu_uuid(node, minor)},
                                                          **_common(node, minor, model)}}
        if consumable:
            step = 2**20
            capacity["memory"] = {"value": str(memory // step * step), "requestPolicy": {
                "default": str(memory // step * step),
                "validRange": {"min": "1Mi", "max": str(memory // step * step), "step": "1Mi"}}}
            device["allowMultipleAllocations"] = True
        device["capacity"] = capacity
        devices.append(device)
    return [_slice(node, generation, 1, devices=devices)]


def mig_device(minor: int, profile: str, start: int, model: str) -> str:
    """The driver's name of a MIG device: `gpu-0-mig-1g10gb-19-3`."""
    p = mig.lookup_model(model).profile(profile)
    return f"gpu-{minor}-mig-{re.sub('[^a-z0-9-]', '-', p.name.replace('.', ''))}-{p.profile_id}-{start}"


def allocated_claim(namespace: str, name: str, node: str, *devices: str, memory: str | None = None) -> dict:
    """A ResourceClaim as the kube-scheduler leaves it once it allocated `devices` of node `node`'s pool."""
    results = [{"request": "gpu", "driver": DRIVER, "pool": node, "device": d,
                **({"consumedCapacity": {"memory": memory}} if memory else {})} for d in devices]
    return {"metadata": {"namespace": namespace, "name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
            "status": {"allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}
