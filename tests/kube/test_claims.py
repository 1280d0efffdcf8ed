"""The ResourceClaim of a lease on a DRA node (kube/claims.py): the claim says what the slice is, its
allocation names exactly the devices the core chose on the lease's node (the API server accepts both
in tests/k8s/test_dra.py)."""

from __future__ import annotations

from jupyter_gpualloc.kube.claims import FINALIZER, claim_allocation, claim_name, pod_claim, resource_claim

MIG = {"kind": "mig", "node": "dra-h100-1", "gpu_uuids": ["GPU-1"], "memory_mib": 9984, "profile": "1g.10gb",
       "start": 4, "mig_uuid": "MIG-1"}
SHARED = {"kind": "shared", "node": "dra-l4-1", "gpu_uuids": ["GPU-2"], "memory_mib": 6144}
LABELS = {"gpualloc.jupyter.org/lease": "ab12", "gpualloc.jupyter.org/instance": "jhub.gpualloc"}


def test_a_mig_leases_claim_asks_for_its_profile_and_is_allocated_on_the_chosen_partition():
    claim = resource_claim("AB12", "jhub", LABELS, MIG, ["gpu-0-mig-1g10gb-19-4"])
    assert claim["metadata"] == {"name": "gpualloc-ab12", "namespace": "jhub", "labels": LABELS,
                                 "finalizers": [FINALIZER]}
    [request] = claim["spec"]["devices"]["requests"]
    assert request == {"name": "gpu", "exactly": {
        "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1,
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}]}}
    status = claim_allocation("AB12", "dra-h100-1", MIG, ["gpu-0-mig-1g10gb-19-4"], now=0)
    assert status == {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "dra-h100-1",
                                 "device": "gpu-0-mig-1g10gb-19-4"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["dra-h100-1"]}]}]},
        "allocationTimestamp": "1970-01-01T00:00:00Z"}}


def test_a_shared_leases_claim_requests_and_consumes_its_memory_as_a_share_of_its_own():
    claim = resource_claim("ab12", "jhub", LABELS, SHARED, ["gpu-1"])
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "6144Mi"}}
    [result] = claim_allocation("ab12", "dra-l4-1", SHARED, ["gpu-1"], now=0)["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"memory": "6144Mi"}
    other = claim_allocation("cd34", "dra-l4-1", SHARED, ["gpu-1"], now=0)["allocation"]["devices"]["results"][0]
    assert len(result["shareID"]) == 36 and result["shareID"] != other["shareID"]



def test_a_pod_uses_the_claim_by_the_name_of_its_one_request():
    assert pod_claim(claim_name("Lease_1")) == ([{"name": "gpu", "resourceClaimName": "gpualloc-lease-1"}],
                                             [{"name": "gpu"}])
