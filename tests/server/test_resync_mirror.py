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
