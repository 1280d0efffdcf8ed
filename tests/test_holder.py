"""The holder lifecycle's two shared parts: the wait in the queue and the keepalive."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_gpualloc.holder import Keepalive, WaitGaveUp, wait_in_queue


class Service:
    """A lease that leaves the queue at the `granted_after`-th read; heartbeats recorded."""

    def __init__(self, granted_after: int = 3, reasons=("quota for alice: 2 slices in use",)):
        self.reads, self.granted_after, self.reasons = 0, granted_after, reasons
        self.beats: list[list[str]] = []
        self.ended: set[str] = set()

    async def read(self, view):
        self.reads += 1
        if self.reads >= self.granted_after:
            return {**view, "state": "granted", "position": None, "reason": ""}
        return {**view, "position": self.granted_after - self.reads, "reason": self.reasons[0]}

    async def heartbeat(self, holders):
        self.beats.append(list(holders))
        return [{"id": f"lease-{h}", "holder": h} for h in holders if h not in self.ended]


QUEUED = {"id": "l1", "state": "queued", "position": 3, "reason": "quota for alice: 2 slices in use"}


def test_the_wait_tells_each_round_where_the_request_stands_and_why_and_ends_at_the_grant():
    service, rounds = Service(), []
    lease = asyncio.run(wait_in_queue(service.read, QUEUED, on_round=rounds.append, poll=0.01))
    assert lease["state"] == "granted" and service.reads == 3
    assert [r.position for r in rounds] == [3, 2, 1]
    assert {r.reason for r in rounds} == {"quota for alice: 2 slices in use"}
    assert all(r.left == float("inf") for r in rounds)


def test_the_wait_gives_up_at_its_patience_and_leaves_withdrawing_to_the_holder():
    service = Service(granted_after=10**6)
    with pytest.raises(WaitGaveUp) as gave_up:
        asyncio.run(wait_in_queue(service.read, QUEUED, patience=0.1, poll=0.02))
    assert gave_up.value.waiting.view["state"] == "queued" and gave_up.value.waiting.left <= 0
    assert 3 <= service.reads <= 10


def test_a_pod_already_starting_is_waited_for_past_the_patience():
    """Patience applies to the queue only: a kernel's pod granted and starting is not given up."""
    views = iter([{"state": "starting"}, {"state": "starting"}, {"state": "running"}])

    async def read(view):
        return next(views)

    pod = asyncio.run(wait_in_queue(read, {"state": "starting"}, patience=0.0, poll=0.01,
                                    waiting=lambda v: v["state"] not in ("running", "ended"),
                                    patience_applies=lambda v: v["state"] == "queued"))
    assert pod == {"state": "running"}


def test_a_waiting_holder_is_heartbeaten_while_it_waits():
    service = Service(granted_after=6)
    beats = []

    async def beat():
        beats.append(service.reads)

    asyncio.run(wait_in_queue(service.read, QUEUED, poll=0.02, beat=beat, beat_every=0.0))
    assert beats == [0, 1, 2, 3, 4, 5]  # one per round, before each read


def test_one_heartbeat_carries_every_holder_and_each_kind_reacts_to_its_own_end():
    service = Service()
    ended, lost = [], []
    runs = {"server": True}

    async def server_runs():
        return runs["server"]

    async def scenario():
        keepalive = Keepalive(service.heartbeat, 0.01)
        keepalive.keep("kernel:a", lease_id="lease-kernel:a", on_lost=lost.append)
        keepalive.keep("server", lease_id="lease-server", running=server_runs, on_ended=ended.append)
        await keepalive.beat()
        service.ended.add("kernel:a")  # its lease ends at the service (released from the sidebar)
        await keepalive.beat()
        runs["server"] = False  # the server's process ended
        await keepalive.beat()
        return keepalive

    keepalive = asyncio.run(scenario())
    assert service.beats == [["kernel:a", "server"], ["kernel:a", "server"]]
    assert lost == ["kernel:a"] and ended == ["server"] and keepalive.holders == []


def test_a_failed_heartbeat_is_tried_again_and_the_loop_stops_from_its_own_callback():
    calls = []

    async def flaky(holders):
        calls.append(list(holders))
        if len(calls) == 1:
            raise ConnectionError("the service restarts")
        return []  # the lease is gone at the second beat

    async def scenario():
        keepalive = Keepalive(flaky, 0.01)
        keepalive.keep("job:j1", lease_id="l-j1", on_lost=lambda holder: keepalive.stop())
        keepalive.start()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not keepalive.running:
                break
        return keepalive

    keepalive = asyncio.run(scenario())
    assert calls == [["job:j1"], ["job:j1"]] and not keepalive.running
