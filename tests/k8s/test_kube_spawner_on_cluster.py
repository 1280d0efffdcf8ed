"""GPUKubeSpawner through a real JupyterHub on the local control plane: the pod of each slice kind is
bound by kube-scheduler itself to the lease's node with the lease's resources, named as that node
advertises them (a time-sliced node renamed or not), KubeSpawner's
profile still reaches it, a No GPU pod gets no GPU, and concurrent spawns beside a foreign GPU pod
never put two users on one device beyond its capacity.

kwok runs no process in a pod: each spawn is followed up to its pod bound and Running, then to the
server's stop through the hub (the pod is deleted and the lease ends). What the hub does when the
server never answers cannot be shown on this machine: its network answers HTTP for any address,
so the hub's readiness check passes.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from tests.hubfixture import GPUALLOC_CUSTOM_SCOPES, Hub, free_port, gpualloc_roles

from .test_cluster import gpu_pod, until

client = pytest.importorskip("kubernetes_asyncio.client")

NAMESPACE = "spawns"
LEASE_LABEL = "gpualloc.jupyter.org/lease"
PROFILES = [
    {"display_name": "Small", "slug": "small", "default": True,
     "kubespawner_override": {"image": "registry.example.org/small:1"}},
    {"display_name": "Big", "slug": "big", "kubespawner_override": {"image": "registry.example.org/big:2"}},
]


@pytest.fixture(scope="module")
def hub(k8s_cluster, tmp_path_factory):
    yield from hub_on(k8s_cluster, tmp_path_factory.mktemp("hub-k8s"))


def hub_on(k8s_cluster, workdir, extra_config: tuple[str, ...] = ()):
    """A JupyterHub with GPUKubeSpawner and the gpualloc service on the cluster (a generator for a
    fixture: the hub, then stopped)."""
    async def namespace(api):
        core = client.CoreV1Api(api)
        await core.create_namespace({"metadata": {"name": NAMESPACE}})

        async def account():
            accounts = await core.list_namespaced_service_account(NAMESPACE)
            return any(a.metadata.name == "default" for a in accounts.items)
        await until(account, what="the namespace's default service account")

    k8s_cluster.run(namespace)
    policy = workdir / "gpualloc_config.py"
    policy.write_text("c.SchedulerPolicy.heartbeat_ttl = 3600\nc.GpuAllocService.tick_interval = 0.5\n"
                      f"c.GpuAllocService.namespace = {NAMESPACE!r}\n")
    service = {
        "name": "gpualloc", "url": f"http://127.0.0.1:{free_port()}", "oauth_no_confirm": True, "cwd": str(workdir),
        "command": [sys.executable, "-m", "jupyter_gpualloc.cli", "serve", "--backend", "kubernetes",
                    "-f", str(policy), "--db", f"sqlite:///{workdir / 'gpualloc.sqlite'}"],
        "environment": {"KUBECONFIG": k8s_cluster.kubeconfig},
    }
    extra = "\n".join([
        "import os",
        f"os.environ['KUBECONFIG'] = {k8s_cluster.kubeconfig!r}",
        "c.JupyterHub.spawner_class = 'jupyter_gpualloc.hub.GPUKubeSpawner'",
        f"c.KubeSpawner.namespace = {NAMESPACE!r}",
        "c.KubeSpawner.start_timeout = 90",
        "c.KubeSpawner.http_timeout = 5",
        # a spawn's POST answers 202 at once: kwok runs no server at the pod's (loopback) IP, so the
        # hub's wait for it fails after http_timeout, which the tests expect
        "c.JupyterHub.tornado_settings = {'slow_spawn_timeout': 0}",
        f"c.KubeSpawner.profile_list = {PROFILES!r}",
        "c.GPUSpawnerMixin.gpu_heartbeat_interval = 1",
        *extra_config,
    ])
    hub = Hub(workdir, services=[service], roles=gpualloc_roles(["root"]), custom_scopes=GPUALLOC_CUSTOM_SCOPES,
              extra_config=extra)
    hub.start()
    hub.add_users("root")
    try:
        hub.wait_for_service("gpualloc", timeout=90)
        yield hub
    finally:
        hub.stop()


def spawn(hub, user: str, options: dict) -> None:
    hub.add_users(user)
    status, body = hub.api("POST", f"/users/{user}/server", options)
    assert status in (201, 202), (status, body)


def pod_of(k8s_cluster, user: str, timeout: float = 90):
    """The user's pod once kube-scheduler bound it and kwok made it Running."""
    async def running(api):
        async def check():
            pods = await client.CoreV1Api(api).list_namespaced_pod(
                NAMESPACE, label_selector=f"hub.jupyter.org/username={user}")
            return next((p for p in pods.items if p.spec.node_name and p.status.phase == "Running"), None)
        return await until(check, timeout=timeout, what=f"{user}'s pod bound and Running")

    return k8s_cluster.run(running, timeout=timeout + 30)


def scheduled_by_kube_scheduler(k8s_cluster, pod) -> bool:
    async def events(api):
        found = await client.CoreV1Api(api).list_namespaced_event(
            NAMESPACE, field_selector=f"involvedObject.name={pod.metadata.name}")
        return any(e.reason == "Scheduled" for e in found.items)
    return k8s_cluster.run(events)


def lease_of(hub, pod) -> dict:
    lease_id = pod.metadata.labels[LEASE_LABEL]
    token = hub.token("root")
    from tests.hubfixture import http_json
    status, lease = http_json("GET", f"{hub.url}/services/gpualloc/api/v1/leases/{lease_id}", token=token)
    assert status == 200, lease
    return lease


def stopped(hub, k8s_cluster, user: str, lease_id: str) -> dict:
    """Stop the user's server through the hub; once its pod is gone, its lease as it ended."""
    status, body = hub.api("DELETE", f"/users/{user}/server")
    assert status in (202, 204), (status, body)

    async def deleted(api):
        async def check():
            pods = await client.CoreV1Api(api).list_namespaced_pod(
                NAMESPACE, label_selector=f"hub.jupyter.org/username={user}")
            return not pods.items
        await until(check, timeout=90, what=f"{user}'s pod deleted")

    k8s_cluster.run(deleted, timeout=120)
    from tests.hubfixture import http_json
    deadline = time.monotonic() + 30
    while True:
        status, lease = http_json("GET", f"{hub.url}/services/gpualloc/api/v1/leases/{lease_id}",
                                  token=hub.token("root"))
        if lease.get("state") not in ("granted", "queued") or time.monotonic() > deadline:
            return lease
        time.sleep(0.5)


@pytest.mark.parametrize("user, offer, resource, count", [
    ("mig-user", "mig-1g.10gb-h100-80gb-hbm3", "nvidia.com/mig-1g.10gb", "1"),
    ("whole-user", "whole-a100-sxm4-80gb", "nvidia.com/gpu", "1"),
    ("shared-user", "shared-8gb-t4", "nvidia.com/gpu.shared", "1"),  # time-sliced, renamed
    ("shared-l4-user", "shared-8gb-l4", "nvidia.com/gpu", "1"),  # time-sliced, not renamed: gpu-l4-shared-1
])
def test_each_slice_kinds_pod_is_bound_by_kube_scheduler_to_the_leases_node(hub, k8s_cluster, user, offer,
                                                                               resource, count):
    spawn(hub, user, {"gpu": offer, "profile": "big"})
    pod = pod_of(k8s_cluster, user)
    lease = lease_of(hub, pod)
    assert lease["state"] == "granted" and pod.spec.node_name == lease["slice"]["node"]
    assert scheduled_by_kube_scheduler(k8s_cluster, pod)
    limits = pod.spec.containers[0].resources.limits
    assert limits.get(resource) == count and lease["pod"]["resources"] == {resource: count}, (limits, lease)
    assert pod.spec.containers[0].image == "registry.example.org/big:2"  # the profile's choice
    assert not pod.spec.automount_service_account_token
    ended = stopped(hub, k8s_cluster, user, lease["id"])
    assert ended["state"] == "released", ended


def test_a_no_gpu_pod_gets_no_gpu(hub, k8s_cluster):
    spawn(hub, "cpu-user", {"gpu": "none"})
    pod = pod_of(k8s_cluster, "cpu-user")
    limits = pod.spec.containers[0].resources.limits or {}
    assert not [r for r in limits if r.startswith("nvidia.com/")]
    env = {e.name: e.value for e in pod.spec.containers[0].env or []}
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "void" and LEASE_LABEL not in (pod.metadata.labels or {})
    hub.api("DELETE", "/users/cpu-user/server")


def test_concurrent_spawns_beside_a_foreign_pod_never_overcommit_a_node(hub, k8s_cluster):
    """gpu-l4-1 has 2 L4s; a foreign pod takes one: of three users asking for a whole L4 at once,
    one gets it, and no pod ever waits Pending for a device it was promised."""
    async def foreign(api):
        await client.CoreV1Api(api).create_namespaced_pod("default", gpu_pod("l4-train", {"nvidia.com/gpu": "1"},
                                                                              node="gpu-l4-1"))
    k8s_cluster.run(foreign)
    time.sleep(2)  # the service's watch sees it
    users = ["race-a", "race-b", "race-c"]
    threads = [threading.Thread(target=spawn, args=(hub, u, {"gpu": "whole-l4"})) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def watch_pods(api):
        """The most of the users' pods bound to gpu-l4-1 at once (each spawn fails after http_timeout,
        so the next waiting user gets the GPU then), every pod that ever got there, and any pod
        the kube-scheduler found no room for."""
        most, ever, unschedulable = 0, set(), []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pods = await client.CoreV1Api(api).list_namespaced_pod(NAMESPACE)
            ours = [p for p in pods.items if (p.metadata.labels or {}).get("hub.jupyter.org/username") in users]
            there = [p for p in ours if p.spec.node_name == "gpu-l4-1" and not p.metadata.deletion_timestamp]
            most, ever = max(most, len(there)), ever | {p.metadata.name for p in there}
            unschedulable += [(p.metadata.name, c.message) for p in ours for c in p.status.conditions or []
                              if c.reason == "Unschedulable"]
            await asyncio.sleep(0.3)
        return most, ever, unschedulable

    try:
        most, ever, unschedulable = k8s_cluster.run(watch_pods)
        assert most == 1 and ever and unschedulable == [], (most, ever, unschedulable)
    finally:
        k8s_cluster.run(lambda api: client.CoreV1Api(api).delete_namespaced_pod("l4-train", "default"))
