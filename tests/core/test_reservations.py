"""Reservations: capacity held for members in a window, with the clock passed in (issue 27)."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.model import LeaseState, PriorityClass, SliceSpec, SpecError
from jupyter_gpualloc.core.reservations import WEEK, ReservationConflict, parse_request

from .conftest import A100_40, fleet

BATCH = PriorityClass.BATCH
START, END = 10 * 3600.0, 12 * 3600.0
LEAD = 600.0
SLICE = SliceSpec.from_json({"kind": "mig", "profile": "1g.5gb"})
L4 = SliceSpec.from_json({"kind": "whole", "model": "L4"})


def reserve(s, now=0.0, **fields):
    """Create a reservation (ml101 for the group students, 3 x 1g.5gb, 10:00-12:00 on day one by default)."""
    body = {"name": "ml101", "groups": ["students"], "spec": {"kind": "mig", "profile": "1g.5gb"}, "count": 3,
            "start": START, "end": END, "lead_seconds": LEAD, **fields}
    return s.reservations.create(parse_request(body, "admin", now), now)


@pytest.fixture
def mig_fleet(harness):
    """Two A100-40GB GPUs with dynamic MIG: seven 1g.5gb slices each."""
    return harness(fleet({"model": A100_40, "count": 2, "mig": "dynamic"}), heartbeat_ttl=0, idle_timeout=0)


@pytest.fixture
def l4_fleet(harness):
    def build(count=2, **policy):
        return harness(fleet({"model": "L4", "count": count}), heartbeat_ttl=0, idle_timeout=0, **policy)
    return build


def state(s, lease):
    return s.lease(lease.id).state


def test_creation_is_refused_with_how_many_fit(mig_fleet):
    s = mig_fleet.scheduler
    with pytest.raises(ReservationConflict) as refused:
        reserve(s, count=20)
    assert refused.value.field == "count" and refused.value.fits == 14
    assert "only 14 of 20" in str(refused.value)
    reserve(s, count=7)
    with pytest.raises(ReservationConflict) as beside:
        reserve(s, name="ml102", count=8, start=START + 3600, end=END + 3600)
    assert beside.value.fits == 7  # the GPU ml101 holds is not counted twice
    reserve(s, name="ml102", count=7, start=START + 3600, end=END + 3600)  # overlapping, but both fit
    reserve(s, name="friday", count=14, start=START + 3 * 86400, end=END + 3 * 86400)  # no overlap
    with pytest.raises(ReservationConflict) as exists:
        reserve(s, count=1)
    assert exists.value.field == "name"
    with pytest.raises(SpecError) as unknown:
        reserve(s, name="h100", spec={"kind": "whole", "model": "H100"})
    assert unknown.value.field == "spec.model"
    assert [r.name for r in s.reservations.all()] == ["ml101", "ml102", "friday"]


def test_the_request_is_checked_field_by_field():
    for body, field in [({"name": "x", "spec": {"kind": "whole"}, "start": 0, "end": 10}, "users"),
                        ({"name": "x", "users": ["a"], "spec": {"kind": "whole"}, "start": 10, "end": 5}, "end"),
                        ({"name": "x", "users": ["a"], "spec": {"kind": "whole"}, "start": "tuesday", "end": 5},
                         "start"),
                        ({"name": "x", "users": ["a"], "spec": {"kind": "whole"}, "count": 0, "start": 0,
                          "end": 5}, "count"),
                        ({"name": "x", "users": ["a"], "spec": {"kind": "whole"}, "start": 0, "end": 5,
                          "color": 1}, "color")]:
        with pytest.raises(SpecError) as err:
            parse_request(body, "admin", 0)
        assert err.value.field == field
    r = parse_request({"name": "ml101", "groups": ["students"], "spec": {"profile": "1g.5gb"}, "count": 30,
                       "start": "2026-12-08T10:00", "end": "2026-12-08T12:00+00:00", "weekly": True}, "admin", 0)
    assert r.end - r.start == 7200 and r.weekly and r.lead == 600


def test_a_window_out_of_range_is_refused_naming_its_field_and_nothing_is_stored(mig_fleet):
    """An admin's typo (-1e11), milliseconds (Date.now()), a date before 1970 or past year 9999:
    refused as the request is read and by create() itself, and the store keeps nothing."""
    h = mig_fleet
    s = h.scheduler
    for fields, field in [({"start": -1e11}, "start"), ({"end": 1.7e12}, "end"), ({"start": -1}, "start"),
                          ({"start": "1969-12-31T23:59"}, "start"), ({"end": "9999-12-31T23:00-05:00"}, "end"),
                          ({"start": 253402300800, "end": 253402300900}, "start")]:
        with pytest.raises(SpecError) as refused:
            reserve(s, **fields)
        assert refused.value.field == field and "9999-12-31" in refused.value.message
    typo = parse_request({"name": "ml101", "groups": ["students"], "spec": {"profile": "1g.5gb"}, "start": START,
                          "end": END}, "admin", 0)
    typo.start = -1e11
    with pytest.raises(SpecError) as refused:
        s.reservations.create(typo, 0)
    assert refused.value.field == "start"
    assert s.reservations.all() == [] and h.store.load_reservations() == []
    reserve(s, start="9999-12-31T20:00", end="9999-12-31T23:59:59Z")  # the last hours a date can show
    assert [r.name for r in h.restart(1).reservations.all()] == ["ml101"]


def test_long_work_keeps_off_reserved_capacity_but_preemptible_work_borrows_it(l4_fleet):
    h = l4_fleet(count=2)
    s = h.scheduler
    reserve(s, spec={"kind": "whole", "model": "L4"}, count=1)
    first = s.submit("carol", "kernel:1", L4, now=0)
    second = s.submit("carol", "kernel:2", L4, now=0)
    assert state(s, first) is LeaseState.GRANTED and state(s, second) is LeaseState.QUEUED
    borrowed = s.submit("dave", "job:1", L4, BATCH, now=1)
    assert state(s, borrowed) is LeaseState.GRANTED
    [held] = s.reservations.held(1).values()
    assert set(s.lease(borrowed.id).slice.gpu_uuids) == held


def test_work_that_ends_before_the_start_may_use_reserved_capacity(l4_fleet):
    h = l4_fleet(count=1, max_duration={"kernel": 3600})
    s = h.scheduler
    reserve(s, spec={"kind": "whole", "model": "L4"}, count=1)
    early = s.submit("carol", "kernel:1", L4, now=0)
    assert state(s, early) is LeaseState.GRANTED
    s.release(early.id, now=10, holder_gone=True)
    late = s.submit("carol", "kernel:2", L4, now=START - 1800)  # its hour would run into the window
    assert state(s, late) is LeaseState.QUEUED


def test_preemptible_work_is_displaced_at_start_minus_lead(l4_fleet):
    h = l4_fleet(count=1)
    s = h.scheduler
    reserve(s, spec={"kind": "whole", "model": "L4"}, count=1)
    job = s.submit("dave", "job:1", L4, BATCH, now=0)
    assert state(s, job) is LeaseState.GRANTED
    s.tick(START - LEAD - 1)
    assert state(s, job) is LeaseState.GRANTED
    s.tick(START - LEAD)
    ended = s.lease(job.id)
    assert ended.state is LeaseState.PREEMPTED and "reservation ml101 starts at 10:00" in ended.reason
    again = s.submit("dave", "job:2", L4, BATCH, now=START - LEAD + 1)
    assert state(s, again) is LeaseState.QUEUED  # nothing is lent in the lead


def test_interactive_work_is_never_displaced_without_preempt_interactive(l4_fleet):
    h = l4_fleet(count=1)
    s = h.scheduler
    session = s.submit("carol", "server", L4, now=0)
    warnings = reserve(s, spec={"kind": "whole", "model": "L4"}, count=1, now=1)
    assert warnings and "only 0 of 1 can be promised" in warnings[0]
    for t in (START - LEAD, START, START + 60):
        s.tick(t)
    assert state(s, session) is LeaseState.GRANTED
    assert "lease.deadline_warning" not in h.types()


def test_preempt_interactive_warns_at_the_lead_and_ends_at_the_start(l4_fleet):
    h = l4_fleet(count=1)
    s = h.scheduler
    session = s.submit("carol", "server", L4, now=0)
    assert reserve(s, spec={"kind": "whole", "model": "L4"}, count=1, now=1, preempt_interactive=True) == []
    s.tick(START - LEAD)
    [warning] = [e for e in h.events if e.type == "lease.deadline_warning"]
    assert warning.lease_id == session.id and warning.data["release_at"] == START
    assert state(s, session) is LeaseState.GRANTED
    s.tick(START)
    ended = s.lease(session.id)
    assert ended.state is LeaseState.EXPIRED and ended.reason == "ended for reservation ml101"
    member = s.submit("stu", "server", L4, now=START + 1, groups=["students"])
    assert state(s, member) is LeaseState.GRANTED


def fill(s, user, n, now, priority=PriorityClass.INTERACTIVE, prefix="kernel"):
    return [s.submit(user, f"{prefix}:{user}{i}", SLICE, priority, now=now) for i in range(n)]


def test_members_are_served_ahead_of_a_long_queue(mig_fleet):
    s = mig_fleet.scheduler
    reserve(s)
    outside = fill(s, "carol", 12, now=0)
    assert [state(s, l) for l in outside].count(LeaseState.GRANTED) == 7  # one GPU is held for ml101
    members = [s.submit(f"stu{i}", "server", SLICE, now=START + i, groups=["students"]) for i in range(4)]
    assert [state(s, l) for l in members] == [LeaseState.GRANTED] * 3 + [LeaseState.QUEUED]
    assert [state(s, l) for l in outside].count(LeaseState.GRANTED) == 7
    assert all(s.deadlines.of(l.id).deadline == END for l in members[:3])
    view = s.reservations.view(s.reservations.get("ml101"), START + 10)
    assert view["state"] == "active" and view["in_use"] == 3 and view["free"] == 0
    assert view["summary"] == "ml101 reservation: 0 of 3 free until 12:00 UTC"


def test_unused_capacity_is_lent_to_preemptible_work_and_reclaimed(mig_fleet):
    s = mig_fleet.scheduler
    reserve(s)
    fill(s, "carol", 7, now=0)
    lent = fill(s, "dave", 7, now=START, priority=BATCH, prefix="job")
    assert all(state(s, l) is LeaseState.GRANTED for l in lent)
    interactive = s.submit("erin", "kernel:e", SLICE, now=START)
    assert state(s, interactive) is LeaseState.QUEUED  # lent only to preemptible work
    member = s.submit("stu", "server", SLICE, now=START + 5, groups=["students"])
    assert state(s, member) is LeaseState.GRANTED
    preempted = [l for l in lent if state(s, l) is LeaseState.PREEMPTED]
    assert len(preempted) == 1 and s.lease(preempted[0].id).reason == "reclaimed for its reservation"


def test_leases_from_a_reservation_end_with_its_window(mig_fleet):
    h = mig_fleet
    s = h.scheduler
    reserve(s)
    member = s.submit("stu", "server", SLICE, now=START, groups=["students"])
    outside = s.submit("stu", "kernel:1", SLICE, now=START)  # not a member without the group
    s.tick(END - s.policy.deadline_warning)
    assert [e.lease_id for e in h.events if e.type == "lease.deadline_warning"] == [member.id]
    s.tick(END)
    assert state(s, member) is LeaseState.EXPIRED and state(s, outside) is LeaseState.GRANTED
    assert s.lease(member.id).reason == "the window of reservation ml101 ended"
    assert [e.type for e in h.events if e.type.startswith("reservation.")] == [
        "reservation.created", "reservation.started", "reservation.ended"]
    [row] = s.reservations.report(END)
    assert row["gpu_hours"] == pytest.approx(2 * (1 / 7))
    [by_reservation] = s.usage.report(0, END, "reservation", END, reservation_of=s.reservations.lease_names())
    assert by_reservation["reservation"] == "ml101" and by_reservation["leases"] == 1
    assert by_reservation["gpu_hours"] == pytest.approx(2 * (1 / 7))  # the member's, not the other lease's


def test_a_weekly_reservation_repeats_across_a_restart(mig_fleet):
    h = mig_fleet
    reserve(h.scheduler, weekly=True)
    h.scheduler.tick(START)
    first = h.scheduler.submit("stu", "server", SLICE, now=START, groups=["students"])
    assert h.scheduler.reservations.of_lease(first.id).name == "ml101"
    h.scheduler.tick(END)
    s = h.restart(END + 3600)
    r = s.reservations.get("ml101")
    assert r.state(END + 3600) == "upcoming" and r.window(END + 3600) == (START + WEEK, END + WEEK)
    fill(s, "carol", 7, now=END + 3600)
    late = s.submit("carol", "kernel:late", SLICE, now=END + 3600)
    assert state(s, late) is LeaseState.QUEUED
    s.tick(START + WEEK)
    member = s.submit("stu", "server", SLICE, now=START + WEEK, groups=["students"])
    assert state(s, member) is LeaseState.GRANTED and s.deadlines.of(member.id).deadline == END + WEEK
    starts = [e.data["start"] for e in h.events if e.type == "reservation.started"]
    assert starts == [START, START + WEEK]
    assert [e.data["start"] for e in h.events if e.type == "reservation.ended"] == [START]


def test_deleting_a_reservation_frees_its_capacity(mig_fleet):
    s = mig_fleet.scheduler
    reserve(s)
    fill(s, "carol", 8, now=0)
    s.reservations.delete("ml101", now=1)
    s.tick(2)
    assert len([l for l in s.leases("carol") if l.state is LeaseState.GRANTED]) == 8
    assert s.reservations.all() == []


def test_quotas_and_fair_share_are_unchanged_outside_reservations(harness):
    gpus = fleet({"model": "L4", "count": 4}, {"model": A100_40, "count": 1, "mig": "dynamic"})
    plain = harness(gpus, heartbeat_ttl=0, idle_timeout=0, quotas={"alice": {"slices": 2}})
    held = harness(gpus, heartbeat_ttl=0, idle_timeout=0, quotas={"alice": {"slices": 2}})
    reserve(held.scheduler)
    for h in (plain, held):
        s = h.scheduler
        leases = [s.submit(u, f"kernel:{u}{i}", L4, now=i) for u in ("alice", "bob") for i in range(3)
                  if not (u == "alice" and i == 2)]
        assert [state(s, l) for l in leases] == [LeaseState.GRANTED] * 4 + [LeaseState.QUEUED]
        s.release(leases[0].id, now=10, holder_gone=True)
        assert state(s, leases[-1]) is LeaseState.GRANTED


def test_a_displaced_job_is_requeued_and_waits_for_the_window_to_end(l4_fleet):
    from jupyter_gpualloc.core.jobs import JobRequest, Jobs

    h = l4_fleet(count=1)
    s = h.scheduler
    jobs = Jobs(s, now=0)
    reserve(s, spec={"kind": "whole", "model": "L4"}, count=1)
    request = JobRequest.from_json({"spec": {"kind": "whole", "model": "L4"}, "workdir": "/w",
                                    "source": {"kind": "cell", "code": "x"}})
    job = jobs.submit("dave", request, now=0)
    jobs.start(job.id, now=1)
    s.tick(START - LEAD)
    jobs.tick(START - LEAD)
    again = jobs.job(job.id)
    assert again.state.value == "queued" and again.preemptions == 1 and "reservation ml101" in again.reason
    assert state(s, s.lease(again.lease_id)) is LeaseState.QUEUED
    s.tick(END)
    assert state(s, s.lease(again.lease_id)) is LeaseState.GRANTED  # lent again once the window is over
