"""The ResourceClaims of the leases on DRA nodes: written and allocated by the service, so the device
a lease's pod gets is the one the core chose (kube/claims.py builds them).

For a granted lease on a node whose GPUs NVIDIA's DRA driver publishes, `ensure` creates the claim,
then writes its `status.allocation` (the devices, the node), before the pod naming it exists: the
kube-scheduler never allocates it, it only reserves it and binds the pod. `delete` removes it once
the lease's pod is gone (the reconciler calls it, service/cluster.py). A lease on another node has
no claim: its pod asks for the device plugin's extended resources.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from ..core.devices.kubernetes import KubernetesBackend
from ..kube.claims import claim_allocation, claim_name, resource_claim

log = logging.getLogger(__name__)


class ClaimError(RuntimeError):
    """The claim could not be written; the message says why, for the lease's end."""


class LeaseClaims:
    """Writes and deletes the claims of the leases on DRA nodes."""

    def __init__(self, backend: KubernetesBackend, watch: Any):
        """`watch`: the ClusterWatch, whose client writes and whose labels mark a lease's objects."""
        self.backend, self.watch = backend, watch

    def devices(self, slice_: Mapping[str, Any]) -> list[str] | None:
        """The DRA devices of a granted slice (REST API v1's `slice`), or None off DRA nodes."""
        pool = self.backend.pool(slice_["node"])
        if pool is None:
            return None
        if slice_["kind"] == "mig":
            device = pool.named_by(slice_["mig_uuid"])
            return [device.name] if device is not None else None
        found = [pool.device_of(uuid) for uuid in slice_["gpu_uuids"]]
        return [d.name for d in found] if found and all(found) else None

    async def ensure(self, lease: Mapping[str, Any], namespace: str) -> str | None:
        """The name of granted `lease`'s claim in `namespace`, created and allocated (again, where it
        was made before); None for a lease off DRA nodes. ClaimError when the API refuses."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        slice_ = lease["slice"]
        devices = self.devices(slice_)
        if devices is None:
            return None
        name = claim_name(lease["id"])
        api = client.ResourceV1Api(self.watch.api_client)
        body = resource_claim(lease["id"], namespace, self.watch.pod_labels(lease["id"]), slice_, devices)
        try:
            try:
                await api.create_namespaced_resource_claim(namespace, body, _request_timeout=30)
            except ApiException as err:
                if err.status != 409:  # 409: made before (a retry, a restart, the grant's own call)
                    raise
                if await self._allocated(api, name, namespace, devices):
                    return name
            try:
                await api.patch_namespaced_resource_claim_status(
                    name, namespace, {"status": claim_allocation(lease["id"], slice_["node"], slice_, devices,
                                                                 time.time())}, _request_timeout=30)
            except ApiException as err:  # 422: allocated meanwhile (an allocation is immutable)
                if err.status != 422 or not await self._allocated(api, name, namespace, devices):
                    raise
        except ApiException as err:
            raise ClaimError(f"its ResourceClaim {namespace}/{name} could not be written: {err.status} {err.reason}") \
                from None
        log.info("lease %s: claim %s/%s allocated %s on node %s", lease["id"], namespace, name, ", ".join(devices),
                 slice_["node"])
        return name

    @staticmethod
    async def _allocated(api: Any, name: str, namespace: str, devices: list[str]) -> bool:
        """Whether the claim is allocated already (an allocation is immutable): True on `devices`,
        False when not allocated, ClaimError on other devices. Read by `list` (the service's RBAC
        lists claims for its watch and has no `get`)."""
        found = await (await api.list_namespaced_resource_claim(
            namespace, field_selector=f"metadata.name={name}", _preload_content=False, _request_timeout=30)).json()
        made = (found.get("items") or [{}])[0]
        held = (((made.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        if held is None:
            return False
        if [r.get("device") for r in held] != devices:
            raise ClaimError(f"its ResourceClaim {namespace}/{name} holds {[r.get('device') for r in held]}, "
                             f"not {devices}")
        return True

    async def delete(self, lease_id: str, namespace: str) -> None:
        """Delete lease `lease_id`'s claim (nothing when it has none); call once its pod is gone."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await client.ResourceV1Api(self.watch.api_client).delete_namespaced_resource_claim(
                claim_name(lease_id), namespace, _request_timeout=30)
        except ApiException as err:
            if err.status != 404:
                raise
