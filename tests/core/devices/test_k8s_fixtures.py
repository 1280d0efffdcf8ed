"""Real GPU node shapes (k8s_fixtures/, sources in its README) read right, fast, and only once."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from jupyter_gpualloc.core import mig
from jupyter_gpualloc.core.devices import kubernetes
from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend, node_from_object
from jupyter_gpualloc.core.model import MigMode
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store

FIXTURES = {p.stem: json.loads(p.read_text()) for p in sorted((Path(__file__).parent / "k8s_fixtures").glob("*.json"))}
NODES = [f["node"] for f in FIXTURES.values()]


@pytest.fixture(scope="module")
def cluster():
    backend = KubernetesBackend.from_node_objects(NODES)
    return backend, {n.name: n for n in backend.discover()}


def expand(groups):
    """[count, model, memory, mode, profiles] groups -> one (model, memory, mode, sorted profiles) per GPU."""
    return [(model, memory, mode, sorted(profiles)) for count, model, memory, mode, profiles in groups
            for _ in range(count)]


def test_the_fixture_set_covers_the_documented_shapes():
    assert len(FIXTURES) >= 20
    assert all(f["source"] and f["node"]["metadata"]["name"] == name for name, f in FIXTURES.items())


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_each_node_reads_right(cluster, name):
    backend, fleet = cluster
    expect = FIXTURES[name]["expect"]
    if "unusable" in expect:
        assert name not in fleet
        [reason] = [u.reason for u in backend.unusable_nodes() if u.name == name]
        assert expect["unusable"] in reason and name in reason
        return
    node = fleet[name]
    read = []
    for gpu in node.gpus:
        profiles = backend.mig_profiles(gpu.uuid)
        if gpu.mig_mode is MigMode.OFF:
            assert profiles == {} and gpu.instances == []
        else:
            assert gpu.mig_mode is MigMode.STATIC and mig.is_legal(gpu.instances, profiles)
        read.append((gpu.model, gpu.memory_mib, gpu.mig_mode.value,
                     sorted(profiles[i.profile_id].name for i in gpu.instances)))
    if expect["gpus"] == "any":  # a custom config: the counts are known, the per-GPU layout is ours
        assert len(node.gpus) == expect["gpu_count"]
        assert sum(g.mig_mode is MigMode.OFF for g in node.gpus) == expect.get("whole", 0)
        totals: dict[str, int] = {}
        for *_, names in read:
            for profile in names:
                totals[profile] = totals.get(profile, 0) + 1
        assert totals == expect["mig_total"]
    else:
        assert read == expand(expect["gpus"])
    mig_gpus = [g for g in node.gpus if g.mig_mode is not MigMode.OFF]
    for profile, memory in expect.get("profile_memory_mib", {}).items():  # GFD's measured sizes win
        assert {p.memory_mib for g in mig_gpus for p in backend.mig_profiles(g.uuid).values()
                if p.name == profile} == {memory}
    if "memory_slices" in expect:
        assert {mig.MigGeometry.of(backend.mig_profiles(g.uuid)).memory_slices for g in mig_gpus} == {
            expect["memory_slices"]}


def _read_cold(node):
    """Read a node with no packing remembered (each model's table of one-GPU layouts, built once
    per process in about 15 ms, is kept like the catalogue)."""
    for cache in (kubernetes._pack, kubernetes._fewest_gpus, kubernetes._fits_one_gpu):
        cache.cache_clear()
    started = time.perf_counter()
    try:
        node_from_object(node)
    except kubernetes.DeviceError:
        pass
    return time.perf_counter() - started


def test_every_node_reads_in_under_50_ms():
    for node in NODES:
        _read_cold(node)
    slowest = {}
    for node in NODES:
        times = [_read_cold(node) for _ in range(5)]
        slowest[node["metadata"]["name"]] = statistics.median(times)
    assert max(slowest.values()) < 0.050, {k: round(v * 1000, 1) for k, v in slowest.items()}


def test_discover_reads_a_node_again_only_when_it_changed(monkeypatch):
    nodes = json.loads(json.dumps(NODES))
    backend = KubernetesBackend(lambda: json.loads(json.dumps(nodes)))
    reads = []
    real = kubernetes._read_node
    monkeypatch.setattr(kubernetes, "_read_node", lambda raw, *rest: reads.append(raw["metadata"]["name"]) or real(raw, *rest))
    first = backend.discover()
    assert sorted(reads) == sorted(FIXTURES)
    reads.clear()
    first[0].gpus[0].mig_mode = MigMode.DYNAMIC  # callers may change what they got; the cache does not
    again = backend.discover()
    assert reads == [] and again[0].gpus[0].mig_mode is not MigMode.DYNAMIC
    assert [g.uuid for n in again for g in n.gpus] == [g.uuid for n in first for g in n.gpus]
    balanced = next(n for n in nodes if n["metadata"]["name"] == "h100x8-all-balanced")
    balanced["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = "1715709999"  # not read: no new reading
    balanced["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-12-03T08:00:00Z"
    backend.discover()
    assert reads == []
    balanced["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "7"  # one GPU lost its 3g.40gb
    backend.discover()
    assert reads == ["h100x8-all-balanced"]
    [node] = [n for n in backend.discover() if n.name == "h100x8-all-balanced"]
    assert len(node.gpus) == 8 and sum(len(g.instances) for g in node.gpus) == 31


def test_an_unknown_mig_model_is_reported_and_skipped_not_fatal(caplog, tmp_path):
    backend = KubernetesBackend.from_node_objects(NODES)
    with caplog.at_level("WARNING", logger="jupyter_gpualloc.core.devices.kubernetes"):
        events = []
        scheduler = Scheduler(backend, Store(f"sqlite:///{tmp_path / 'db.sqlite'}"), SchedulerPolicy(),
                              listeners=[events.append])
    unusable = {u["name"]: u["reason"] for u in scheduler.inventory()["unusable_nodes"]}
    assert sorted(unusable) == ["gb200-mig", "rtx-pro-6000-mig"]
    assert sorted((e.data["node"], e.data["reason"]) for e in events if e.type == "gpu.node_unusable") == sorted(
        unusable.items())
    assert all("skipping Kubernetes node" in r.getMessage() for r in caplog.records) and len(caplog.records) == 2
    served = {n["name"] for n in scheduler.inventory()["nodes"]}
    assert served == set(FIXTURES) - set(unusable)
    a30 = next(g for n in scheduler.inventory()["nodes"] if n["name"] == "a30x4-all-balanced" for g in n["gpus"])
    assert (a30["memory_slices"], a30["compute_slices"]) == (4, 4)
    assert sorted((i["start"], i["size"]) for i in a30["instances"]) == [(0, 2), (2, 1), (3, 1)]


def test_a_malformed_node_is_skipped_with_its_reason():
    broken = json.loads(json.dumps(FIXTURES["l4x2-mps"]["node"]))
    broken["metadata"]["name"] = "l4-broken"
    broken["status"]["allocatable"]["cpu"] = "lots"
    backend = KubernetesBackend.from_node_objects([broken, FIXTURES["l4x2-mps"]["node"]])
    assert [n.name for n in backend.discover()] == ["l4x2-mps"]
    [unusable] = backend.unusable_nodes()
    assert unusable.name == "l4-broken" and "allocatable cpu is not a quantity: 'lots'" in unusable.reason


def test_the_inventory_drawing_shows_a30_slices_and_unusable_nodes():
    from jupyter_gpualloc.cli import render_inventory

    lines = list(render_inventory(KubernetesBackend.from_node_objects(NODES)))
    a30 = lines.index("a30x4-all-balanced  cpu 96 cores, memory 1007.44 GiB")
    assert lines[a30 + 1].endswith("|a|a|b|c|  a=2g.12gb@0 b=1g.6gb@2 c=1g.6gb@3")
    assert lines[-2:] == [
        "gb200-mig  unusable: node gb200-mig: advertises MIG devices on GB200, which is not a MIG-capable "
        "model this allocator knows",
        "rtx-pro-6000-mig  unusable: node rtx-pro-6000-mig: advertises MIG devices on "
        "RTX-PRO-6000-Blackwell-Server-Edition, which is not a MIG-capable model this allocator knows"]
