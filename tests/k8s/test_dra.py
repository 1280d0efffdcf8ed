"""DRA nodes on the local control plane: kwok nodes whose GPUs NVIDIA's DRA driver publishes (the
ResourceSlices its kubelet plugin would write, tests/core/devices/dra_slices.py: a DynamicMIG H100 and
A100, full L4s), read by the service's watch into the core's fleet; a foreign pod's claim, allocated
and bound by the real kube-scheduler, holds the very device it got until it is deleted."""

from __future__ import annotations

import time
import uuid

import pytest

from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend, parse_quantity
from jupyter_gpualloc.core.model import MigMode, SliceKind, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.store import Store, sqlite_url
from jupyter_gpualloc.core.wiring import open_core
from jupyter_gpualloc.kube.claims import claim_name
from jupyter_gpualloc.service.cluster import ClusterReconciler
from tests.service.conftest import ALICE, ROOT

from ..core.devices.dra_slices import dynamic_mig, full_gpus, gpu_uuid, mig_device
from .test_cluster import KWOK_ANNOTATION, until
from .test_job_pods import (JobPodService, cell_job, kube_jobs, running_pod, server_pod, submit, wait_for,
                            wait_for_nodes)
from .test_kernel_pods import KERNEL_LABEL

client = pytest.importorskip("kubernetes_asyncio.client")
ApiException = pytest.importorskip("kubernetes_asyncio.client.exceptions").ApiException

H100, A100 = "H100 80GB HBM3", "A100-SXM4-40GB"
DRA_NODES = {"dra-h100-1": dynamic_mig("dra-h100-1", H100, 2), "dra-a100-1": dynamic_mig("dra-a100-1", A100, 1),
             "dra-l4-1": full_gpus("dra-l4-1", "L4", 2), "dra-l4-shared-1": full_gpus("dra-l4-shared-1", "L4", 1,
                                                                                    consumable=True)}
# The DeviceClasses the driver's Helm chart installs.
DEVICE_CLASSES = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig"}


def dra_node(name: str) -> dict:
    """A kwok node with no device-plugin resources: its GPUs are the DRA driver's."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
                         "annotations": {KWOK_ANNOTATION: "fake"}},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                                   "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


@pytest.fixture(scope="module")
def dra_cluster(k8s_cluster):
    """The DRA nodes, their slices and the driver's DeviceClasses, removed after the module."""
    async def add(api):
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        for name, kind in DEVICE_CLASSES.items():
            try:
                await resource.create_device_class({"metadata": {"name": name}, "spec": {"selectors": [{"cel": {
                    "expression": f"device.driver == 'gpu.nvidia.com' && "
                                  f"device.attributes['gpu.nvidia.com'].type == '{kind}'"}}]}})
            except ApiException as err:
                if err.status != 409:
                    raise
        for name, slices in DRA_NODES.items():
            await core.create_node(dra_node(name))
            for body in slices:
                await resource.create_resource_slice(body)

    async def remove(api):
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        for name in DRA_NODES:
            await resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={name}")
            await core.delete_node(name)

    k8s_cluster.run(add)
    yield k8s_cluster
    k8s_cluster.run(remove)


def claim_pod(name: str, claim: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"automountServiceAccountToken": False,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "python:3.12-slim", "command": ["sleep", "infinity"],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def mig_claim(name: str, profile: str, product: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression":
                    f"device.attributes['gpu.nvidia.com'].profile == '{profile}' && "
                    f"device.attributes['gpu.nvidia.com'].productName == '{product}'"}}]}}]}}}


def gpus_of(scheduler, node: str) -> list[dict]:
    return next((n["gpus"] for n in scheduler.inventory()["nodes"] if n["name"] == node), [])


def available(scheduler, profile: str, model: str) -> int:
    return next((o["available"] for o in scheduler.offers() if o["spec"].get("profile") == profile
                 and o["spec"].get("model") == model), 0)


def test_the_watch_reads_dra_nodes_and_a_foreign_claim_holds_the_partition_the_kube_scheduler_gave_it(
        dra_cluster, namespace, tmp_path):
    async def body(api):
        core_api, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        backend = KubernetesBackend.from_cluster(kubeconfig=dra_cluster.kubeconfig)
        core = open_core(backend, Store(sqlite_url(str(tmp_path / "dra.sqlite"))),
                         SchedulerPolicy(wait_for_holders=False, heartbeat_ttl=1e9), now=time.time())
        reconciler = ClusterReconciler(core.scheduler, backend, namespace=namespace, instance=f"{namespace}.gpualloc",
                                       kubeconfig=dra_cluster.kubeconfig)
        await reconciler.start()
        try:
            scheduler = core.scheduler
            h100 = gpus_of(scheduler, "dra-h100-1")
            assert [(g["uuid"], g["model"], g["mig_mode"]) for g in h100] == [
                (gpu_uuid("dra-h100-1", i), H100, MigMode.DYNAMIC.value) for i in range(2)]
            assert [g["mig_mode"] for g in gpus_of(scheduler, "dra-a100-1")] == ["dynamic"]
            assert [(g["model"], g["mig_mode"]) for g in gpus_of(scheduler, "dra-l4-1")] == [("L4", "off")] * 2
            before = available(scheduler, "1g.10gb", H100)

            await resource.create_namespaced_resource_claim(namespace, mig_claim("train", "1g.10gb",
                                                                                 "NVIDIA H100 80GB HBM3"))
            await core_api.create_namespaced_pod(namespace, claim_pod("train", "train"))

            async def bound():
                pod = await core_api.read_namespaced_pod("train", namespace)
                claim = await resource.read_namespaced_resource_claim("train", namespace)
                return pod.spec.node_name and claim.status.allocation and (pod.spec.node_name, claim)
            node, claim = await until(bound, what="the kube-scheduler's allocation and binding")
            assert node == "dra-h100-1"
            device = claim.status.allocation.devices.results[0].device
            pool = backend.pool("dra-h100-1")

            async def held():
                return [(g["uuid"], i["start"]) for g in gpus_of(scheduler, "dra-h100-1") for i in g["instances"]
                        if i.get("outside") == f"claim:{namespace}/train"]
            expected = pool.devices[device]
            assert await until(held, what="the claim's partition held") == [(expected.gpu_uuid, expected.start)]
            assert available(scheduler, "1g.10gb", H100) == before - 1

            await core_api.delete_namespaced_pod("train", namespace, grace_period_seconds=0)
            await resource.delete_namespaced_resource_claim("train", namespace)

            async def freed():
                return not await held() and available(scheduler, "1g.10gb", H100) == before
            await until(freed, what="the partition free again")
        finally:
            await reconciler.close()
            core.close()

    dra_cluster.run(body, timeout=180)


@pytest.fixture(scope="module")
def service(dra_cluster, tmp_path_factory, install_namespace):
    """The service, GPU kernels in pods of their own, on a cluster with the DRA nodes."""
    svc = JobPodService(tmp_path_factory.mktemp("service-dra"), dra_cluster.kubeconfig,
                        "c.GpuAllocService.kernel_pods = True\n", namespace=install_namespace)
    svc.start()
    try:
        wait_for_nodes(svc, DRA_NODES)
        yield svc
    finally:
        svc.kill()


@pytest.fixture
def server(service, dra_cluster, install_pods, tmp_path):
    """alice's CPU-only server pod (a named server of this test's), Running."""
    name = f"s{uuid.uuid4().hex[:8]}"
    dra_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(
        install_pods, server_pod(service, "alice", tmp_path, server_name=name)))
    return f"server:{name}"


def lease_claim(dra_cluster, namespace: str, lease_id: str):
    async def read(api):
        claims = await client.ResourceV1Api(api).list_namespaced_resource_claim(namespace)
        return next((c for c in claims.items if c.metadata.name == claim_name(lease_id)), None)
    return dra_cluster.run(read)


def chosen_device(service, slice_: dict) -> str:
    """The driver's name of the MIG device the core chose for `slice_`, from the inventory."""
    node = slice_["node"]
    gpus = next(n["gpus"] for n in service.call("GET", "inventory", token=ROOT).json()["nodes"] if n["name"] == node)
    gpu = next(g for g in gpus if g["uuid"] == slice_["gpu_uuids"][0])
    instance = next(i for i in gpu["instances"] if i["uuid"] == slice_["mig_uuid"])
    minor = [gpu_uuid(node, i) for i in range(len(gpus))].index(gpu["uuid"])
    return mig_device(minor, slice_["profile"], instance["start"], gpu["model"])


CONNECTION = {"key": "k", "signature_scheme": "hmac-sha256", "shell_port": 1, "iopub_port": 2, "stdin_port": 3,
              "control_port": 4, "hb_port": 5}


def test_a_kernels_pod_on_a_dra_node_gets_the_partition_the_core_chose_through_a_claim_the_service_allocated(
        service, server, dra_cluster, install_pods):
    namespace = install_pods
    body = {"spec": {"kind": "mig", "profile": "1g.10gb", "node": "dra-h100-1"}, "server": server,
            "argv": ["python"], "connection": CONNECTION}
    kernel_id = str(uuid.uuid4())
    made = wait_for(lambda: (r := service.call("POST", f"kernels/{kernel_id}/pod", body, ALICE)).json()
                    .get("field") != "runner" and r, what="the service seeing the server pod")
    assert made.status == 201, made
    lease = made.json()["lease"]
    chosen = chosen_device(service, lease["slice"])

    async def body_(api):
        core_api, resource = client.CoreV1Api(api), client.ResourceV1Api(api)

        async def bound():
            pods = (await core_api.list_namespaced_pod(namespace, label_selector=f"{KERNEL_LABEL}={kernel_id}")).items
            return next((p for p in pods if p.spec.node_name), None)
        pod = await until(bound, what="the kernel's pod bound by the kube-scheduler")
        claim = await resource.read_namespaced_resource_claim(claim_name(lease["id"]), namespace)
        return pod, claim
    pod, claim = dra_cluster.run(body_)
    assert pod.spec.node_name == "dra-h100-1"
    assert [c.resource_claim_name for c in pod.spec.resource_claims] == [claim_name(lease["id"])]
    assert not any(k.startswith("nvidia.com/") for k in (pod.spec.containers[0].resources.limits or {}))
    assert [(r.driver, r.pool, r.device) for r in claim.status.allocation.devices.results] == [
        ("gpu.nvidia.com", "dra-h100-1", chosen)]
    assert [r.name for r in claim.status.reserved_for] == [pod.metadata.name]  # the kube-scheduler only reserved it
    assert claim.metadata.labels["gpualloc.jupyter.org/lease"] == lease["id"]

    dra_cluster.run(lambda api: client.CoreV1Api(api).delete_namespaced_pod(pod.metadata.name, namespace,
                                                                             grace_period_seconds=0))
    wait_for(lambda: service.call("GET", f"leases/{lease['id']}", token=ALICE).json()["state"] != "granted",
             what="the lease released with its pod")

    wait_for(lambda: lease_claim(dra_cluster, namespace, lease["id"]) is None, what="the lease's claim deleted")
    # what the pod held is free again: every 1g.10gb of the node is offered
    wait_for(lambda: not any(i for n in service.call("GET", "inventory", token=ROOT).json()["nodes"]
                             if n["name"] == "dra-h100-1" for g in n["gpus"] for i in g["instances"]),
             what="the partition gone from the inventory")


def test_shared_slices_on_a_dra_gpu_with_consumable_memory_are_capacity_claims_on_the_same_device(
        service, server, dra_cluster, install_pods):
    """An L4 whose driver publishes its memory as consumable capacity: two kernels' shared slices are two
    claims on its one device, each consuming the slice's memory as a share of its own, both bound there."""
    namespace, leases = install_pods, []
    for memory_mib in (8192, 12288):
        body = {"spec": {"kind": "shared", "memory_mib": memory_mib, "node": "dra-l4-shared-1"}, "server": server,
                "argv": ["python"], "connection": CONNECTION}
        made = wait_for(lambda: (r := service.call("POST", f"kernels/{uuid.uuid4()}/pod", body, ALICE)).json()
                        .get("field") != "runner" and r, what="the service seeing the server pod")
        assert made.status == 201, made
        leases.append(made.json()["lease"])

    async def bound(api):
        core_api = client.CoreV1Api(api)

        async def both():
            pods = (await core_api.list_namespaced_pod(namespace, label_selector=KERNEL_LABEL)).items
            mine = {p.metadata.labels["gpualloc.jupyter.org/lease"]: p for p in pods if p.spec.node_name}
            return all(lease["id"] in mine for lease in leases) and mine
        return await until(both, what="both kernels' pods bound by the kube-scheduler")
    pods = dra_cluster.run(bound)
    shares = set()
    for lease in leases:
        claim = lease_claim(dra_cluster, namespace, lease["id"])
        [result] = claim.status.allocation.devices.results
        assert (pods[lease["id"]].spec.node_name, result.pool, result.device) == ("dra-l4-shared-1",) * 2 + ("gpu-0",)
        memory = lease["slice"]["memory_mib"] * 2**20  # the API server writes quantities canonically (8Gi)
        assert {k: parse_quantity(v) for k, v in result.consumed_capacity.items()} == {"memory": memory}
        assert parse_quantity(claim.spec.devices.requests[0].exactly.capacity.requests["memory"]) == memory
        assert [r.name for r in claim.status.reserved_for] == [pods[lease["id"]].metadata.name]
        shares.add(result.share_id)
    assert len(shares) == 2 and None not in shares

    for pod in pods.values():
        dra_cluster.run(lambda api, pod=pod: client.CoreV1Api(api).delete_namespaced_pod(
            pod.metadata.name, namespace, grace_period_seconds=0))
    wait_for(lambda: all(lease_claim(dra_cluster, namespace, lease["id"]) is None for lease in leases),
             what="both claims deleted with their pods")


def test_a_jobs_pod_on_a_dra_node_uses_the_claim_the_service_allocated_and_it_goes_with_the_job(
        service, server, dra_cluster, install_pods, tmp_path):
    namespace = install_pods
    job = submit(service, cell_job(tmp_path, "1", {"kind": "mig", "profile": "3g.20gb", "node": "dra-a100-1"},
                                   runner=server))
    pod = running_pod(dra_cluster, namespace, job["id"], service)  # bound there by the kube-scheduler
    [kube_job] = kube_jobs(dra_cluster, namespace, job["id"])
    lease = service.call("GET", f"leases/{job['lease_id']}", token=ALICE).json()
    claim = lease_claim(dra_cluster, namespace, lease["id"])
    assert pod.spec.node_name == "dra-a100-1"
    assert [c.resource_claim_name for c in kube_job.spec.template.spec.resource_claims] == [claim.metadata.name]
    assert [(r.pool, r.device) for r in claim.status.allocation.devices.results] == [
        ("dra-a100-1", chosen_device(service, lease["slice"]))]
    assert [r.name for r in claim.status.reserved_for] == [pod.metadata.name]
    assert service.call("DELETE", f"jobs/{job['id']}", token=ALICE).status == 200
    wait_for(lambda: not kube_jobs(dra_cluster, namespace, job["id"]) and
             lease_claim(dra_cluster, namespace, lease["id"]) is None, what="the Job, then its claim, deleted")


def test_a_restarted_service_names_every_granted_servers_claim_allocated_on_its_partition(
        dra_cluster, namespace, tmp_path):
    """One server's claim was allocated before the service stopped; another server was granted while
    no reconciler ran (the service stopped between the grant and the claim). Restarted, the service
    names both claims to their spawners, each allocated on the partition the core chose."""
    url = sqlite_url(str(tmp_path / "restart.sqlite"))
    policy = SchedulerPolicy(wait_for_holders=False, heartbeat_ttl=1e9)
    spec = SliceSpec(kind=SliceKind.MIG, profile="1g.10gb", node="dra-h100-1")

    def open_service(reconciled: bool = True):
        backend = KubernetesBackend.from_cluster(kubeconfig=dra_cluster.kubeconfig)
        core = open_core(backend, Store(url), policy, now=time.time())
        return backend, core, ClusterReconciler(core.scheduler, backend, namespace=namespace,
                                                instance=f"{namespace}.gpualloc", kubeconfig=dra_cluster.kubeconfig) \
            if reconciled else None

    async def claim_of(reconciler, scheduler, lease_id):
        return reconciler.pod(scheduler.lease(lease_id))["claim"]

    async def body(api):
        resource = client.ResourceV1Api(api)
        _, core, reconciler = open_service()
        await reconciler.start()
        try:
            first = core.scheduler.submit("alice", "server:first", spec, now=time.time())
            await until(lambda: claim_of(reconciler, core.scheduler, first.id), what="the first server's claim")
        finally:
            await reconciler.close()
            core.close()
        _, core, _ = open_service(reconciled=False)  # no reconciler: the grant's claim is never written
        try:
            second = core.scheduler.submit("alice", "server", spec, now=time.time())
        finally:
            core.close()

        backend, core, reconciler = open_service()
        await reconciler.start()
        try:
            for lease_id in (first.id, second.id):
                assert await until(lambda: claim_of(reconciler, core.scheduler, lease_id),
                                   what=f"lease {lease_id}'s claim named again") == claim_name(lease_id)
                lease = core.scheduler.lease(lease_id).to_json()
                claim = await resource.read_namespaced_resource_claim(claim_name(lease_id), namespace)
                device = backend.pool("dra-h100-1").named_by(lease["slice"]["mig_uuid"]).name
                assert [(r.pool, r.device) for r in claim.status.allocation.devices.results] == [
                    ("dra-h100-1", device)]
            for lease_id in (first.id, second.id):
                core.scheduler.release(lease_id, now=time.time())
            await until(lambda: claims_left(resource, namespace), what="both claims deleted")
        finally:
            await reconciler.close()
            core.close()

    async def claims_left(resource, namespace):
        return not (await resource.list_namespaced_resource_claim(namespace)).items

    dra_cluster.run(body, timeout=180)
