"""The scheduler's indexes stay what a fresh scan finds, and decisions read them, not the fleet."""

from __future__ import annotations

import random

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.indexes import ActiveLeases, MigCapacity
from jupyter_gpualloc.core.model import LeaseState, PriorityClass, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.errors import SchedulerError, StoreFailed
from jupyter_gpualloc.core.scheduler import Scheduler

from .conftest import A100_40, fleet
from .test_store_failures import FlakyStore

PROFILES = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


def mig(profile: str, **extra) -> SliceSpec:
    return SliceSpec.from_json({"kind": "mig", "profile": profile, **extra})


def filed(capacity: MigCapacity, model: str) -> tuple[dict, dict]:
    """The index's groups as plain data: layout -> GPU uuids, profile id -> GPU uuids with a free one."""
    layouts = {layout: [gs.gpu.uuid for gs in gpus] for layout, gpus in capacity.layouts(model)}
    free = {pid: [gs.gpu.uuid for gs in capacity.with_free(model, pid)] for pid in range(32)}
    return layouts, {pid: uuids for pid, uuids in free.items() if uuids}


def indexed(active: ActiveLeases, users: list[str], groups: list[str]) -> tuple:
    """The lease index as plain data: each user's and group's lease ids, preemptible ids, held memory."""
    return ({u: sorted(l.id for l in active.of_user(u)) for u in users},
            {g: sorted(l.id for l in active.of_group(g)) for g in groups},
            sorted(active.preemptible), active.held_mib)


def test_indexes_stay_what_a_fresh_scan_finds(store_urls):
    """Random grants, releases, drains, ticks and refused writes (rolled back): after each, the
    scheduler's MIG index files every GPU, and its lease index every active lease, as indexes
    built from scratch over the same GPUs and leases do."""
    backend = SimulatedBackend(fleet({"model": A100_40, "count": 3, "mig": "dynamic"},
                                     {"model": A100_40, "mig": "static", "layout": ["3g.20gb", "1g.5gb"]},
                                     nodes=3))
    store = FlakyStore(store_urls.fresh())
    s = Scheduler(backend, store, SchedulerPolicy(heartbeat_ttl=0, reserve_after=3, max_duration={"job": 40}))
    rng = random.Random(7)
    mig_gpus = [gs for gs in s._fleet.gpus.values() if gs.is_mig]
    for step in range(400):
        now = float(step)
        if rng.random() < 0.1:
            store.fail_next.add(rng.choice(["save", "record_intent"]))
        op = rng.random()
        try:
            if op < 0.5:
                priority = rng.choice([PriorityClass.INTERACTIVE, PriorityClass.BATCH])
                s.submit(f"u{step % 5}", f"job:{step}", mig(rng.choice(PROFILES)), priority,
                         now=now, wait=rng.random() < 0.5, groups=[f"g{step % 3}", "all"][:1 + step % 2])
            elif op < 0.8 and s.leases():
                s.release(rng.choice(s.leases()).id, now=now)
            elif op < 0.9:
                s.drain(rng.choice(mig_gpus).gpu.uuid, rng.random() < 0.5, now=now)
            else:
                s.tick(now)
        except (SchedulerError, StoreFailed):
            pass
        store.fail_next.clear()
        assert filed(s._fleet.mig_capacity, A100_40) == filed(MigCapacity(mig_gpus), A100_40), f"step {step}"
        fresh = ActiveLeases()
        for lease in s.leases():
            fresh.add(lease)
        users, groups = [f"u{i}" for i in range(5)], ["g0", "g1", "g2", "all"]
        assert indexed(s._book.active, users, groups) == indexed(fresh, users, groups), f"step {step}"
        active = s._book.active  # the tick's order: by_id's
        assert sorted(active.by_id, key=active.place) == list(active.by_id), f"step {step}"
        fresh_undrained = {gs.gpu.model: set() for gs in s._fleet.gpus.values()}
        for gs in s._fleet.gpus.values():
            if not gs.drained:
                fresh_undrained[gs.gpu.model].add(gs.gpu.uuid)
        assert s._fleet.undrained == fresh_undrained, f"step {step}"
        records = s.deadlines._records.values()  # every time limit comes up in the tick's heap
        assert {(r.deadline, r.lease_id) for r in records} <= set(s.deadlines._by_deadline), f"step {step}"
    store.close()


def test_mig_grant_passes_over_gpus_on_nodes_without_room(harness):
    """The first GPU of a layout sits on a node whose CPU is taken: the next one of that layout serves."""
    h = harness(fleet({"model": A100_40, "count": 1, "mig": "dynamic"}, cpu_milli=4000, nodes=3))
    s = h.scheduler
    first = s.submit("a", "kernel:1", mig("1g.5gb", cpu_milli=3000), now=0)
    assert first.slice.node == "node0"
    second = s.submit("b", "kernel:2", mig("1g.5gb", cpu_milli=3000), now=1)
    assert second.slice.node == "node1"  # node0 would pack better, but has 1,000 milli-CPU left
    third = s.submit("c", "kernel:3", mig("1g.5gb", cpu_milli=3000, node="node2"), now=2)
    assert third.slice.node == "node2"
    assert s.submit("d", "kernel:4", mig("1g.5gb", cpu_milli=3000), now=3, wait=False).state \
        is LeaseState.REJECTED


def test_mig_grant_uses_a_free_instance_before_making_one(harness):
    h = harness(fleet({"model": A100_40, "count": 1, "mig": "dynamic"},
                      {"model": A100_40, "mig": "static", "layout": ["3g.20gb", "1g.5gb"]}, nodes=2))
    s = h.scheduler
    lease = s.submit("a", "kernel:1", mig("1g.5gb"), now=0)
    static = [g.uuid for n in h.backend.discover() for g in n.gpus if g.mig_mode.value == "static"]
    assert lease.slice.gpu_uuids[0] == min(static)  # equally full: the lowest UUID
    s.drain(max(static), now=1)
    again = s.submit("b", "kernel:2", mig("1g.5gb"), now=2)
    assert again.slice.gpu_uuids[0] not in static  # the other free one is drained: a new instance


def test_a_pass_searches_the_fleet_once_per_shape_that_has_no_room(harness):
    """200 queued whole-GPU requests on a full fleet and a share waiting behind them: when a
    share is released, the pass asks the placer once per shape, and checks quotas only for the
    requests it tries to place, not for each of the 199 whose shape it already found no room for."""
    h = harness(fleet({"model": "L4", "count": 2}, nodes=2), heartbeat_ttl=0, reserve_after=10_000)
    s = h.scheduler
    whole, share = SliceSpec.from_json({"kind": "whole"}), SliceSpec.from_json({"kind": "shared", "memory_gib": 8})
    for i in range(3):
        s.submit("owner", f"job:w{i}", whole, PriorityClass.BATCH, now=0)
    s.submit("owner", "kernel:half", SliceSpec.from_json({"kind": "shared", "memory_gib": 12}), now=0)
    small = s.submit("owner", "kernel:small", share, now=0)
    waiting = [s.submit(f"u{i}", "kernel:w", whole, PriorityClass.BATCH, now=1) for i in range(200)]
    late = s.submit("late", "kernel:1", share, PriorityClass.BATCH, now=2)
    assert late.state is LeaseState.QUEUED
    calls = []
    choose = s._fit.placement_policy.choose
    s._fit.placement_policy.choose = lambda *args: calls.append(args[1]) or choose(*args)
    checks = []
    check = s._quota_block
    s._quota_block = lambda *args, **kw: checks.append(args[0].user) or check(*args, **kw)
    s.release(small.id, now=3)
    assert s.lease(late.id).state is LeaseState.GRANTED
    assert all(s.lease(w.id).state is LeaseState.QUEUED for w in waiting)
    assert [d.num_gpu for d in calls] == [1, 1] and [d.gpu_milli for d in calls] == [1000, late.slice.milli]
    assert set(checks) == {"u0", "late"} and len(checks) < 10
