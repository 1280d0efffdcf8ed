"""The ResourceClaim of a lease on a DRA node, as pure builders: the claim the service writes for a
lease's pod (kernel or job), the allocation it writes into the claim's status itself (the device the
core chose, for dynamic MIG the partition its MIG placer chose, and the node), and what a pod
spec needs to use it. The kube-scheduler then only reserves the claim and binds the pod to that node.

`devices` are the names NVIDIA's DRA driver publishes (core/devices/dra.py): `gpu-<minor>` for a
GPU, `gpu-<minor>-mig-<profile>-<profileID>-<start>` for a MIG device.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Mapping, Sequence

from ..core.devices.dra import DRIVER

REQUEST = "gpu"  # the one request of a lease's claim, and the pod's name for the claim
# Kept while a pod uses the claim (the kube-scheduler adds it to the claims it allocates; the claim
# controller removes it once the claim is deleted and no pod reserves it).
FINALIZER = "resource.kubernetes.io/delete-protection"
DEVICE_CLASSES = {"mig": "mig.nvidia.com", "whole": "gpu.nvidia.com", "shared": "gpu.nvidia.com"}


def claim_name(lease_id: str) -> str:
    """The claim of lease `lease_id`: `gpualloc-<lease id>`, as a DNS subdomain."""
    return "gpualloc-" + re.sub(r"[^a-z0-9-]", "-", lease_id.lower()).strip("-")


def resource_claim(lease_id: str, namespace: str, labels: Mapping[str, str], slice_: Mapping[str, Any],
                   devices: Sequence[str]) -> dict[str, Any]:
    """The ResourceClaim for a granted slice (REST API v1's `slice`) on the devices the core chose: one
    request of the driver's device class, as many devices as the slice has, a MIG slice's profile and
    a shared slice's memory asked for, so the claim says what it is to anyone who reads it."""
    kind = slice_["kind"]
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASSES[kind], "allocationMode": "ExactCount",
                               "count": len(devices)}
    if kind == "mig":
        exactly["selectors"] = [{"cel": {"expression": f"device.attributes['{DRIVER}'].profile == "
                                                       f"'{slice_['profile']}'"}}]
    elif kind == "shared":
        exactly["capacity"] = {"requests": {"memory": f"{int(slice_['memory_mib'])}Mi"}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim_name(lease_id), "namespace": namespace, "labels": dict(labels),
                         "finalizers": [FINALIZER]},
            "spec": {"devices": {"requests": [{"name": REQUEST, "exactly": exactly}]}}}


def claim_allocation(lease_id: str, node: str, slice_: Mapping[str, Any], devices: Sequence[str],
                     now: float) -> dict[str, Any]:
    """The claim's `status` naming `devices` of node `node`'s pool, on that node, allocated at `now`
    (epoch seconds; the kube-scheduler would write one itself, and an allocation is immutable); a
    shared slice consumes its memory of the device (consumable capacity), as a share named after the lease."""
    results = []
    for device in devices:
        result: dict[str, Any] = {"request": REQUEST, "driver": DRIVER, "pool": node, "device": device}
        if slice_["kind"] == "shared":
            result["consumedCapacity"] = {"memory": f"{int(slice_['memory_mib'])}Mi"}
            result["shareID"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpualloc-lease:{lease_id}"))
        results.append(result)
    return {"allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        "allocationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}}


def pod_claim(claim: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A pod spec's `resourceClaims` using claim `claim`, and its container's `resources.claims`."""
    return [{"name": REQUEST, "resourceClaimName": claim}], [{"name": REQUEST}]
