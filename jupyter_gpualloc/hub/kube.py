"""GPUKubeSpawner: KubeSpawner whose pods run on the lease's node with the lease's GPU resources.

From a granted lease the pod gets: the labels the service names in the lease (`pod.labels`: the
lease's id as `gpualloc.jupyter.org/lease` and the service's instance as
`gpualloc.jupyter.org/instance`), in the namespace it names (`pod.namespace`), so the service ties
the lease to the pod (a pod deleted or ended releases it, a lease ended deletes the pod, a pod that
cannot be scheduled ends it); required node affinity to the lease's node; the NVIDIA device
plugin's extended resources by the names that node advertises, which the service names in the
lease (`pod.resources`: `nvidia.com/mig-<profile>` on a node with the mixed MIG strategy,
`nvidia.com/gpu` on a single one, `nvidia.com/gpu` x count for whole GPUs, a time-sliced
replica renamed or not, HAMi's `nvidia.com/gpumem` where configured); tolerations for GPU nodes
(`c.KubeGpu`, kube/gpu.py, shared with the service's kernel and job pods); and the slice env
(memory caps, service URL). On a node whose GPUs NVIDIA's DRA driver publishes the pod asks for
no extended resource: it uses the lease's ResourceClaim (`pod.claim`), which the service writes and
allocates on the device the core chose; the pod is made only once the lease names it.
A pod without a slice gets `NVIDIA_VISIBLE_DEVICES=void`, so a CUDA image's `all` shows it no GPU.

KubeSpawner's own options keep working beside the GPU choice: `profile_list` and
`profile_options` (the form, `kubespawner_override`, `{value}` substitution) are KubeSpawner's,
applied by its `load_user_options()` when the server starts.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubespawner import KubeSpawner
from traitlets import Bool, TraitError, default, validate

from ..core.devices.kubernetes import LEASE_LABEL
from ..kube.claims import pod_claim
from ..kube.gpu import KubeGpu
from .mixin import GPUSpawnerMixin, spawn_error


class GPUKubeSpawner(GPUSpawnerMixin, KubeSpawner):
    """KubeSpawner on GPU slices from the scheduler service."""

    _kube_gpu: KubeGpu | None = None

    gpu_device_env = Bool(
        False, help="""Always False here: on Kubernetes the pod's env cannot name its devices. The
        kubernetes backend's GPU and MIG UUIDs are the allocator's names for a node's devices (made
        from the node's name and an index), not the driver's, and the device plugin picks the devices
        of the requested resources and sets NVIDIA_VISIBLE_DEVICES itself. True is refused.""",
    ).tag(config=True)
    gpu_hide_devices_without_slice = Bool(
        True, help="""Whether pods without a GPU slice get NVIDIA_VISIBLE_DEVICES=void (and an
        empty CUDA_VISIBLE_DEVICES): CUDA images set NVIDIA_VISIBLE_DEVICES=all, which shows
        every GPU of the node to a pod that requested none where the NVIDIA runtime is the default.""",
    ).tag(config=True)

    @validate("gpu_device_env")
    def _no_device_env(self, proposal: Any) -> bool:
        if proposal["value"]:
            raise TraitError(
                "GPUKubeSpawner.gpu_device_env = True cannot work: on Kubernetes the device plugin picks a pod's "
                "devices and sets NVIDIA_VISIBLE_DEVICES itself, and the allocator's GPU and MIG UUIDs there are "
                "not the driver's; remove the setting (docs/hub.md)")
        return False

    @property
    def kube_gpu(self) -> KubeGpu:
        """The cluster's GPU settings (c.KubeGpu), as the service's kernel and job pods use them."""
        if self._kube_gpu is None:
            self._kube_gpu = KubeGpu(parent=self)
        return self._kube_gpu

    @default("gpu_containers")
    def _kube_containers_default(self) -> bool:
        return True

    def gpu_sets_visible_devices(self) -> bool:
        if self._gpu_lease is None:
            return self.gpu_hide_devices_without_slice
        return False

    def gpu_pod_settings(self) -> dict[str, Any]:
        """Extra resource limits, node affinity and tolerations for the lease now held."""
        if not self._gpu_lease:
            return {"extra_resource_limits": {}, "node_affinity_required": [], "tolerations": []}
        slice_ = self._gpu_lease["slice"]
        named = (self._gpu_lease.get("pod") or {}).get("resources")  # by the service, as the node advertises them
        return {
            "extra_resource_limits": dict(named) if named is not None else self.kube_gpu.limits(slice_, None),
            "node_affinity_required": [self.kube_gpu.node_term(slice_["node"])],
            "tolerations": list(self.kube_gpu.tolerations),
        }

    async def get_pod_manifest(self):
        """KubeSpawner's pod, with the lease's label, node affinity, GPU resources and tolerations added."""
        self._gpu_init()
        owned = (self._gpu_lease or {}).get("pod") or {}
        if owned.get("namespace") not in (None, self.namespace):
            raise spawn_error(f"The GPU service owns the pods of namespace {owned['namespace']}, but this server's "
                              f"pod would be in {self.namespace}: an administrator must make them agree "
                              "(c.GpuAllocService.namespace, c.KubeSpawner.namespace).", "misconfigured", 500)
        added = self.gpu_pod_settings()
        saved = {name: getattr(self, name) for name in added}
        try:
            self.extra_resource_limits = {**saved["extra_resource_limits"], **added["extra_resource_limits"]}
            self.node_affinity_required = _merged(saved["node_affinity_required"], added["node_affinity_required"])
            self.tolerations = _merged(saved["tolerations"], added["tolerations"])
            pod = await super().get_pod_manifest()
        finally:
            for name, value in saved.items():
                setattr(self, name, value)
        if self._gpu_lease:
            labels = owned.get("labels") or {LEASE_LABEL: self._gpu_lease["id"]}
            pod.metadata.labels = {**(pod.metadata.labels or {}), **labels}
            if "claim" in owned:
                _use_claim(pod, await self._allocated_claim(owned))
        return pod

    async def _allocated_claim(self, owned: dict[str, Any], timeout: float = 60.0) -> str:
        """The lease's ResourceClaim on a DRA node, once the service allocated it (a pod made before
        would have the kube-scheduler allocate the claim by itself)."""
        deadline = time.monotonic() + timeout
        while not owned.get("claim"):
            if time.monotonic() > deadline:
                raise spawn_error(f"The GPU service did not allocate the claim of your slice within {timeout:g} s.",
                                  "claim", 503)
            await asyncio.sleep(0.5)
            owned = ((await self.gpu_lease.read()) or {}).get("pod") or {}
        return owned["claim"]


def _use_claim(pod: Any, claim: str) -> None:
    """Make KubeSpawner's pod (a kubernetes_asyncio V1Pod) use ResourceClaim `claim` in its first container."""
    from kubernetes_asyncio.client import CoreV1ResourceClaim, V1PodResourceClaim, V1ResourceRequirements

    claims, used = pod_claim(claim)
    pod.spec.resource_claims = [V1PodResourceClaim(name=c["name"], resource_claim_name=c["resourceClaimName"])
                                for c in claims]
    container = pod.spec.containers[0]
    container.resources = container.resources or V1ResourceRequirements()
    container.resources.claims = [CoreV1ResourceClaim(name=c["name"]) for c in used]


def _merged(configured: list | dict, extra: list) -> list | dict:
    """KubeSpawner list-or-dict settings with our entries added (dict keys: gpualloc-<n>)."""
    if isinstance(configured, dict):
        return {**configured, **{f"gpualloc-{i}": item for i, item in enumerate(extra)}}
    return [*configured, *extra]
