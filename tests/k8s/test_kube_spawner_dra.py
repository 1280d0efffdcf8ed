"""GPUKubeSpawner on a DRA node: a control plane of its own whose one GPU node's GPUs NVIDIA's DRA
driver publishes (a DynamicMIG H100 x2, tests/core/devices/dra_slices.py). A MIG 1g.10gb server's pod
asks for no extended resource; it uses the lease's ResourceClaim, which the service allocated on the
partition the core chose before the spawner made the pod, and the kube-scheduler binds it to that
node. Stopping the server releases the lease, and the claim goes after the pod."""

from __future__ import annotations

import pytest
import yaml

from jupyter_gpualloc.kube.claims import claim_name

from .conftest import Cluster, require_binary
from .controlplane import ControlPlane
from .test_dra import DEVICE_CLASSES, H100
from .test_kube_spawner_on_cluster import NAMESPACE, hub_on, lease_of, pod_of, scheduled_by_kube_scheduler, spawn, stopped
from .test_job_pods import wait_for
from ..core.devices.dra_slices import dynamic_mig, gpu_uuid, mig_device

client = pytest.importorskip("kubernetes_asyncio.client")

NODE = "dra-h100-1"


@pytest.fixture(scope="module")
def dra_cluster(tmp_path_factory):
    require_binary()
    directory = tmp_path_factory.mktemp("k8s-dra")
    (directory / "fleet.yaml").write_text(yaml.safe_dump({"nodes": [
        {"name": NODE, "cpu_milli": 64000, "memory_mib": 524288, "labels": {}, "resources": {}}]}))
    control_plane = ControlPlane(directory / "k8s", fleet=directory / "fleet.yaml").start()
    cluster = Cluster(control_plane)

    async def publish(api):
        resource = client.ResourceV1Api(api)
        for name, kind in DEVICE_CLASSES.items():
            await resource.create_device_class({"metadata": {"name": name}, "spec": {"selectors": [{"cel": {
                "expression": f"device.driver == 'gpu.nvidia.com' && "
                              f"device.attributes['gpu.nvidia.com'].type == '{kind}'"}}]}})
        for body in dynamic_mig(NODE, H100, 2):
            await resource.create_resource_slice(body)

    cluster.run(publish)
    yield cluster
    control_plane.stop()


@pytest.fixture(scope="module")
def hub(dra_cluster, tmp_path_factory):
    yield from hub_on(dra_cluster, tmp_path_factory.mktemp("hub-dra"))


def claim_of(cluster, lease_id: str):
    async def read(api):
        claims = await client.ResourceV1Api(api).list_namespaced_resource_claim(NAMESPACE)
        return next((c for c in claims.items if c.metadata.name == claim_name(lease_id)), None)
    return cluster.run(read)


def test_a_mig_servers_pod_uses_the_claim_the_service_allocated_on_the_partition_the_core_chose(hub, dra_cluster):
    spawn(hub, "dra-user", {"gpu": "mig-1g.10gb-h100-80gb-hbm3", "profile": "small"})
    pod = pod_of(dra_cluster, "dra-user")
    lease = lease_of(hub, pod)
    assert lease["state"] == "granted" and lease["slice"]["node"] == pod.spec.node_name == NODE, lease
    assert scheduled_by_kube_scheduler(dra_cluster, pod)
    assert not any(r.startswith("nvidia.com/") for r in pod.spec.containers[0].resources.limits or {})
    assert [c.name for c in pod.spec.containers[0].resources.claims] == ["gpu"]
    assert [c.resource_claim_name for c in pod.spec.resource_claims] == [claim_name(lease["id"])]
    assert lease["pod"]["claim"] == claim_name(lease["id"])
    claim = claim_of(dra_cluster, lease["id"])
    minor = [gpu_uuid(NODE, i) for i in range(2)].index(lease["slice"]["gpu_uuids"][0])
    assert [(r.pool, r.device) for r in claim.status.allocation.devices.results] == [
        (NODE, mig_device(minor, "1g.10gb", lease["slice"]["start"], H100))]  # the placement the core chose
    assert [r.name for r in claim.status.reserved_for] == [pod.metadata.name]
    ended = stopped(hub, dra_cluster, "dra-user", lease["id"])
    assert ended["state"] == "released", ended
    wait_for(lambda: claim_of(dra_cluster, lease["id"]) is None, what="the server's claim deleted")
