"""A change of some nodes costs what those nodes cost (FleetChanges.nodes_changed with `names`) and
decides what a reload of the whole fleet decides: random cordons, DRA partitions taken and freed by
claims the allocator did not write, partitions that vanish, and leases granted, released and
returning on those nodes, applied to one core node by node and to another through a full reload,
leave the two with the same fleet, leases and outside uses, and the same lease events."""

from __future__ import annotations

import copy
import json
import random

import pytest

from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend
from jupyter_gpualloc.core.model import OutsideUse, SliceKind, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.store import Store
from jupyter_gpualloc.core.wiring import open_core

from .devices.dra_slices import allocated_claim, dynamic_mig, full_gpus

H100, L4 = "H100 80GB HBM3", "L4"
PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
DRA_NODES = ["dra-0", "dra-1", "dra-2"]
NODES = [*DRA_NODES, "l4-0"]


def node_object(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def named_slices() -> list[dict]:
    """The nodes' ResourceSlices, each named and versioned as an API server serves them."""
    slices = []
    for name in NODES:
        published = dynamic_mig(name, H100, 2) if name in DRA_NODES else full_gpus(name, L4, 2, consumable=True)
        for j, body in enumerate(published):
            body["metadata"].update(name=f"{name}-slice-{j}", resourceVersion="1")
            slices.append(body)
    return slices


class Cluster:
    """What the API server holds: node objects, slices and the claims of pods the allocator did not place."""

    def __init__(self) -> None:
        self.nodes = {name: node_object(name) for name in NODES}
        self.slices = named_slices()
        self.claims: dict[str, dict] = {}  # claim key -> claim

    def slices_of(self, node: str) -> list[dict]:
        return [s for s in self.slices if s["spec"]["pool"]["name"] == node]

    def claims_on(self, node: str) -> list[dict]:
        return [c for c in self.claims.values() if c["status"]["allocation"]["devices"]["results"][0]["pool"] == node]


class Core:
    """A core over its own backend; the outside uses it was told of, as the service's watch tells them."""

    def __init__(self, cluster: Cluster, url: str, now: float):
        self.cluster = cluster
        self.backend = KubernetesBackend.from_node_objects(cluster.nodes.values())
        self.backend.slices = copy.deepcopy(cluster.slices)
        self.core = open_core(self.backend, Store(url), SchedulerPolicy(heartbeat_ttl=1e9), now=now)
        self.scheduler = self.core.scheduler
        self.events: list = []
        self.scheduler.subscribe(self.events.append)
        self.told: dict[str, OutsideUse] = {}  # claim key -> the use told

    def claims_changed(self, claims: list[dict], node: str | None, now: float) -> None:
        """Tell the uses of these claims (those on `node`, or all) that changed, and None for those gone."""
        uses = {key: use for c in claims if (use := self.backend.claim_use(c)) is not None
                for key in [f"claim:{c['metadata']['namespace']}/{c['metadata']['name']}"]}
        for key in sorted(k for k, use in self.told.items() if k not in uses and node in (None, use.node)):
            del self.told[key]
            self.scheduler.outside_use(key, None, now=now)
        for key, use in uses.items():
            if self.told.get(key) != use:
                self.told[key] = use
                self.scheduler.outside_use(key, use, now=now)

    def node_changed(self, node: str, now: float) -> None:
        """As the watch does after a batch naming `node`: its claims, the node read again alone, its claims."""
        cluster = self.cluster
        self.claims_changed(cluster.claims_on(node), node, now)
        nodes = self.backend.read_named([node], cluster.nodes, cluster.slices_of(node), cluster.claims_on(node))
        self.scheduler.nodes_changed(nodes, now=now, names=[node])
        self.claims_changed(cluster.claims_on(node), node, now)

    def reloaded(self, now: float) -> None:
        """The same change through a reload of the whole fleet, read whole."""
        cluster = self.cluster
        claims = list(cluster.claims.values())
        self.claims_changed(claims, None, now)
        nodes = self.backend.read_nodes(cluster.nodes.values(), cluster.slices, claims)
        self.scheduler._changes.reload(nodes, now)
        self.claims_changed(claims, None, now)


def state(core: Core, ids: dict[str, str]) -> dict:
    """The core's fleet, leases, outside holds and lease events as plain data, lease ids as `ids` maps them."""
    s = core.scheduler
    fleet = s._fleet

    def lease_id(key: str) -> str:
        return ids.get(key, key)
    gpus = {uuid: (sorted((i.uuid, i.profile_id, i.start, i.size) for i in gs.instances.values()),
                   sorted((mig, lease_id(owner)) for mig, owner in gs.owner.items()), sorted(gs.created),
                   sorted((lease_id(holder), milli) for holder, milli in gs.holders.items()),
                   gs.drained_by_admin, gs.cordoned, (gs.node_index, gs.slot))
            for uuid, gs in fleet.gpus.items()}
    view = fleet.view
    leases = {lease_id(lease.id): (lease.state, lease.slice.to_json() if lease.slice else None, lease.reason,
                                   lease.returning)
              for lease in [*s._book.by_id.values(), *s._book.returning.values()]}
    held = {key: (h.use, sorted((gs.gpu.uuid, mig, milli) for gs, mig, milli in h.devices), h.unplaced)
            for key, h in s._changes.outside._held.items()}
    events = [(e.type, lease_id(e.lease_id), json.dumps(e.data, sort_keys=True, default=str))
              for e in core.events if e.lease_id is not None]
    return {"nodes": [(n.name, n.unschedulable) for n in fleet.nodes], "gpus": gpus,
            "view": (view.cpu_free.tolist(), view.mem_free.tolist(), view.gpu_vis.tolist()),
            "leases": leases, "queue": [lease_id(i) for i in s._book.queue], "outside": held,
            "offers": [(o["name"], o["available"]) for o in s.offers()], "events": events}


def free_partition(rng: random.Random, core: Core, node: str) -> str | None:
    """A DynamicMIG device of `node` no instance overlaps now (one the kube-scheduler could allocate)."""
    pool = core.backend.pool(node)
    fleet = core.scheduler._fleet
    free = [d.name for d in pool.devices.values() if d.dynamic and not any(
        i.start < d.start + d.size and d.start < i.start + i.size for i in fleet.gpus[d.gpu_uuid].instances.values())]
    return rng.choice(sorted(free)) if free else None


def free_share(rng: random.Random, core: Core, node: str, milli: int) -> str | None:
    """A GPU of `node` with `milli` free now (where the kube-scheduler could allocate that much of it)."""
    pool = core.backend.pool(node)
    fleet = core.scheduler._fleet
    free = [d.name for d in pool.devices.values() if fleet.gpus[d.gpu_uuid].free_milli() >= milli]
    return rng.choice(sorted(free)) if free else None


@pytest.mark.parametrize("seed", range(12))
def test_node_by_node_changes_decide_what_a_reload_decides(tmp_path, seed):
    rng = random.Random(seed)
    cluster = Cluster()
    now = 1000.0
    a = Core(cluster, f"sqlite:///{tmp_path}/a.sqlite", now)  # node by node
    b = Core(cluster, f"sqlite:///{tmp_path}/b.sqlite", now)  # through reloads
    ids: dict[str, str] = {}  # lease id in a -> the same lease's in b
    try:
        for step in range(40):
            now += 1
            op = rng.random()
            node = None
            if op < 0.15:  # a node cordoned, or uncordoned
                node = rng.choice(NODES)
                spec = cluster.nodes[node]["spec"]
                spec["unschedulable"] = not spec.get("unschedulable")
            elif op < 0.35:  # a claim the allocator did not write takes a partition, or an L4 share
                node = rng.choice(NODES)
                name = f"train-{step}"
                if node in DRA_NODES:
                    device = free_partition(rng, a, node)
                    if device is None:
                        continue
                    claim = allocated_claim("ml", name, node, device)
                else:
                    device = free_share(rng, a, node, 356)  # 8 GiB of an L4
                    if device is None:
                        continue
                    claim = allocated_claim("ml", name, node, device, memory="8Gi")
                cluster.claims[f"claim:ml/{name}"] = claim
            elif op < 0.5 and cluster.claims:  # and frees it
                claim = cluster.claims.pop(rng.choice(sorted(cluster.claims)))
                node = claim["status"]["allocation"]["devices"]["results"][0]["pool"]
            elif op < 0.58:  # a partition vanishes from under a lease (or a returning slice)
                held = sorted((gs.gpu.node, gs.gpu.uuid, mig) for gs in a.scheduler._fleet.gpus.values()
                              for mig, owner in gs.owner.items() if a.scheduler._book.knows(owner))
                if not held:
                    continue
                node, gpu, mig = rng.choice(held)
                for core in (a, b):
                    core.backend.destroy_mig_instance(gpu, mig)
            elif op < 0.85:  # a lease asked for, granted or queued
                spec = (SliceSpec(kind=SliceKind.MIG, profile=rng.choice(PROFILES), model=H100) if rng.random() < 0.8
                        else SliceSpec(kind=SliceKind.SHARED, memory_mib=rng.choice([4096, 12288]), model=L4))
                got = [core.scheduler.submit(f"u{step % 3}", f"server:s{step}", spec, now=now) for core in (a, b)]
                ids[got[0].id] = got[1].id
            else:  # a lease released, its holder gone or not; or a returning slice's holder gone
                mine = sorted(a.scheduler._book.by_id) + sorted(a.scheduler._book.returning)
                if not mine:
                    continue
                lease_id = rng.choice(mine)
                if lease_id in a.scheduler._book.returning:
                    lease = a.scheduler.lease(lease_id)
                    for core, lid in ((a, lease_id), (b, ids[lease_id])):
                        core.scheduler.holders_gone(lease.user, [lease.holder], now=now)
                else:
                    gone = rng.random() < 0.5
                    for core, lid in ((a, lease_id), (b, ids[lease_id])):
                        core.scheduler.release(lid, now=now, holder_gone=gone)
            if node is not None:
                a.node_changed(node, now)
                b.reloaded(now)
            assert state(a, ids) == state(b, {}), f"seed {seed}, step {step}"
        assert "fleet.reloaded" not in {e.type for e in a.events}
        assert any(e.type == "node.repartitioned" for e in a.events)
    finally:
        a.core.close()
        b.core.close()
