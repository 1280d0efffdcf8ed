"""The service on the real control plane (--backend kubernetes): its view of nodes and pods stays
true as the cluster changes, and every lease is tied to the pod made for it.

The service reaches the API server through a TCP proxy the outage test cuts. Each test works on
nodes of its own, and puts back what it changed.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.cuttable_proxy import CuttableProxy
from tests.kernel.conftest import Kernel, assert_one_line_error, kernel_env
from tests.processes import start_logged, wait_until_ready
from tests.service.conftest import ALICE, ROOT, ServiceProcess

from .conftest import create_namespace, delete_namespace
from .test_cluster import KWOK_ANNOTATION, PHASE, gpu_pod, until

client = pytest.importorskip("kubernetes_asyncio.client")

LEASE_LABEL = "gpualloc.jupyter.org/lease"
CONFIG = """
c.SchedulerPolicy.heartbeat_ttl = 3600
c.SchedulerPolicy.wait_for_holders = False
c.GpuAllocService.tick_interval = 0.5
c.GpuAllocService.pod_unschedulable_timeout = 3
c.GpuAllocService.pod_missing_timeout = 8
"""


class ClusterService(ServiceProcess):
    """The service with the kubernetes backend, on a kubeconfig (that may go through `proxy`), its
    pods in `namespace`."""

    def __init__(self, workdir: Path, kubeconfig: Path | str, config: str = CONFIG, *, namespace: str):
        super().__init__(workdir, config=f"{config}\nc.GpuAllocService.namespace = {namespace!r}\n")
        self.kubeconfig, self.namespace = kubeconfig, namespace

    def command(self) -> list[str]:
        command = super().command()
        at = command.index("--fleet")
        return [*command[:at], "--backend", "kubernetes", *command[at + 2:]]

    def start(self, timeout: float = 90) -> "ClusterService":
        self.proc = start_logged(self.command(), self.workdir / "service.log", cwd=self.workdir,
                                 env={**os.environ, "JUPYTERHUB_API_TOKEN": "", "KUBECONFIG": str(self.kubeconfig)})
        wait_until_ready(self.proc, lambda: self.call("GET", "health").status == 200, "the service",
                         self.log_tail, timeout)
        return self


@pytest.fixture(scope="module")
def proxy(k8s_cluster):
    config = yaml.safe_load(Path(k8s_cluster.kubeconfig).read_text())
    server = config["clusters"][0]["cluster"]["server"]
    proxy = CuttableProxy(int(server.rsplit(":", 1)[1]))
    yield proxy
    proxy.cut()


@pytest.fixture(scope="module")
def service(k8s_cluster, proxy, tmp_path_factory, install_namespace):
    workdir = tmp_path_factory.mktemp("service-k8s")
    config = yaml.safe_load(Path(k8s_cluster.kubeconfig).read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    svc = ClusterService(workdir, kubeconfig, namespace=install_namespace).start()
    yield svc
    svc.kill()


@pytest.fixture
def namespace(install_pods) -> str:
    """The service's namespace, where its pods are its own; what a test leaves there is deleted after it."""
    return install_pods


def node_of(service, name: str) -> dict | None:
    return next((n for n in service.call("GET", "inventory", token=ROOT).json()["nodes"] if n["name"] == name), None)


def outside_on(service, name: str) -> list[str]:
    node = node_of(service, name) or {"gpus": []}
    return sorted(held["outside"] for gpu in node["gpus"]
                  for held in gpu.get("shares", []) + gpu.get("instances", []) if held.get("outside"))


def wait_for(check, timeout: float = 30.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def lease_state(service, lease_id: str) -> dict:
    return service.call("GET", f"leases/{lease_id}", token=ROOT).json()


def request(service, spec: dict, holder: str) -> dict:
    reply = service.call("POST", "leases", {"spec": spec, "holder": holder}, ROOT)
    assert reply.status in (201, 202), reply
    return reply.json()


def test_health_says_the_view_is_current(service):
    health = service.call("GET", "health").json()
    assert health["backend"] == "kubernetes" and health["cluster"] == "current"


def test_a_foreign_pod_holding_the_node_makes_a_request_queue_until_it_is_deleted(service, k8s_cluster, namespace):
    k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(
        namespace, gpu_pod("train", {"nvidia.com/gpu": "4"}, node="gpu-a100-1")))
    wait_for(lambda: outside_on(service, "gpu-a100-1") == [f"pod:{namespace}/train"] * 4,
             what="the foreign pod's GPUs outside the allocator")
    lease = request(service, {"kind": "whole", "count": 4, "node": "gpu-a100-1"}, "server:foreign")
    assert lease["state"] == "queued"
    users = service.call("GET", "inventory", token="alice-token-0001").json()
    assert {h["outside"] for n in users["nodes"] for g in n["gpus"] for h in g.get("shares", []) if h.get("outside")} \
        == {"outside the allocator"}

    k8s_cluster.run(lambda api: client.CoreV1Api(api).delete_namespaced_pod("train", namespace, grace_period_seconds=0))
    started = time.monotonic()
    wait_for(lambda: lease_state(service, lease["id"])["state"] == "granted", what="the grant")
    assert time.monotonic() - started < 10
    service.call("DELETE", f"leases/{lease['id']}", token=ROOT)


def test_foreign_mig_and_time_sliced_pods_take_their_devices(service, k8s_cluster, namespace):
    async def create(api):
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(namespace, gpu_pod("mig", {"nvidia.com/mig-3g.40gb": "2"}, node="gpu-h100-mig-1"))
        await core.create_namespaced_pod(namespace, gpu_pod("ts", {"nvidia.com/gpu": "3"}, node="gpu-l4-shared-1"))

    k8s_cluster.run(create)
    wait_for(lambda: len(outside_on(service, "gpu-h100-mig-1")) == 2 and outside_on(service, "gpu-l4-shared-1"),
             what="the MIG and time-sliced pods' devices")
    gpus = node_of(service, "gpu-h100-mig-1")["gpus"]
    assert all(g["free_profiles"]["3g.40gb"] == 0 for g in gpus)
    shared = node_of(service, "gpu-l4-shared-1")["gpus"]
    assert sorted(g["free_milli"] for g in shared) == [250, 1000]  # three quarter-GPU replicas on the first


def test_a_cordoned_node_drains_and_comes_back_when_uncordoned(service, k8s_cluster):
    lease = None
    k8s_cluster.run(lambda api: client.CoreV1Api(api).patch_node("gpu-l4-1", {"spec": {"unschedulable": True}}))
    try:
        wait_for(lambda: node_of(service, "gpu-l4-1")["unschedulable"] == "cordoned", what="the cordon")
        lease = request(service, {"kind": "whole", "node": "gpu-l4-1"}, "server:cordon")
        assert lease["state"] == "queued"
    finally:
        k8s_cluster.run(lambda api: client.CoreV1Api(api).patch_node("gpu-l4-1", {"spec": {"unschedulable": False}}))
    wait_for(lambda: lease_state(service, lease["id"])["state"] == "granted", what="the grant once uncordoned")
    service.call("DELETE", f"leases/{lease['id']}", token=ROOT)


def test_a_node_added_serves_without_a_restart_and_its_deletion_ends_its_leases(service, k8s_cluster):
    async def add(api):
        core = client.CoreV1Api(api)
        node = (await core.read_node("gpu-l4-1", _preload_content=False))
        raw = await node.json()
        new = {"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "gpu-l4-new", "labels": {**raw["metadata"]["labels"],
                                                             "kubernetes.io/hostname": "gpu-l4-new"},
                            "annotations": {KWOK_ANNOTATION: "fake"}},
               "spec": {}, "status": {"allocatable": raw["status"]["allocatable"],
                                      "capacity": raw["status"]["capacity"]}}
        await core.create_node(new)

    k8s_cluster.run(add)
    try:
        wait_for(lambda: (node_of(service, "gpu-l4-new") or {"unschedulable": "absent"})["unschedulable"] is None,
                 what="the new node, Ready, in the inventory")
        lease = request(service, {"kind": "whole", "node": "gpu-l4-new"}, "server:new-node")
        assert lease["state"] == "granted"
    finally:
        k8s_cluster.run(lambda api: client.CoreV1Api(api).delete_node("gpu-l4-new"))
    ended = wait_for(lambda: (l := lease_state(service, lease["id"]))["state"] != "granted" and l,
                     what="the lease's end")
    assert ended["state"] == "expired" and ended["reason"] == "node gpu-l4-new left the cluster"


def lease_pod(lease: dict, name: str, resources: dict, node: str | None, phase: str = "Running") -> dict:
    """The pod of a lease, labelled as the service says its pods are (in the namespace it names)."""
    pod = gpu_pod(name, resources, node=node, labels=lease["pod"]["labels"])
    pod["metadata"]["annotations"] = {PHASE: phase}
    return pod


def test_deleting_a_leases_pod_releases_the_lease(service, k8s_cluster, namespace):
    lease = request(service, {"kind": "whole", "node": "gpu-l4-1"}, "server:deleted")
    k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(
        namespace, lease_pod(lease, "server-pod", {"nvidia.com/gpu": "1"}, "gpu-l4-1")))

    async def running(api):
        async def check():
            return (await client.CoreV1Api(api).read_namespaced_pod("server-pod", namespace)).status.phase == "Running"
        await until(check, what="the pod Running")
        assert outside_on(service, "gpu-l4-1") == []  # the lease's own pod is not a foreign one
        await client.CoreV1Api(api).delete_namespaced_pod("server-pod", namespace, grace_period_seconds=0)

    k8s_cluster.run(running)
    ended = wait_for(lambda: (l := lease_state(service, lease["id"]))["state"] != "granted" and l, what="the release")
    assert ended["state"] == "released" and ended["reason"] == f"its pod {namespace}/server-pod was deleted"


def test_a_lease_ended_by_the_core_has_its_pod_deleted(service, k8s_cluster, namespace):
    lease = request(service, {"kind": "whole", "node": "gpu-l4-1"}, "server:ended")
    k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(
        namespace, lease_pod(lease, "orphan", {"nvidia.com/gpu": "1"}, "gpu-l4-1")))
    assert service.call("DELETE", f"leases/{lease['id']}", token=ROOT).status == 200
    wait_until_deleted(k8s_cluster, namespace, "orphan")
    # an operator reads it in the service's log and in the audit log
    log = (service.workdir / "service.log").read_text()
    assert f"deleting pod {namespace}/orphan of lease {lease['id']}: its lease ended" in log, log[-3000:]
    deleted = wait_for(lambda: [e for e in audit_events(service) if e["type"] == "pod.deleted"
                                and e["lease_id"] == lease["id"]], what="the deletion in the audit log")
    assert deleted[0]["user"] == "root" and deleted[0]["data"]["pod"] == f"{namespace}/orphan", deleted
    assert deleted[0]["data"]["holder"] == "server:ended", deleted
    assert deleted[0]["data"]["reason"].startswith("its lease ended"), deleted


def audit_events(service) -> list[dict]:
    return [json.loads(line) for line in service.audit_log.read_text().splitlines() if line.strip()]


def wait_until_deleted(k8s_cluster, namespace: str, name: str) -> None:
    """Until the pod `name` is gone from `namespace` (deleted by the service)."""
    async def gone(api):
        async def check():
            pods = await client.CoreV1Api(api).list_namespaced_pod(namespace)
            return not [p for p in pods.items if p.metadata.name == name]
        await until(check, what=f"pod {namespace}/{name} deleted")

    k8s_cluster.run(gone)


def test_an_unschedulable_pod_ends_its_lease_with_the_schedulers_message(service, k8s_cluster, namespace):
    lease = request(service, {"kind": "whole", "node": "gpu-l4-1"}, "server:stuck")
    k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(
        namespace, lease_pod(lease, "stuck", {"nvidia.com/gpu": "64"}, "gpu-l4-1")))
    ended = wait_for(lambda: (l := lease_state(service, lease["id"]))["state"] != "granted" and l,
                     timeout=60, what="the lease's end")
    assert re.match(r"its pod could not be scheduled for \d+ s: .*Insufficient nvidia\.com/gpu", ended["reason"]), ended


def test_a_lease_whose_pod_never_appears_is_released(service):
    lease = request(service, {"kind": "whole", "node": "gpu-l4-1"}, "server:never-started")
    assert lease["state"] == "granted"
    ended = wait_for(lambda: (l := lease_state(service, lease["id"]))["state"] != "granted" and l,
                     timeout=40, what="the lease's end")
    assert ended["state"] == "released", ended
    assert re.fullmatch(r"it has no pod in the cluster \d+ s after its grant", ended["reason"]), ended


def test_an_outage_leaves_the_view_equal_to_a_fresh_list(service, k8s_cluster, proxy, namespace, tmp_path):
    proxy.cut()
    try:
        wait_for(lambda: service.call("GET", "health").json()["cluster"].startswith("stale since"),
                 what="the view marked stale")

        async def change(api):  # while the service cannot see
            core = client.CoreV1Api(api)
            await core.create_namespaced_pod(namespace, gpu_pod("during", {"nvidia.com/gpu": "2"}, node="gpu-a100-1"))
            await core.patch_node("gpu-t4-shared-1", {"spec": {"unschedulable": True}})

        k8s_cluster.run(change)
        time.sleep(1)
    finally:
        proxy.restore()
    try:
        wait_for(lambda: service.call("GET", "health").json()["cluster"] == "current", what="the view current again")
        wait_for(lambda: outside_on(service, "gpu-a100-1") == [f"pod:{namespace}/during"] * 2
                 and node_of(service, "gpu-t4-shared-1")["unschedulable"] == "cordoned",
                 what="the changes made during the outage")
        fresh = ClusterService(tmp_path / "fresh", Path(k8s_cluster.kubeconfig), namespace=namespace).start()
        try:
            assert views(fresh) == views(service)
        finally:
            fresh.kill()
    finally:
        k8s_cluster.run(lambda api: client.CoreV1Api(api).patch_node("gpu-t4-shared-1", {"spec": {"unschedulable": False}}))


async def copy_node(api, model: str, name: str) -> None:
    """A node named `name`, a copy of the demo fleet's node `model` (kwok keeps it Ready)."""
    core = client.CoreV1Api(api)
    raw = await (await core.read_node(model, _preload_content=False)).json()
    await core.create_node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {**raw["metadata"]["labels"], "kubernetes.io/hostname": name},
                     "annotations": {KWOK_ANNOTATION: "fake"}},
        "spec": {}, "status": {"allocatable": raw["status"]["allocatable"], "capacity": raw["status"]["capacity"]}})


def pod_exists(k8s_cluster, namespace: str, name: str) -> bool:
    async def read(api):
        pods = await client.CoreV1Api(api).list_namespaced_pod(namespace)
        return any(p.metadata.name == name and not p.metadata.deletion_timestamp for p in pods.items)
    return k8s_cluster.run(read)


def test_a_pod_labelled_as_ours_elsewhere_or_for_a_lease_we_never_made_is_outside_use_and_kept(
        service, k8s_cluster, namespace):
    """A user copied a notebook pod's manifest into another namespace, and someone made up a lease id:
    neither pod is this install's, so neither is deleted, and both hold their GPUs."""
    lease = request(service, {"kind": "whole", "node": "gpu-l4-1"}, "server:copied-from")
    other = f"o-{uuid.uuid4().hex[:8]}"
    create_namespace(k8s_cluster, other)
    try:
        labels = lease["pod"]["labels"]
        assert labels == {LEASE_LABEL: lease["id"], "gpualloc.jupyter.org/instance": f"{namespace}.gpualloc"}
        assert lease["pod"]["namespace"] == namespace

        async def create(api):
            core = client.CoreV1Api(api)
            await core.create_namespaced_pod(other, gpu_pod("copied", {"nvidia.com/gpu": "2"}, "gpu-a100-1", labels))
            await core.create_namespaced_pod(namespace, gpu_pod(
                "made-up", {"nvidia.com/gpu": "1"}, "gpu-a100-1", {**labels, LEASE_LABEL: "0123456789abcdef"}))

        k8s_cluster.run(create)
        wait_for(lambda: outside_on(service, "gpu-a100-1") == sorted([f"pod:{other}/copied"] * 2
                                                                     + [f"pod:{namespace}/made-up"]),
                 what="both pods' GPUs counted as outside use")
        time.sleep(3)  # many ticks of the reconciler
        assert pod_exists(k8s_cluster, other, "copied") and pod_exists(k8s_cluster, namespace, "made-up")
        assert lease_state(service, lease["id"])["state"] == "granted"
        log = (service.workdir / "service.log").read_text()
        assert f"deleting pod {other}/copied" not in log and f"deleting pod {namespace}/made-up" not in log
    finally:
        k8s_cluster.run(lambda api: client.CoreV1Api(api).delete_namespaced_pod("copied", other, grace_period_seconds=0))
        delete_namespace(k8s_cluster, other)
        service.call("DELETE", f"leases/{lease['id']}", token=ROOT)


def test_two_installs_in_one_namespace_never_touch_each_others_pods(service, k8s_cluster, namespace, tmp_path):
    """Staging and production on one cluster (here one namespace, told apart by their instances):
    each counts the other's pod as outside use, and deletes only its own."""
    second = ClusterService(tmp_path / "second", Path(k8s_cluster.kubeconfig),
                            CONFIG + "c.GpuAllocService.instance = 'second'\n", namespace=namespace).start()
    try:
        ours = request(service, {"kind": "whole", "node": "gpu-a100-1"}, "server:first-install")
        theirs = request(second, {"kind": "whole", "node": "gpu-a100-1"}, "server:second-install")
        assert theirs["pod"]["labels"]["gpualloc.jupyter.org/instance"] == "second"

        async def create(api):
            core = client.CoreV1Api(api)
            await core.create_namespaced_pod(namespace, lease_pod(ours, "ours", {"nvidia.com/gpu": "1"}, "gpu-a100-1"))
            await core.create_namespaced_pod(namespace, lease_pod(theirs, "theirs", {"nvidia.com/gpu": "1"},
                                                                  "gpu-a100-1"))

        k8s_cluster.run(create)
        wait_for(lambda: outside_on(service, "gpu-a100-1") == [f"pod:{namespace}/theirs"]
                 and outside_on(second, "gpu-a100-1") == [f"pod:{namespace}/ours"],
                 what="each install counting the other's pod as outside use")
        assert service.call("DELETE", f"leases/{ours['id']}", token=ROOT).status == 200
        wait_until_deleted(k8s_cluster, namespace, "ours")
        time.sleep(2)
        assert pod_exists(k8s_cluster, namespace, "theirs")
        assert lease_state(second, theirs["id"])["state"] == "granted"
        assert second.call("DELETE", f"leases/{theirs['id']}", token=ROOT).status == 200
        wait_until_deleted(k8s_cluster, namespace, "theirs")
        assert f"deleting pod {namespace}/ours" not in (second.workdir / "service.log").read_text()
        assert f"deleting pod {namespace}/theirs" not in (service.workdir / "service.log").read_text()
    finally:
        second.kill()


def whole_l4_available(service) -> int:
    return next(o for o in service.call("GET", "offers", token=ROOT).json()["offers"] if o["name"] == "whole-l4")["available"]


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}  # c.KubeGpu.tolerations


def test_a_node_tainted_against_the_pods_is_drained_and_one_they_tolerate_serves(service, k8s_cluster, namespace):
    k8s_cluster.run(lambda api: copy_node(api, "gpu-l4-1", "gpu-l4-taint"))
    core = client.CoreV1Api
    try:
        wait_for(lambda: (node_of(service, "gpu-l4-taint") or {"unschedulable": "absent"})["unschedulable"] is None,
                 what="the new node, Ready, in the inventory")
        before = whole_l4_available(service)
        k8s_cluster.run(lambda api: core(api).patch_node("gpu-l4-taint", {"spec": {"taints": [
            {"key": "dedicated", "value": "ml-team", "effect": "NoSchedule"}]}}))
        wait_for(lambda: node_of(service, "gpu-l4-taint")["unschedulable"]
                 == "tainted dedicated=ml-team:NoSchedule, which this install's GPU pods do not tolerate",
                 what="the tainted node drained, saying why")
        assert whole_l4_available(service) == before - 2  # its two L4s are not offered
        refused = service.call("POST", "leases", {"spec": {"kind": "whole", "node": "gpu-l4-taint"},
                                                  "holder": "server:tainted", "wait": 0}, ROOT)
        assert refused.status == 409 and refused.json()["lease"]["state"] == "rejected", refused  # as when cordoned

        # the kube-scheduler agrees: a pod with the install's tolerations stays Pending there
        pending = gpu_pod("would-pend", {"nvidia.com/gpu": "1"}, node="gpu-l4-taint")
        pending["spec"]["tolerations"] = [GPU_TOLERATION]
        k8s_cluster.run(lambda api: core(api).create_namespaced_pod(namespace, pending))

        async def unschedulable(api):
            async def check():
                pod = await core(api).read_namespaced_pod("would-pend", namespace)
                scheduled = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
                return scheduled is not None and scheduled.reason == "Unschedulable" and "untolerated taint" in \
                    scheduled.message
            await until(check, what="the kube-scheduler refusing the pod")

        k8s_cluster.run(unschedulable)

        # a taint the pods tolerate drains nothing: the slice is granted and its pod bound there
        k8s_cluster.run(lambda api: core(api).patch_node("gpu-l4-taint", {"spec": {"taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}}))
        wait_for(lambda: node_of(service, "gpu-l4-taint")["unschedulable"] is None, what="the node serving again")
        lease = request(service, {"kind": "whole", "node": "gpu-l4-taint"}, "server:tolerated")
        assert lease["state"] == "granted", lease
        pod = lease_pod(lease, "tolerated", {"nvidia.com/gpu": "1"}, "gpu-l4-taint")
        pod["spec"]["tolerations"] = [GPU_TOLERATION]
        k8s_cluster.run(lambda api: core(api).create_namespaced_pod(namespace, pod))

        async def running(api):
            async def check():
                return (await core(api).read_namespaced_pod("tolerated", namespace)).status.phase == "Running"
            await until(check, what="the lease's pod Running on the tainted node")

        k8s_cluster.run(running)
        assert service.call("DELETE", f"leases/{lease['id']}", token=ROOT).status == 200
    finally:
        k8s_cluster.run(lambda api: core(api).delete_node("gpu-l4-taint"))


def views(service) -> dict:
    """What the service holds of the cluster: each node's schedulability and outside holds."""
    nodes = service.call("GET", "inventory", token=ROOT).json()["nodes"]
    return {n["name"]: (n["unschedulable"], outside_on(service, n["name"])) for n in nodes}


def test_a_kernel_or_a_job_gets_no_slice_it_could_never_see_and_the_offers_say_so(service):
    refused = service.call("GET", "offers", token=ROOT).json()["refused_holders"]
    assert set(refused) == {"kernel", "job"}
    for holder in ("kernel:k1", "job:j1"):
        reply = service.call("POST", "leases", {"spec": {"kind": "whole"}, "holder": holder}, ROOT)
        assert reply.status == 400 and reply.json()["field"] == "holder", reply
        assert reply.json()["error"] == f"holder: {refused[holder.split(':')[0]]}", reply
    assert "GPU kernels need kernel pods" in refused["kernel"]


def test_a_kernel_hears_it_gets_no_slice_here_in_one_line(service, tmp_path):
    """A real ipykernel with the magics, against the service on the cluster: `%gpu offers` says why
    first and suggests no request that would be refused; `%gpu request` answers in one line."""
    kernel = Kernel(kernel_env(SimpleNamespace(url=service.url.removesuffix("api/v1/")), ALICE), tmp_path)
    try:
        offers = kernel.run("%gpu offers")
        assert offers.status == "ok" and not offers.stderr, offers
        lines = offers.stdout.splitlines()
        assert lines[0].startswith("gpu: on Kubernetes a kernel cannot get a GPU slice"), lines
        assert lines[1] == "gpu: offers (available now)" and "%gpu request" not in offers.stdout, lines
        assert_one_line_error(kernel.run("%gpu request 4GB"), "a kernel cannot get a GPU slice")
    finally:
        kernel.shutdown()
