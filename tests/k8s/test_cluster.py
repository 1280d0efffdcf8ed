"""The local control plane behaves as a cluster with GPU nodes does: kwok keeps the demo fleet's
nodes Ready, kube-scheduler binds GPU pods by their extended resources (or says why not), the Job
and garbage-collector controllers do their work, a cordoned node is unschedulable, and the
`kubernetes` device backend reads the fleet's GPUs from the API server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend
from jupyter_gpualloc.core.model import MigMode

from .controlplane import DEMO_FLEET

FLEET = yaml.safe_load(Path(DEMO_FLEET).read_text())["nodes"]
NODE_NAMES = sorted(n["name"] for n in FLEET)
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
PHASE = "gpualloc.test/phase"  # holds a pod Running, or ends it (k8s/run.go)


async def until(check, timeout: float = 60.0, every: float = 0.2, what: str = "the condition"):
    """Poll the coroutine function `check` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def gpu_pod(name: str, resources: dict[str, str], node: str | None = None, labels: dict | None = None) -> dict:
    """A pod that asks for extended resources, pinned by node affinity (as the spawner does) when
    a node is named."""
    spec: dict = {
        "containers": [{"name": "main", "image": "python:3.12-slim", "command": ["sleep", "infinity"],
                        "resources": {"requests": dict(resources), "limits": dict(resources)}}],
        "automountServiceAccountToken": False,
    }
    if node:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def condition(obj, kind: str):
    return next((c for c in (obj.status.conditions or []) if c.type == kind), None)


def test_the_demo_nodes_exist_are_ready_and_kwok_renews_their_leases(k8s_cluster):
    async def body(api):
        core, leases = client.CoreV1Api(api), client.CoordinationV1Api(api)
        nodes = {n.metadata.name: n for n in (await core.list_node()).items}
        assert sorted(nodes) == NODE_NAMES
        for node in nodes.values():
            assert node.metadata.annotations[KWOK_ANNOTATION] == "fake"
            assert condition(node, "Ready").status == "True"
            assert not node.spec.unschedulable
        assert nodes["gpu-a100-1"].status.allocatable["nvidia.com/gpu"] == "4"
        assert nodes["gpu-h100-mig-1"].status.allocatable["nvidia.com/mig-1g.10gb"] == "4"
        assert nodes["gpu-t4-shared-1"].status.allocatable["nvidia.com/gpu.shared"] == "8"
        assert nodes["gpu-h100-mig-1"].metadata.labels["nvidia.com/mig.config"] == "all-balanced"

        # The heartbeat: kwok renews each node's Lease (every 10 s for a 40 s lease), which is
        # what kube-controller-manager's node-lifecycle controller reads.
        before = {lease.metadata.name: lease.spec.renew_time
                  for lease in (await leases.list_namespaced_lease("kube-node-lease")).items}
        assert set(before) >= set(NODE_NAMES)

        async def all_renewed():
            now = {lease.metadata.name: lease.spec.renew_time
                   for lease in (await leases.list_namespaced_lease("kube-node-lease")).items}
            return all(now[name] > before[name] for name in NODE_NAMES)

        await until(all_renewed, timeout=30, every=1, what="every node's lease renewed")
        for node in (await core.list_node()).items:
            assert condition(node, "Ready").status == "True"

    k8s_cluster.run(body)


def test_a_gpu_pod_is_bound_by_the_scheduler_and_runs(k8s_cluster, namespace):
    async def body(api):
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(namespace, gpu_pod("one-gpu", {"nvidia.com/gpu": "1"}, node="gpu-l4-1"))

        async def running():
            pod = await core.read_namespaced_pod("one-gpu", namespace)
            return pod if pod.status.phase == "Running" else None

        pod = await until(running, what="the pod Running")
        assert pod.spec.node_name == "gpu-l4-1"
        assert condition(pod, "PodScheduled").status == "True"
        assert condition(pod, "Ready").status == "True"
        # Bound by kube-scheduler itself (the pod named no node), which says so in an event.
        events = await core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=one-gpu,reason=Scheduled")
        assert [(e.reporting_component or e.source.component) for e in events.items] == ["default-scheduler"]
        assert "gpu-l4-1" in events.items[0].message

    k8s_cluster.run(body)


def test_a_pod_asking_for_more_gpus_than_any_node_has_stays_pending(k8s_cluster, namespace):
    async def body(api):
        core = client.CoreV1Api(api)
        await core.create_namespaced_pod(namespace, gpu_pod("too-many", {"nvidia.com/gpu": "64"}))

        async def unschedulable():
            pod = await core.read_namespaced_pod("too-many", namespace)
            scheduled = condition(pod, "PodScheduled")
            return pod if scheduled and scheduled.reason == "Unschedulable" else None

        pod = await until(unschedulable, what="the scheduler's verdict")
        assert pod.status.phase == "Pending" and not pod.spec.node_name
        assert "Insufficient nvidia.com/gpu" in condition(pod, "PodScheduled").message
        await asyncio.sleep(2)
        assert (await core.read_namespaced_pod("too-many", namespace)).status.phase == "Pending"

    k8s_cluster.run(body)


def test_a_job_completes_and_the_garbage_collector_deletes_an_orphaned_pod(k8s_cluster, namespace):
    async def body(api):
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        template = gpu_pod("unused", {"nvidia.com/mig-1g.10gb": "1"})
        template["spec"]["restartPolicy"] = "Never"
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "mig-job"},
               "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "mig-job"}},
                                                        "spec": template["spec"]}}}
        await batch.create_namespaced_job(namespace, job)

        # kwok's pod-complete stage: a Running pod owned by a Job Succeeds.
        async def complete():
            status = (await batch.read_namespaced_job("mig-job", namespace)).status
            return status if any(c.type == "Complete" and c.status == "True"
                                 for c in status.conditions or []) else None

        status = await until(complete, what="the Job Complete")
        assert status.succeeded == 1
        [pod] = (await core.list_namespaced_pod(namespace, label_selector="app=mig-job")).items
        assert pod.status.phase == "Succeeded" and pod.spec.node_name == "gpu-h100-mig-1"

        # Deleting the Job in the background leaves its pod to the garbage collector.
        await batch.delete_namespaced_job("mig-job", namespace, propagation_policy="Background")

        async def pod_gone():
            return not (await core.list_namespaced_pod(namespace, label_selector="app=mig-job")).items

        await until(pod_gone, what="the Job's pod deleted by the garbage collector")

        # The same for a running pod whose owner (a ConfigMap here) is deleted.
        owner = await core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
        dependent = gpu_pod("dependent", {"nvidia.com/gpu": "1"})
        dependent["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]
        await core.create_namespaced_pod(namespace, dependent)
        await until(lambda: _phase(core, namespace, "dependent", "Running"), what="the dependent pod Running")
        await core.delete_namespaced_config_map("owner", namespace)

        async def dependent_gone():
            try:
                await core.read_namespaced_pod("dependent", namespace)
            except ApiException as exc:
                return exc.status == 404
            return False

        await until(dependent_gone, what="the dependent pod deleted by the garbage collector")

    k8s_cluster.run(body)


async def _phase(core, namespace: str, name: str, phase: str) -> bool:
    return (await core.read_namespaced_pod(name, namespace)).status.phase == phase


def test_a_cordoned_node_is_unschedulable(k8s_cluster, namespace):
    async def body(api):
        core = client.CoreV1Api(api)
        await core.patch_node("gpu-a100-1", {"spec": {"unschedulable": True}})
        try:
            # The node-lifecycle controller taints it as kubectl cordon's nodes are.
            async def tainted():
                node = await core.read_node("gpu-a100-1")
                return any(t.key == "node.kubernetes.io/unschedulable" and t.effect == "NoSchedule"
                           for t in node.spec.taints or [])

            await until(tainted, what="the unschedulable taint")
            await core.create_namespaced_pod(namespace, gpu_pod("on-cordoned", {"nvidia.com/gpu": "1"},
                                                                node="gpu-a100-1"))

            async def verdict():
                scheduled = condition(await core.read_namespaced_pod("on-cordoned", namespace), "PodScheduled")
                return scheduled if scheduled and scheduled.reason == "Unschedulable" else None

            scheduled = await until(verdict, what="the scheduler's verdict")
            assert "unschedulable" in scheduled.message

            # The backend reads a cordoned node as unschedulable (the scheduler drains it).
            backend = KubernetesBackend.from_cluster(kubeconfig=k8s_cluster.kubeconfig)
            nodes = await asyncio.to_thread(lambda: {n.name: n.unschedulable for n in backend.discover()})
            assert nodes["gpu-a100-1"] == "cordoned" and nodes["gpu-l4-1"] is None
        finally:
            await core.patch_node("gpu-a100-1", {"spec": {"unschedulable": False}})

        # Uncordoned, the same pod is bound there.
        async def bound():
            pod = await core.read_namespaced_pod("on-cordoned", namespace)
            return pod.spec.node_name == "gpu-a100-1"

        await until(bound, what="the pod bound once the node is uncordoned")

    k8s_cluster.run(body)


def test_the_kubernetes_backend_discovers_the_demo_fleet_from_the_api_server(k8s_cluster):
    backend = KubernetesBackend.from_cluster(kubeconfig=k8s_cluster.kubeconfig)
    fleet = {node.name: node for node in backend.discover()}
    assert backend.unusable_nodes() == []
    read = {name: [(g.model, g.memory_mib, g.mig_mode,
                    sorted(backend.mig_profiles(g.uuid)[i.profile_id].name for i in g.instances))
                   for g in node.gpus]
            for name, node in fleet.items()}
    balanced_h100 = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    balanced_a100 = ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    assert read == {
        "gpu-a100-1": [("A100-SXM4-80GB", 81920, MigMode.OFF, [])] * 4,
        "gpu-h100-mig-1": [("H100 80GB HBM3", 81559, MigMode.STATIC, balanced_h100)] * 2,
        "gpu-a100-mig-1": [("A100-SXM4-40GB", 40960, MigMode.STATIC, balanced_a100)] * 2,
        "gpu-l4-1": [("L4", 23034, MigMode.OFF, [])] * 2,
        "gpu-l4-shared-1": [("L4", 23034, MigMode.OFF, [])] * 2,
        "gpu-t4-shared-1": [("T4", 15360, MigMode.OFF, [])] * 2,
    }  # cpu-1 has no GPU
    assert fleet["gpu-h100-mig-1"].cpu_milli == 96000 and fleet["gpu-h100-mig-1"].memory_mib == 1048576
    # GFD's measured MIG sizes win over the catalogue's
    [gpu, _] = fleet["gpu-h100-mig-1"].gpus
    assert {p.name: p.memory_mib for p in backend.mig_profiles(gpu.uuid).values()
            if p.name in ("1g.10gb", "2g.20gb", "3g.40gb")} == {"1g.10gb": 9984, "2g.20gb": 20096, "3g.40gb": 40320}


def test_a_pod_held_running_ends_when_its_phase_annotation_says(k8s_cluster, namespace):
    """gpualloc.test/phase (k8s/run.go): "Running" keeps a Job's pod running, "Failed" and
    "Succeeded" end a running pod, as a process that ends would."""
    async def body(api):
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        template = gpu_pod("unused", {"nvidia.com/gpu.shared": "1"})["spec"]
        template["restartPolicy"] = "Never"
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "held"},
               "spec": {"backoffLimit": 0, "template": {
                   "metadata": {"labels": {"app": "held"}, "annotations": {PHASE: "Running"}}, "spec": template}}}
        await batch.create_namespaced_job(namespace, job)

        async def running_pod():
            pods = (await core.list_namespaced_pod(namespace, label_selector="app=held")).items
            return pods[0] if pods and pods[0].status.phase == "Running" else None

        pod = await until(running_pod, what="the Job's pod Running")
        assert pod.spec.node_name == "gpu-t4-shared-1"
        await asyncio.sleep(3)  # kwok's pod-complete stage would have ended it by now
        assert (await core.read_namespaced_pod(pod.metadata.name, namespace)).status.phase == "Running"
        assert (await batch.read_namespaced_job("held", namespace)).status.active == 1

        await core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"annotations": {PHASE: "Failed"}}})

        async def job_failed():
            status = (await batch.read_namespaced_job("held", namespace)).status
            return any(c.type == "Failed" and c.status == "True" for c in status.conditions or [])

        await until(job_failed, what="the Job Failed")
        ended = await core.read_namespaced_pod(pod.metadata.name, namespace)
        assert ended.status.phase == "Failed"
        assert [s.state.terminated.exit_code for s in ended.status.container_statuses] == [1]

        # A pod of no Job: Running until its annotation says Succeeded.
        solo = gpu_pod("solo", {"nvidia.com/gpu": "1"}, node="gpu-l4-shared-1")
        solo["metadata"]["annotations"] = {PHASE: "Running"}
        await core.create_namespaced_pod(namespace, solo)
        await until(lambda: _phase(core, namespace, "solo", "Running"), what="the pod Running")
        await core.patch_namespaced_pod("solo", namespace, {"metadata": {"annotations": {PHASE: "Succeeded"}}})
        await until(lambda: _phase(core, namespace, "solo", "Succeeded"), what="the pod Succeeded")
        done = await core.read_namespaced_pod("solo", namespace)
        assert [s.state.terminated.exit_code for s in done.status.container_statuses] == [0]
        assert condition(done, "Ready").status == "False" and condition(done, "PodScheduled").status == "True"

    k8s_cluster.run(body)
