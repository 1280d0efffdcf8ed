"""The GPUs of DRA nodes, read from the NVIDIA DRA driver's ResourceSlices (core/devices/dra.py, through
KubernetesBackend): DynamicMIG partitions become dynamic MIG GPUs the core places on, static MIG devices
static ones, full GPUs whole or (consumable capacity) shared; a claim the service did not write holds
exactly the devices it names."""

from __future__ import annotations

import time

import pytest

from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend
from jupyter_gpualloc.core.model import MigMode, SliceKind, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.store import Store, sqlite_url
from jupyter_gpualloc.core.wiring import open_core

from .dra_slices import allocated_claim, dynamic_mig, full_gpus, gpu_uuid, mig_device

H100, A100 = "H100 80GB HBM3", "A100-SXM4-40GB"


def node(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


NODES = [node("dra-h100"), node("dra-a100"), node("dra-l4"), node("cpu")]
SLICES = [*dynamic_mig("dra-h100", H100, 2), *dynamic_mig("dra-a100", A100, 1), *full_gpus("dra-l4", "L4", 2)]


def backend(slices=SLICES, claims=()) -> KubernetesBackend:
    b = KubernetesBackend.from_node_objects(NODES)
    b.slices, b.claims = list(slices), list(claims)
    return b


@pytest.fixture
def core(tmp_path):
    opened = []

    def open_(b: KubernetesBackend):
        opened.append(open_core(b, Store(sqlite_url(str(tmp_path / f"dra{len(opened)}.sqlite"))),
                                SchedulerPolicy(wait_for_holders=False, heartbeat_ttl=1e9), now=time.time()))
        return opened[-1]
    yield open_
    for c in opened:
        c.close()


def available(scheduler, profile: str, model: str = H100) -> int:
    return next((o["available"] for o in scheduler.offers() if o["spec"].get("profile") == profile
                 and o["spec"].get("model") == model), 0)


def test_each_kind_of_dra_node_is_read_from_its_slices():
    fleet = {n.name: n for n in backend().discover()}
    assert set(fleet) == {"dra-h100", "dra-a100", "dra-l4"}  # the CPU node has no GPU
    h100 = fleet["dra-h100"]
    assert [(g.uuid, g.model, g.mig_mode, g.instances) for g in h100.gpus] == [
        (gpu_uuid("dra-h100", 0), H100, MigMode.DYNAMIC, []), (gpu_uuid("dra-h100", 1), H100, MigMode.DYNAMIC, [])]
    assert h100.cpu_milli == 64000 and h100.memory_mib == 512 * 1024
    b = backend()
    b.discover()
    profiles = b.mig_profiles(gpu_uuid("dra-a100", 0))
    assert {p.name: (p.starts, p.memory_slices) for p in profiles.values()} == {
        "1g.5gb": ((0, 1, 2, 3, 4, 5, 6), 1), "1g.5gb+me": ((0, 1, 2, 3, 4, 5, 6), 1), "1g.10gb": ((0, 2, 4, 6), 2),
        "2g.10gb": ((0, 2, 4), 2), "3g.20gb": ((0, 4), 4), "4g.20gb": ((0,), 4), "7g.40gb": ((0,), 8)}
    assert [(g.model, g.mig_mode, g.sharing) for g in fleet["dra-l4"].gpus] == [("L4", MigMode.OFF, "whole")] * 2
    consumable = KubernetesBackend.from_node_objects([node("dra-l4")])
    consumable.slices = full_gpus("dra-l4", "L4", 1, consumable=True)
    assert [g.sharing for g in consumable.discover()[0].gpus] == ["any"]


def test_only_a_pools_newest_generation_counts():
    republished = [*dynamic_mig("dra-h100", H100, 2), *dynamic_mig("dra-h100", H100, 1, generation=2)]
    assert len(backend(republished).discover()[0].gpus) == 1


def test_a_pool_is_read_again_when_a_slice_moves_to_a_new_version_and_only_then():
    """Slices from a cluster carry a resourceVersion the API server moves on every change: a pool is
    read again when one of its slices' versions moves, and not otherwise (re-encoding every pool's
    slices on each claim event cost seconds at a thousand nodes)."""
    def versioned(slices, version: str):
        return [{**s, "metadata": {**s["metadata"], "name": f"slice-{i}", "resourceVersion": version}}
                for i, s in enumerate(slices)]
    b = KubernetesBackend.from_node_objects([node("dra-l4")])
    b.slices = versioned(full_gpus("dra-l4", "L4", 2), "1")
    assert len(b.discover()[0].gpus) == 2
    first = b.pool("dra-l4")
    assert len(b.discover()[0].gpus) == 2 and b.pool("dra-l4") is first  # the same versions: kept as read
    b.slices = versioned(full_gpus("dra-l4", "L4", 3), "2")  # the driver published a third GPU
    assert len(b.discover()[0].gpus) == 3 and b.pool("dra-l4") is not first


def test_one_node_read_again_alone_reads_as_the_whole_cluster_and_leaves_the_others_as_last_read():
    claim = allocated_claim("ml", "train", "dra-h100", mig_device(1, "3g.40gb", 4, H100))
    unknown = dynamic_mig("dra-a100", A100, 1)
    for device in unknown[1]["spec"]["devices"]:
        device["attributes"]["productName"] = {"string": "NVIDIA Z9000"}
    slices = [*dynamic_mig("dra-h100", H100, 2), *unknown, *full_gpus("dra-l4", "L4", 2)]
    b = backend(slices)
    before = b.discover()
    a100_problem, l4 = b.unusable_nodes(), b.pool("dra-l4")
    objects = {n["metadata"]["name"]: n for n in NODES}
    read = b.read_named(["dra-h100"], objects, [s for s in slices if s["spec"]["nodeName"] == "dra-h100"], [claim])
    assert read == backend(slices, [claim]).discover()[:1]
    assert [i.start for i in read[0].gpus[1].instances] == [4]
    assert b.unusable_nodes() == a100_problem and b.pool("dra-l4") is l4
    assert b.mig_profiles(before[0].gpus[0].uuid)  # known without listing the cluster again
    assert b.read_named(["dra-l4"], {}, [], []) == [] and b.pool("dra-l4") is None  # gone
    assert b.pool("dra-h100") is not None and b.unusable_nodes() == a100_problem


def test_static_mig_devices_are_the_gpus_instances():
    devices = [{"name": mig_device(0, profile, start, A100),
                "attributes": {"type": {"string": "mig"}, "parentUUID": {"string": "GPU-static"},
                               "profile": {"string": profile}, "productName": {"string": "NVIDIA A100-SXM4-40GB"},
                               "uuid": {"string": f"MIG-{profile}-{start}"}},
                "capacity": {"memory": {"value": "4864Mi"},
                             **{f"memorySlice{i}": {"value": "1"} for i in range(start, start + size)}}}
               for profile, start, size in (("3g.20gb", 4, 4), ("2g.10gb", 0, 2), ("1g.5gb", 2, 1), ("1g.5gb", 3, 1))]
    static = {"spec": {"driver": "gpu.nvidia.com", "nodeName": "dra-a100", "devices": devices,
                       "pool": {"name": "dra-a100", "generation": 1, "resourceSliceCount": 1}}}
    gpu = backend([static]).discover()[0].gpus[0]
    assert (gpu.uuid, gpu.mig_mode) == ("GPU-static", MigMode.STATIC)
    assert [(i.profile_id, i.start, i.size) for i in gpu.instances] == [(14, 0, 2), (19, 2, 1), (19, 3, 1), (9, 4, 4)]


def test_a_node_publishing_mig_devices_of_an_unknown_model_is_unusable():
    slices = dynamic_mig("dra-a100", A100, 1)
    for device in slices[1]["spec"]["devices"]:
        device["attributes"]["productName"] = {"string": "NVIDIA Z9000"}
    b = backend(slices)
    assert b.discover() == []
    assert [(u.name, "Z9000" in u.reason) for u in b.unusable_nodes()] == [("dra-a100", True)]


def test_a_foreign_claim_holds_the_very_partition_it_names(core):
    claim = allocated_claim("ml", "train", "dra-h100", mig_device(1, "2g.20gb", 2, H100))
    b = backend(claims=[claim])
    c = core(b)
    gpu = b.discover()[0].gpus[1]
    assert [(i.profile_id, i.start) for i in gpu.instances] == [(14, 2)]
    use = b.claim_use(claim)
    assert (use.key, use.node, dict(use.mig), use.devices) == (
        "claim:ml/train", "dra-h100", {"2g.20gb": 1}, (gpu.instances[0].uuid,))
    assert available(c.scheduler, "2g.20gb") == 6  # held by nobody the core knows yet: no room taken
    c.scheduler.outside_use(use.key, use, now=time.time())
    held = [i for n in c.scheduler.inventory()["nodes"] for g in n["gpus"] if g["uuid"] == gpu.uuid
            for i in g["instances"]]
    assert [(i["start"], i["outside"]) for i in held] == [(2, "claim:ml/train")]
    assert available(c.scheduler, "2g.20gb") == 5 and available(c.scheduler, "7g.80gb") == 1


def test_a_foreign_claim_on_a_dynamic_gpu_whole_takes_all_of_it(core):
    claim = allocated_claim("ml", "big", "dra-h100", "gpu-0")
    b = backend(claims=[claim])
    c = core(b)
    c.scheduler.outside_use("claim:ml/big", b.claim_use(claim), now=time.time())
    assert available(c.scheduler, "1g.10gb") == 7 and available(c.scheduler, "7g.80gb") == 1


def test_a_consumable_share_claimed_by_memory_is_a_share_of_its_gpu(core):
    claim = allocated_claim("ml", "infer", "dra-l4", "gpu-0", memory="6Gi")
    b = KubernetesBackend.from_node_objects([node("dra-l4")])
    b.slices, b.claims = full_gpus("dra-l4", "L4", 1, consumable=True), [claim]
    b.discover()
    use = b.claim_use(claim)
    assert (use.whole, use.shares, use.devices) == (0, (-(-6 * 1024 * 1000 // 23034),), (gpu_uuid("dra-l4", 0),))


def test_the_core_places_a_partition_on_a_device_the_driver_publishes(core):
    claim = allocated_claim("ml", "train", "dra-h100", mig_device(0, "1g.10gb", 3, H100))
    b = backend(claims=[claim])
    c = core(b)
    c.scheduler.outside_use("claim:ml/train", b.claim_use(claim), now=time.time())
    now = time.time()
    lease = c.scheduler.submit("alice", "server:a", SliceSpec(kind=SliceKind.MIG, profile="3g.40gb", model=H100),
                               now=now)
    assert lease.slice is not None
    device = b.pool("dra-h100").named_by(lease.slice.mig_uuid)
    assert device is not None and device.dynamic and device.profile_id == 9
    assert (device.gpu_uuid, device.start) == (gpu_uuid("dra-h100", 0), 4)  # 3g beside the held 1g@3 leaves 0-2
    c.scheduler.release(lease.id, now=now + 1)
    assert available(c.scheduler, "3g.40gb") == 3


def test_a_partition_granted_before_its_claim_is_written_outlives_a_reload_and_goes_with_its_lease(core):
    """Between the grant and the claim the service writes, the fleet may be read again (another
    claim came): the lease keeps its partition, and its release makes it free."""
    b = backend()
    c = core(b)
    now = time.time()
    lease = c.scheduler.submit("alice", "server:a", SliceSpec(kind=SliceKind.MIG, profile="1g.10gb", model=H100),
                               now=now)
    other = allocated_claim("ml", "train", "dra-h100", mig_device(1, "7g.80gb", 0, H100))
    b.claims = [other]
    c.scheduler.nodes_changed(b.discover(), now=now + 1)
    c.scheduler.outside_use("claim:ml/train", b.claim_use(other), now=now + 1)
    assert c.scheduler.lease(lease.id).state.value == "granted"
    assert available(c.scheduler, "1g.10gb") == 6  # GPU 1 is the claim's, GPU 0 has the lease's
    c.scheduler.release(lease.id, now=now + 2)
    c.scheduler.nodes_changed(b.discover(), now=now + 3)
    assert available(c.scheduler, "1g.10gb") == 7
    assert [i for g in b.discover()[0].gpus[:1] for i in g.instances] == []
