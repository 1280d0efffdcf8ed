"""The scheduler's decisions: MIG (static and dynamic), shares, whole GPUs, queue, quotas, expiry."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.model import LeaseState, PriorityClass, SliceKind, SliceSpec, SpecError
from jupyter_gpualloc.core.scheduler import HolderBusy, NotFound, QuotaExceeded

from .conftest import A100_40, fleet

BATCH = PriorityClass.BATCH


def mig(profile: str, **kw) -> SliceSpec:
    return SliceSpec.from_json({"kind": "mig", "profile": profile, **kw})


def shared(gib: float, **kw) -> SliceSpec:
    return SliceSpec.from_json({"kind": "shared", "memory_gib": gib, **kw})


def whole(count: int = 1, **kw) -> SliceSpec:
    return SliceSpec.from_json({"kind": "whole", "count": count, **kw})


@pytest.fixture
def mixed(harness):
    """One node: two dynamic-MIG A100-40GB, one L4, two T4."""
    return harness(fleet({"model": A100_40, "count": 2, "mig": "dynamic"},
                         {"model": "L4", "count": 1}, {"model": "T4", "count": 2}))


def test_dynamic_mig_creates_then_destroys_instance(mixed):
    s = mixed.scheduler
    lease = s.submit("alice", "kernel:k1", mig("3g.20gb"), now=1)
    assert lease.state is LeaseState.GRANTED
    sl = lease.slice
    assert sl.kind is SliceKind.MIG and sl.profile == "3g.20gb" and sl.mig_uuid.startswith("MIG-")
    assert sl.visible_devices == sl.mig_uuid
    gpu = next(g for n in mixed.backend.discover() for g in n.gpus if g.uuid == sl.gpu_uuids[0])
    assert [i.uuid for i in gpu.instances] == [sl.mig_uuid]
    s.release(lease.id, now=2)
    gpu = next(g for n in mixed.backend.discover() for g in n.gpus if g.uuid == sl.gpu_uuids[0])
    assert gpu.instances == []
    assert mixed.types()[:2] == ["mig.created", "lease.granted"]
    assert "mig.destroyed" in mixed.types() and "lease.released" in mixed.types()


@pytest.mark.parametrize("order", [("4g.20gb", "3g.20gb"), ("3g.20gb", "4g.20gb")])
def test_3g_and_4g_share_one_gpu_in_either_order(harness, order):
    h = harness(fleet({"model": A100_40, "count": 1, "mig": "dynamic"}))
    first = h.scheduler.submit("a", "kernel:1", mig(order[0]), now=0)
    second = h.scheduler.submit("b", "kernel:2", mig(order[1]), now=0)
    assert first.state is second.state is LeaseState.GRANTED
    starts = {l.slice.profile: l.slice.start for l in (first, second)}
    assert starts == {"4g.20gb": 0, "3g.20gb": 4}


def test_static_mig_hands_out_existing_instances_only(harness):
    h = harness(fleet({"model": A100_40, "count": 1, "mig": "static", "layout": ["3g.20gb", "2g.10gb"]}))
    s = h.scheduler
    a = s.submit("a", "kernel:1", mig("2g.10gb"), now=0)
    assert a.state is LeaseState.GRANTED and a.slice.start == 4
    b = s.submit("b", "kernel:2", mig("2g.10gb"), now=0, wait=False)
    assert b.state is LeaseState.REJECTED
    with pytest.raises(SpecError):  # free slices exist, but static MIG never creates
        s.submit("c", "kernel:3", mig("1g.5gb"), now=0, wait=False)
    s.release(a.id, now=1)
    assert len(next(g for n in h.backend.discover() for g in n.gpus).instances) == 2  # not destroyed


def test_policy_can_force_static_mig(harness):
    h = harness(fleet({"model": A100_40, "count": 1, "mig": "dynamic"}), mig_changes="static")
    with pytest.raises(SpecError):  # no instance exists, and none may be made
        h.scheduler.submit("a", "kernel:1", mig("1g.5gb"), now=0, wait=False)


def test_shares_never_exceed_gpu_memory(mixed):
    s = mixed.scheduler
    big = s.submit("a", "kernel:1", shared(16, model="L4"), now=0)
    assert big.state is LeaseState.GRANTED and big.slice.memory_mib == 16 * 1024
    again = s.submit("b", "kernel:2", shared(16, model="L4"), now=0, wait=False)
    assert again.state is LeaseState.REJECTED
    small = s.submit("c", "kernel:3", shared(4, model="L4"), now=0)
    assert small.state is LeaseState.GRANTED and small.slice.gpu_uuids == big.slice.gpu_uuids
    free = next(g for g in s.inventory()["nodes"][0]["gpus"] if g["model"] == "L4")["free_memory_mib"]
    assert free == 23034 - 20 * 1024


def test_whole_gpus_need_fully_free_gpus_on_one_node(mixed):
    s = mixed.scheduler
    pair = s.submit("a", "server", whole(2, model="T4"), now=0)
    assert pair.state is LeaseState.GRANTED and len(pair.slice.gpu_uuids) == 2
    assert pair.slice.visible_devices == ",".join(pair.slice.gpu_uuids)
    s.release(pair.id, now=1)
    s.submit("b", "kernel:1", shared(2, model="T4"), now=2)
    assert s.submit("c", "server", whole(2, model="T4"), now=3, wait=False).state is LeaseState.REJECTED
    assert s.submit("d", "server", whole(1, model="T4"), now=3).state is LeaseState.GRANTED


def test_any_prefers_the_smallest_mig_profile_then_a_share(mixed):
    s = mixed.scheduler
    lease = s.submit("a", "kernel:1", SliceSpec.from_json({"memory_gib": 10}), now=0)
    assert lease.slice.kind is SliceKind.MIG and lease.slice.profile == "1g.10gb"  # by its name's size
    too_big = s.submit("b", "kernel:2", SliceSpec.from_json({"memory_gib": 30}), now=0)
    assert too_big.slice.kind is SliceKind.MIG and too_big.slice.profile == "7g.40gb"
    for i in range(3):  # fill the second A100 with 1g.10gb
        s.submit("c", f"kernel:c{i}", mig("1g.10gb"), now=0)
    share = s.submit("d", "kernel:3", SliceSpec.from_json({"memory_gib": 9}), now=0)
    assert share.slice.kind is SliceKind.SHARED and share.slice.model in ("L4", "T4")


def test_unknown_profile_is_a_spec_error_naming_the_field(mixed):
    with pytest.raises(SpecError) as err:
        mixed.scheduler.submit("a", "kernel:1", mig("3g.40gb"), now=0)
    assert err.value.field == "spec.profile"
    with pytest.raises(SpecError) as err:
        mixed.scheduler.submit("a", "kernel:1", shared(200), now=0)
    assert err.value.field == "spec.memory_mib"  # the API names it as the request did
    with pytest.raises(SpecError) as err:
        mixed.scheduler.submit("a", "nonsense", shared(2), now=0)
    assert err.value.field == "holder"


def test_one_active_lease_per_holder(mixed):
    s = mixed.scheduler
    lease = s.submit("a", "kernel:1", shared(2), now=0)
    with pytest.raises(HolderBusy):
        s.submit("a", "kernel:1", shared(2), now=0)
    s.submit("b", "kernel:1", shared(2), now=0)  # another user's kernel id is another holder
    s.release(lease.id, now=1)
    s.submit("a", "kernel:1", shared(2), now=2)


def test_release_unknown_or_ended_lease(mixed):
    s = mixed.scheduler
    with pytest.raises(NotFound):
        s.release("nope", now=0)
    lease = s.submit("a", "kernel:1", shared(2), now=0)
    s.release(lease.id, now=1)
    with pytest.raises(NotFound, match="already ended"):
        s.release(lease.id, now=2)
    assert s.lease(lease.id).state is LeaseState.RELEASED


def test_user_quota_rejects_interactive_and_queues_batch(harness):
    h = harness(fleet({"model": "L4", "count": 4}), quotas={"alice": {"slices": 1}, "*": {"memory_gib": 8}})
    s = h.scheduler
    first = s.submit("alice", "kernel:1", shared(4), now=0)
    with pytest.raises(QuotaExceeded) as err:
        s.submit("alice", "kernel:2", shared(4), now=0)
    assert err.value.key == "slices" and "at most 1 slice" in str(err.value)
    job = s.submit("alice", "job:1", shared(4), BATCH, now=0)
    assert job.state is LeaseState.QUEUED and "quota" in job.reason
    s.release(first.id, now=1)
    assert s.lease(job.id).state is LeaseState.GRANTED
    with pytest.raises(QuotaExceeded):
        s.submit("bob", "kernel:1", shared(10), now=2)  # default quota "*"


def test_group_quota_counts_all_members(harness):
    h = harness(fleet({"model": "L4", "count": 4}), group_quotas={"students": {"whole_gpus": 2}})
    s = h.scheduler
    s.submit("a", "server", whole(), now=0, groups=["students"])
    s.submit("b", "server", whole(), now=0, groups=["students"])
    with pytest.raises(QuotaExceeded) as err:
        s.submit("c", "server", whole(), now=0, groups=["students"])
    assert err.value.scope == "group"
    assert s.submit("d", "server", whole(), now=0, groups=["staff"]).state is LeaseState.GRANTED


def test_interactive_waits_ahead_of_batch_and_fifo_within_class(harness):
    h = harness(fleet({"model": "L4", "count": 1}), preemption=False, fair_share=False)
    s = h.scheduler
    holder = s.submit("x", "server", whole(), now=0)
    b1 = s.submit("b", "job:1", whole(), BATCH, now=1)
    i1 = s.submit("i", "kernel:1", whole(), now=2)
    i2 = s.submit("j", "kernel:2", whole(), now=3)
    assert [l.id for l in s.queue()] == [i1.id, i2.id, b1.id]
    assert s.position(b1.id) == 3
    s.release(holder.id, now=4)
    assert s.lease(i1.id).state is LeaseState.GRANTED
    s.release(i1.id, now=5)
    assert s.lease(i2.id).state is LeaseState.GRANTED
    assert s.lease(b1.id).state is LeaseState.QUEUED


def test_fair_share_serves_the_lighter_user_first(harness):
    h = harness(fleet({"model": "L4", "count": 2}), preemption=False)
    s = h.scheduler
    s.submit("heavy", "server", whole(), now=0)
    blocker = s.submit("other", "server", whole(), now=0)
    heavy_job = s.submit("heavy", "job:1", whole(), BATCH, now=1)
    light_job = s.submit("light", "job:2", whole(), BATCH, now=2)
    assert [l.id for l in s.queue()] == [light_job.id, heavy_job.id]
    s.release(blocker.id, now=3)
    assert s.lease(light_job.id).state is LeaseState.GRANTED


def test_backfill_grants_a_later_request_that_fits(harness):
    h = harness(fleet({"model": "L4", "count": 2}), preemption=False, reserve_after=100, heartbeat_ttl=0)
    s = h.scheduler
    s.submit("a", "kernel:1", shared(12), now=0)
    s.submit("b", "kernel:2", shared(12), now=0)
    big = s.submit("c", "server", whole(), now=1)
    assert big.state is LeaseState.QUEUED
    small = s.submit("d", "kernel:3", shared(4), now=2)
    assert small.state is LeaseState.GRANTED  # backfilled ahead of the waiting whole-GPU request


def test_reservation_stops_backfill_after_reserve_after(harness):
    h = harness(fleet({"model": "L4", "count": 2}), preemption=False, reserve_after=100, heartbeat_ttl=0)
    s = h.scheduler
    a = s.submit("a", "kernel:1", shared(12), now=0)
    s.submit("b", "kernel:2", shared(16), now=0)
    big = s.submit("c", "server", whole(), now=1)
    s.tick(200)  # the whole-GPU request has now waited past reserve_after
    late = s.submit("d", "kernel:3", shared(8), now=201, wait=False)
    assert late.state is LeaseState.REJECTED  # it fits only on the GPU reserved for the whole one
    other = s.submit("e", "kernel:4", shared(4), now=201)
    assert other.state is LeaseState.GRANTED and other.slice.gpu_uuids != a.slice.gpu_uuids
    s.release(a.id, now=202)
    assert s.lease(big.id).state is LeaseState.GRANTED


def test_interactive_preempts_newest_preemptible_batch(harness):
    h = harness(fleet({"model": "L4", "count": 2}), allow_non_preemptible=True)
    s = h.scheduler
    old = s.submit("b", "job:1", whole(), BATCH, now=0)
    new = s.submit("b", "job:2", whole(), BATCH, now=1)
    pinned = s.submit("b", "job:3", whole(), BATCH, now=2, preemptible=False)
    assert pinned.state is LeaseState.QUEUED
    wanted = s.submit("i", "kernel:1", whole(), now=3)
    assert wanted.state is LeaseState.GRANTED
    assert s.lease(new.id).state is LeaseState.PREEMPTED
    assert s.lease(old.id).state is LeaseState.GRANTED
    assert "lease.preempted" in h.types()


def test_preemption_ties_go_to_the_newest_request(harness):
    """Leases granted at the same time are preempted newest request first, whatever their ids hash
    to (before, a set of holders decided, so the victim changed with PYTHONHASHSEED)."""
    h = harness(fleet({"model": "L4", "count": 1}))
    s = h.scheduler
    batch = [s.submit("b", f"job:{n}", shared(5), BATCH, now=0) for n in range(4)]
    assert all(l.state is LeaseState.GRANTED for l in batch)
    wanted = s.submit("i", "kernel:1", shared(5), now=1)
    assert wanted.state is LeaseState.GRANTED
    assert [s.lease(l.id).state for l in batch] == [LeaseState.GRANTED] * 3 + [LeaseState.PREEMPTED]


def test_mig_preemption_frees_room_for_a_profile(harness):
    h = harness(fleet({"model": A100_40, "count": 1, "mig": "dynamic"}))
    s = h.scheduler
    jobs = [s.submit("b", f"job:{i}", mig("2g.10gb"), BATCH, now=i) for i in range(3)]
    assert all(j.state is LeaseState.GRANTED for j in jobs)
    wanted = s.submit("i", "kernel:1", mig("3g.20gb"), now=5)
    assert wanted.state is LeaseState.GRANTED
    states = [s.lease(j.id).state for j in jobs]
    assert states.count(LeaseState.PREEMPTED) == 1  # two 2g slices remain beside the 3g


def test_idle_warning_then_expiry_and_busy_is_spared(harness):
    h = harness(fleet({"model": "L4", "count": 2}), idle_timeout=100, idle_grace=20, heartbeat_ttl=0)
    s = h.scheduler
    idle = s.submit("a", "kernel:1", shared(4), now=0)
    busy = s.submit("b", "kernel:2", shared(4), now=0)
    s.touch(busy.id, now=50, last_activity=50, busy=True)
    s.tick(100)
    assert h.types().count("lease.idle_warning") == 1
    assert s.lease(idle.id).idle_warned_at == 100
    s.tick(119)
    assert s.lease(idle.id).state is LeaseState.GRANTED
    s.tick(121)
    assert s.lease(idle.id).state is LeaseState.EXPIRED and "idle" in s.lease(idle.id).reason
    s.tick(10_000)
    assert s.lease(busy.id).state is LeaseState.GRANTED


def test_a_lease_says_when_idle_release_will_take_it_and_the_tick_keeps_to_it(harness):
    h = harness(fleet({"model": "L4", "count": 2}), idle_timeout=100, idle_grace=20, heartbeat_ttl=0)
    s = h.scheduler
    idle = s.submit("a", "kernel:1", shared(4), now=0)
    server = s.submit("a", "server", shared(4), now=0)
    assert s.idle_release(idle.id) == {"since": 0, "warn_at": 100, "release_at": 120, "grace": 20, "warned": False}
    assert s.idle_release(server.id) is None  # no idle release for servers by default
    s.touch(idle.id, now=30, last_activity=30)
    assert s.idle_release(idle.id)["warn_at"] == 130
    s.touch(idle.id, now=40, last_activity=40, busy=True)
    assert s.idle_release(idle.id) is None  # a running cell: not idle
    s.touch(idle.id, now=50, last_activity=50, busy=False)
    expected = s.idle_release(idle.id)
    s.tick(expected["warn_at"] - 1)
    assert h.types().count("lease.idle_warning") == 0
    s.tick(expected["warn_at"])
    assert h.types().count("lease.idle_warning") == 1
    assert s.idle_release(idle.id) == {**expected, "warned": True}
    s.tick(expected["release_at"] - 1)
    assert s.lease(idle.id).state is LeaseState.GRANTED
    s.tick(expected["release_at"])
    assert s.lease(idle.id).state is LeaseState.EXPIRED and s.idle_release(idle.id) is None


def test_activity_after_warning_clears_it(harness):
    h = harness(fleet({"model": "L4", "count": 1}), idle_timeout=100, idle_grace=20, heartbeat_ttl=0)
    s = h.scheduler
    lease = s.submit("a", "kernel:1", shared(4), now=0)
    s.tick(100)
    s.touch(lease.id, now=105, last_activity=105)
    assert s.lease(lease.id).idle_warned_at is None
    s.tick(150)
    assert s.lease(lease.id).state is LeaseState.GRANTED


def test_server_leases_are_not_idle_released_by_default(harness):
    h = harness(fleet({"model": "L4", "count": 1}), idle_timeout=10, idle_grace=1, heartbeat_ttl=0)
    lease = h.scheduler.submit("a", "server", shared(4), now=0)
    h.scheduler.tick(1000)
    assert h.scheduler.lease(lease.id).state is LeaseState.GRANTED


def test_missing_heartbeats_expire_granted_and_queued_leases(harness):
    h = harness(fleet({"model": "L4", "count": 1}), heartbeat_ttl=60, preemption=False)
    s = h.scheduler
    dead = s.submit("a", "server", whole(), now=0)
    alive = s.submit("b", "server", whole(), now=0)
    assert alive.state is LeaseState.QUEUED
    s.heartbeat("b", ["server"], now=50)
    s.tick(61)
    assert s.lease(dead.id).state is LeaseState.EXPIRED
    assert s.lease(alive.id).state is LeaseState.GRANTED


def test_drained_gpu_takes_no_new_slices(harness):
    h = harness(fleet({"model": "L4", "count": 1}))
    s = h.scheduler
    gpu = s.inventory()["nodes"][0]["gpus"][0]["uuid"]
    s.drain(gpu, now=0)
    lease = s.submit("a", "kernel:1", shared(4), now=1, wait=False)
    assert lease.state is LeaseState.REJECTED and lease.reason.startswith("drained")
    queued = s.submit("a", "kernel:2", shared(4), now=1)
    s.drain(gpu, False, now=2)
    assert s.lease(queued.id).state is LeaseState.GRANTED


def test_offers_count_what_is_free_now(mixed):
    s = mixed.scheduler
    offers = {o["name"]: o for o in s.offers("alice")}
    assert offers["mig-1g.5gb-a100-sxm4-40gb"]["available"] == 14
    assert offers["whole-t4"]["available"] == 2
    assert offers["shared-8gb-l4"]["available"] == 2
    s.submit("a", "kernel:1", mig("4g.20gb"), now=0)
    offers = {o["name"]: o for o in s.offers("alice")}
    assert offers["mig-1g.5gb-a100-sxm4-40gb"]["available"] == 10
    assert offers["mig-7g.40gb-a100-sxm4-40gb"]["available"] == 1


def test_events_are_announced_after_they_are_stored(mixed):
    seen = []

    def check(event):
        if event.lease_id:
            seen.append((event.type, mixed.store.load_lease(event.lease_id).state.value))

    mixed.scheduler.subscribe(check)
    lease = mixed.scheduler.submit("a", "kernel:1", shared(2), now=0)
    mixed.scheduler.release(lease.id, now=1)
    assert seen == [("lease.granted", "granted"), ("lease.released", "released")]


def test_restart_recovers_leases_queue_and_mig_instances(harness):
    h = harness(fleet({"model": A100_40, "count": 1, "mig": "dynamic"}, {"model": "L4", "count": 1}),
                preemption=False)
    s = h.scheduler
    m = s.submit("a", "kernel:1", mig("4g.20gb"), now=0)
    w = s.submit("b", "server", whole(model="L4"), now=0)
    q1 = s.submit("c", "kernel:2", whole(model="L4"), now=1)
    q2 = s.submit("d", "kernel:3", whole(model="L4"), now=2)
    s2 = h.restart(now=10)
    assert {l.id: l.state for l in s2.leases()} == {
        m.id: LeaseState.GRANTED, w.id: LeaseState.GRANTED, q1.id: LeaseState.QUEUED, q2.id: LeaseState.QUEUED}
    assert [l.id for l in s2.queue()] == [q1.id, q2.id]
    assert s2.submit("e", "kernel:4", mig("4g.20gb"), now=11, wait=False).state is LeaseState.REJECTED
    assert s2.submit("e", "kernel:5", mig("3g.20gb"), now=11).slice.start == 4
    s2.release(w.id, now=12)
    assert s2.lease(q1.id).state is LeaseState.GRANTED
    s2.release(m.id, now=13)
    gpu = next(g for n in h.backend.discover() for g in n.gpus if g.model == A100_40)
    assert [i.profile_id for i in gpu.instances] == [9]  # 4g destroyed, 3g remains


def test_restart_reports_vanished_and_found_instances(harness):
    from jupyter_gpualloc.core.devices.simulated import SimulatedBackend

    h = harness(fleet({"model": A100_40, "count": 1, "mig": "dynamic"}))
    lease = h.scheduler.submit("a", "kernel:1", mig("3g.20gb"), now=0)
    # The devices come back without that instance, and with one nobody asked for.
    other = SimulatedBackend(fleet({"model": A100_40, "count": 1, "mig": "static", "layout": ["1g.5gb"]}))
    h.events.clear()
    s2 = h.restart(now=5, backend=other)
    assert "reconcile.instance_vanished" in h.types() and "reconcile.instance_found" in h.types()
    assert s2.lease(lease.id).state is LeaseState.EXPIRED
    assert s2.leases() == []
