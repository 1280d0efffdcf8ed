"""A slice is free again only when its holder is gone: however a lease ends, its slice stays
"returning" (out of the pool) until the holder is reported gone or its heartbeats stop."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.model import LeaseState, PriorityClass, SliceSpec
from jupyter_gpualloc.core.scheduler import NotFound

from .conftest import A100_40, fleet

WHOLE_L4 = SliceSpec.from_json({"kind": "whole", "model": "L4"})
MIG_7G = SliceSpec.from_json({"kind": "mig", "profile": "7g.40gb"})


@pytest.fixture
def one_l4(harness):
    """One L4, holders waiting to be gone (the default policy), heartbeats every 30 s at most."""
    return harness(fleet({"model": "L4", "count": 1}), wait_for_holders=True, heartbeat_ttl=30,
                   idle_timeout=100, idle_grace=20)


def held_by(s, lease_id: str) -> bool:
    gpu = s.inventory()["nodes"][0]["gpus"][0]
    return any(share["lease_id"] == lease_id for share in gpu.get("shares", [])) or \
        any(inst["lease_id"] == lease_id for inst in gpu.get("instances", []))


def test_a_released_slice_waits_for_its_holder_and_then_goes_to_the_next_user(one_l4):
    s = one_l4.scheduler
    dave = s.submit("dave", "server", WHOLE_L4, now=0)
    bob = s.submit("bob", "server", WHOLE_L4, now=1)
    assert bob.state is LeaseState.QUEUED
    s.release(dave.id, now=2, reason="released from the sidebar")
    assert s.lease(dave.id).state is LeaseState.RELEASED and s.lease(dave.id).returning
    assert held_by(s, dave.id) and s.lease(bob.id).state is LeaseState.QUEUED
    assert [l.id for l in s.returning("dave")] == [dave.id] and s.returning("bob") == []
    assert [l.id for l in s.holders_gone("dave", ["server"], now=5)] == [dave.id]
    assert not s.lease(dave.id).returning and not held_by(s, dave.id)
    assert s.lease(bob.id).state is LeaseState.GRANTED
    assert "lease.slice_returned" in one_l4.types()


def test_a_holder_gone_release_frees_at_once_and_can_finish_a_returning_one(one_l4):
    s = one_l4.scheduler
    first = s.submit("a", "kernel:1", WHOLE_L4, now=0)
    s.release(first.id, now=1, holder_gone=True)
    assert not s.lease(first.id).returning and not held_by(s, first.id)
    second = s.submit("a", "kernel:2", WHOLE_L4, now=2)
    s.release(second.id, now=3)
    with pytest.raises(NotFound, match="already ended"):
        s.release(second.id, now=4)
    s.release(second.id, now=4, holder_gone=True)
    assert not held_by(s, second.id)


def test_idle_expiry_keeps_the_slice_until_the_kernel_is_gone(one_l4):
    s = one_l4.scheduler
    idle = s.submit("a", "kernel:1", WHOLE_L4, now=0)
    s.heartbeat("a", now=100)
    s.tick(100)
    s.heartbeat("a", now=121)
    s.tick(121)
    assert s.lease(idle.id).state is LeaseState.EXPIRED and s.lease(idle.id).returning
    other = s.submit("b", "kernel:2", WHOLE_L4, now=122)
    assert other.state is LeaseState.QUEUED
    s.holders_gone("a", ["kernel:1"], now=123)
    assert s.lease(other.id).state is LeaseState.GRANTED


def test_a_deadline_keeps_the_slice_until_the_holder_is_gone(harness):
    h = harness(fleet({"model": "L4", "count": 1}), wait_for_holders=True, heartbeat_ttl=0,
                max_duration={"kernel": 60}, deadline_warning=0)
    s = h.scheduler
    boxed = s.submit("a", "kernel:1", WHOLE_L4, now=0)
    s.tick(61)
    assert s.lease(boxed.id).state is LeaseState.EXPIRED and held_by(s, boxed.id)
    s.holders_gone("a", ["kernel:1"], now=62)
    assert not held_by(s, boxed.id)


def test_heartbeats_keep_a_returning_slice_held_and_their_end_returns_it(one_l4):
    s = one_l4.scheduler
    lease = s.submit("a", "kernel:1", WHOLE_L4, now=0)
    s.release(lease.id, now=1)
    for t in (20, 40, 60):
        s.heartbeat("a", ["kernel:1"], now=t)
        s.tick(t)
        assert held_by(s, lease.id)
    s.tick(91)  # no heartbeat since 60: the holder is presumed gone
    assert not held_by(s, lease.id) and not s.lease(lease.id).returning


def test_an_active_lease_whose_heartbeats_stop_frees_at_once(one_l4):
    s = one_l4.scheduler
    lease = s.submit("a", "kernel:1", WHOLE_L4, now=0)
    s.tick(31)
    assert s.lease(lease.id).state is LeaseState.EXPIRED and not held_by(s, lease.id)


def test_preemption_waits_for_the_victim_and_preempts_nobody_else_meanwhile(harness):
    h = harness(fleet({"model": "L4", "count": 2}), wait_for_holders=True, heartbeat_ttl=0)
    s = h.scheduler
    old = s.submit("b", "job:1", WHOLE_L4, PriorityClass.BATCH, now=0)
    new = s.submit("b", "job:2", WHOLE_L4, PriorityClass.BATCH, now=1)
    wanted = s.submit("i", "kernel:1", WHOLE_L4, now=2)
    assert wanted.state is LeaseState.QUEUED
    assert s.lease(new.id).state is LeaseState.PREEMPTED and s.lease(new.id).returning
    for t in (3, 4, 5):
        s.tick(t)
        assert s.lease(old.id).state is LeaseState.GRANTED  # no cascade while job:2 is stopping
    s.holders_gone("b", ["job:2"], now=6)
    assert s.lease(wanted.id).state is LeaseState.GRANTED
    assert s.lease(old.id).state is LeaseState.GRANTED


def test_a_restart_recovers_returning_slices(harness):
    h = harness(fleet({"model": A100_40, "count": 1, "mig": "dynamic"}), wait_for_holders=True, heartbeat_ttl=30)
    s = h.scheduler
    lease = s.submit("a", "server", MIG_7G, now=0)
    s.release(lease.id, now=1)
    s = h.restart(now=10)
    assert [l.id for l in s.returning()] == [lease.id] and held_by(s, lease.id)
    waiting = s.submit("b", "server", MIG_7G, now=11)
    assert waiting.state is LeaseState.QUEUED
    s.holders_gone("a", ["server"], now=12)
    assert s.lease(waiting.id).state is LeaseState.GRANTED
    s = h.restart(now=13)
    assert s.returning() == []


def test_holders_gone_ends_the_active_leases_of_those_holders(one_l4):
    s = one_l4.scheduler
    running = s.submit("a", "kernel:1", WHOLE_L4, now=0)
    waiting = s.submit("a", "kernel:2", WHOLE_L4, now=1)
    returned = s.holders_gone("a", ["kernel:1", "kernel:2"], now=2)
    assert [l.id for l in returned] == [running.id]
    assert s.lease(running.id).state is LeaseState.RELEASED and not held_by(s, running.id)
    assert s.lease(waiting.id).state is LeaseState.CANCELLED
    assert s.holders_gone("b", ["kernel:1"], now=3) == []  # another user's holders are not a's
