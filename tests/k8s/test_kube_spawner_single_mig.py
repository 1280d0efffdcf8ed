"""GPUKubeSpawner on a cluster whose nodes differ in MIG strategy, with no strategy configured
anywhere: on a node of the `single` strategy MIG devices are advertised as `nvidia.com/gpu`, GFD
labels it `nvidia.com/mig.strategy=single`, `nvidia.com/gpu.product=...-MIG-1g.10gb`, and counts MIG
devices in `nvidia.com/gpu.count`; a node of the `mixed` one advertises `nvidia.com/mig-<profile>`.
A control plane of its own, with one node of each and a node of whole GPUs (which also advertises
`nvidia.com/gpu`): each MIG slice's pod must land on its node, bound there by kube-scheduler,
asking for what that node advertises.
"""

from __future__ import annotations

import pytest
import yaml

from .conftest import Cluster, require_binary
from .controlplane import ControlPlane
from .test_kube_spawner_on_cluster import (hub_on, lease_of, pod_of, scheduled_by_kube_scheduler, spawn,
                                           stopped)

client = pytest.importorskip("kubernetes_asyncio.client")

SINGLE = {
    "name": "gpu-h100-single-1", "cpu_milli": 64000, "memory_mib": 524288,
    "labels": {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        "nvidia.com/gpu.count": "14",  # MIG devices: 2 GPUs x 7
        "nvidia.com/gpu.memory": "9984",  # a device's
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mig.config": "all-1g.10gb",
        "nvidia.com/mig.config.state": "success",
    },
    "resources": {"nvidia.com/gpu": "14"},
}
WHOLE = {
    "name": "gpu-l4-whole-1", "cpu_milli": 16000, "memory_mib": 65536,
    "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-L4",
               "nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "23034",
               "nvidia.com/mig.strategy": "single"},
    "resources": {"nvidia.com/gpu": "2"},
}


MIXED = {
    "name": "gpu-a100-mixed-1", "cpu_milli": 64000, "memory_mib": 524288,
    "labels": {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "all-1g.5gb",
        "nvidia.com/mig.config.state": "success",
    },
    "resources": {"nvidia.com/mig-1g.5gb": "7"},
}


@pytest.fixture(scope="module")
def single_cluster(tmp_path_factory):
    require_binary()
    directory = tmp_path_factory.mktemp("k8s-single")
    (directory / "fleet.yaml").write_text(yaml.safe_dump({"nodes": [SINGLE, MIXED, WHOLE]}))
    control_plane = ControlPlane(directory / "k8s", fleet=directory / "fleet.yaml").start()
    yield Cluster(control_plane)
    control_plane.stop()


@pytest.fixture(scope="module")
def hub(single_cluster, tmp_path_factory):
    yield from hub_on(single_cluster, tmp_path_factory.mktemp("hub-single"))  # no MIG strategy set anywhere


def test_a_mig_slice_is_bound_to_a_single_strategy_node_asking_for_one_gpu(hub, single_cluster):
    spawn(hub, "mig-single-user", {"gpu": "mig-1g.10gb-h100-80gb-hbm3", "profile": "small"})
    pod = pod_of(single_cluster, "mig-single-user")
    lease = lease_of(hub, pod)
    assert lease["state"] == "granted" and lease["slice"]["kind"] == "mig", lease
    assert lease["slice"]["node"] == pod.spec.node_name == "gpu-h100-single-1"
    assert scheduled_by_kube_scheduler(single_cluster, pod)
    limits = pod.spec.containers[0].resources.limits
    assert limits.get("nvidia.com/gpu") == "1" and not [r for r in limits if r.startswith("nvidia.com/mig-")], limits
    assert lease["pod"]["resources"] == {"nvidia.com/gpu": "1"}, lease
    ended = stopped(hub, single_cluster, "mig-single-user", lease["id"])
    assert ended["state"] == "released", ended


def test_beside_it_a_mig_slice_on_a_mixed_strategy_node_asks_for_its_profile(hub, single_cluster):
    spawn(hub, "mig-mixed-user", {"gpu": "mig-1g.5gb-a100-sxm4-40gb", "profile": "small"})
    pod = pod_of(single_cluster, "mig-mixed-user")
    lease = lease_of(hub, pod)
    assert lease["slice"]["node"] == pod.spec.node_name == "gpu-a100-mixed-1", lease
    assert scheduled_by_kube_scheduler(single_cluster, pod)
    limits = pod.spec.containers[0].resources.limits
    assert limits.get("nvidia.com/mig-1g.5gb") == "1" and "nvidia.com/gpu" not in limits, limits
    ended = stopped(hub, single_cluster, "mig-mixed-user", lease["id"])
    assert ended["state"] == "released", ended
