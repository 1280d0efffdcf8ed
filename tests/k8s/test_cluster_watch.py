"""The watch keeps of the cluster's pods only what the service reads (service/cluster_watch.py), on the
local control plane: a pod without GPUs is not kept at all, a GPU pod the allocator did not place
is kept as a slim record that still counts as outside use, a pod of a lease is seen even when it
asks for no device, and the install's server pods, which kernel and Job pods are copied from, are
kept whole."""

from __future__ import annotations

import time

import pytest

from jupyter_gpualloc.core.devices.kubernetes import INSTANCE_LABEL, LEASE_LABEL, KubernetesBackend
from jupyter_gpualloc.core.model import SliceKind, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.store import Store, sqlite_url
from jupyter_gpualloc.core.wiring import open_core
from jupyter_gpualloc.service.cluster import ClusterReconciler

from .test_cluster import gpu_pod, until

client = pytest.importorskip("kubernetes_asyncio.client")

SECRET_ENV = [{"name": "DATABASE_PASSWORD", "value": "not-for-the-allocator"}]


def bound(name: str, node: str, resources: dict[str, str], labels: dict | None = None) -> dict:
    pod = gpu_pod(name, resources, labels=labels)
    pod["spec"]["nodeName"] = node
    pod["spec"]["containers"][0]["env"] = SECRET_ENV
    if not resources:
        del pod["spec"]["containers"][0]["resources"]
    return pod


def outside(scheduler, node: str) -> list[str]:
    """What holds the node's devices outside the allocator, one entry per device."""
    return [held["outside"] for n in scheduler.inventory()["nodes"] if n["name"] == node for gpu in n["gpus"]
            for held in gpu.get("shares", []) + gpu.get("instances", []) if held.get("outside")]


def test_the_watch_keeps_only_what_it_reads_of_each_pod(k8s_cluster, namespace, tmp_path):
    instance = f"{namespace}.gpualloc"

    async def body(api):
        core_api = client.CoreV1Api(api)
        policy = SchedulerPolicy(wait_for_holders=False, heartbeat_ttl=1e9)
        backend = KubernetesBackend.from_cluster(kubeconfig=k8s_cluster.kubeconfig)
        core = open_core(backend, Store(sqlite_url(str(tmp_path / "watch.sqlite"))), policy, now=time.time())
        lease = core.scheduler.submit("alice", "server:watch", SliceSpec(kind=SliceKind.WHOLE, node="gpu-l4-1"),
                                      now=time.time())
        server = bound("jupyter-alice", "cpu-1", {}, {"component": "singleuser-server"})
        pods = [bound("web", "cpu-1", {}, {"app": "web"}),
                bound("train", "gpu-a100-1", {"nvidia.com/gpu": "1"}),
                bound("lease-pod", "gpu-l4-1", {}, {LEASE_LABEL: lease.id, INSTANCE_LABEL: instance}),
                server]
        for pod in pods:
            await core_api.create_namespaced_pod(namespace, pod)
        reconciler = ClusterReconciler(core.scheduler, backend, namespace=namespace, instance=instance,
                                       kubeconfig=k8s_cluster.kubeconfig)
        await reconciler.start()
        try:
            def held():
                return {p["metadata"]["name"]: p for p in reconciler.watch.pods()
                        if p["metadata"]["namespace"] == namespace}

            async def all_running():
                return {"train", "lease-pod"} <= set(held()) \
                    and all(p["status"].get("phase") == "Running" for p in held().values())
            await until(all_running, what="the pods Running in the watch's view")
            kept = held()
            assert "web" not in kept  # no GPU, no lease: nothing kept
            train = kept["train"]
            assert train["spec"] == {"nodeName": "gpu-a100-1", "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
            assert set(train["metadata"]) == {"name", "namespace", "labels"}  # no managedFields, uid, ...
            assert "not-for-the-allocator" not in repr(train)
            assert outside(core.scheduler, "gpu-a100-1").count(f"pod:{namespace}/train") == 1  # still outside use
            assert [p.name for p in reconciler.watch.own_pods_of(lease.id)] == ["lease-pod"]  # a lease's pod without devices
            assert [p.name for p in reconciler._pods.values()] == ["lease-pod"]  # and no other
            assert kept["jupyter-alice"]["spec"]["containers"][0]["env"] == SECRET_ENV  # the server pod whole

            await core_api.delete_namespaced_pod("train", namespace, grace_period_seconds=0)

            async def gone():
                return "train" not in held() and f"pod:{namespace}/train" not in outside(core.scheduler, "gpu-a100-1")
            await until(gone, what="the deleted GPU pod forgotten")
        finally:
            await reconciler.close()
            core.close()

    k8s_cluster.run(body, timeout=180)
