"""The views a plain search reads for its kind: what the fleet's view shows without the GPUs that
cannot take the kind, at a cost that does not grow with how many such GPUs there are."""

from __future__ import annotations

import random

import numpy as np

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import Gpu, LeaseState, Node, SliceKind, SliceSpec
from jupyter_gpualloc.core.placement import ClusterView
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store

ARRAYS = ("cpu_free", "mem_free", "gpu_vis", "gpu_free_total", "gpu_count")


def mixed_nodes(time_sliced_nodes: int) -> list[Node]:
    """Nodes of 8 time-sliced H100s (shares only), then two nodes of 4 L4s that take either kind
    and one of 2 plain Kubernetes A10s (whole GPUs only)."""
    kinds = [("H100-80GB", 8, "shared")] * time_sliced_nodes + [("L4", 4, "any")] * 2 + [("A10", 2, "whole")]
    nodes = []
    for n, (model, count, sharing) in enumerate(kinds):
        name = f"n{n}"
        nodes.append(Node(name, 256_000, 1 << 21, [
            Gpu(uuid=f"GPU-{name}-{i}", index=i, model=model, memory_mib=24_576, node=name, sharing=sharing)
            for i in range(count)]))
    return nodes


def scheduler(nodes: list[Node]) -> Scheduler:
    policy = SchedulerPolicy(heartbeat_ttl=0, idle_timeout=0, wait_for_holders=False)
    return Scheduler(SimulatedBackend(nodes), Store("sqlite://"), policy)


def test_a_whole_gpu_search_does_not_touch_the_time_sliced_gpus_it_cannot_use(monkeypatch):
    """A whole L4 on a fleet of 400 time-sliced H100s: the grant refreshes the node it goes on in
    each view, and no node's state besides (hiding and showing each H100 for the search took 800)."""
    s = scheduler(mixed_nodes(50))
    refreshed: list[int] = []
    refresh = ClusterView._refresh
    monkeypatch.setattr(ClusterView, "_refresh", lambda view, node: refreshed.append(node) or refresh(view, node))
    lease = s.submit("a", "kernel:1", SliceSpec(kind=SliceKind.WHOLE), now=1, wait=False)
    assert lease.state is LeaseState.GRANTED and lease.slice.model in ("L4", "A10")
    assert len(refreshed) <= 3 and set(refreshed) == {s._fleet.node_index[lease.slice.node]}


def test_each_kind_view_is_the_fleet_view_without_the_gpus_that_cannot_take_the_kind():
    """Grants and releases of both kinds, drains and undrains in a random order: after each, a
    kind's view holds what the fleet's view holds with those GPUs hidden, and its nodes are the fleet's."""
    s = scheduler(mixed_nodes(3))
    fleet = s._fleet
    rng = random.Random(7)
    held = []
    specs = [SliceSpec(kind=SliceKind.SHARED, memory_mib=4096), SliceSpec(kind=SliceKind.WHOLE),
             SliceSpec(kind=SliceKind.SHARED, memory_mib=12_288, model="L4")]
    for step in range(300):
        roll = rng.random()
        if held and roll < 0.4:
            s.release(held.pop(rng.randrange(len(held))), now=step)
        elif roll < 0.45:
            gpu = rng.choice(list(fleet.gpus))
            s.drain(gpu, not fleet.gpus[gpu].drained_by_admin, now=step)
        else:
            lease = s.submit(f"u{step}", "kernel:x", rng.choice(specs), now=step, wait=False)
            if lease.state is LeaseState.GRANTED:
                held.append(lease.id)
        for kind in (SliceKind.SHARED, SliceKind.WHOLE):
            expected = fleet.view.copy()
            for gs in fleet.gpus.values():
                if not gs.takes(kind):
                    expected.set_gpu_enabled(gs.node_index, gs.slot, False)
            own = fleet.views.of(kind)
            assert own is not fleet.view and own.nodes is fleet.view.nodes
            for name in ARRAYS:
                assert np.array_equal(getattr(own, name), getattr(expected, name)), (step, kind, name)
            assert own.classes == expected.classes
            assert [own.state(n) for n in range(len(own.nodes))] == [expected.state(n) for n in range(len(own.nodes))]
