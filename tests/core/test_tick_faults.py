"""A rule of tick() that raises is undone alone, logged once and shown, while the other rules go on (issue 38)."""

from __future__ import annotations

import logging

from jupyter_gpualloc.core.model import LeaseState, SliceSpec
from jupyter_gpualloc.core.reservations import Reservation
from jupyter_gpualloc.core.scheduler import Scheduler

from .conftest import fleet
from .test_reservations import reserve

L4 = SliceSpec.from_json({"kind": "whole", "model": "L4"})
POLICY = {"heartbeat_ttl": 100, "idle_timeout": 200, "idle_grace": 10, "wait_for_holders": False}


def broken_row(name: str = "typo") -> Reservation:
    """A reservation as today's service stored it from an admin's typo: its window starts before year 1."""
    return Reservation(name, "admin", ("stu",), (), L4, 1, -1e11, 3000.0)


def test_a_corrupt_reservation_stops_no_other_rule(harness, caplog):
    h = harness(fleet({"model": "L4", "count": 4}), **POLICY)
    reserve(h.scheduler, name="good", users=["stu"], groups=[], spec={"kind": "whole", "model": "L4"}, count=1,
            start=1000, end=2000)
    h.store.save_reservations([broken_row()])  # an old row, written before times were bounded
    s = h.restart(0)
    dead = s.submit("alice", "kernel:a", L4, now=0)  # never heard from again
    idle = s.submit("bob", "kernel:b", L4, now=0)  # heartbeats, never active
    caplog.set_level(logging.WARNING, logger="jupyter_gpualloc.core.tick_faults")
    for now in (60, 110, 200, 215, 1000, 1005):
        s.heartbeat("bob", now=now)
        s.tick(now)
    assert s.lease(dead.id).state is LeaseState.EXPIRED and "no heartbeat" in s.lease(dead.id).reason
    assert s.lease(idle.id).state is LeaseState.EXPIRED and s.lease(idle.id).reason.startswith("idle for")
    assert [e.data["name"] for e in h.events if e.type == "reservation.started"] == ["good"]
    [broken] = s.broken_rules()
    assert broken["rule"] == "reservation typo" and broken["kind"] == "reservation" and broken["since"] == 60
    assert broken["failures"] == 6 and "out of range" in broken["error"]
    assert s.tick_failures() == {"reservation typo": 6}
    logged = [r for r in caplog.records if r.name == "jupyter_gpualloc.core.tick_faults"]
    assert [r.levelno for r in logged] == [logging.ERROR]  # once, not at every tick
    stored = {r["name"]: r for r in h.store.load_reservations()}
    assert stored["typo"]["started"] is None and stored["good"]["started"] == 1000  # its own part was undone
    s.reservations.delete("typo", now=1010)
    s.tick(1010)
    assert s.broken_rules() == []
    assert "no longer runs" in [r for r in caplog.records if r.name == "jupyter_gpualloc.core.tick_faults"][-1].getMessage()


def test_a_rule_that_raises_half_way_is_undone_alone(harness, monkeypatch):
    """Idle release warns one lease, then raises: that warning is undone (in memory and in the
    store), the dead holder's lease still expires, and the rule works again once it stops raising."""
    h = harness(fleet({"model": "L4", "count": 3}), **{**POLICY, "idle_timeout": 50})
    s = h.scheduler
    dead = s.submit("alice", "kernel:a", L4, now=0)
    first, second = (s.submit("bob", f"kernel:b{i}", L4, now=0) for i in range(2))
    real_check = Scheduler._check_idle

    def check_then_fail(self, lease, now):
        real_check(self, lease, now)
        if lease.id == second.id:
            raise RuntimeError("a bug in the idle rule")
    monkeypatch.setattr(Scheduler, "_check_idle", check_then_fail)
    s.heartbeat("bob", now=120)
    s.tick(120)
    assert s.lease(dead.id).state is LeaseState.EXPIRED
    assert [l.idle_warned_at for l in (s.lease(first.id), s.lease(second.id))] == [None, None]
    assert not [e for e in h.events if e.type == "lease.idle_warning"]
    assert [b["rule"] for b in s.broken_rules()] == ["idle release"]
    again = h.restart(121)
    assert again.lease(dead.id).state is LeaseState.EXPIRED and again.lease(first.id).idle_warned_at is None
    monkeypatch.setattr(Scheduler, "_check_idle", real_check)
    again.heartbeat("bob", now=122)
    again.tick(122)
    assert again.broken_rules() == [] and again.tick_failures() == {}
    assert {e.lease_id for e in h.events if e.type == "lease.idle_warning"} == {first.id, second.id}


def test_a_stored_window_past_year_9999_can_still_be_read_and_deleted(harness):
    """Milliseconds stored as seconds before windows were bounded: the view answers (its time as epoch
    seconds), so GET /reservations works for everyone and the admin can delete it."""
    h = harness(fleet({"model": "L4", "count": 2}), **POLICY)
    h.store.save_reservations([Reservation("ms", "admin", ("stu",), (), L4, 1, 1.7e12, 1.7e12 + 3600)])
    s = h.restart(0)
    s.tick(10)
    view = s.reservations.view(s.reservations.get("ms"), 10)
    assert view["state"] == "upcoming" and "1700000000000 (epoch seconds, out of range)" in view["summary"]
    assert s.broken_rules() == []
    s.reservations.delete("ms", now=11)
    assert h.store.load_reservations() == []
