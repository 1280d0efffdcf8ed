"""Property tests over random request/release streams: nothing is double-booked, every MIG layout
is legal, releases return capacity exactly, quotas hold, the queue never holds a request that fits,
and nothing waits forever while the fleet turns over."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_gpualloc.core import mig
from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import LeaseState, MILLI_PER_GPU, PriorityClass, SliceKind, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import QuotaExceeded, Scheduler
from jupyter_gpualloc.core.store import Store, sqlite_url

from .conftest import A100_40

FLEET = {"nodes": [
    {"name": "n0", "cpu_milli": 16000, "memory_mib": 65536, "gpus": [
        {"model": A100_40, "count": 1, "mig": "dynamic"},
        {"model": A100_40, "count": 1, "mig": "static", "layout": ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]},
        {"model": "L4", "count": 1}]},
    {"name": "n1", "cpu_milli": 8000, "memory_mib": 32768, "gpus": [
        {"model": A100_40, "count": 1, "mig": "dynamic"}, {"model": "T4", "count": 2}]},
]}
QUOTAS = {"u2": {"slices": 2}, "u3": {"memory_gib": 24}}

SPECS = [
    {"kind": "mig", "profile": p} for p in ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
] + [
    {"kind": "shared", "memory_gib": g} for g in (2, 6, 12)
] + [
    {"kind": "whole", "count": 1}, {"kind": "whole", "count": 2, "model": "T4"},
    {"memory_gib": 8}, {"memory_gib": 14, "cpu_milli": 4000, "host_memory_mib": 8192},
]

op = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 3), st.sampled_from(range(len(SPECS))),
              st.sampled_from([PriorityClass.INTERACTIVE, PriorityClass.BATCH]), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 10_000)),
    st.tuples(st.just("gone"), st.integers(0, 10_000)),
    st.tuples(st.just("tick"), st.integers(1, 50)),
)


def check_invariants(s: Scheduler, backend: SimulatedBackend) -> None:
    leases = s.leases()
    granted = [l for l in leases if l.state is LeaseState.GRANTED]
    quota_counted = list(granted)
    granted += s.returning()  # ended, their slices still held: nobody else may have them
    assert all(not l.state.active for l in s.returning())
    nodes = backend.discover()
    gpus = {g.uuid: g for n in nodes for g in n.gpus}
    # MIG: legal layouts, one holder per instance, every granted instance exists.
    mig_owners = Counter(l.slice.mig_uuid for l in granted if l.slice.kind is SliceKind.MIG)
    assert all(n == 1 for n in mig_owners.values())
    for gpu in gpus.values():
        if gpu.instances:
            assert mig.is_legal(gpu.instances, backend.mig_profiles(gpu.uuid))
    instance_ids = {i.uuid for g in gpus.values() for i in g.instances}
    assert set(mig_owners) <= instance_ids
    # Non-MIG GPUs: memory never over-committed, whole GPUs exclusive.
    per_gpu: dict[str, list] = {}
    for l in granted:
        if l.slice.kind is not SliceKind.MIG:
            for u in l.slice.gpu_uuids:
                per_gpu.setdefault(u, []).append(l)
    for uuid, holders in per_gpu.items():
        assert gpus[uuid].mig_mode.value == "off"
        assert sum(h.slice.milli for h in holders) <= MILLI_PER_GPU
        assert sum(h.slice.memory_mib for h in holders) <= gpus[uuid].memory_mib
        if any(h.slice.kind is SliceKind.WHOLE for h in holders):
            assert len(holders) == 1
    # Host CPU and memory per node.
    for node in nodes:
        on_node = [l for l in granted if l.slice.node == node.name]
        assert sum(l.spec.cpu_milli for l in on_node) <= node.cpu_milli
        assert sum(l.spec.host_memory_mib for l in on_node) <= node.memory_mib
    # Quotas.
    for user, limits in QUOTAS.items():
        mine = [l for l in quota_counted if l.user == user]
        if "slices" in limits:
            assert len(mine) <= limits["slices"]
        if "memory_gib" in limits:
            assert sum(l.slice.memory_mib for l in mine) <= limits["memory_gib"] * 1024
    # Work conservation: no queued request could be granted now (no reservations, of either kind, in
    # force here, so the time given to the search does not matter).
    for lease in s.queue():
        plans = s._book.plans[lease.id]
        assert s._quota_block(lease, plans) is not None or s._find_fit(lease, plans, set(), 0.0) is None, lease


def free_capacity(s: Scheduler) -> list:
    return [(g["uuid"], g.get("free_memory_mib"), g.get("free_profiles"), g.get("free_milli"))
            for n in s.inventory()["nodes"] for g in n["gpus"]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=40))
def test_random_streams_keep_every_invariant(ops):
    with tempfile.TemporaryDirectory() as tmp:
        backend = SimulatedBackend(FLEET)
        store = Store(sqlite_url(Path(tmp) / "db.sqlite"))
        policy = SchedulerPolicy(quotas=QUOTAS, heartbeat_ttl=0, idle_timeout=0, reserve_after=1e12)
        s = Scheduler(backend, store, policy)
        initial = free_capacity(s)
        initial_instances = sorted(i.uuid for n in backend.discover() for g in n.gpus for i in g.instances)
        now, ids = 0.0, []
        for step in ops:
            if step[0] == "submit":
                _, user, spec_i, prio, wait = step
                try:
                    lease = s.submit(f"u{user}", f"kernel:{len(ids)}", SliceSpec.from_json(SPECS[spec_i]),
                                     prio, now=now, wait=wait)
                    ids.append(lease.id)
                except QuotaExceeded:
                    pass
            elif step[0] == "release":
                active = s.leases()
                if active:
                    s.release(active[step[1] % len(active)].id, now=now)
            elif step[0] == "gone":  # a holder ends: its active lease or the slice it still held
                held = s.leases() + s.returning()
                if held:
                    lease = held[step[1] % len(held)]
                    s.holders_gone(lease.user, [lease.holder], now=now)
            else:
                now += step[1]
                s.tick(now)
            check_invariants(s, backend)
        # Liveness: turning the fleet over grants every waiting request in the end.
        for _ in range(len(ids) + 1):
            for lease in [l for l in s.leases() if l.state is LeaseState.GRANTED]:
                s.release(lease.id, now=now)
            check_invariants(s, backend)
            for lease in s.returning():
                s.holders_gone(lease.user, [lease.holder], now=now)
            check_invariants(s, backend)
            if not s.leases():
                break
        assert s.leases() == []
        # Releasing everything returns capacity exactly, and only pre-existing instances remain.
        assert free_capacity(s) == initial
        assert sorted(i.uuid for n in backend.discover() for g in n.gpus for i in g.instances) == initial_instances
        store.close()
