"""StreamMirror: after a stream.reset, the events made from the state are what changed, once."""

from __future__ import annotations

from jupyter_gpualloc.kernel.notices import notice_line
from jupyter_gpualloc.server.resync import StreamMirror


def lease(lease_id: str, state: str = "granted", **fields) -> dict:
    base = {"id": lease_id, "user": "alice", "holder": f"kernel:{lease_id}", "state": state, "slice": None,
            "created_at": 10.0, "granted_at": 11.0 if state == "granted" else None, "ended_at": None,
            "last_activity": 20.0, "idle_warned_at": None, "reason": "", "position": None, "deadline": None}
    return {**base, **fields}


def deadline(at: float, extensions: int = 0, warned_at: float | None = None) -> dict:
    return {"at": at, "extensions": extensions, "extensions_left": 2 - extensions, "warned_at": warned_at}


def quota(used: float, who: str = "alice", scope: str = "user", limit: float = 10.0) -> dict:
    standing = "exceeded" if used >= limit else "warning" if used >= 0.9 * limit else "ok"
    return {"scope": scope, "who": who, "gpu_hours": used, "limit": limit, "window": "7d", "resets_at": None,
            "warn_fraction": 0.9, "standing": standing,
            "message": f"you have used {used:.2f} of {limit:g} GPU-hours in the last 7d"}


def kinds(events: list[dict]) -> list[tuple[str, str | None]]:
    return [(e["type"], e["lease_id"]) for e in events]


def test_warnings_extensions_and_grants_missed_are_made_once_from_the_state():
    mirror = StreamMirror()
    mirror.load([lease("a", deadline=deadline(500.0)), lease("b", idle_warned_at=30.0), lease("q", "queued")],
                [{"id": "j1", "state": "queued", "lease_id": "q"}])
    mirror.seen({"type": "lease.granted", "time": 40.0, "lease_id": "c", "data": {"state": "granted",
                                                                                   "holder": "kernel:c"}})
    now = [lease("a", deadline=deadline(800.0, extensions=1, warned_at=None)),  # extended
           lease("b"),  # used again: its idle warning cleared
           lease("c", idle_warned_at=90.0, deadline=deadline(700.0, warned_at=95.0)),  # both warnings
           lease("q", deadline=deadline(600.0)),  # granted from the queue
           lease("n", "queued", position=1)]  # new, waiting
    jobs = [{"id": "j1", "state": "running", "lease_id": "q", "user": "alice", "name": "train", "attempts": 1}]
    made = mirror.catch_up(now, {}, jobs, now=100.0)
    assert kinds(made) == [("lease.extended", "a"), ("lease.idle_cleared", "b"), ("lease.idle_warning", "c"),
                           ("lease.deadline_warning", "c"), ("lease.granted", "q"), ("lease.queued", "n"),
                           ("job.started", "q")]
    assert all(e["resync"] for e in made)
    extended, _, idle, warned, _, queued, job = made
    assert extended["data"] == {"holder": "kernel:a", "state": "granted", "deadline": 800.0, "extensions": 1,
                                "extensions_left": 1}
    assert (idle["time"], idle["data"]["idle_s"]) == (90.0, 70.0)
    assert notice_line(idle) == "gpu: lease c is idle: it is released soon unless this kernel is used"
    assert (warned["time"], warned["data"]["deadline"], warned["data"]["release_at"]) == (95.0, 700.0, 700.0)
    assert queued["data"]["position"] == 1 and job["data"]["job_id"] == "j1"
    assert mirror.catch_up(now, {}, jobs, now=200.0) == []  # the same state again: nothing


def test_a_lease_gone_from_the_list_ends_with_its_own_state_or_as_expired_when_unknown():
    mirror = StreamMirror()
    mirror.load([lease("p"), lease("u")], [])
    assert sorted(mirror.missing([])) == ["p", "u"]
    gone = {"p": lease("p", "preempted", ended_at=50.0, reason="for a higher priority request"), "u": None}
    made = mirror.catch_up([], gone, [], now=60.0)
    assert [(e["type"], e["time"], e["data"]["state"], e["data"]["holder"]) for e in made] == [
        ("lease.preempted", 50.0, "preempted", "kernel:p"), ("lease.expired", 60.0, "expired", "kernel:u")]
    assert made[0]["data"]["reason"] == "for a higher priority request"
    assert mirror.leases == {} and mirror.catch_up([], {}, [], now=70.0) == []


def test_events_seen_on_the_stream_are_not_made_again():
    mirror = StreamMirror()
    mirror.load([lease("a", deadline=deadline(500.0))], [])
    for event in ({"type": "lease.idle_warning", "time": 30.0, "lease_id": "a", "data": {"state": "granted"}},
                  {"type": "lease.extended", "time": 31.0, "lease_id": "a",
                   "data": {"state": "granted", "deadline": 800.0, "extensions": 1}},
                  {"type": "lease.deadline_warning", "time": 32.0, "lease_id": "a",
                   "data": {"state": "granted", "deadline": 800.0}}):
        mirror.seen(event)
    state = [lease("a", idle_warned_at=30.0, deadline=deadline(800.0, extensions=1, warned_at=32.0))]
    assert mirror.catch_up(state, {}, [], now=40.0) == []


def test_usage_warnings_missed_are_made_once_per_lease_quota_and_level():
    mirror = StreamMirror()
    group = quota(9.5, "students", "group", limit=10.0)
    # the group's quota was warned of before the stream opened: not again
    mirror.load([lease("a"), lease("b"), lease("q", "queued")], [], [quota(1.0), group])
    mirror.seen({"type": "usage.warning", "time": 30.0, "lease_id": "a", "data": quota(9.1)})
    now = [lease("a"), lease("b"), lease("q", "queued")]
    quotas = [quota(9.2), quota(10.0, "students", "group")]
    made = mirror.catch_up(now, {}, [], now=100.0, quotas=quotas)
    assert kinds(made) == [("usage.exceeded", "a"), ("usage.warning", "b"), ("usage.exceeded", "b")]
    assert all(e["resync"] and e["time"] == 100.0 for e in made)
    assert made[0]["data"]["who"] == "students" and made[1]["data"]["holder"] == "kernel:b"
    assert notice_line(made[1]) == "gpu: usage quota nearly used up: you have used 9.20 of 10 GPU-hours in the last 7d"
    assert mirror.catch_up(now, {}, [], now=200.0, quotas=quotas) == []  # the same levels again: nothing
    # back under the warning level (a rolling window), then past it again: warned again, as the service does
    assert mirror.catch_up(now, {}, [], now=300.0, quotas=[quota(5.0), quota(5.0, "students", "group")]) == []
    again = mirror.catch_up(now, {}, [], now=400.0, quotas=[quota(9.3), quota(5.0, "students", "group")])
    assert kinds(again) == [("usage.warning", "a"), ("usage.warning", "b")]
    mirror.catch_up([lease("b")], {"a": lease("a", "released", ended_at=410.0)}, [], now=420.0, quotas=quotas)
    assert {key[0] for key in mirror.usage} == {"b"}  # an ended lease's warnings are forgotten
