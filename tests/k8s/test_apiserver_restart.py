"""The service on a control plane whose kube-apiserver is stopped and started again (k8s/run.go:
SIGUSR1 stops it, SIGUSR2 starts a new one on the same port and the same etcd, whose data it finds
as it was). A control plane of its own, with three nodes (and a DynamicMIG node the DRA test adds),
so the session's one is not disturbed.

The service reaches the API server through a proxy, held cut while the restarted API server is
changed, so that those changes are made while the service cannot see them; it then resumes its
watches with resourceVersions from the old API server (a relist where they are too old for the
new one's watch cache).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jupyter_gpualloc.kube.claims import pod_claim
from tests.cuttable_proxy import CuttableProxy
from tests.service.conftest import ROOT

from ..core.devices.dra_slices import dynamic_mig

from .conftest import Cluster, require_binary
from .controlplane import ControlPlane
from .test_cluster import until
from .test_dra import DEVICE_CLASSES, H100, dra_node
from .test_service_on_cluster import (ClusterService, lease_pod, lease_state, node_of, outside_on, request, views,
                                      wait_for)

client = pytest.importorskip("kubernetes_asyncio.client")

NODES = ["gpu-l4-a", "gpu-l4-b", "gpu-l4-c"]
FLEET = {"nodes": [{
    "name": name, "cpu_milli": 8000, "memory_mib": 32768,
    "labels": {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "2",
               "nvidia.com/gpu.memory": "23034"},
    "resources": {"nvidia.com/gpu": "2"}} for name in NODES]}


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    require_binary()
    directory = tmp_path_factory.mktemp("k8s-restart")
    (directory / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    control_plane = ControlPlane(directory / "k8s", fleet=directory / "fleet.yaml").start()
    yield control_plane
    control_plane.stop()


def test_the_service_rides_out_an_apiserver_restart(plane, tmp_path):
    cluster = Cluster(plane)
    server = yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    proxy = CuttableProxy(int(server.rsplit(":", 1)[1]))
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    service = ClusterService(tmp_path / "service", kubeconfig, namespace="restart")
    service.start()
    try:
        kept = request(service, {"kind": "whole", "node": "gpu-l4-a"}, "server:kept")
        doomed = request(service, {"kind": "whole", "node": "gpu-l4-a"}, "server:doomed")
        assert kept["state"] == doomed["state"] == "granted"

        async def pods(api):
            core = client.CoreV1Api(api)
            await core.create_namespace({"metadata": {"name": "restart"}})
            await until(lambda: _has_default_account(core), what="the namespace's service account")
            for lease, name in ((kept, "kept"), (doomed, "doomed")):
                pod = lease_pod(lease, name, {"nvidia.com/gpu": "1"}, "gpu-l4-a")
                await core.create_namespaced_pod("restart", pod)
            await until(lambda: _all_running(core), what="both pods Running")

        cluster.run(pods)

        plane.stop_apiserver()
        health = wait_for(lambda: (h := service.call("GET", "health").json())["cluster"].startswith("stale since")
                          and h, what="the view marked stale")
        assert health["backend"] == "kubernetes"
        # It answers from what it knows: the nodes, the leases, and a new grant.
        assert sorted(n["name"] for n in service.call("GET", "inventory", token=ROOT).json()["nodes"]) == NODES
        assert lease_state(service, kept["id"])["state"] == "granted"
        during = request(service, {"kind": "whole", "node": "gpu-l4-b"}, "server:during")
        assert during["state"] == "granted"

        proxy.cut()  # the service stays blind while the new API server is changed
        try:
            plane.start_apiserver()

            async def change(api):
                core = client.CoreV1Api(api)
                assert sorted(n.metadata.name for n in (await core.list_node()).items) == NODES  # etcd's data
                await core.patch_node("gpu-l4-c", {"spec": {"unschedulable": True}})
                await core.delete_namespaced_pod("doomed", "restart", grace_period_seconds=0)

            cluster.run(change)
        finally:
            proxy.restore()

        wait_for(lambda: service.call("GET", "health").json()["cluster"] == "current", what="the view current again")
        wait_for(lambda: node_of(service, "gpu-l4-c")["unschedulable"] == "cordoned", what="the cordon")
        ended = wait_for(lambda: (l := lease_state(service, doomed["id"]))["state"] != "granted" and l,
                         what="the deleted pod's lease released")
        assert ended["state"] == "released" and ended["reason"] == "its pod restart/doomed was deleted"
        assert lease_state(service, kept["id"])["state"] == "granted"  # no lease lost
        assert lease_state(service, during["id"])["state"] == "granted"
        fresh = ClusterService(tmp_path / "fresh", Path(cluster.kubeconfig), namespace="restart")
        fresh.start()
        try:
            expected = views(service)  # but for `kept`'s pod, which is outside use to a store that never made its lease
            expected["gpu-l4-a"] = (expected["gpu-l4-a"][0], sorted(expected["gpu-l4-a"][1] + ["pod:restart/kept"]))
            assert views(fresh) == expected
        finally:
            fresh.kill()
    finally:
        service.kill()
        proxy.cut()


async def _has_default_account(core, namespace: str = "restart") -> bool:
    return any(a.metadata.name == "default" for a in (await core.list_namespaced_service_account(namespace)).items)


async def _all_running(core) -> bool:
    found = (await core.list_namespaced_pod("restart")).items
    return len(found) == 2 and all(p.status.phase == "Running" for p in found)


def test_a_dra_leases_claim_and_partition_outlive_an_apiserver_restart(plane, tmp_path):
    """A server's lease on a DynamicMIG node: the service allocates its claim, the kube-scheduler binds
    its pod. Across an API-server restart the allocation stays on the partition the core chose, the
    lease stays granted, and the watches resumed count that partition as the lease's (not as outside
    use, not as free)."""
    cluster, namespace = Cluster(plane), "restart-dra"

    async def dra_node_and_namespace(api):
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        await core.create_namespace({"metadata": {"name": namespace}})
        await until(lambda: _has_default_account(core, namespace), what="the namespace's service account")
        for name, kind in DEVICE_CLASSES.items():
            await resource.create_device_class({"metadata": {"name": name}, "spec": {"selectors": [{"cel": {
                "expression": f"device.driver == 'gpu.nvidia.com' && "
                              f"device.attributes['gpu.nvidia.com'].type == '{kind}'"}}]}})
        await core.create_node(dra_node("dra-h100-r"))
        for body in dynamic_mig("dra-h100-r", H100, 1):
            await resource.create_resource_slice(body)

    cluster.run(dra_node_and_namespace)
    service = ClusterService(tmp_path / "service", Path(cluster.kubeconfig), namespace=namespace)
    service.start()
    try:
        wait_for(lambda: node_of(service, "dra-h100-r"), what="the DRA node in the service's view")
        lease = request(service, {"kind": "mig", "profile": "1g.10gb", "node": "dra-h100-r"}, "server:dra")
        assert lease["state"] == "granted"
        claim = wait_for(lambda: lease_state(service, lease["id"])["pod"].get("claim"), what="its claim allocated")
        pod = lease_pod(lease, "dra-server", {}, None)
        pod["spec"]["resourceClaims"], pod["spec"]["containers"][0]["resources"]["claims"] = pod_claim(claim)

        async def bound(api):
            core = client.CoreV1Api(api)
            await core.create_namespaced_pod(namespace, pod)
            return await until(lambda: _node_of_pod(core, namespace, "dra-server"), what="its pod bound")

        assert cluster.run(bound) == "dra-h100-r"
        before = cluster.run(lambda api: _allocation(api, namespace, claim))
        mine = _partition(service, lease["id"])

        plane.stop_apiserver()
        wait_for(lambda: service.call("GET", "health").json()["cluster"].startswith("stale since"),
                 what="the view marked stale")
        plane.start_apiserver()
        wait_for(lambda: service.call("GET", "health").json()["cluster"] == "current", what="the view current again",
                 timeout=90)

        assert cluster.run(lambda api: _allocation(api, namespace, claim)) == before
        assert lease_state(service, lease["id"])["state"] == "granted"
        assert _partition(service, lease["id"]) == mine
        assert outside_on(service, "dra-h100-r") == []
    finally:
        service.kill()


async def _node_of_pod(core, namespace: str, name: str) -> str | None:
    return (await core.read_namespaced_pod(name, namespace)).spec.node_name


async def _allocation(api, namespace: str, claim: str) -> tuple:
    found = await client.ResourceV1Api(api).read_namespaced_resource_claim(claim, namespace)
    return ([(r.pool, r.device) for r in found.status.allocation.devices.results],
            [r.name for r in found.status.reserved_for or []])


def _partition(service, lease_id: str) -> list[tuple]:
    """Where the service holds the lease's MIG instance: (GPU, start, profile)."""
    node = node_of(service, "dra-h100-r")
    return [(gpu["uuid"], held["start"], held["profile"]) for gpu in node["gpus"] for held in gpu["instances"]
            if held.get("lease_id") == lease_id]
