"""Time-boxed leases: deadlines from policy and offers, warning, release, extensions, restarts."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.deadlines import ExtensionRefused
from jupyter_gpualloc.core.model import LeaseState, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy

from .conftest import fleet

HOUR = 3600.0
T4 = SliceSpec.from_json({"kind": "whole", "model": "T4"})


@pytest.fixture
def make(harness):
    def build(**policy):
        policy.setdefault("heartbeat_ttl", 0)
        policy.setdefault("idle_timeout", 0)
        return harness(fleet({"model": "T4", "count": 1}, {"model": "L4", "count": 1}), **policy)
    return build


def events(h, kind):
    return [e for e in h.events if e.type == kind]


def test_policy_deadline_warns_then_releases(make):
    h = make(max_duration={"kernel": 4 * HOUR}, deadline_warning=600)
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", T4, now=100)
    server = s.submit("bob", "server", SliceSpec.from_json({"kind": "whole", "model": "L4"}), now=100)
    assert s.deadlines.of(lease.id).deadline == 100 + 4 * HOUR and s.deadlines.of(server.id) is None
    s.tick(100 + 4 * HOUR - 601)
    assert events(h, "lease.deadline_warning") == []
    s.tick(100 + 4 * HOUR - 600)
    [warning] = events(h, "lease.deadline_warning")
    assert warning.lease_id == lease.id and warning.data["release_at"] == 100 + 4 * HOUR
    assert warning.data["extensions_left"] == 0
    s.tick(100 + 4 * HOUR - 1)
    assert len(events(h, "lease.deadline_warning")) == 1
    s.tick(100 + 4 * HOUR)
    ended = s.lease(lease.id)
    assert ended.state is LeaseState.EXPIRED and ended.reason == "reached its maximum duration of 4h"
    assert s.lease(server.id).state is LeaseState.GRANTED
    assert h.store.load_deadlines() == []


def test_an_offer_max_duration_wins_over_the_policy(make):
    offers = [{"name": "t4-2h", "label": "T4 for 2 h", "spec": {"kind": "whole", "model": "T4"}, "max_duration": 7200},
              {"name": "l4", "label": "L4", "spec": {"kind": "whole", "model": "L4"}, "max_duration": 0}]
    h = make(max_duration={"kernel": 4 * HOUR}, offers=offers)
    s = h.scheduler
    t4 = s.submit("alice", "kernel:1", T4, now=0)
    l4 = s.submit("alice", "kernel:2", SliceSpec.from_json({"kind": "whole", "model": "L4"}), now=0)
    assert s.deadlines.of(t4.id).deadline == 7200 and s.deadlines.of(l4.id) is None
    assert {o["name"]: o["max_duration"] for o in s.offers()} == {"t4-2h": 7200, "l4": None}


def test_extensions_are_limited_and_refused_while_others_wait(make):
    h = make(max_duration={"kernel": HOUR}, max_extensions=2, extension=1800)
    s = h.scheduler
    lease = s.submit("alice", "kernel:1", T4, now=0)
    s.extend(lease.id, now=100)
    assert s.deadlines.of(lease.id).deadline == HOUR + 1800
    [extended] = events(h, "lease.extended")
    assert extended.data == {"deadline": HOUR + 1800, "extensions": 1, "extensions_left": 1,
                             "state": "granted", "holder": "kernel:1"}
    s.submit("bob", "kernel:1", T4, now=200)  # waits for the only T4
    with pytest.raises(ExtensionRefused, match="others are waiting"):
        s.extend(lease.id, now=300)
    s.policy.extend_while_others_wait = True
    s.extend(lease.id, now=2 * HOUR)  # late: counted from now
    assert s.deadlines.of(lease.id).deadline == 2 * HOUR + 1800
    with pytest.raises(ExtensionRefused, match="used its 2 extension"):
        s.extend(lease.id, now=2 * HOUR)


def test_a_lease_without_a_deadline_cannot_be_extended(make):
    h = make(max_extensions=3)
    lease = h.scheduler.submit("alice", "kernel:1", T4, now=0)
    with pytest.raises(ExtensionRefused, match="no deadline"):
        h.scheduler.extend(lease.id, now=1)


def test_a_restart_keeps_deadlines_and_extensions(make):
    h = make(max_duration={"kernel": HOUR}, max_extensions=1)
    lease = h.scheduler.submit("alice", "kernel:1", T4, now=0)
    h.scheduler.extend(lease.id, now=10)
    s = h.restart(HOUR)
    record = s.deadlines.of(lease.id)
    assert (record.deadline, record.extensions) == (2 * HOUR, 1)
    s.tick(2 * HOUR)
    assert s.lease(lease.id).state is LeaseState.EXPIRED


def test_bad_max_duration_is_refused():
    with pytest.raises(Exception, match="unknown holder kind 'notebook'"):
        SchedulerPolicy(max_duration={"notebook": 60})


class CountingDict(dict):
    """A dict that counts its lookups by get()."""

    gets = 0

    def get(self, key, default=None):
        self.gets += 1
        return super().get(key, default)


def test_a_tick_looks_only_at_the_leases_near_their_deadline(harness):
    """400 granted kernels with 4 h limits: a tick that ends none reads none of their deadline
    records (it read all 400 before); one that warns two reads those two."""
    h = harness(fleet({"model": "A100-SXM4-80GB", "count": 8}, nodes=50), heartbeat_ttl=0, idle_timeout=0,
                max_duration={"kernel": 4 * HOUR}, deadline_warning=600)
    s = h.scheduler
    shared = SliceSpec.from_json({"kind": "shared", "memory_gib": 8})
    leases = [s.submit(f"u{i}", f"kernel:{i}", shared, now=0 if i < 2 else 600) for i in range(400)]
    assert all(lease.state is LeaseState.GRANTED for lease in leases)
    s.deadlines._records = CountingDict(s.deadlines._records)
    s.tick(HOUR)
    assert s.deadlines._records.gets == 0
    s.tick(4 * HOUR - 600)
    assert [e.lease_id for e in events(h, "lease.deadline_warning")] == [leases[0].id, leases[1].id]
    assert s.deadlines._records.gets <= 10


def test_deadlines_end_leases_in_the_order_they_were_granted_not_by_deadline(make):
    """Leases whose deadlines all pass at one tick end in the scheduler's lease order, as before the
    time limits had an index: a lease extended and one restored by an undone change keep their places."""
    h = make(max_duration={"kernel": HOUR}, deadline_warning=0, max_extensions=2, extension=HOUR)
    s = h.scheduler
    t4 = s.submit("a", "kernel:1", T4, now=0)
    l4 = s.submit("b", "kernel:2", SliceSpec.from_json({"kind": "whole", "model": "L4"}), now=500)
    s.extend(t4.id, now=600)  # t4's deadline is now after l4's
    s.tick(3 * HOUR)
    ended = [e.lease_id for e in h.events if e.type == "lease.expired"]
    assert ended == [t4.id, l4.id]
